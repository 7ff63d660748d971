//! The memory store's test controls (the crate's `testing` feature):
//! outages and stalls, announcements lost or delayed, leases revoked,
//! deleted or stolen by hand, snapshots restored, the store wiped, and the
//! calls counted. They are what the simulation and tenure's own tests
//! inject; a user's tests of code built on tenure can use them too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::faults::{lock, View};
use super::state::Lease;
use super::{Announcements, Calls, Fault, MemoryStore, Snapshot};

impl MemoryStore {
    /// Make every later call fail, hang, or work again. On a
    /// [`MemoryStore::view`] this is the view's own fault: only calls made
    /// through it are affected (a fault of the whole store, set on the
    /// store itself, applies to views too and takes precedence, except
    /// that a view's own [`Fault::Stall`], [`Fault::Fail`] or
    /// [`Fault::LoseReplies`] still applies on a [`Fault::Busy`] store).
    /// Setting the store's fault ends a saturation's backlog: work queued
    /// under one [`Fault::Busy`] does not carry over into the next.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// store.set_fault(tenure::Fault::Fail); // as if Redis refused connections
    /// assert!(matches!(election.leader().await, Err(tenure::Error::Unavailable)));
    /// store.set_fault(tenure::Fault::None);
    /// assert!(election.leader().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn set_fault(&self, fault: Fault) {
        match &self.view {
            Some(view) => lock(view).fault = fault,
            None => {
                let mut state = self.lock();
                state.fault = fault;
                state.busy_until = None;
            }
        }
    }

    /// Another client's connection to this store: the same leases, tokens
    /// and members, but its own [`Fault`] and [`Announcements`], so that
    /// one instance's calls can fail, stall or lose their replies, and its
    /// announcements arrive late or not at all, while other instances work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let (view_a, view_b) = (store.view(), store.view());
    /// let ttl = Duration::from_millis(300);
    /// let a = tenure::Election::builder("jobs").memory(&view_a).id("a").ttl(ttl).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&view_b).id("b").ttl(ttl).build().await?;
    /// let term = a.campaign().await?;
    /// view_a.set_fault(tenure::Fault::Stall); // only a is cut off
    /// assert_eq!(term.lost().await, tenure::LostReason::DeadlinePassed);
    /// let next = b.campaign().await?; // b still reaches the store
    /// assert!(next.token() > term.token());
    /// # Ok(()) }
    /// ```
    pub fn view(&self) -> MemoryStore {
        MemoryStore {
            state: self.state.clone(),
            view: Some(Arc::new(Mutex::new(View::default()))),
        }
    }

    /// How announcements reach the elections built on this view from now
    /// on. Only views have their own: on the store itself this does nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let view_b = store.view();
    /// view_b.set_announcements(tenure::Announcements::Lost); // b hears of no change
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&view_b).id("b").ttl(Duration::from_millis(300)).build().await?;
    /// let term = a.campaign().await?;
    /// let first = term.token();
    /// let b_campaigns = tokio::spawn(async move { b.campaign().await });
    /// term.resign().await?;
    /// let next = b_campaigns.await.unwrap()?; // b found the lease free by polling
    /// assert!(next.token() > first);
    /// # Ok(()) }
    /// ```
    pub fn set_announcements(&self, announcements: Announcements) {
        if let Some(view) = &self.view {
            lock(view).announcements = announcements;
        }
    }

    /// Delete an election's lease without announcing it, as if it expired
    /// or Redis evicted it. The holder learns at its next renewal. As on
    /// every store, the lease's witness stays: no other candidate is
    /// granted the election until the holder has released it (after it
    /// stopped) or it has run out.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_millis(300)).build().await?;
    /// let term = a.campaign().await?;
    /// store.revoke("jobs");
    /// assert!(store.holder("jobs").is_none());
    /// assert_eq!(term.lost().await, tenure::LostReason::Expired); // at its next renewal
    /// # Ok(()) }
    /// ```
    pub fn revoke(&self, election: &str) {
        self.lock().leases.remove(election);
    }

    /// Delete an election's lease by hand, as an operator forcing a
    /// re-election would (`DEL`, `etcdctl del`), and announce it, as
    /// etcd's watch does: the holder renews at once and stops, and only
    /// then releases the witness that holds the candidates off.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").build().await?;
    /// let term = a.campaign().await?;
    /// store.delete("jobs");
    /// let next = b.campaign().await?;
    /// assert!(!term.is_leader(), "a stopped before b was elected");
    /// assert!(next.token() > term.token());
    /// # Ok(()) }
    /// ```
    pub fn delete(&self, election: &str) {
        let mut state = self.lock();
        state.leases.remove(election);
        state.notify(election, |n| n.released += 1);
    }

    /// **Unsafe; for failing-mode tests only.** Grant an election whose
    /// lease vanished without waiting for its witness, as before tenure
    /// kept one: a lease deleted by hand then lets a candidate in while
    /// its holder still acts.
    #[doc(hidden)]
    pub fn unsafe_ignore_witness(&self, on: bool) {
        self.lock().ignore_witness = on;
    }

    /// Give an election's lease to `owner` with a new token, as if another
    /// instance took over; returns that token.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_millis(300)).build().await?;
    /// let term = a.campaign().await?;
    /// let stolen = store.steal("jobs", "intruder", Duration::from_secs(10));
    /// assert!(stolen > term.token());
    /// let lost = term.lost().await;
    /// assert_eq!(lost, tenure::LostReason::Taken { by: "intruder".into(), token: stolen });
    /// # Ok(()) }
    /// ```
    pub fn steal(&self, election: &str, owner: &str, ttl: Duration) -> u64 {
        let mut state = self.lock();
        let token = state.next_token(election);
        let now = Instant::now();
        state.leases.insert(
            election.to_string(),
            Lease {
                owner: owner.to_string(),
                token,
                expires: now + ttl,
                since_ms: 0,
                attempt: String::new(),
                ttl,
            },
        );
        state.witness(election, owner.to_string(), token, now + ttl);
        state.notify(election, |n| n.acquired += 1);
        token
    }

    /// The leases and token counters as they are now.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let term = election.campaign().await?;
    /// let snapshot = store.snapshot(); // a's lease, as a replica saw it
    /// term.resign().await?;
    /// store.restore(&snapshot); // a failover to that replica: the lease is back
    /// assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            leases: state.leases.clone(),
            last_tokens: state.last_tokens.clone(),
            runs: state.runs.clone(),
            witnesses: state.witnesses.clone(),
        }
    }

    /// Replace every lease and token counter with a snapshot's, as a Redis
    /// restart that loads an older RDB file (or a failover to a lagging
    /// replica) does: leases expired since are gone, leases granted since
    /// are lost, and, as after [`MemoryStore::wipe`], the start-up hold-off
    /// period applies. Later tokens still rise above all earlier ones.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let ttl = Duration::from_millis(300);
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").ttl(ttl).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").ttl(ttl).build().await?;
    /// let before = store.snapshot(); // nobody leads
    /// let term = a.campaign().await?;
    /// store.restore(&before); // the store rolls back: a's lease is lost
    /// assert!(store.holder("jobs").is_none());
    /// let next = b.campaign().await?; // after the hold-off
    /// assert!(next.token() > term.token(), "tokens still rise");
    /// # Ok(()) }
    /// ```
    pub fn restore(&self, snapshot: &Snapshot) {
        let mut state = self.lock();
        state.leases = snapshot.leases.clone();
        state.last_tokens = snapshot.last_tokens.clone();
        state.runs = snapshot.runs.clone();
        state.witnesses = snapshot.witnesses.clone();
        state.hold_off_since.clear();
        state.busy_until = None;
        state.wiped = true;
    }

    /// Lose every lease, token counter and last-run marker, as a Redis
    /// restart without persistence does. Later tokens still rise above earlier ones, and,
    /// as with Redis, no lease is granted until one ttl after an election
    /// is next asked for one (a leader from before may still believe).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let ttl = Duration::from_millis(300);
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").ttl(ttl).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").ttl(ttl).build().await?;
    /// let term = a.campaign().await?;
    /// store.wipe(); // Redis restarted without persistence
    /// assert!(store.holder("jobs").is_none());
    /// let next = b.campaign().await?; // after the hold-off
    /// assert!(next.token() > term.token(), "tokens still rise");
    /// # Ok(()) }
    /// ```
    pub fn wipe(&self) {
        let mut state = self.lock();
        state.leases.clear();
        state.last_tokens.clear();
        state.runs.clear();
        state.witnesses.clear();
        state.hold_off_since.clear();
        state.busy_until = None;
        state.wiped = true;
    }

    /// Requests made so far for `election`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let _term = election.campaign().await?;
    /// assert_eq!(store.calls("jobs").acquire, 1);
    /// # Ok(()) }
    /// ```
    pub fn calls(&self, election: &str) -> Calls {
        self.lock().calls.get(election).copied().unwrap_or_default()
    }
}
