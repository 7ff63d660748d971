//! Partition sets: many elections per process, shared fairly among the live
//! members of a group, renewed in batches.
//!
//! A [`PartitionSet`] is N named partitions (say `orders-0` .. `orders-63`)
//! and the members of a group that share them. Each partition is an
//! election of its own with every guarantee of one (a fencing token, a
//! local deadline, a [`Leadership`] whose `lost()` fires, resignation); what
//! the set adds is *who should own what* and *how cheaply*:
//!
//! - **Membership.** Every member refreshes a heartbeat in a Redis sorted set
//!   once per renew interval; a member whose heartbeat is older than one ttl
//!   is gone.
//! - **Fair, stable assignment.** From the sorted list of live members, every
//!   member computes the same target: each partition goes to the member that
//!   ranks highest for it by rendezvous hashing and still has room under the
//!   fair share, `ceil(N / members)`. When a member joins, only the
//!   partitions it now ranks first for move; when one leaves, only its
//!   partitions move.
//! - **Handing over.** A member that owns a partition outside its target
//!   tells that partition's work to stop (its `lost()` fires with
//!   [`LostReason::Resigned`]), keeps renewing the lease until the work has
//!   returned, and only then resigns, so the next owner never overlaps it.
//!   A member's partitions that it does not release (it died) are taken
//!   over once their leases expire.
//! - **Batching.** One cycle per renew interval costs one round trip in the
//!   steady state: the heartbeat and the renewal of every owned lease go in
//!   one pipeline. Acquisitions and releases, when there are any, go in one
//!   more pipeline each.
//!
//! Partition sets use the same store seam as elections: Redis, or a
//! [`MemoryStore`] for deterministic tests under tokio's paused clock.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{interval, sleep_until, timeout, Instant, MissedTickBehavior};

use crate::backend::{validate_name, Address};
use crate::backend::{Op, Reply, Store, RENEW_MANY};
use crate::election::{Settings, StoreSpec};
use crate::keeper::{Keeper, Report};
use crate::leadership::Command;
use crate::machine::{
    after_acquire, AcquireReply, AcquireRequest, CandidateStep, LeaderStep, Reading, RenewReply,
    Timing,
};
use crate::{metrics, Error, Leadership, LostReason, MemoryStore, Result};

/// The most acquisitions sent in one round trip.
const ACQUIRE_CHUNK: usize = 1_000;

/// The most renewals sent in one round trip (as [`RENEW_MANY`]-sized
/// operations): a set of up to 100,000 partitions renews in one round trip.
const RENEW_CHUNK: usize = 100_000;

/// Settings of a partition set; [`PartitionSetBuilder::build`] validates
/// them and connects.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let builder = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
///     .memory(&tenure::MemoryStore::new())
///     .ttl(Duration::from_secs(3))
///     .id("member-a");
/// let set = builder.build().await?;
/// assert_eq!(set.id(), "member-a");
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug)]
pub struct PartitionSetBuilder {
    group: String,
    partitions: Vec<String>,
    store: Option<StoreSpec>,
    pub(crate) settings: Settings,
    per_partition_metrics: bool,
}

impl PartitionSetBuilder {
    /// Label metrics by partition (one series per partition and metric)
    /// instead of by group (the default, whose number of series does not
    /// grow with the partitions; see the metrics table in the crate docs).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .memory(&store)
    ///     .per_partition_metrics(true)
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn per_partition_metrics(mut self, on: bool) -> Self {
        self.per_partition_metrics = on;
        self
    }

