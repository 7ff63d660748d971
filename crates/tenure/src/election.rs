//! Elections: configuration, campaigning, and the keeper of a term.
//!
//! This is the I/O driver around [`crate::machine`]: it sends requests to
//! the backend with per-call timeouts, notes when each was sent, and lets
//! the state machine decide. Followers sleep until the holder's lease would
//! expire or a release is announced, whichever comes first, so an idle
//! follower costs about one Redis call per term.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, timeout, Instant};

use crate::backend::{validate_name, Address, Backend, Needs, Notices, Store};
use crate::keeper::{Keeper, Report};
use crate::leadership::{Command, TermShared};
use crate::machine::{
    after_acquire, AcquireReply, AcquireRequest, CandidateStep, LeaderState, LeaderStep, Reading,
    Timing,
};
use crate::term::{Holder, LeaderInfo, LostReason};
use crate::testing::Bugs;
use crate::{instance_id, metrics, Error, Leadership, MemoryStore, Result};

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
    Url(String),
    Store(crate::Store),
}

impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Url(url) => f.debug_tuple("Url").field(&crate::redact_url(url)).finish(),
            StoreSpec::Store(store) => store.fmt(f),
        }
    }
}

impl StoreSpec {
    /// The store, connected (through [`crate::StoreBuilder`], the one
    /// connect path) with the builder's TLS files, call timeout and
    /// failing-mode switches if it is a URL.
    pub async fn connect(self, settings: &mut Settings, call_timeout: Duration) -> Result<Store> {
        match self {
            StoreSpec::Store(store) => Ok(store.inner),
            StoreSpec::Url(url) => {
                let builder = crate::Store::open(url).with(
                    settings.tls_files(),
                    call_timeout,
                    settings.bugs.store,
                );
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
    name: String,
    store: Option<StoreSpec>,
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
    pub tls_ca: Option<PathBuf>,
    /// An etcd client certificate and its key (PEM files).
    pub tls_client: Option<(PathBuf, PathBuf)>,
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
            tls_ca: None,
            tls_client: None,
            max_ttl: None,
            allow_eviction: false,
            bugs: Bugs::default(),
            jitter_seed: None,
        }
    }
}

impl Settings {
    /// The TLS files given (taken: they are used once, to connect).
    pub fn tls_files(&mut self) -> crate::backend::TlsFiles {
        let (cert, key) = self.tls_client.take().unzip();
        crate::backend::TlsFiles {
            ca: self.tls_ca.take(),
            cert,
            key,
        }
    }

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
    /// verified against the system's roots, or
    /// [`ElectionBuilder::tls_ca_file`]). The book's "Topologies" page says
    /// what each guarantees and what a failover costs.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("reports")
    ///     .redis("redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster")
    ///     .build()
    ///     .await?;
    /// # drop(election); Ok(()) }
    /// ```
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.store = Some(StoreSpec::Url(url.into()));
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

    /// Upper bound of one Redis call (default: the renew interval, at most 2 s).
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

    /// Verify a `rediss://` server or an `etcds://` cluster against this
    /// CA certificate (PEM file) instead of the system's roots.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("reports")
    ///     .redis("rediss://redis.internal:6380")
    ///     .tls_ca_file("/etc/tenure/redis-ca.pem")
    ///     .build()
    ///     .await?;
    /// # drop(election); Ok(()) }
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.settings.tls_ca = Some(path.into());
        self
    }

