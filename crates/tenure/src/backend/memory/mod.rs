//! A deterministic in-process backend, for tests.
//!
//! [`MemoryStore`] keeps leases in a map and measures their TTLs with
//! tokio's clock, so tests that pause time (`#[tokio::test(start_paused =
//! true)]`) run the whole election protocol instantly and identically on
//! every run. It also lets a test do what is hard to arrange against a real
//! server: revoke or delete a lease now (its witness stays, as on every
//! store), hand it to another owner, lose all data, or make every call
//! fail or hang. A [`MemoryStore::view`] is one client's
//! connection to the same data, with faults and announcements of its own,
//! so one instance can be cut off, slowed or deafened while others work.
//!
//! **Files.** This one holds the [`MemoryStore`] and its public API;
//! `state.rs` the shared data and how each operation changes it (as the
//! Redis scripts do), with the [`Calls`] counted and the [`Snapshot`]
//! taken of it; `faults.rs` what one client's calls and announcements
//! suffer ([`Fault`], [`Announcements`]).

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio::time::Instant;

use super::address::Address;
use super::op::{Hints, Notices, Op, Reply};
use crate::term::LeaderInfo;
use crate::{Error, Result};
pub use faults::Fault;
use faults::{relay, View};
use state::{holder_of, StoreState};

#[cfg(feature = "testing")]
mod controls;
mod faults;
mod state;

#[cfg(feature = "testing")]
pub use faults::Announcements;
#[cfg(feature = "testing")]
pub use state::{Calls, Snapshot};

/// An in-memory lease store shared by any number of elections, for tests.
///
/// Clones share the same store (and, for a [`MemoryStore::view`], the same
/// view).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("jobs")
///     .memory(&store)
///     .ttl(Duration::from_secs(3))
///     .build()
///     .await?;
/// let term = election.campaign().await?;
/// assert!(term.is_leader());
///
/// store.revoke("jobs"); // simulate losing the lease right now
/// let reason = term.lost().await;
/// assert!(!term.is_leader());
/// println!("lost: {reason}");
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<StoreState>>,
    /// Set on a [`MemoryStore::view`]: that client's own behaviour.
    view: Option<Arc<Mutex<View>>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store.
    ///
    /// ```
    /// let store = tenure::MemoryStore::new();
    /// assert!(store.holder("jobs").is_none());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        // A panic while holding this lock can only come from a bug in this
        // file; the state is still consistent, so keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Who holds an election's lease now.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let term = election.campaign().await?;
    /// assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    /// term.resign().await?;
    /// assert!(store.holder("jobs").is_none());
    /// # Ok(()) }
    /// ```
    pub fn holder(&self, election: &str) -> Option<LeaderInfo> {
        let mut state = self.lock();
        let now = Instant::now();
        state
            .live_lease(election, now)
            .map(|lease| LeaderInfo::from(holder_of(lease, now)))
    }

    /// The last scheduled slot claimed in an election
    /// ([`Leadership::claim_slot`](crate::Leadership::claim_slot)), as the
    /// store keeps it now: what [`Election::last_slot`](crate::Election::last_slot)
    /// would answer, read without the faults of any view. A test asks it
    /// whether a claim its code was told of is still there (a
    /// [`MemoryStore::restore`] or [`MemoryStore::wipe`] may have lost it).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::{Duration, SystemTime};
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("report").memory(&store).build().await?;
    /// let before = store.snapshot();
    /// let term = election.campaign().await?;
    /// let slot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// assert!(term.claim_slot(slot, Duration::from_secs(3600)).await?);
    /// assert_eq!(store.last_slot("report"), Some(slot));
    /// store.restore(&before); // the store rolls back: the claim is lost
    /// assert_eq!(store.last_slot("report"), None);
    /// # Ok(()) }
    /// ```
    pub fn last_slot(&self, election: &str) -> Option<std::time::SystemTime> {
        let slot = self.lock().last_slot(election, Instant::now())?;
        crate::runner::slot_time(slot)
    }

    /// Names of the elections with a live lease, sorted (the memory store
    /// has no prefixes).
    pub(crate) fn elections(&self) -> Vec<String> {
        let mut state = self.lock();
        let now = Instant::now();
        let names: Vec<String> = state.leases.keys().cloned().collect();
        let mut live: Vec<String> = names
            .into_iter()
            .filter(|name| state.live_lease(name, now).is_some())
            .collect();
        live.sort();
        live
    }

    /// The announcements of the election at `at` on this store (through
    /// this view's faults, on a view).
    pub(crate) fn election(&self, at: Address<'_>) -> Hints {
        let election = at.name;
        let mut notices = self
            .lock()
            .notices
            .entry(election.to_string())
            .or_insert_with(|| watch::channel(Notices::default()).0)
            .subscribe();
        if let Some(view) = &self.view {
            notices = relay(notices, view.clone());
        }
        Hints {
            notices,
            guard: None,
        }
    }

    /// Carry out `ops` under one lock, as one round trip: each is counted,
    /// then the configured fault applies to the batch as a whole.
    pub(crate) async fn batch(&self, ops: &[Op<'_>]) -> Result<Vec<Result<Reply>>> {
        let (fault, served_at) = {
            let mut state = self.lock();
            for op in ops {
                state.count(op);
            }
            let fault = self.fault(&state);
            (fault, state.serve(fault, ops))
        };
        match fault {
            Fault::None | Fault::LoseReplies | Fault::Slow(_) | Fault::Busy(_) => {}
            Fault::Fail => return Err(Error::Unavailable),
            Fault::Stall => std::future::pending().await,
        }
        let now = Instant::now();
        let replies = {
            let mut state = self.lock();
            let replies: Vec<Result<Reply>> =
                ops.iter().map(|op| Ok(state.apply(op, now))).collect();
            if self.fault(&state) == Fault::LoseReplies {
                return Err(Error::Unavailable);
            }
            replies
        };
        if let Fault::Slow(delay) = fault {
            tokio::time::sleep(delay).await;
        }
        if let Some(served_at) = served_at {
            tokio::time::sleep_until(served_at).await;
        }
        Ok(replies)
    }
}
