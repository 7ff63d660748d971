//! What a running [`PartitionSet`] shows the outside: the state it
//! publishes ([`Observed`]) and the read-only [`PartitionObserver`] over it.
//! Apart from the run loop, because observers only read, from other tasks,
//! what the loop writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(doc)]
use super::PartitionSet;

/// What an observer of a running set can see.
#[derive(Default, Debug)]
pub(super) struct Observed {
    pub(super) partitions: Arc<[String]>,
    /// Indexes of the partitions held, as of the last change.
    pub(super) owned: Mutex<Vec<usize>>,
    /// The keeper's generation `owned` was taken at.
    pub(super) generation: AtomicU64,
    pub(super) members: Mutex<Vec<String>>,
    pub(super) round_trips: AtomicU64,
    pub(super) cycles: AtomicU64,
}

/// A read-only view of a running [`PartitionSet`], for tests, status pages
/// and benchmarks.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
///     .memory(&tenure::MemoryStore::new())
///     .ttl(Duration::from_millis(300))
///     .id("member-a")
///     .build()
///     .await?;
/// let observer = set.observer();
/// // Run until this member, alone in its group, owns both partitions.
/// let both_owned = {
///     let observer = observer.clone();
///     async move {
///         while observer.owned().len() < 2 {
///             tokio::time::sleep(Duration::from_millis(10)).await;
///         }
///     }
/// };
/// set.run(|_partition, term| async move { term.lost().await; }, both_owned)
///     .await?;
/// assert_eq!(observer.members(), ["member-a"]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PartitionObserver {
    pub(super) observed: Arc<Observed>,
}

impl PartitionObserver {
    /// Partitions this member owns now, in the order they were given.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_millis(300))
    ///     .build()
    ///     .await?;
    /// let observer = set.observer();
    /// let owns_both = async move {
    ///     while observer.owned().len() < 2 {
    ///         tokio::time::sleep(Duration::from_millis(10)).await;
    ///     }
    ///     assert_eq!(observer.owned(), ["orders-0", "orders-1"]);
    /// };
    /// set.run(|_partition, term| async move { term.lost().await; }, owns_both).await?;
    /// # Ok(()) }
    /// ```
    pub fn owned(&self) -> Vec<String> {
        let owned = self
            .observed
            .owned
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        owned
            .iter()
            .filter_map(|index| self.observed.partitions.get(*index).cloned())
            .collect()
    }

    /// How many partitions this member owns now (cheaper than
    /// [`PartitionObserver::owned`] for large sets).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let partitions: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
    /// let set = tenure::PartitionSet::builder("orders", partitions)
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_millis(300))
    ///     .build()
    ///     .await?;
    /// let observer = set.observer();
    /// let owns_all = async move {
    ///     while observer.owned_count() < 100 {
    ///         tokio::time::sleep(Duration::from_millis(10)).await;
    ///     }
    /// };
    /// set.run(|_partition, term| async move { term.lost().await; }, owns_all).await?;
    /// # Ok(()) }
    /// ```
    pub fn owned_count(&self) -> usize {
        self.observed
            .owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Live members as of the last heartbeat (sorted).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let set = tenure::PartitionSet::builder("orders", ["p0", "p1"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .id("member-a")
    ///     .ttl(Duration::from_millis(300))
    ///     .build()
    ///     .await?;
    /// let observer = set.observer();
    /// let joined = async move {
    ///     while observer.members().is_empty() {
    ///         tokio::time::sleep(Duration::from_millis(10)).await;
    ///     }
    ///     assert_eq!(observer.members(), ["member-a"]);
    /// };
    /// set.run(|_partition, term| async move { term.lost().await; }, joined).await?;
    /// # Ok(()) }
    /// ```
    pub fn members(&self) -> Vec<String> {
        self.observed
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Round trips to the store made so far: pipelines and single calls,
    /// one per node a batch goes to (on a Redis Cluster, one per primary
    /// that holds some of the batch's keys), and on Redis one per slice of
    /// a long pipeline (about 30,000 arguments: 10,000 renewals on one
    /// server, about 3,750 per primary on a cluster).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let set = tenure::PartitionSet::builder("orders", ["p0", "p1", "p2"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_millis(300))
    ///     .build()
    ///     .await?;
    /// let observer = set.observer();
    /// let stop = tokio::time::sleep(Duration::from_millis(500));
    /// set.run(|_partition, term| async move { term.lost().await; }, stop).await?;
    /// // Batched: far fewer round trips than one per partition and cycle.
    /// assert!(observer.round_trips() < 3 * observer.cycles());
    /// # Ok(()) }
    /// ```
    pub fn round_trips(&self) -> u64 {
        self.observed.round_trips.load(Ordering::Relaxed)
    }

    /// Renewal cycles (heartbeat and renewals, one per renew interval)
    /// begun so far.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let set = tenure::PartitionSet::builder("orders", ["p0"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .renew_every(Duration::from_secs(1))
    ///     .build()
    ///     .await?;
    /// let observer = set.observer();
    /// let stop = tokio::time::sleep(Duration::from_millis(10_500));
    /// set.run(|_partition, term| async move { term.lost().await; }, stop).await?;
    /// assert!((10..=12).contains(&observer.cycles()), "about one a second");
    /// # Ok(()) }
    /// ```
    pub fn cycles(&self) -> u64 {
        self.observed.cycles.load(Ordering::Relaxed)
    }
}