    /// Present this client certificate and key (PEM files) to an
    /// `etcds://` cluster that requires one (`--client-cert-auth`).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("reports")
    ///     .redis("etcds://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
    ///     .tls_ca_file("/etc/tenure/etcd-ca.pem")
    ///     .tls_client_cert_file("/etc/tenure/client.pem", "/etc/tenure/client-key.pem")
    ///     .build()
    ///     .await?;
    /// # drop(election); Ok(()) }
    /// ```
    pub fn tls_client_cert_file(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.settings.tls_client = Some((cert.into(), key.into()));
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
        let prefix = self.settings.prefix.clone();
        let at = Address::new(&prefix, &self.name);
        let Some(spec) = self.store.take() else {
            return Err(Error::Config(
                "no store given: call .redis(url) or .memory(&store)".into(),
            ));
        };
        let store = spec
            .connect(&mut self.settings, timing.call_timeout)
            .await?;
        let needs = StoreSpec::needs(&self.settings, false, timing.ttl);
        let backend = store.election(at, needs).await?;
        metrics::describe();
        Ok(Election {
            inner: Arc::new(Inner {
                name: self.name,
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

struct Inner {
    name: String,
    id: String,
    timing: Timing,
    backend: Backend,
    attempts: Attempts,
    /// The start-up hold-off this instance asks for: the largest of its
    /// ttl, its max_ttl setting and every lease ttl it has seen.
    hold_off_ms: AtomicU64,
    /// Bugs switched back on for failing-mode tests (all off normally).
    bugs: Bugs,
    /// The jitter's RNG when seeded ([`ElectionBuilder::jitter_seed`]).
    jitter: Option<Mutex<StdRng>>,
}

/// The campaign attempts of one [`Election`] value.
///
/// An attempt names one campaign in the lease it writes. Only a retry of the
/// same attempt adopts a lease found under this instance's id (its first
/// reply was lost); every other lease under the id (an earlier term still
/// being released, a lease restored by a rollback, another process using
/// the same id) is held by someone else, so a new term always gets a new
/// token and can never be ended by an older term's release.
struct Attempts {
    /// Every attempt name starts with it: `NONCE.` with a random nonce, so
    /// two processes (or two `Election` values) with one id never share
    /// attempts.
    prefix: String,
    state: Mutex<AttemptState>,
}

#[derive(Default)]
struct AttemptState {
    next: u64,
    /// An attempt whose campaign was abandoned (cancelled or failed) after
    /// it may have written a lease: the next campaign reuses it, and so
    /// adopts that lease instead of waiting for it to lapse.
    unfinished: Option<u64>,
    /// The attempt that began the latest term: its lease is its keeper's
    /// to renew and release, never [`Election::release_if_held`]'s.
    began: Option<u64>,
    /// Attempts whose campaign is still running (its reply may be on its
    /// way): their leases are not [`Election::release_if_held`]'s either.
    running: Vec<u64>,
}

impl Attempts {
    fn new() -> Self {
        Attempts {
            prefix: format!("{:016x}.", rand::random::<u64>()),
            state: Mutex::new(AttemptState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attempt for a new campaign. Never the attempt of a term that
    /// began, and never one another running campaign holds.
    fn begin(&self) -> Attempt<'_> {
        let mut state = self.lock();
        let number = state.unfinished.take().unwrap_or_else(|| {
            state.next += 1;
            state.next
        });
        state.running.push(number);
        Attempt {
            attempts: self,
            number,
            name: format!("{}{number}", self.prefix),
            won: false,
        }
    }

    /// Whether an attempt name is one of ours.
    fn is_ours(&self, attempt: &str) -> bool {
        attempt.starts_with(&self.prefix)
    }

    /// Whether an attempt name is the one that began the latest term, or
    /// one whose campaign is still running: a lease that is not for
    /// [`Election::release_if_held`] to release.
    fn is_kept(&self, attempt: &str) -> bool {
        let Some(number) = attempt
            .strip_prefix(&self.prefix)
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return false;
        };
        let state = self.lock();
        state.began == Some(number) || state.running.contains(&number)
    }
}

/// One campaign's attempt; handed back for reuse unless a term began.
struct Attempt<'a> {
    attempts: &'a Attempts,
    number: u64,
    name: String,
    won: bool,
}

impl Attempt<'_> {
    /// This attempt won: a term begins, kept by its own keeper.
    fn won(&mut self) {
        self.won = true;
        self.attempts.lock().began = Some(self.number);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let mut state = self.attempts.lock();
        state.running.retain(|number| *number != self.number);
        if !self.won && state.unfinished.is_none() {
            state.unfinished = Some(self.number);
        }
    }
}

impl Inner {
    /// One backend call bounded by `limit`. A timeout also replaces the
    /// connection: the call may have run, and the connection may be dead.
    async fn call<T>(
        &self,
        limit: Duration,
        call: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let result = match timeout(limit, call).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(limit)),
        };
        if let Err(Error::Timeout(_)) = result {
            self.backend.reset();
        }
        result
    }
}

/// One named election, seen from this instance. Cheap to clone.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// let election = tenure::Election::builder("report-mailer")
///     .redis("redis://127.0.0.1:6379")
///     .build()
///     .await?;
/// loop {
///     let term = election.campaign().await?;
///     tokio::select! {
///         reason = term.lost() => eprintln!("no longer leader: {reason}"),
///         _ = send_reports(term.token()) => { term.resign().await?; break }
///     }
/// }
/// # Ok(()) }
/// # async fn send_reports(_token: u64) {}
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .field("ttl", &self.inner.timing.ttl)
            .finish_non_exhaustive()
    }
}

impl Election {
    /// Start configuring the election `name`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_eq!(election.name(), "jobs");
    /// # Ok(()) }
    /// ```
    pub fn builder(name: impl Into<String>) -> ElectionBuilder {
        ElectionBuilder {
            name: name.into(),
            store: None,
            settings: Settings::default(),
        }
    }

