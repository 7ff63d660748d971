//! An election's settings and the builder that checks them and connects:
//! the one place they are validated, shared with partition sets.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::attempts::Attempts;
use super::{Election, Inner};
use crate::backend::{validate_name, Address, Needs, Store};
use crate::machine::Timing;
use crate::testing::Bugs;
use crate::{instance_id, metrics, Error, MemoryStore, Result};

/// The default lease TTL.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let election = tenure::Election::builder("jobs")
///     .memory(&tenure::MemoryStore::new())
///     .build()
///     .await?;
/// assert_eq!(election.ttl(), tenure::DEFAULT_TTL);
/// # Ok(()) }
/// ```
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// The default key prefix.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::Store::memory(&tenure::MemoryStore::new());
/// let election = tenure::Election::builder("jobs").store(&store).build().await?;
/// let _term = election.campaign().await?;
/// // Every key of an election starts with its prefix.
/// assert_eq!(store.elections(tenure::DEFAULT_PREFIX).await?, ["jobs"]);
/// # Ok(()) }
/// ```
pub const DEFAULT_PREFIX: &str = "tenure";

/// Where leases are to be kept, as a builder was told: a store's URL, or
/// a store already connected (a shared one, or a memory store).
pub(crate) enum StoreSpec {
    Open(crate::StoreBuilder),
    Store(crate::Store),
}

impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Open(builder) => builder.fmt(f),
            StoreSpec::Store(store) => store.fmt(f),
        }
    }
}

impl StoreSpec {
    /// The store, connected (through [`crate::StoreBuilder`], the one
    /// connect path) with the election's call timeout, unless the store's
    /// own was set, and its failing-mode switches.
    pub async fn connect(self, settings: &Settings, call_timeout: Duration) -> Result<Store> {
        match self {
            StoreSpec::Store(store) => Ok(store.inner),
            StoreSpec::Open(builder) => {
                let builder = builder.with(call_timeout, settings.bugs.store);
                Ok(builder.connect().await?.inner)
            }
        }
    }

    /// What `settings` asks of the store, for an election (or, with
    /// `partitions`, a partition set) of this `ttl`.
    pub fn needs(settings: &Settings, partitions: bool, ttl: Duration) -> Needs {
        Needs {
            partitions,
            allow_eviction: settings.allow_eviction,
            ttl,
        }
    }
}

/// Settings of an election; [`ElectionBuilder::build`] validates them and
/// connects.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let err = tenure::Election::builder("nightly")
///     .memory(&tenure::MemoryStore::new())
///     .ttl(Duration::from_secs(10))
///     .renew_every(Duration::from_secs(10))
///     .build()
///     .await
///     .unwrap_err();
/// assert!(err.to_string().contains("renew interval"));
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug)]
pub struct ElectionBuilder {
    pub(super) name: String,
    pub(super) store: Option<StoreSpec>,
    pub(crate) settings: Settings,
}

/// The settings an election and a partition set share, and their checks.
#[derive(Debug)]
pub(crate) struct Settings {
    pub ttl: Duration,
    pub renew_every: Option<Duration>,
    pub margin: Option<Duration>,
    pub call_timeout: Option<Duration>,
    pub id: Option<String>,
    pub prefix: String,
    /// An etcd client certificate and its key (PEM files).
    pub max_ttl: Option<Duration>,
    pub allow_eviction: bool,
    /// Bugs switched back on by the hidden `unsafe_*` builder methods.
    pub bugs: Bugs,
    /// See [`ElectionBuilder::jitter_seed`].
    pub jitter_seed: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl: DEFAULT_TTL,
            renew_every: None,
            margin: None,
            call_timeout: None,
            id: None,
            prefix: DEFAULT_PREFIX.to_string(),
            max_ttl: None,
            allow_eviction: false,
            bugs: Bugs::default(),
            jitter_seed: None,
        }
    }
}