    /// Use Redis at `url` (see [`crate::ElectionBuilder::redis`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .redis("redis+cluster://10.0.0.1:6379,10.0.0.2:6379")
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.store = Some(StoreSpec::Url(url.into()));
        self
    }

    /// Use an in-memory store (tests; see [`MemoryStore`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .memory(&store)
    ///     .id("member-a")
    ///     .build()
    ///     .await?;
    /// assert_eq!(set.id(), "member-a");
    /// # Ok(()) }
    /// ```
    pub fn memory(mut self, store: &MemoryStore) -> Self {
        self.store = Some(StoreSpec::Store(crate::Store::memory(store)));
        self
    }

    /// Use a store shared with elections and other partition sets of this
    /// process (see [`crate::Store`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::memory(&tenure::MemoryStore::new());
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0"]).store(&store).build().await?;
    /// let reports = tenure::Election::builder("reports").store(&store).build().await?;
    /// let _term = reports.campaign().await?; // one store, one connection, for both
    /// assert_eq!(store.leader_of("tenure", "reports").await?.map(|l| l.id), Some(reports.id().into()));
    /// # drop(set); Ok(()) }
    /// ```
    pub fn store(mut self, store: &crate::Store) -> Self {
        self.store = Some(StoreSpec::Store(store.clone()));
        self
    }

    /// Lease ttl of every partition, and the heartbeat ttl of members.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let builder = || tenure::PartitionSet::builder("orders", ["p0"]).memory(&tenure::MemoryStore::new());
    /// let set = builder().ttl(Duration::from_secs(5)).build().await?;
    /// // A ttl that is not a whole number of milliseconds is refused.
    /// let refused = builder().ttl(Duration::from_micros(5_000_500)).build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # drop(set); Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// The largest ttl any member of the group uses (default: this
    /// member's ttl). After the store lost or rolled back data, no partition
    /// lease is granted until this long after it came back, so that a member
    /// with a longer ttl, which may still believe it leads a partition, has
    /// passed its deadline first. Give every member the same value when
    /// their ttls differ (during a rolling change of the ttl, say).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let set = tenure::PartitionSet::builder("consumers", ["p0", "p1"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_secs(5))
    ///     .max_ttl(Duration::from_secs(30)) // the old ttl, while members are upgraded
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.settings.max_ttl = Some(max_ttl);
        self
    }

    /// How often the set runs a cycle (heartbeat, renewals, hand-overs).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let builder = || tenure::PartitionSet::builder("orders", ["p0"]).memory(&tenure::MemoryStore::new());
    /// let set = builder().renew_every(Duration::from_secs(2)).build().await?;
    /// // The default ttl is 15 s: a cycle every 15 s would let leases lapse.
    /// let refused = builder().renew_every(Duration::from_secs(15)).build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # drop(set); Ok(()) }
    /// ```
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.settings.renew_every = Some(every);
        self
    }

    /// Safety margin of the local deadlines.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let builder = || tenure::PartitionSet::builder("orders", ["p0"]).memory(&tenure::MemoryStore::new());
    /// let set = builder().margin(Duration::from_millis(500)).build().await?;
    /// // Margin plus renew interval (5 s) must leave room in the ttl (15 s).
    /// let refused = builder().margin(Duration::from_secs(10)).build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # drop(set); Ok(()) }
    /// ```
    pub fn margin(mut self, margin: Duration) -> Self {
        self.settings.margin = Some(margin);
        self
    }

    /// Upper bound of one Redis round trip.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let builder = || tenure::PartitionSet::builder("orders", ["p0"]).memory(&tenure::MemoryStore::new());
    /// let set = builder().call_timeout(Duration::from_millis(500)).build().await?;
    /// let refused = builder().call_timeout(Duration::ZERO).build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # drop(set); Ok(()) }
    /// ```
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.settings.call_timeout = Some(timeout);
        self
    }

    /// This member's id (default: hostname plus 128 random bits).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .id("consumer-7")
    ///     .build()
    ///     .await?;
    /// assert_eq!(set.id(), "consumer-7");
    /// # Ok(()) }
    /// ```
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.settings.id = Some(id.into());
        self
    }

    /// Key prefix (default `tenure`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let builder = || tenure::PartitionSet::builder("orders", ["p0"]).memory(&tenure::MemoryStore::new());
    /// let set = builder().prefix("staging").build().await?;
    /// let refused = builder().prefix("").build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # drop(set); Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// CA certificate for `rediss://` and `etcds://`.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .redis("rediss://redis.internal:6380")
    ///     .tls_ca_file("/etc/tenure/redis-ca.pem")
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.settings.tls_ca = Some(path.into());
        self
    }

    /// Client certificate and key (PEM files) for an `etcds://` cluster
    /// that requires one (see [`crate::ElectionBuilder::tls_client_cert_file`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .redis("etcds://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
    ///     .tls_ca_file("/etc/tenure/etcd-ca.pem")
    ///     .tls_client_cert_file("/etc/tenure/client.pem", "/etc/tenure/client-key.pem")
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn tls_client_cert_file(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.settings.tls_client = Some((cert.into(), key.into()));
        self
    }

    /// Validate and connect.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let set = tenure::PartitionSet::builder("orders", ["p0", "p1"]).memory(&store).build().await?;
    /// assert!(set.observer().owned().is_empty(), "nothing is owned before `run`");
    /// let empty: [&str; 0] = [];
    /// let refused = tenure::PartitionSet::builder("orders", empty).memory(&store).build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # Ok(()) }
    /// ```
    pub async fn build(mut self) -> Result<PartitionSet> {
        validate_name("group name", &self.group)?;
        if self.partitions.is_empty() {
            return Err(Error::Config(
                "a partition set needs at least one partition".into(),
            ));
        }
        let mut seen = BTreeSet::new();
        for partition in &self.partitions {
            validate_name("partition name", partition)?;
            if !seen.insert(partition.as_str()) {
                return Err(Error::Config(format!(
                    "partition {partition:?} is listed twice"
                )));
            }
        }
        let (timing, id) = self.settings.validate(&self.group)?;
        let Some(spec) = self.store else {
            return Err(Error::Config(
                "no store given: call .redis(url) or .memory(&store)".into(),
            ));
        };
        let store = spec
            .connect(&mut self.settings, timing.call_timeout)
            .await?;
        let needs = StoreSpec::needs(&self.settings, true, timing.ttl);
        let group = Address::new(&self.settings.prefix, &self.group);
        store.check_partition_set(group, needs).await?;
        metrics::describe();
        let hold_off_ms = self.settings.max_ttl.unwrap_or(timing.ttl).as_millis() as u64;
        let keys_len = self.partitions.len();
        let mut slots: Vec<u32> = (0..keys_len as u32).collect();
        slots.sort_unstable_by(|a, b| {
            self.partitions[*a as usize].cmp(&self.partitions[*b as usize])
        });
        let partitions: Arc<[String]> = self.partitions.into();
        Ok(PartitionSet {
            slots,
            per_partition_metrics: self.per_partition_metrics,
            prefix: self.settings.prefix.clone(),
            group: self.group,
            partitions: partitions.clone(),
            id,
            timing,
            store,
            attempts: Mutex::new(vec![0; keys_len]),
            nonce: rand::random(),
            hold_off_ms,
            resign_by_name: self.settings.bugs.resign_by_name,
            observed: Arc::new(Observed {
                partitions,
                ..Observed::default()
            }),
        })
    }
}