    /// The election's name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("nightly-backup").memory(&store).build().await?;
    /// assert_eq!(election.name(), "nightly-backup");
    /// assert_eq!(election.campaign().await?.election(), "nightly-backup");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// This instance's id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_ne!(a.id(), b.id(), "each instance gets its own id");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The lease TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_secs(9)).build().await?;
    /// assert_eq!(election.ttl(), Duration::from_secs(9));
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.inner.timing.ttl
    }

    /// The renew interval.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// assert_eq!(election.renew_every(), election.ttl() / 3);
    /// # Ok(()) }
    /// ```
    pub fn renew_every(&self) -> Duration {
        self.inner.timing.renew_every
    }

    /// Campaign until this instance is leader, then return the term.
    ///
    /// Transient failures (Redis down, timeouts) are retried with backoff;
    /// errors that need a person (credentials, ACL, foreign data) are returned.
    ///
    /// # Cancel safety
    /// If cancelled while an acquire is in flight, a term may have been won
    /// that nobody renews; the next `campaign` (or `try_campaign`) of this
    /// `Election` retries the same attempt and so adopts it at once. Left
    /// alone, it lapses after one TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let term = election.campaign().await?;
    /// assert!(term.is_leader());
    /// assert_eq!(store.holder("jobs").map(|h| h.token), Some(term.token()));
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self) -> Result<Leadership> {
        self.campaign_observed(|_| {}).await
    }

    /// [`Election::campaign`], calling `on_follower` each time another
    /// instance is seen leading with a new term.
    pub(crate) async fn campaign_observed(
        &self,
        mut on_follower: impl FnMut(&LeaderInfo),
    ) -> Result<Leadership> {
        let timing = &self.inner.timing;
        let mut notices = self.inner.backend.notices();
        let mut attempt = self.inner.attempts.begin();
        let mut failures: u32 = 0;
        let mut last_seen_token = None;
        let mut announced_hold_off = false;
        let mut pace = Pace::default();
        loop {
            let seen = *notices.borrow_and_update();
            let sent_at = Reading::take();
            let sent = sent_at.now;
            let reply = match self.acquire_once(&attempt.name).await {
                Ok(reply) => {
                    failures = 0;
                    Some(reply)
                }
                Err(err) if !err.is_transient() => return Err(err),
                Err(err) => {
                    // After a timeout the outcome is unknown: the script may
                    // have run. The next attempt adopts the term if it did.
                    failures = failures.saturating_add(1);
                    if failures == 1 {
                        tracing::warn!(election = %self.inner.name, error = %err, "acquire failed; retrying");
                    }
                    None
                }
            };
            let now_at = Reading::take();
            match after_acquire(timing, sent_at, now_at, reply, self.jitter(), failures) {
                CandidateStep::Elected(state) => {
                    attempt.won();
                    return Ok(self.start_term(state));
                }
                CandidateStep::Follow { until, holder } => {
                    if last_seen_token != Some(holder.token) {
                        last_seen_token = Some(holder.token);
                        self.note_holder(&holder);
                        tracing::debug!(election = %self.inner.name, leader = ?holder.owner, token = holder.token, "following");
                        on_follower(&LeaderInfo::from(holder.clone()));
                    }
                    // A renewal announcement may push the wait back, but
                    // only to what this instance believes a lease can last,
                    // and never more than one such ttl past the expiry the
                    // store just reported: announcements are hints.
                    let ttl = holder.ttl.max(timing.ttl);
                    let (limit, ttl) = if self.inner.bugs.unbounded_announcements {
                        let unbounded = Duration::from_secs(365 * 24 * 3600);
                        (until + unbounded, unbounded)
                    } else {
                        (until + ttl, ttl)
                    };
                    let woken = wait_for_turn(&mut notices, seen, until, limit, ttl).await;
                    if woken == Woken::Announcement && !self.inner.bugs.unbounded_announcements {
                        pace.before_attempt(sent, timing.retry_every).await;
                    }
                }
                CandidateStep::HoldOff { until, wait } => {
                    if !announced_hold_off {
                        announced_hold_off = true;
                        tracing::info!(
                            election = %self.inner.name,
                            wait = ?wait,
                            "the store may have lost or rolled back leases (first use of the election, a restart or a failover): no lease is granted until any leader from before has passed its deadline"
                        );
                    }
                    // A lease that vanished without its holder's release
                    // holds the election off until its witness runs out,
                    // or until the holder, having stopped, releases it:
                    // that release is announced.
                    let mut since = seen;
                    tokio::select! {
                        _ = sleep_until(until) => {}
                        _ = lease_changed(&mut notices, &mut since, sent, Duration::ZERO) => {
                            pace.before_attempt(sent, timing.retry_every).await;
                        }
                    }
                }
                CandidateStep::Retry { at } => sleep_until(at).await,
            }
        }
    }

    /// One acquire request for `attempt`, bounded by the call timeout.
    async fn acquire_once(&self, attempt: &str) -> Result<AcquireReply> {
        let timing = &self.inner.timing;
        let bugs = self.inner.bugs;
        let request = AcquireRequest {
            id: &self.inner.id,
            attempt,
            ttl_ms: timing.ttl_ms(),
            hold_off_ms: if bugs.hold_off_own_ttl {
                timing.ttl_ms()
            } else {
                self.inner.hold_off_ms.load(Ordering::Relaxed)
            },
        };
        let acquire = self.inner.backend.acquire(&request);
        match self.inner.call(timing.call_timeout, acquire).await? {
            AcquireReply::Held(holder)
                if bugs.adopt_earlier_lease && holder.owner == self.inner.id =>
            {
                Ok(AcquireReply::Won {
                    token: holder.token,
                })
            }
            reply => Ok(reply),
        }
    }

    /// Remember what a lease held by someone else tells: its ttl may be
    /// longer than ours, and it may carry our own id.
    fn note_holder(&self, holder: &Holder) {
        let ttl_ms = (holder.ttl.min(crate::machine::MAX_TTL)).as_millis() as u64;
        self.inner.hold_off_ms.fetch_max(ttl_ms, Ordering::Relaxed);
        if holder.owner == self.inner.id && !self.inner.attempts.is_ours(&holder.attempt) {
            tracing::warn!(
                election = %self.inner.name,
                id = %self.inner.id,
                token = holder.token,
                "the lease is held under this instance's id by a campaign that is not this process's: \
                 another process uses the same id, or the store restored an old lease (rollback); \
                 treating it as held by someone else. Give every process its own id"
            );
        }
    }

    /// A little randomness so followers woken by the same expiry or
    /// announcement do not all call Redis in the same instant.
    fn jitter(&self) -> Duration {
        let max = (self.inner.timing.ttl / 200).min(Duration::from_millis(5));
        let max_us = max.as_micros() as u64;
        let us = match &self.inner.jitter {
            Some(rng) => rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .random_range(0..=max_us),
            None => rand::rng().random_range(0..=max_us),
        };
        Duration::from_micros(us)
    }

    /// Start the term that an acquire won, with a keeper of its own.
    fn start_term(&self, state: LeaderState) -> Leadership {
        let (commands_tx, commands_rx) = mpsc::channel(8);
        let mut keeper = Keeper::new(&self.inner.id, &commands_tx, Report::PerTerm, true);
        let term = keeper.begin(TERM, &self.inner.name, state, ());
        // From now on the term's handles hold the only senders: the keeper
        // hears when the last one is dropped.
        drop(commands_tx);
        tokio::spawn(keep(self.clone(), keeper, commands_rx));
        term
    }

    /// Who leads now, read from the store (`None` when nobody does).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// assert!(a.leader().await?.is_none());
    /// let term = a.campaign().await?;
    /// let leader = a.leader().await?.expect("a leads");
    /// assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<LeaderInfo>> {
        let inspect = self.inner.backend.inspect();
        let holder = self
            .inner
            .call(self.inner.timing.call_timeout, inspect)
            .await?;
        Ok(holder.map(LeaderInfo::from))
    }

    /// A stream of leadership changes: the current leader first, then one
    /// item each time the leader (or its term) changes, `None` while nobody
    /// leads. Driven by lease announcements, with the holder's TTL as a
    /// fallback, so a crash is reported when its lease expires. Errors are
    /// yielded and the stream keeps going.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use futures_util::StreamExt;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let mut changes = Box::pin(election.watch());
    /// assert_eq!(changes.next().await.unwrap()?, None);
    /// let term = election.campaign().await?;
    /// let leader = changes.next().await.unwrap()?.unwrap();
    /// assert_eq!(leader.token, term.token());
    /// # Ok(()) }
    /// ```
    pub fn watch(&self) -> impl Stream<Item = Result<Option<LeaderInfo>>> + Send + 'static {
        struct State {
            election: Election,
            notices: watch::Receiver<Notices>,
            /// The announcements seen when the lease was last read.
            seen: Notices,
            last: Option<Option<(String, u64)>>,
            wait: Option<Duration>,
        }
        let state = State {
            notices: self.inner.backend.notices(),
            election: self.clone(),
            seen: Notices::default(),
            last: None,
            wait: None,
        };
        futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(wait) = state.wait.take() {
                    // Renewals do not change the leader; terms and releases
                    // do. Compared with what was seen at the last read, so a
                    // change announced while the caller was busy is not missed.
                    let seen = state.seen;
                    let notices = &mut state.notices;
                    let term_changed = async {
                        loop {
                            let now = *notices.borrow_and_update();
                            if now.released != seen.released || now.acquired != seen.acquired {
                                return;
                            }
                            if notices.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = term_changed => {}
                    }
                }
                state.seen = *state.notices.borrow_and_update();
                let timing = state.election.inner.timing;
                match state.election.leader().await {
                    Ok(leader) => {
                        // Re-read when the lease would expire; 1 ms past it
                        // so the store has dropped it.
                        state.wait = Some(
                            leader
                                .as_ref()
                                .map_or(timing.ttl, |l| l.ttl_left + Duration::from_millis(1)),
                        );
                        let key = leader.as_ref().map(|l| (l.id.clone(), l.token));
                        if state.last.as_ref() != Some(&key) {
                            state.last = Some(key);
                            return Some((Ok(leader), state));
                        }
                    }
                    Err(err) => {
                        state.wait = Some(timing.renew_every);
                        return Some((Err(err), state));
                    }
                }
            }
        })
    }
}