impl Settings {
    /// Validate everything but the names, and fill in the defaults: the
    /// timing and this instance's id. `name` is for the log only.
    pub fn validate(&mut self, name: &str) -> Result<(Timing, String)> {
        validate_name("key prefix", &self.prefix)?;
        let mut timing = Timing::new(self.ttl, self.renew_every, self.margin, self.call_timeout)?;
        timing.late_renewal_bug = self.bugs.late_renewal_moves_deadline;
        let id = match self.id.take() {
            Some(id) if id.is_empty() || id.len() > 256 => {
                return Err(Error::Config(
                    "instance id must be 1 to 256 bytes long".into(),
                ))
            }
            Some(id) if id.chars().any(|c| c.is_control() || c.is_whitespace()) => {
                return Err(Error::Config(format!(
                    "instance id {id:?} contains white space or control characters; ids appear \
                     in logs and `tenure status`, so only printable characters are allowed"
                )))
            }
            Some(id) => id,
            None => instance_id(),
        };
        if let Some(max_ttl) = self.max_ttl {
            if max_ttl < timing.ttl || max_ttl > crate::machine::MAX_TTL {
                return Err(Error::Config(format!(
                    "max ttl ({max_ttl:?}) must be at least the ttl ({:?}) and at most 24h",
                    timing.ttl
                )));
            }
        }
        if timing.ttl < crate::machine::SHORT_TTL {
            tracing::warn!(
                election = %name,
                ttl = ?timing.ttl,
                "ttl below 1s: scheduling or network hiccups of a few hundred ms will cost leadership"
            );
        }
        Ok((timing, id))
    }
}