/// What an observer of a running set can see.
#[derive(Default, Debug)]
struct Observed {
    partitions: Arc<[String]>,
    /// Indexes of the partitions held, as of the last change.
    owned: Mutex<Vec<usize>>,
    /// The keeper's generation `owned` was taken at.
    generation: AtomicU64,
    members: Mutex<Vec<String>>,
    round_trips: AtomicU64,
    cycles: AtomicU64,
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
    observed: Arc<Observed>,
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
    /// that holds some of the batch's keys).
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

/// N partitions shared fairly among the live members of a group.
///
/// Each partition is an election of its own (token, local deadline, a
/// [`Leadership`] for its work). Members keep heartbeats in a Redis sorted
/// set (`PREFIX:{GROUP}:members`); every member computes the same target from
/// the live members: rendezvous hashing under a cap of `ceil(N / members)`,
/// so joins and deaths move few partitions. A partition leaving a member's
/// target has its work told to stop (`lost()` fires with
/// [`LostReason::Resigned`]); the lease is released only once that work has
/// returned. One cycle per renew interval sends the heartbeat and every
/// renewal in a single pipeline: one round trip in the steady state,
/// however many partitions are held.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// let partitions: Vec<String> = (0..64).map(|p| format!("orders-{p}")).collect();
/// let set = tenure::PartitionSet::builder("orders", partitions)
///     .redis("redis://127.0.0.1:6379")
///     .build()
///     .await?;
/// set.run(
///     |partition, term| async move {
///         // consume `partition` until term.lost(), fencing writes with term.token()
///         let reason = term.lost().await;
///         println!("stopped consuming {partition}: {reason}");
///     },
///     tenure::shutdown_signal(),
/// )
/// .await
/// # }
/// ```
pub struct PartitionSet {
    group: String,
    partitions: Arc<[String]>,
    /// Partition indexes sorted by name, to address commands from handles.
    slots: Vec<u32>,
    /// The key prefix of the group and of every partition.
    prefix: String,
    id: String,
    timing: Timing,
    store: Store,
    /// Per partition, the number of the current campaign attempt; it moves
    /// on when a term begins, so only a retry of the same attempt adopts a
    /// lease (see `AcquireRequest::attempt`).
    attempts: Mutex<Vec<u64>>,
    nonce: u64,
    hold_off_ms: u64,
    /// See `PartitionSetBuilder::unsafe_resign_by_name` (the `testing` feature; off normally).
    resign_by_name: bool,
    per_partition_metrics: bool,
    observed: Arc<Observed>,
}

impl std::fmt::Debug for PartitionSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionSet")
            .field("group", &self.group)
            .field("id", &self.id)
            .field("partitions", &self.partitions.len())
            .finish_non_exhaustive()
    }
}

/// What the set keeps beside each term it holds.
#[derive(Default)]
struct Work {
    /// The work task for this term.
    task: Option<JoinHandle<()>>,
    /// When its work was told to stop; the lease is resigned once the work
    /// has returned, or after one ttl if the work ignores `lost()` (it may
    /// no longer act: its `is_leader()` is false).
    releasing: Option<Instant>,
}