/// Why [`wait_for_turn`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// The holder's lease should have expired.
    Expiry,
    /// A release (or a resubscription) was announced.
    Announcement,
}

/// Wait for our turn to try again: until the holder's lease would expire
/// (`until`), pushed back whenever a renewal is announced (to at most `ttl`
/// after the announcement and never past `limit`), or at once when a
/// release is announced after `seen`. Announcements are hints: without them
/// this is a plain sleep until `until`, after which the lease is asked
/// again; with forged ones, it is a wait of at most `limit`.
async fn wait_for_turn(
    notices: &mut watch::Receiver<Notices>,
    seen: Notices,
    mut until: Instant,
    limit: Instant,
    ttl: Duration,
) -> Woken {
    let mut last = seen;
    loop {
        let current = *notices.borrow_and_update();
        if current.released != seen.released {
            return Woken::Announcement;
        }
        if current.renewed != last.renewed {
            // The lease was just extended: it cannot expire before a full
            // ttl from now, counted from when we heard, which is after the
            // renewal ran.
            let announced = Duration::from_millis(current.renewed_ttl_ms).min(ttl);
            until = until.max(Instant::now() + announced).min(limit);
        }
        last = current;
        tokio::select! {
            _ = sleep_until(until) => return Woken::Expiry,
            changed = notices.changed() => {
                if changed.is_err() {
                    // No more announcements: only the ttl is left to wait for.
                    sleep_until(until).await;
                    return Woken::Expiry;
                }
            }
        }
    }
}

