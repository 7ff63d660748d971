//! The builder of a [`PartitionSet`]: its settings, checked and connected
//! by [`PartitionSetBuilder::build`]. Apart from the set's run loop, because
//! it is all configuration (one setter per knob, each with its example).

use std::collections::BTreeSet;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Observed, PartitionSet};
use crate::backend::{validate_name, Address};
use crate::election::{Settings, StoreSpec};
use crate::{metrics, Error, MemoryStore, Result};

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
    pub(super) group: String,
    pub(super) partitions: Vec<String>,
    pub(super) store: Option<StoreSpec>,
    pub(crate) settings: Settings,
    pub(super) per_partition_metrics: bool,
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

    /// Use the store at `url` (any URL [`crate::Store::open`] takes; see
    /// [`crate::ElectionBuilder::redis`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .redis("redis+cluster://10.0.0.1:6379,10.0.0.2:6379")
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.open(crate::Store::open(url))
    }

    /// Use the store at a URL, or the store these settings describe (TLS
    /// files, a call timeout), connected when the set is built (see
    /// [`crate::ElectionBuilder::open`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::open("rediss://redis.internal:6380")
    ///     .tls_ca_file("/etc/tenure/redis-ca.pem");
    /// let set = tenure::PartitionSet::builder("orders", ["orders-0", "orders-1"])
    ///     .open(store)
    ///     .build()
    ///     .await?;
    /// # drop(set); Ok(()) }
    /// ```
    pub fn open(mut self, store: impl Into<crate::StoreBuilder>) -> Self {
        self.store = Some(StoreSpec::Open(store.into()));
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
        let store = spec.connect(&self.settings, timing.call_timeout).await?;
        let needs = StoreSpec::needs(&self.settings, true, timing.ttl);
        let group = Address::new(&self.settings.prefix, &self.group);
        store.check_partition_set(group, needs).await?;
        metrics::describe();
        let hold_off_ms = self.settings.max_ttl.unwrap_or(timing.ttl).as_millis() as u64;
        let keys_len = self.partitions.len();
        let mut by_name: Vec<u32> = (0..keys_len as u32).collect();
        by_name.sort_unstable_by(|a, b| {
            self.partitions[*a as usize].cmp(&self.partitions[*b as usize])
        });
        let partitions: Arc<[String]> = self.partitions.into();
        Ok(PartitionSet {
            by_name,
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