impl ElectionBuilder {
    /// Use Redis at `url`: one server (`redis://[user:password@]host[:port][/db]`),
    /// Redis Sentinel (`redis+sentinel://[user:password@]host:port[,host:port…]/SERVICE[/db]`,
    /// sentinel credentials as `?sentinel_username=U&sentinel_password=P`)
    /// or Redis Cluster (`redis+cluster://[user:password@]host:port[,host:port…]`);
    /// `rediss`, `rediss+sentinel` and `rediss+cluster` for TLS (server
    /// verified against the system's roots); with the crate's `etcd`
    /// feature, an etcd cluster (`etcd://`, `etcds://`): any URL
    /// [`crate::Store::open`] takes. For a CA file or a client certificate,
    /// give the store's settings with [`ElectionBuilder::open`]. The book's
    /// "Topologies" page says what each guarantees and what a failover
    /// costs.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("reports")
    ///     .redis("redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster")
    ///     .build()
    ///     .await?;
    /// # drop(election); Ok(()) }
    /// ```
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.open(crate::Store::open(url))
    }

    /// Use the store at a URL, or the store these settings describe (TLS
    /// files, a call timeout), connected when the election is built, for
    /// this election alone. The store's call timeout is the election's
    /// unless set here. `.open(url)` is `.redis(url)` by a name that fits
    /// every store.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let url = std::env::var("TENURE_STORE").unwrap_or("redis://127.0.0.1:6379".into());
    /// let election = tenure::Election::builder("reports").open(url).build().await?;
    /// # drop(election); Ok(()) }
    /// ```
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("reports")
    ///     .open(
    ///         tenure::Store::open("etcds://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
    ///             .tls_ca_file("/etc/tenure/etcd-ca.pem")
    ///             .tls_client_cert_file("/etc/tenure/client.pem", "/etc/tenure/client-key.pem"),
    ///     )
    ///     .build()
    ///     .await?;
    /// # drop(election); Ok(()) }
    /// ```
    pub fn open(mut self, store: impl Into<crate::StoreBuilder>) -> Self {
        self.store = Some(StoreSpec::Open(store.into()));
        self
    }

    /// Use a store shared with other elections and partition sets of
    /// this process: one connection for all of them (see [`crate::Store`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::memory(&tenure::MemoryStore::new());
    /// let reports = tenure::Election::builder("reports").store(&store).build().await?;
    /// let backups = tenure::Election::builder("backups").store(&store).build().await?;
    /// let (_r, _b) = (reports.campaign().await?, backups.campaign().await?);
    /// assert_eq!(store.elections("tenure").await?, ["backups", "reports"]);
    /// # Ok(()) }
    /// ```
    pub fn store(mut self, store: &crate::Store) -> Self {
        self.store = Some(StoreSpec::Store(store.clone()));
        self
    }

    /// Use an in-memory store (tests).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let term = election.campaign().await?;
    /// assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    /// # drop(term); Ok(()) }
    /// ```
    pub fn memory(mut self, store: &MemoryStore) -> Self {
        self.store = Some(StoreSpec::Store(crate::Store::memory(store)));
        self
    }

    /// Lease time-to-live (default 15 s): how long a crashed leader blocks
    /// the election, and how long a leader survives without reaching Redis.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let election = tenure::Election::builder("jobs")
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_secs(6))
    ///     .build()
    ///     .await?;
    /// assert_eq!(election.renew_every(), Duration::from_secs(2)); // ttl/3
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// How often the leader renews (default ttl/3). Must be shorter than
    /// the ttl minus the margin.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let builder = || tenure::Election::builder("jobs").memory(&tenure::MemoryStore::new());
    /// let election = builder().renew_every(Duration::from_secs(1)).build().await?;
    /// assert_eq!(election.renew_every(), Duration::from_secs(1));
    /// // Renewing only after the deadline would be useless: refused.
    /// assert!(builder().renew_every(Duration::from_secs(15)).build().await.is_err());
    /// # Ok(()) }
    /// ```
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.settings.renew_every = Some(every);
        self
    }

    /// Safety margin subtracted from the ttl for the local deadline (default
    /// ttl/10, at most 2 s): the allowance for this host's clock running
    /// slower than the Redis server's during one ttl.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let election = tenure::Election::builder("jobs")
    ///     .memory(&tenure::MemoryStore::new())
    ///     .margin(Duration::from_millis(500))
    ///     .build()
    ///     .await?;
    /// assert_eq!(election.margin(), Duration::from_millis(500));
    /// # Ok(()) }
    /// ```
    pub fn margin(mut self, margin: Duration) -> Self {
        self.settings.margin = Some(margin);
        self
    }

    /// Upper bound of one store call (default: the renew interval, at most 2 s).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let builder = || tenure::Election::builder("jobs").memory(&tenure::MemoryStore::new());
    /// let election = builder().call_timeout(Duration::from_millis(500)).build().await?;
    /// assert!(election.campaign().await?.is_leader());
    /// let refused = builder().call_timeout(Duration::ZERO).build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # Ok(()) }
    /// ```
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.settings.call_timeout = Some(timeout);
        self
    }

    /// This instance's id (default: hostname plus 128 random bits). Two
    /// processes must never share one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("jobs")
    ///     .memory(&tenure::MemoryStore::new())
    ///     .id("worker-1")
    ///     .build()
    ///     .await?;
    /// assert_eq!(election.id(), "worker-1");
    /// assert_eq!(election.campaign().await?.id(), "worker-1");
    /// # Ok(()) }
    /// ```
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.settings.id = Some(id.into());
        self
    }

    /// Key prefix (default `tenure`); see the key layout in the crate docs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let builder = || tenure::Election::builder("jobs").memory(&store);
    /// let staging = builder().prefix("staging").build().await?;
    /// assert!(staging.campaign().await?.is_leader());
    /// // Prefixes are part of Redis keys: no braces or white space.
    /// let refused = builder().prefix("my {app}").build().await;
    /// assert!(matches!(refused, Err(tenure::Error::Config(_))));
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// The largest ttl any instance of this election may use (default: this
    /// instance's ttl). After the store lost or rolled back data, no lease
    /// is granted until this long after it came back, by when a leader from
    /// before has passed its deadline whatever its ttl. Each candidate also
    /// remembers the longest lease it has seen; set this during a rolling
    /// change to a shorter ttl, to the old ttl, until every instance runs
    /// the new one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let election = tenure::Election::builder("nightly")
    ///     .memory(&tenure::MemoryStore::new())
    ///     .ttl(Duration::from_secs(5))
    ///     .max_ttl(Duration::from_secs(30)) // the old ttl, while instances are upgraded
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn max_ttl(mut self, max_ttl: Duration) -> Self {
        self.settings.max_ttl = Some(max_ttl);
        self
    }

    /// Accept a Redis whose `maxmemory-policy` may evict keys (default:
    /// refuse it with [`Error::Unsafe`]). An evicted lease lets a second
    /// leader in while the first still believes it leads; allow it only if
    /// fencing tokens protect every write.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// // A cache-only Redis (`maxmemory-policy allkeys-lru`), writes fenced.
    /// let election = tenure::Election::builder("reports")
    ///     .redis("redis://cache.internal:6379")
    ///     .allow_eviction(true)
    ///     .build()
    ///     .await?;
    /// # drop(election); Ok(()) }
    /// ```
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.settings.allow_eviction = allow;
        self
    }

    /// Validate the settings and connect.
    ///
    /// Fails with [`Error::Config`] on invalid settings, and with
    /// [`Error::Unreachable`], [`Error::Auth`], [`Error::Tls`] when Redis
    /// cannot be used.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_eq!(election.name(), "jobs");
    /// // Without a store there is nothing to build on.
    /// let none = tenure::Election::builder("jobs").build().await;
    /// assert!(matches!(none, Err(tenure::Error::Config(_))));
    /// # Ok(()) }
    /// ```
    pub async fn build(mut self) -> Result<Election> {
        validate_name("election name", &self.name)?;
        let (timing, id) = self.settings.validate(&self.name)?;
        let store = self.connect(timing).await?;
        let name = self.name.clone();
        self.on(&store, name, timing, id).await
    }

    /// Validate the settings and connect, as [`ElectionBuilder::build`]
    /// does, for a semaphore of `permits` permits named as this builder's
    /// election: `permits` elections, `NAME/permit-0` to
    /// `NAME/permit-{permits-1}`, with this builder's settings and one
    /// instance id. Fails with [`Error::Config`] for 0 permits or more than
    /// [`crate::MAX_PERMITS`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let exports = tenure::Election::builder("exports").memory(&store).semaphore(3).await?;
    /// assert_eq!(exports.permits(), 3);
    /// let none = tenure::Election::builder("exports").memory(&store).semaphore(0).await;
    /// assert!(matches!(none, Err(tenure::Error::Config(_))));
    /// # Ok(()) }
    /// ```
    pub async fn semaphore(mut self, permits: usize) -> Result<crate::Semaphore> {
        validate_name("semaphore name", &self.name)?;
        if permits == 0 || permits > crate::MAX_PERMITS {
            return Err(Error::Config(format!(
                "a semaphore has 1 to {} permits, not {permits}",
                crate::MAX_PERMITS
            )));
        }
        let names: Vec<String> = (0..permits)
            .map(|index| crate::Semaphore::permit_election(&self.name, index))
            .collect();
        for name in &names {
            validate_name("permit's election name", name)?;
        }
        let (timing, id) = self.settings.validate(&self.name)?;
        let store = self.connect(timing).await?;
        let mut elections = Vec::with_capacity(permits);
        for name in names {
            elections.push(self.on(&store, name, timing, id.clone()).await?);
        }
        Ok(crate::Semaphore::new(self.name, elections))
    }

    /// The store this builder was given, connected.
    async fn connect(&mut self, timing: Timing) -> Result<Store> {
        let Some(spec) = self.store.take() else {
            return Err(Error::Config(
                "no store given: call .redis(url) or .memory(&store)".into(),
            ));
        };
        spec.connect(&self.settings, timing.call_timeout).await
    }

    /// The election `name` on `store`, with this builder's settings.
    async fn on(
        &self,
        store: &Store,
        name: String,
        timing: Timing,
        id: String,
    ) -> Result<Election> {
        let at = Address::new(&self.settings.prefix, &name);
        let needs = StoreSpec::needs(&self.settings, false, timing.ttl);
        let backend = store.election(at, needs).await?;
        metrics::describe();
        Ok(Election {
            inner: Arc::new(Inner {
                name,
                id,
                timing,
                backend,
                attempts: Attempts::new(),
                hold_off_ms: AtomicU64::new(
                    self.settings.max_ttl.unwrap_or(timing.ttl).as_millis() as u64,
                ),
                bugs: self.settings.bugs,
                jitter: self
                    .settings
                    .jitter_seed
                    .map(|seed| Mutex::new(StdRng::seed_from_u64(seed))),
            }),
        })
    }
}
