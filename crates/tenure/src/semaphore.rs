//! Semaphores: at most N holders at once.
//!
//! A [`Semaphore`] of N permits is N elections, `NAME/permit-0` to
//! `NAME/permit-{N-1}`, each with every guarantee of one: a lease with a
//! ttl, a fencing token that only grows, a local deadline past which its
//! holder does not hold it, hand-over in milliseconds on a release and at
//! the lease's expiry on a crash. At most one instance holds each permit,
//! so at most N hold one at any instant, under the faults an election
//! survives, on every store an election runs on: the semaphore adds no
//! state of its own to get wrong.
//!
//! What it adds is the choice of permit. [`Semaphore::acquire`] campaigns
//! for every permit at once and keeps the first it wins; the campaigns
//! for the others are abandoned, and a lease one of them won meanwhile is
//! released at once, so a waiter never sits on two permits and the group
//! never runs with fewer holders than it could. A permit is a
//! [`Leadership`]: its token fences writes of that permit's holder (a
//! resource keeps the highest token it has seen *per permit*, see
//! [`Leadership::election`]), `lost()` fires when it ends, `resign()`
//! hands it to a waiter at once, dropping every clone releases it.
//!
//! Every instance of a group must use the same number of permits: with
//! two numbers, as many instances hold one as the larger number allows.
//! A waiter follows each permit on its own (N campaigns); for hundreds
//! of slots of work, partition sets ([`crate::PartitionSet`]) cost less.

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::{metrics, Election, Error, LeaderInfo, Leadership, Result};

/// The most permits a semaphore may have: each waiter campaigns for every
/// one of them.
pub const MAX_PERMITS: usize = 1_000;

/// N permits, each held by at most one instance at a time; made by
/// [`crate::ElectionBuilder::semaphore`]. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let exports = tenure::Election::builder("exports").memory(&store).semaphore(2).await?;
/// let first = exports.acquire().await?;
/// let second = exports.acquire().await?;
/// assert!(exports.try_acquire().await?.is_none(), "both permits are held");
/// second.resign().await?;
/// assert!(exports.try_acquire().await?.is_some(), "a released permit is free at once");
/// # drop(first); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    name: String,
    permits: Vec<Election>,
}

impl Semaphore {
    pub(crate) fn new(name: String, permits: Vec<Election>) -> Semaphore {
        metrics::semaphore_permits(&name, permits.len());
        // Both series exist from the start, at 0: a group where nobody ever
        // won a permit still shows (and alerts on) its waiters.
        metrics::semaphore_held(&name, 0);
        metrics::semaphore_waiting(&name, 0);
        Semaphore { name, permits }
    }

    /// Count `term`, a permit just won, as held until it ends.
    fn count_held(&self, term: &Leadership) {
        #[cfg(feature = "metrics")]
        {
            metrics::semaphore_held(&self.name, 1);
            // Only the term's shared state: a clone of the handle would
            // keep the lease.
            let shared = std::sync::Arc::clone(term.shared());
            let name = self.name.clone();
            tokio::spawn(async move {
                shared.lost().await;
                metrics::semaphore_held(&name, -1);
            });
        }
        #[cfg(not(feature = "metrics"))]
        let _ = term;
    }

    /// The semaphore's name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let exports = tenure::Election::builder("exports").memory(&store).semaphore(3).await?;
    /// assert_eq!(exports.name(), "exports");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let exports = tenure::Election::builder("exports").memory(&store).semaphore(3).await?;
    /// assert_eq!(exports.permits(), 3);
    /// # Ok(()) }
    /// ```
    pub fn permits(&self) -> usize {
        self.permits.len()
    }

    /// The election name of permit `index` of a semaphore named `name`:
    /// what [`Semaphore::elections`] are called, for tools that read a
    /// semaphore's permits without taking part (`tenure status --slots`).
    ///
    /// ```
    /// assert_eq!(tenure::Semaphore::permit_election("exports", 2), "exports/permit-2");
    /// ```
    pub fn permit_election(name: &str, index: usize) -> String {
        format!("{name}/permit-{index}")
    }

    /// The election of each permit, in order (`NAME/permit-0` first): to
    /// watch one, or read its last run.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let exports = tenure::Election::builder("exports").memory(&store).semaphore(2).await?;
    /// let names: Vec<&str> = exports.elections().iter().map(|e| e.name()).collect();
    /// assert_eq!(names, ["exports/permit-0", "exports/permit-1"]);
    /// # Ok(()) }
    /// ```
    pub fn elections(&self) -> &[Election] {
        &self.permits
    }