/// Paces acquire attempts caused by announcements, which anyone allowed to
/// publish on the channel can send: a few right away (a real release is
/// acted on within milliseconds), then at most one per `gap`.
#[derive(Debug, Default)]
struct Pace {
    quick: u32,
}

impl Pace {
    const BURST: u32 = 3;

    async fn before_attempt(&mut self, previous: Instant, gap: Duration) {
        if Instant::now() >= previous + gap {
            self.quick = 0;
        }
        self.quick += 1;
        if self.quick > Self::BURST {
            sleep_until(previous + gap).await;
        }
    }
}

/// An election's keeper keeps one term, in this slot.
const TERM: usize = 0;

/// The task that keeps an election's one term: renews on schedule, answers
/// confirm and resign requests, and ends the term on loss or when every
/// handle is dropped. The term itself begins and ends in the [`Keeper`].
async fn keep(election: Election, mut keeper: Keeper<()>, mut commands: mpsc::Receiver<Command>) {
    let inner = &election.inner;
    let Some(shared) = keeper.get(TERM).map(|kept| kept.shared.clone()) else {
        return;
    };
    let mut notices = inner.backend.notices();
    let mut seen = *notices.borrow_and_update();
    let mut last_early = Instant::now();
    loop {
        let Some(wake) = keeper
            .get(TERM)
            .map(|kept| kept.state.next_renewal.min(kept.state.deadline))
        else {
            // Ended by its last renewal. A term that ran out of time may
            // still have its lease in the store (the renewals that failed
            // may have run): release it, so that the election (this
            // instance's next campaign included) need not wait for it to
            // lapse. The release checks the term, so it can only end this
            // term's lease, which no handle acts on any more.
            //
            // A lease that vanished (deleted by hand, evicted, revoked) left
            // its witness behind, and no candidate is granted the election
            // until the witness runs out: the release deletes it now that
            // this term has stopped, so the next leader need not wait.
            if matches!(
                shared.lost_reason(),
                Some(LostReason::DeadlinePassed | LostReason::Expired)
            ) {
                if let Err(err) = release(&election, &shared).await {
                    tracing::debug!(election = %inner.name, error = %err, "could not release the lease of a term past its deadline; it lapses at its ttl");
                }
            }
            return;
        };
        let command = tokio::select! {
            command = commands.recv() => command,
            _ = sleep_until(wake) => {
                renew_once(&election, &mut keeper).await;
                continue;
            }
            // The lease vanished (a watch or an announcement says so): renew now, so that a term whose lease
            // was deleted or revoked by hand stops at once instead of at its
            // next renewal. A hint only ever brings a renewal forward, at
            // most once per retry interval (announcements can be forged).
            _ = lease_changed(&mut notices, &mut seen, last_early, inner.timing.retry_every),
                if !inner.bugs.no_early_renewal => {
                last_early = Instant::now();
                renew_once(&election, &mut keeper).await;
                continue;
            }
        };
        match command {
            Some(Command::Confirm { token, reply, .. }) => {
                if keeper.slot_of(Some(TERM), token).is_none() {
                    let _ = reply.send(Err(Error::NotLeader(
                        shared.lost_reason().unwrap_or(LostReason::Resigned),
                    )));
                    continue;
                }
                let outcome = match renew_once(&election, &mut keeper).await {
                    LeaderStep::RenewAt(_) if shared.lost_reason().is_none() => {
                        Ok(shared.deadline().saturating_duration_since(Instant::now()))
                    }
                    LeaderStep::RenewAt(_) => Err(Error::NotLeader(
                        shared.lost_reason().unwrap_or(LostReason::Shutdown),
                    )),
                    LeaderStep::Lost(reason) => Err(Error::NotLeader(reason)),
                };
                let _ = reply.send(outcome);
            }
            Some(Command::Resign {
                token,
                reason,
                reply,
                ..
            }) => {
                if keeper.slot_of(Some(TERM), token).is_none() {
                    let _ = reply.send(Ok(()));
                    continue;
                }
                keeper.end(TERM, reason);
                let _ = reply.send(release(&election, &shared).await);
                return;
            }
            Some(Command::RecordRun {
                token, keep, reply, ..
            }) => {
                if keeper.slot_of(Some(TERM), token).is_none() {
                    let _ = reply.send(Ok(false));
                    continue;
                }
                // Beside the keeper, so that renewals never wait for it;
                // the store checks the term anyway.
                let election = election.clone();
                tokio::spawn(async move {
                    let inner = &election.inner;
                    let record = inner.backend.record_run(&inner.id, token, keep);
                    let _ = reply.send(inner.call(inner.timing.call_timeout, record).await);
                });
            }
            None => {
                // Every handle is gone: nobody can act on this term.
                keeper.end(TERM, LostReason::Resigned);
                if let Err(err) = release(&election, &shared).await {
                    tracing::warn!(election = %inner.name, error = %err, "could not release the lease of a dropped term; it lapses at its ttl");
                }
                return;
            }
        }
    }
}