impl Work {
    fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

/// The state of a running set, owned by its run loop.
struct Running {
    keeper: Keeper<Work>,
    /// Per partition, when it may be tried for again.
    retry_at: Vec<Instant>,
    /// The live members last seen, and this member's target among them
    /// (computed again only when the members change).
    members: Vec<String>,
    mine: BTreeSet<usize>,
    /// Whether a look for partitions to acquire may find any: set by every
    /// cycle and every round of acquisitions, cleared by a look that found
    /// none (a set of 100,000 held partitions is not scanned every time a
    /// handle sends a command).
    look_for_work: bool,
}

/// The outcome of one round trip of acquisitions.
struct Acquired {
    chunk: Vec<usize>,
    sent: Reading,
    results: Option<Vec<Result<Reply>>>,
}

impl PartitionSet {
    /// Start configuring the partition set `group` over `partitions`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let partitions = (0..16).map(|i| format!("orders-{i}"));
    /// let set = tenure::PartitionSet::builder("orders", partitions)
    ///     .memory(&tenure::MemoryStore::new())
    ///     .build()
    ///     .await?;
    /// assert!(!set.id().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn builder<I, S>(group: impl Into<String>, partitions: I) -> PartitionSetBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        PartitionSetBuilder {
            group: group.into(),
            partitions: partitions.into_iter().map(Into::into).collect(),
            store: None,
            settings: Settings::default(),
            per_partition_metrics: false,
        }
    }

    /// This member's id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::PartitionSet::builder("orders", ["p0"]).memory(&store).build().await?;
    /// let b = tenure::PartitionSet::builder("orders", ["p0"]).memory(&store).build().await?;
    /// assert_ne!(a.id(), b.id(), "each member gets its own id");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A view of what this set owns while it runs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let set = tenure::PartitionSet::builder("orders", ["p0", "p1"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .build()
    ///     .await?;
    /// let observer = set.observer(); // stays usable while `set.run` consumes the set
    /// assert_eq!(observer.owned_count(), 0);
    /// # Ok(()) }
    /// ```
    pub fn observer(&self) -> PartitionObserver {
        PartitionObserver {
            observed: self.observed.clone(),
        }
    }

    /// Join the group and run `work(partition, term)` for every partition
    /// this member comes to own, until `shutdown` completes; then stop all
    /// work, release every lease and leave the group.
    ///
    /// `work` should run until `term.lost()` fires; it is spawned as a task
    /// per partition and term.
    ///
    /// Renewals run once per renew interval, whatever else is going on:
    /// acquisitions are in flight beside them (one round trip of up to
    /// 1,000 at a time), never in their way.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping it leaves the work tasks to stop at their
    /// deadlines and the leases to lapse after one ttl. Complete `shutdown`
    /// to stop the work, release everything and leave the group.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_millis(300))
    ///     .build()
    ///     .await?;
    /// let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    /// let work = move |partition: String, term: tenure::Leadership| {
    ///     let _ = started.send(partition);
    ///     async move { term.lost().await; }
    /// };
    /// let both_started = async move {
    ///     let mut seen = vec![starts.recv().await.unwrap(), starts.recv().await.unwrap()];
    ///     seen.sort();
    ///     assert_eq!(seen, ["orders-0", "orders-1"]);
    /// };
    /// set.run(work, both_started).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<F, Fut>(self, mut work: F, shutdown: impl Future<Output = ()>) -> Result<()>
    where
        F: FnMut(String, Leadership) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (commands_tx, mut commands) = mpsc::channel(64);
        let report = if self.per_partition_metrics {
            Report::PerTerm
        } else {
            Report::Group(self.group.clone())
        };
        let mut running = Running {
            keeper: Keeper::new(&self.id, &commands_tx, report, false),
            retry_at: vec![Instant::now(); self.partitions.len()],
            members: Vec::new(),
            mine: BTreeSet::new(),
            look_for_work: true,
        };
        let mut ticker = interval(self.timing.renew_every);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut retry: Option<Instant> = None;
        let mut acquisition: Option<BoxFuture<'_, Acquired>> = None;
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(command) = commands.recv() => self.serve(command, &mut running.keeper).await,
                _ = ticker.tick() => {
                    retry = self.cycle(&mut running).await?;
                }
                // A failed renewal batch is tried again soon, like a single
                // election's renewal, not only at the next tick.
                _ = sleep_until(retry.unwrap_or_else(Instant::now)), if retry.is_some() => {
                    retry = self.cycle(&mut running).await?;
                }
                acquired = async { acquisition.as_mut().expect("guarded by is_some").await }, if acquisition.is_some() => {
                    acquisition = None;
                    self.acquired(acquired, &mut running, &mut work)?;
                }
            }
            if acquisition.is_none() {
                acquisition = self.next_acquisition(&mut running);
            }
            self.publish(&running.keeper);
        }
        drop(acquisition);
        self.stop(running.keeper).await;
        Ok(())
    }

    /// One round trip; a failure of the round trip as a whole (a timeout,
    /// a dropped connection) yields `None`, and a timeout also replaces the
    /// connection.
    async fn send(&self, ops: &[Op<'_>], limit: Duration) -> Option<Vec<Result<Reply>>> {
        let counted = self.store.batch_counted(ops, &self.observed.round_trips);
        match timeout(limit, counted).await {
            Ok(Ok(replies)) => Some(replies),
            Ok(Err(err)) => {
                tracing::warn!(group = %self.group, error = %err, "partition set round trip failed");
                None
            }
            Err(_) => {
                tracing::warn!(group = %self.group, ?limit, "partition set round trip timed out");
                self.store.reset();
                None
            }
        }
    }

    /// This member's heartbeat (`join`), or its farewell.
    fn heartbeat(&self, join: bool) -> Op<'_> {
        Op::Heartbeat {
            group: Address::new(&self.prefix, &self.group),
            member: &self.id,
            ttl_ms: self.timing.ttl_ms(),
            join,
        }
    }

    /// Where partition `index` lives in the store.
    fn at(&self, index: usize) -> Address<'_> {
        Address::new(&self.prefix, &self.partitions[index])
    }

    /// The name of the current campaign attempt for partition `index`.
    fn attempt(&self, index: usize) -> String {
        let number = self.attempts.lock().unwrap_or_else(|p| p.into_inner())[index];
        format!("{:016x}.{index}.{number}", self.nonce)
    }

    /// One cycle: heartbeat and renewals (one round trip), then the target
    /// from the members, and releases of what left it. Returns when to try
    /// again if the renewals failed. Acquisitions are not made here (see
    /// [`PartitionSet::next_acquisition`]).
    async fn cycle(&self, running: &mut Running) -> Result<Option<Instant>> {
        self.observed.cycles.fetch_add(1, Ordering::Relaxed);
        running.look_for_work = true;
        let timing = &self.timing;
        let sent_at = Reading::take();
        let keeper = &mut running.keeper;
        let held: Vec<(usize, u64)> = keeper
            .iter()
            .map(|(index, kept)| (index, kept.state.token))
            .collect();
        let terms: Vec<(&str, u64)> = held
            .iter()
            .map(|(index, token)| (self.partitions[*index].as_str(), *token))
            .collect();
        // The heartbeat first, then the renewals, a thousand to an
        // operation. The whole call timeout, whatever the deadlines: a
        // partition whose deadline passes meanwhile ends at its deadline by
        // itself (its handle checks the clock), and the others keep their
        // renewal. Sets beyond RENEW_CHUNK partitions renew in several
        // round trips, so that no batch outgrows the call timeout; a failed
        // one fails only its own.
        let mut members = None;
        let mut failed = false;
        let round_trips: Vec<&[(&str, u64)]> = if terms.is_empty() {
            vec![&[]]
        } else {
            terms.chunks(RENEW_CHUNK).collect()
        };
        // Position in `held` of the first term of the current operation.
        let mut offset = 0;
        for (round, round_terms) in round_trips.into_iter().enumerate() {
            let mut ops = Vec::with_capacity(round_terms.len() / RENEW_MANY + 2);
            if round == 0 {
                ops.push(self.heartbeat(true));
            }
            ops.extend(round_terms.chunks(RENEW_MANY).map(|chunk| Op::RenewMany {
                prefix: &self.prefix,
                id: &self.id,
                ttl_ms: timing.ttl_ms(),
                terms: chunk,
            }));
            let chunk_sent = Instant::now();
            let results = self.send(&ops, timing.call_timeout).await;
            keeper.batch_renewed(chunk_sent.elapsed(), results.is_none());
            let mut results = results.into_iter().flatten();
            let slept = crate::clock::suspended();
            if round == 0 {
                members = match results.next() {
                    Some(Ok(reply)) => {
                        let (members, phantoms) = reply.into_members()?;
                        if phantoms > 0 {
                            metrics::phantom_members(&self.group, phantoms);
                            tracing::warn!(group = %self.group, prefix = %self.prefix, phantoms, "ignoring member entries whose heartbeat expires more than 2 ttl from now; no member writes those (forged or corrupted data)");
                        }
                        Some(members)
                    }
                    Some(Err(err)) if !err.is_transient() => return Err(err),
                    Some(Err(_)) | None => None,
                };
            }
            for chunk in round_terms.chunks(RENEW_MANY) {
                let slots = &held[offset..offset + chunk.len()];
                offset += chunk.len();
                let each = match results.next().map(|r| r.and_then(Reply::into_renew_many)) {
                    Some(Ok(each)) if each.len() == slots.len() => each,
                    Some(Err(err)) if !err.is_transient() => return Err(err),
                    // No answer: the outcome is unknown, the deadlines stay.
                    _ => {
                        failed = true;
                        for (index, _) in slots {
                            keeper.renewed_as_of(*index, timing, sent_at, None, slept);
                        }
                        continue;
                    }
                };
                for ((index, _), reply) in slots.iter().zip(each) {
                    let reply = match reply {
                        Ok(reply) => Some(reply),
                        // Foreign data in one lease: that term cannot be
                        // renewed (it ends at its deadline); the rest go on.
                        Err(err @ Error::ForeignData { .. }) => {
                            tracing::error!(group = %self.group, partition = %self.partitions[*index], error = %err, "cannot renew the partition's lease");
                            None
                        }
                        // A person must act (a cluster node with other ACLs).
                        Err(err) if !err.is_transient() => return Err(err),
                        // No answer from the node of this lease (one shard of
                        // a cluster): unknown, the deadline stays; try again
                        // soon, as for a failed round trip.
                        Err(_) => {
                            failed = true;
                            None
                        }
                    };
                    // Ends the term if the renewal says so.
                    keeper.renewed_as_of(*index, timing, sent_at, reply, slept);
                }
            }
        }
        drop(terms);
        let now = Instant::now();
        let retry = (failed && !held.is_empty()).then(|| now + timing.retry_every);

        let Some(members) = members else {
            return Ok(retry);
        };
        if members != running.members {
            *self
                .observed
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = members.clone();
            let target = assign(&self.partitions, &members);
            running.mine = target.get(self.id.as_str()).cloned().unwrap_or_default();
            running.members = members;
        }

        // Tell work outside the target to stop; resign what has stopped.
        let mut resign = Vec::new();
        for (index, kept) in keeper.iter_mut() {
            if !running.mine.contains(&index) && kept.extra.releasing.is_none() {
                kept.extra.releasing = Some(now);
                kept.shared.mark_lost(LostReason::Resigned);
            }
            if let Some(since) = kept.extra.releasing {
                if kept.extra.is_finished() || now >= since + timing.ttl {
                    resign.push(index);
                }
            }
        }
        if !resign.is_empty() {
            self.resign_all(keeper, &resign).await;
        }
        Ok(retry)
    }

    /// The next round trip of acquisitions: target partitions not held and
    /// not waiting for a retry, up to [`ACQUIRE_CHUNK`]. (The run loop asks
    /// only when no round trip is in flight.)
    fn next_acquisition(&self, running: &mut Running) -> Option<BoxFuture<'_, Acquired>> {
        if !running.look_for_work {
            return None;
        }
        let now = Instant::now();
        let chunk: Vec<usize> = running
            .mine
            .iter()
            .copied()
            .filter(|i| !running.keeper.contains(*i) && running.retry_at[*i] <= now)
            .take(ACQUIRE_CHUNK)
            .collect();
        if chunk.is_empty() {
            running.look_for_work = false;
            return None;
        }
        let attempts: Vec<String> = chunk.iter().map(|i| self.attempt(*i)).collect();
        Some(Box::pin(async move {
            let ttl_ms = self.timing.ttl_ms();
            let ops: Vec<Op<'_>> = chunk
                .iter()
                .zip(&attempts)
                .map(|(index, attempt)| Op::Acquire {
                    at: self.at(*index),
                    request: AcquireRequest {
                        id: &self.id,
                        attempt,
                        ttl_ms,
                        hold_off_ms: self.hold_off_ms,
                    },
                })
                .collect();
            let sent = Reading::take();
            let results = self.send(&ops, self.timing.call_timeout).await;
            drop(ops);
            Acquired {
                chunk,
                sent,
                results,
            }
        }))
    }

    /// Begin the terms a round trip of acquisitions won.
    fn acquired<F, Fut>(
        &self,
        acquired: Acquired,
        running: &mut Running,
        work: &mut F,
    ) -> Result<()>
    where
        F: FnMut(String, Leadership) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let timing = &self.timing;
        let now_at = Reading::take();
        let now = now_at.now;
        running.look_for_work = true;
        let Some(results) = acquired.results else {
            // Unknown outcome: the next attempt of each adopts what won.
            for index in &acquired.chunk {
                running.retry_at[*index] = now + timing.retry_every;
            }
            return Ok(());
        };
        for (index, result) in acquired.chunk.iter().copied().zip(results) {
            let reply = match result.and_then(Reply::into_acquire) {
                Ok(reply) => reply,
                // One stray key costs its own partition only: it is left
                // alone and tried again a ttl later.
                Err(err @ Error::ForeignData { .. }) => {
                    tracing::error!(group = %self.group, partition = %self.partitions[index], error = %err, "cannot take the partition; trying again in one ttl");
                    running.retry_at[index] = now + timing.ttl;
                    continue;
                }
                Err(err) if !err.is_transient() => return Err(err),
                // Not again at once: the next look comes after a pause.
                Err(_) => {
                    running.retry_at[index] = now + timing.retry_every;
                    continue;
                }
            };
            match after_acquire(
                timing,
                acquired.sent,
                now_at,
                Some(reply.clone()),
                Duration::ZERO,
                0,
            ) {
                CandidateStep::Elected(state) => {
                    self.attempts.lock().unwrap_or_else(|p| p.into_inner())[index] += 1;
                    let name = &self.partitions[index];
                    let keeper = &mut running.keeper;
                    // The target may have moved while the acquisition was in
                    // flight: a partition no longer ours gets no work and
                    // is released by the next cycle.
                    let wanted = running.mine.contains(&index);
                    let term = keeper.begin(index, name, state, Work::default());
                    if wanted {
                        let task = tokio::spawn(work(name.clone(), term));
                        if let Some(kept) = keeper.get_mut(index) {
                            kept.extra.task = Some(task);
                        }
                    } else {
                        term.shared().mark_lost(LostReason::Resigned);
                        if let Some(kept) = keeper.get_mut(index) {
                            kept.extra.releasing = Some(now);
                        }
                    }
                }
                CandidateStep::Follow { holder, .. } => {
                    // The holder releases it soon if it is a live member
                    // outside its target; else its lease has to expire.
                    running.retry_at[index] = now + holder.ttl_left.min(timing.renew_every);
                }
                CandidateStep::HoldOff { until, .. } => running.retry_at[index] = until,
                CandidateStep::Retry { at } => running.retry_at[index] = at,
            }
            if let AcquireReply::Won { .. } = reply {
                running.retry_at[index] = now;
            }
        }
        Ok(())
    }

    /// End these terms and release their leases in one round trip.
    async fn resign_all(&self, keeper: &mut Keeper<Work>, indexes: &[usize]) {
        let ended: Vec<(usize, u64)> = indexes
            .iter()
            .filter_map(|index| {
                let kept = keeper.end(*index, LostReason::Resigned)?;
                Some((*index, kept.state.token))
            })
            .collect();
        let ops: Vec<Op<'_>> = ended
            .iter()
            .map(|(index, token)| Op::Resign {
                at: self.at(*index),
                id: &self.id,
                token: *token,
            })
            .collect();
        for chunk in ops.chunks(ACQUIRE_CHUNK) {
            self.send(chunk, self.timing.call_timeout).await;
        }
    }

    /// Requests from a partition's [`Leadership`], addressed by (partition,
    /// token): a handle of an earlier term of the partition never reaches a
    /// later one.
    async fn serve(&self, command: Command, keeper: &mut Keeper<Work>) {
        let (election, token) = command.term();
        let slot = self
            .slots
            .binary_search_by(|i| self.partitions[*i as usize].as_str().cmp(election))
            .ok()
            .map(|found| self.slots[found] as usize);
        let found = match command {
            Command::Resign { .. } if self.resign_by_name => slot.filter(|s| keeper.contains(*s)),
            _ => keeper.slot_of(slot, token),
        };
        let Some(index) = found else {
            // A term that is over (this member's later term of the same
            // partition, if any, is not this handle's).
            match command {
                Command::Confirm { reply, .. } => {
                    let _ = reply.send(Err(Error::NotLeader(LostReason::Resigned)));
                }
                Command::Resign { reply, .. } => {
                    let _ = reply.send(Ok(()));
                }
                Command::RecordRun { reply, .. } => {
                    let _ = reply.send(Ok(false));
                }
            }
            return;
        };
        let reply = match command {
            Command::RecordRun { keep, reply, .. } => {
                // Beside the keeper, so that renewals never wait for it;
                // the store checks the term anyway.
                let store = self.store.clone();
                let (prefix, name) = (self.prefix.clone(), self.partitions[index].clone());
                let id = self.id.clone();
                let limit = self.timing.call_timeout;
                tokio::spawn(async move {
                    let at = Address::new(&prefix, &name);
                    let record = crate::backend::record_run(&store, at, &id, token, keep);
                    let recorded = match timeout(limit, record).await {
                        Ok(recorded) => recorded,
                        Err(_) => Err(Error::Timeout(limit)),
                    };
                    let _ = reply.send(recorded);
                });
                return;
            }
            Command::Resign { reason, reply, .. } => {
                if let Some(kept) = keeper.get(index) {
                    kept.shared.mark_lost(reason);
                }
                self.resign_all(keeper, &[index]).await;
                let _ = reply.send(Ok(()));
                return;
            }
            Command::Confirm { reply, .. } => reply,
        };
        let sent = Reading::take();
        let term = [(self.partitions[index].as_str(), token)];
        let op = Op::RenewMany {
            prefix: &self.prefix,
            id: &self.id,
            ttl_ms: self.timing.ttl_ms(),
            terms: &term,
        };
        let renewed: Option<RenewReply> = self
            .send(&[op], self.timing.call_timeout)
            .await
            .and_then(|mut replies| replies.pop())
            .and_then(|reply| reply.and_then(Reply::into_renew_many).ok())
            .and_then(|mut each| each.pop())
            .and_then(Result::ok);
        let outcome = match keeper.renewed(index, &self.timing, sent, renewed) {
            Some(LeaderStep::Lost(reason)) => Err(Error::NotLeader(reason)),
            _ => match keeper.get(index) {
                Some(kept) if kept.shared.lost_reason().is_none() => Ok(kept
                    .shared
                    .deadline()
                    .saturating_duration_since(Instant::now())),
                Some(kept) => Err(Error::NotLeader(
                    kept.shared.lost_reason().unwrap_or(LostReason::Resigned),
                )),
                None => Err(Error::NotLeader(LostReason::Resigned)),
            },
        };
        let _ = reply.send(outcome);
    }

    /// Stop all work, then release everything and leave the group.
    async fn stop(&self, mut keeper: Keeper<Work>) {
        for (_, kept) in keeper.iter() {
            kept.shared.mark_lost(LostReason::Shutdown);
        }
        // The leases stay ours while the work winds down, at most until the
        // earliest deadline.
        let earliest = keeper.iter().map(|(_, kept)| kept.shared.deadline()).min();
        if let Some(deadline) = earliest {
            let all_done = async {
                for (_, kept) in keeper.iter_mut() {
                    if let Some(task) = kept.extra.task.as_mut() {
                        let _ = task.await;
                    }
                }
            };
            let _ = tokio::time::timeout_at(deadline, all_done).await;
        }
        let indexes = keeper.slots();
        self.resign_all(&mut keeper, &indexes).await;
        self.send(&[self.heartbeat(false)], self.timing.call_timeout)
            .await;
        self.publish(&keeper);
    }

    /// Show observers what is held, if that changed.
    fn publish(&self, keeper: &Keeper<Work>) {
        let mut owned = self
            .observed
            .owned
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if self.observed.generation.load(Ordering::Relaxed) != keeper.generation() {
            *owned = keeper.slots();
            self.observed
                .generation
                .store(keeper.generation(), Ordering::Relaxed);
        }
    }
}