    /// Wait until this instance holds a permit, and return it: the term of
    /// that permit's election, held when it is returned.
    ///
    /// Campaigns for every permit at once and keeps the first won; the
    /// other campaigns are abandoned, and a lease one of them won
    /// meanwhile is released before this returns (if that release cannot
    /// be confirmed, the lease lapses after one ttl). Transient failures
    /// are retried, as [`Election::campaign`] does; an error that needs a
    /// person (credentials, ACL, foreign data) is returned.
    ///
    /// Called again while this instance holds a permit, it waits for
    /// another one: one process may hold several.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let semaphore = |id: &str| {
    ///     tenure::Election::builder("exports").memory(&store).id(id).semaphore(1)
    /// };
    /// let (a, b) = (semaphore("a").await?, semaphore("b").await?);
    /// let held = a.acquire().await?;
    /// let waiter = tokio::spawn(async move { b.acquire().await });
    /// tokio::time::sleep(Duration::from_secs(60)).await;
    /// assert!(!waiter.is_finished(), "one permit, held by a");
    /// held.resign().await?;
    /// let taken = waiter.await.expect("no panic")?;
    /// assert_eq!((taken.id(), taken.election()), ("b", "exports/permit-0"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// As [`Election::campaign`]: a permit won by a cancelled call lapses
    /// after one ttl; [`Election::release_if_held`] on each of
    /// [`Semaphore::elections`] releases it sooner.
    pub async fn acquire(&self) -> Result<Leadership> {
        let _waiting = Waiting::new(&self.name);
        loop {
            let term = self.acquire_once().await?;
            // Winding up the other campaigns took store calls, during
            // which the permit won may have ended (its lease lost, its
            // deadline passed): a permit handed out is one held now.
            if term.is_leader() {
                self.count_held(&term);
                return Ok(term);
            }
            tracing::debug!(election = %term.election(), token = term.token(), "the permit won ended while the other campaigns were wound up; campaigning again");
        }
    }

    /// Campaign for every permit; the first won, once the other campaigns
    /// are wound up.
    async fn acquire_once(&self) -> Result<Leadership> {
        let mut campaigns: FuturesUnordered<_> = self
            .permits
            .iter()
            .enumerate()
            .map(|(index, election)| async move { (index, election.campaign().await) })
            .collect();
        let Some((won, first)) = campaigns.next().await else {
            return Err(Error::internal("a semaphore without permits"));
        };
        // Another campaign may have won its permit too (its term's handle,
        // dropped here, releases it) or have a lease written unseen. An
        // error (one that needs a person: credentials, ACL, foreign data in
        // one permit's keys) ends them all the same.
        drop(campaigns);
        let others = self
            .permits
            .iter()
            .enumerate()
            .filter(|(index, _)| *index != won)
            .map(|(_, election)| async move {
                if let Err(err) = election.release_if_held().await {
                    tracing::warn!(election = %election.name(), error = %err, "could not check for a permit won by an abandoned campaign; it lapses at its ttl");
                }
            });
        futures_util::future::join_all(others).await;
        // A campaign dropped with its write in flight may land that write
        // after the look above: on a store whose keys hang on a session
        // the process keeps alive for the permit it won (etcd's session
        // lease, ZooKeeper's session), such a lease would never lapse, and
        // the permit would stay held by nobody. Look again once any write
        // sent before the drop has landed or failed; a permit handed out
        // (kept) is never released by it.
        for (index, election) in self.permits.iter().enumerate() {
            if index == won {
                continue;
            }
            let election = election.clone();
            tokio::spawn(async move {
                for _ in 0..2 {
                    tokio::time::sleep(election.call_timeout()).await;
                    if let Ok(true) = election.release_if_held().await {
                        tracing::debug!(election = %election.name(), "released a permit an abandoned campaign won late");
                    }
                }
            });
        }
        first
    }

    /// One attempt at each permit in turn, starting at a random one: a
    /// permit if one was free, `None` if all are held. Unlike
    /// [`Semaphore::acquire`], transient errors are returned, not retried.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let semaphore = |id: &str| {
    ///     tenure::Election::builder("exports").memory(&store).id(id).semaphore(1)
    /// };
    /// let (a, b) = (semaphore("a").await?, semaphore("b").await?);
    /// let held = a.try_acquire().await?.expect("free");
    /// assert!(b.try_acquire().await?.is_none());
    /// # drop(held); Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// As [`Election::try_campaign`].
    pub async fn try_acquire(&self) -> Result<Option<Leadership>> {
        let Some(first) = self.permits.first() else {
            return Err(Error::internal("a semaphore without permits"));
        };
        let start = first.random_index(self.permits.len());
        for offset in 0..self.permits.len() {
            let election = &self.permits[(start + offset) % self.permits.len()];
            if let Some(term) = election.try_campaign().await? {
                self.count_held(&term);
                return Ok(Some(term));
            }
        }
        Ok(None)
    }

    /// Who holds each permit, in order: `None` for a free one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let exports = tenure::Election::builder("exports").memory(&store).id("a").semaphore(2).await?;
    /// let held = exports.acquire().await?;
    /// let holders = exports.holders().await?;
    /// assert_eq!(holders.iter().flatten().count(), 1);
    /// assert!(holders.iter().flatten().all(|h| h.id == "a" && h.token == held.token()));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn holders(&self) -> Result<Vec<Option<LeaderInfo>>> {
        let reads = self.permits.iter().map(Election::leader);
        futures_util::future::join_all(reads)
            .await
            .into_iter()
            .collect()
    }
}

/// An `acquire` call waiting for a permit, counted in the
/// `leader_election_semaphore_waiting` gauge until it returns or is
/// cancelled.
struct Waiting<'a>(&'a str);

impl<'a> Waiting<'a> {
    fn new(name: &'a str) -> Self {
        metrics::semaphore_waiting(name, 1);
        Waiting(name)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        metrics::semaphore_waiting(self.0, -1);
    }
}
