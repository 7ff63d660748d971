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
//!   one pipeline (on Redis written in slices of 10,000 renewals, about
//!   3,750 per primary on a cluster, one round trip each, so that 100,000
//!   of them are never all in memory at once).
//!   Acquisitions and releases, when there are any, go in one more
//!   pipeline each.
//!
//! Partition sets use the same store seam as elections: Redis, or a
//! [`MemoryStore`] for deterministic tests under tokio's paused clock.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{interval, sleep_until, timeout, Instant, MissedTickBehavior};

use crate::backend::{Address, Op, Reply, Store};
use crate::election::Settings;
use crate::keeper::{Keeper, Report};
use crate::machine::Timing;
use crate::{Leadership, LostReason, Result};

#[cfg(doc)]
use crate::MemoryStore;

mod acquire;
mod builder;
mod cycle;
mod observer;
mod serve;
mod target;

use acquire::Acquired;
pub use builder::PartitionSetBuilder;
use observer::Observed;
pub use observer::PartitionObserver;

/// The most acquisitions sent in one round trip.
const ACQUIRE_CHUNK: usize = 1_000;

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
/// renewal in a single pipeline: one round trip in the steady state for up
/// to 10,000 partitions held, and one per 10,000 beyond (on Redis a long
/// pipeline goes in slices, to bound the client's memory).
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
    by_name: Vec<u32>,
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
                    self.acquired_by_now(&mut acquisition, &mut running, &mut work)?;
                    retry = self.cycle(&mut running).await?;
                }
                // A failed renewal batch is tried again soon, like a single
                // election's renewal, not only at the next tick.
                _ = sleep_until(retry.unwrap_or_else(Instant::now)), if retry.is_some() => {
                    self.acquired_by_now(&mut acquisition, &mut running, &mut work)?;
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

    /// Begin the terms of an acquisition that has been answered by now,
    /// before a renewal cycle starts, so that the cycle renews them too.
    /// An answer that came during the last cycle waited unread; left to
    /// the loop, it might be read after the next cycle began, and the
    /// first renewal of its terms would come two cycles after their
    /// acquisition was sent: past their deadline on a busy store.
    fn acquired_by_now<F, Fut>(
        &self,
        acquisition: &mut Option<BoxFuture<'_, Acquired>>,
        running: &mut Running,
        work: &mut F,
    ) -> Result<()>
    where
        F: FnMut(String, Leadership) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let answered = acquisition.as_mut().and_then(|f| f.as_mut().now_or_never());
        if let Some(acquired) = answered {
            *acquisition = None;
            self.acquired(acquired, running, work)?;
        }
        Ok(())
    }

    /// One batch; a failure of the batch as a whole (a timeout, a dropped
    /// connection before any answer) yields `None`, and a timeout also
    /// replaces the connection. Calls left unanswered when a connection
    /// broke off after answering some (a node of a cluster, the later
    /// slices of a long Redis pipeline) fail one by one, as transient
    /// errors.
    async fn send(&self, ops: &[Op<'_>], limit: Duration) -> Option<Vec<Result<Reply>>> {
        // The store's own wait ends a little before this one, so that a
        // round trip to several nodes (a cluster) whose one node does not
        // answer still yields the answers of the others.
        let inner = limit - limit / 10;
        let counted = self
            .store
            .batch_counted(ops, &self.observed.round_trips, Some(inner));
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
        let indexes = keeper.indexes();
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
            *owned = keeper.indexes();
            self.observed
                .generation
                .store(keeper.generation(), Ordering::Relaxed);
        }
    }
}