/// Resolves when a release is announced after `seen` (on etcd, any delete
/// of the election's key: the lease vanished), but not before `gap` after
/// `last`. A new term of someone else's is announced only after such a
/// delete, and this instance's own term is announced too, so new terms are
/// not counted.
///
/// # Cancel safety
/// Cancel safe: `seen` is updated only when it resolves.
async fn lease_changed(
    notices: &mut watch::Receiver<Notices>,
    seen: &mut Notices,
    last: Instant,
    gap: Duration,
) {
    loop {
        let current = *notices.borrow_and_update();
        if current.released != seen.released {
            sleep_until(last + gap).await;
            *seen = *notices.borrow_and_update();
            return;
        }
        if notices.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One renewal round trip, applied by the keeper (which ends the term if
/// the renewal says so).
async fn renew_once(election: &Election, keeper: &mut Keeper<()>) -> LeaderStep {
    let inner = &election.inner;
    let timing = &inner.timing;
    let Some(kept) = keeper.get(TERM) else {
        return LeaderStep::Lost(LostReason::Resigned);
    };
    let token = kept.state.token;
    let sent_at = Reading::take();
    let sent = sent_at.now;
    // The machine's deadline, which counts time the host spent suspended.
    let deadline = match kept.state.deadline_as_of(sent_at.slept) {
        Some(deadline) if kept.state.is_current(sent_at) => deadline,
        _ => {
            keeper.end(TERM, LostReason::DeadlinePassed);
            return LeaderStep::Lost(LostReason::DeadlinePassed);
        }
    };
    let renew = inner.backend.renew(&inner.id, token, timing.ttl_ms());
    let limit = timing.call_timeout_before(sent, deadline);
    let reply = match inner.call(limit, renew).await {
        Ok(reply) => Some(reply),
        Err(err) => {
            // A timed-out renewal may have run, but its outcome is unknown,
            // so it does not move the deadline.
            tracing::warn!(election = %inner.name, error = %err, time_left = ?deadline.saturating_duration_since(Instant::now()), "renewal failed");
            None
        }
    };
    keeper
        .renewed(TERM, timing, sent_at, reply)
        .unwrap_or(LeaderStep::Lost(LostReason::Resigned))
}

/// Delete the lease if this term still owns it, and announce the release.
async fn release(election: &Election, shared: &TermShared) -> Result<()> {
    let inner = &election.inner;
    let resign = inner.backend.resign(&inner.id, shared.token);
    inner
        .call(inner.timing.call_timeout, resign)
        .await
        .map(|_released| ())
}

impl Election {
    /// Release the lease if this instance holds it without a live
    /// [`Leadership`] handle: call it after abandoning a [`Election::campaign`]
    /// (e.g. on shutdown), since its last acquire may have won. Returns
    /// whether a lease was released.
    ///
    /// A lease written by the attempt that began this `Election`'s latest
    /// term, or by a campaign of it that is still running, is left alone:
    /// that term's keeper (or that campaign) owns it. So a second campaign,
    /// or a second [`crate::Runner`], that gives up while another one leads
    /// or is being elected does not end that one's term.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// store.set_fault(tenure::Fault::LoseReplies); // the acquire wins, unseen
    /// let abandoned = tokio::time::timeout(Duration::from_millis(200), election.campaign());
    /// assert!(abandoned.await.is_err(), "shut down while campaigning");
    /// store.set_fault(tenure::Fault::None);
    /// assert!(election.release_if_held().await?);
    /// assert!(store.holder("jobs").is_none());
    /// # Ok(()) }
    /// ```
    pub async fn release_if_held(&self) -> Result<bool> {
        let inner = &self.inner;
        let inspect = inner.backend.inspect();
        match inner.call(inner.timing.call_timeout, inspect).await? {
            // Only a lease one of our own campaigns wrote: another process
            // with the same id holds its own term.
            Some(holder)
                if holder.owner == inner.id
                    && inner.attempts.is_ours(&holder.attempt)
                    && !inner.attempts.is_kept(&holder.attempt) =>
            {
                let resign = inner.backend.resign(&inner.id, holder.token);
                inner.call(inner.timing.call_timeout, resign).await
            }
            _ => Ok(false),
        }
    }

    /// One acquire attempt: the term if this instance won it, `None` if
    /// another instance leads. Unlike [`Election::campaign`], transient
    /// errors are returned, not retried.
    ///
    /// # Cancel safety
    /// As [`Election::campaign`]: a term won by a cancelled attempt lapses
    /// after one ttl, or is adopted by this instance's next attempt.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("cron").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("cron").memory(&store).id("b").build().await?;
    /// let term = a.try_campaign().await?.expect("nobody led");
    /// assert!(b.try_campaign().await?.is_none());
    /// # drop(term); Ok(()) }
    /// ```
    pub async fn try_campaign(&self) -> Result<Option<Leadership>> {
        let timing = &self.inner.timing;
        let mut attempt = self.inner.attempts.begin();
        let sent = Reading::take();
        let reply = self.acquire_once(&attempt.name).await?;
        match after_acquire(
            timing,
            sent,
            Reading::take(),
            Some(reply),
            Duration::ZERO,
            0,
        ) {
            CandidateStep::Elected(state) => {
                attempt.won();
                Ok(Some(self.start_term(state)))
            }
            CandidateStep::Follow { holder, .. } => {
                self.note_holder(&holder);
                Ok(None)
            }
            CandidateStep::HoldOff { .. } => Ok(None),
            // Won, but answered after the term's deadline (impossible while
            // the call timeout is shorter than the ttl); the lease lapses.
            CandidateStep::Retry { .. } => Err(Error::Timeout(timing.call_timeout)),
        }
    }

    /// [`Election::campaign`] for at most `wait`: the term if this
    /// instance was elected in time, `None` if not (another instance led
    /// all along, or the store could not be reached). A lease the
    /// abandoned campaign may have won meanwhile is released before `None`
    /// is returned (see [`Election::release_if_held`]), so it blocks nobody;
    /// if that release cannot be confirmed the lease lapses after one ttl.
    ///
    /// A term of this `Election` that is already running keeps its lease
    /// (see [`Election::release_if_held`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("cron").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("cron").memory(&store).id("b").build().await?;
    /// let term = a.campaign().await?;
    /// assert!(b.campaign_timeout(Duration::from_millis(100)).await?.is_none());
    /// term.resign().await?;
    /// assert!(b.campaign_timeout(Duration::from_millis(100)).await?.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// As [`Election::campaign`].
    pub async fn campaign_timeout(&self, wait: Duration) -> Result<Option<Leadership>> {
        match timeout(wait, self.campaign()).await {
            Ok(term) => term.map(Some),
            Err(_elapsed) => {
                // The abandoned campaign's last acquire may have won.
                if let Err(err) = self.release_if_held().await {
                    tracing::warn!(election = %self.inner.name, error = %err, "could not check for a lease won by the abandoned campaign; it lapses at its ttl");
                }
                Ok(None)
            }
        }
    }

    /// How long ago the last successful run of this election's work was
    /// recorded ([`Leadership::record_run`], by any instance), measured by
    /// the store's own clock, so every host agrees; `None` when the store
    /// remembers none (never recorded, or kept for less than has passed
    /// since). On etcd, which has no clock clients can read, the age is
    /// whole seconds, counted short (never more than the true age).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("nightly").memory(&store).build().await?;
    /// assert_eq!(election.since_last_run().await?, None);
    /// let term = election.campaign().await?;
    /// term.record_run(Duration::from_secs(60)).await?;
    /// tokio::time::sleep(Duration::from_secs(5)).await;
    /// assert_eq!(election.since_last_run().await?, Some(Duration::from_secs(5)));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn since_last_run(&self) -> Result<Option<Duration>> {
        let inner = &self.inner;
        inner
            .call(inner.timing.call_timeout, inner.backend.last_run())
            .await
    }

    /// The safety margin.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).ttl(Duration::from_secs(10)).build().await?;
    /// assert_eq!(election.margin(), Duration::from_secs(1)); // ttl/10
    /// # Ok(()) }
    /// ```
    pub fn margin(&self) -> Duration {
        self.inner.timing.margin
    }
}