/// The target owner of every partition: rendezvous hashing with a cap of
/// `ceil(partitions / members)` per member. Every member computes the same
/// answer from the same sorted member list. Returns member -> partition indexes.
pub(crate) fn assign<'m>(
    partitions: &[String],
    members: &'m [String],
) -> BTreeMap<&'m str, BTreeSet<usize>> {
    let mut target: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    if members.is_empty() {
        return target;
    }
    let cap = partitions.len().div_ceil(members.len());
    for (index, partition) in partitions.iter().enumerate() {
        let mut ranked: Vec<(u64, &str)> = members
            .iter()
            .map(|m| (rendezvous(m, partition), m.as_str()))
            .collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        if let Some((_, member)) = ranked
            .into_iter()
            .find(|(_, m)| target.get(m).map_or(0, BTreeSet::len) < cap)
        {
            target.entry(member).or_default().insert(index);
        }
    }
    target
}

/// FNV-1a over `member \0 partition`: a stable hash that every build and
/// platform computes alike (std's hashers make no such promise).
fn rendezvous(member: &str, partition: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.bytes().chain([0]).chain(partition.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV's low bits mix poorly for short keys; finish with a xorshift.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn every_partition_gets_one_owner_within_the_fair_share() {
        let partitions = names("p", 32);
        for m in 1..=7 {
            let members = names("m", m);
            let target = assign(&partitions, &members);
            let cap = 32usize.div_ceil(m);
            let total: usize = target.values().map(BTreeSet::len).sum();
            assert_eq!(total, 32);
            assert!(
                target.values().all(|owned| owned.len() <= cap),
                "{m} members: {target:?}"
            );
            let mut all: Vec<usize> = target.values().flatten().copied().collect();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), 32, "no partition twice");
        }
    }

    #[test]
    fn a_joining_member_moves_few_partitions() {
        let partitions = names("orders-", 64);
        let (four, five) = (names("m", 4), names("m", 5));
        let before = assign(&partitions, &four);
        let after = assign(&partitions, &five);
        let owner = |t: &BTreeMap<&str, BTreeSet<usize>>, p: usize| {
            t.iter()
                .find(|(_, s)| s.contains(&p))
                .map(|(m, _)| m.to_string())
        };
        let moved = (0..64)
            .filter(|p| owner(&before, *p) != owner(&after, *p))
            .count();
        // The newcomer's fair share is 13; a stable assignment moves about that many.
        assert!(moved <= 24, "moved {moved} of 64");
        assert!(moved >= 10);
    }

    #[test]
    fn no_members_means_no_target() {
        assert!(assign(&names("p", 3), &[]).is_empty());
    }
}
