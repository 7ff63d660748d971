//! A store shared by many elections and partition sets.
//!
//! Each [`crate::ElectionBuilder::redis`] opens connections of its own: one
//! for lease operations and one for announcements (per node, on a Redis
//! Cluster). A process with a
//! hundred elections on one Redis should not open two hundred: build one
//! [`Store`] and hand it to every builder with `.store(&store)`. All of
//! them then share one connection for lease operations and one pub/sub
//! connection, on which each election subscribes to its own channel.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{self, validate_name, Address, Connect, Op, StoreBugs, TlsFiles};
use crate::{LeaderInfo, MemoryStore, Result};

/// Where leases are kept, shared by any number of elections and partition
/// sets of this process. Cheap to clone.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// let store = tenure::Store::redis("redis://127.0.0.1:6379").connect().await?;
/// let reports = tenure::Election::builder("reports").store(&store).build().await?;
/// let cleanup = tenure::Election::builder("cleanup").store(&store).build().await?;
/// # drop((reports, cleanup)); Ok(()) }
/// ```
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: backend::Store,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("at", &self.inner.describe())
            .finish()
    }
}

impl Store {
    /// Redis at `url`: one server, Redis Sentinel or Redis Cluster, with or
    /// without TLS (the forms of [`crate::ElectionBuilder::redis`]).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::redis("redis+cluster://10.0.0.1:6379,10.0.0.2:6379")
    ///     .connect()
    ///     .await?;
    /// let reports = tenure::Election::builder("reports").store(&store).build().await?;
    /// # drop(reports); Ok(()) }
    /// ```
    pub fn redis(url: impl Into<String>) -> StoreBuilder {
        Store::open(url)
    }

    /// The store at `url`, whichever kind it names: Redis (the forms of
    /// [`Store::redis`]); with the crate's `etcd` feature, an etcd
    /// cluster (`etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]`, `etcds://`
    /// for TLS); with the `zookeeper` feature, a ZooKeeper ensemble
    /// (`zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/CHROOT]`, the user
    /// and password a digest identity). Moving from one to another changes
    /// the URL, not the code.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let url = std::env::var("TENURE_STORE").unwrap_or("redis://127.0.0.1:6379".into());
    /// let store = tenure::Store::open(url).connect().await?;
    /// let reports = tenure::Election::builder("reports").store(&store).build().await?;
    /// # drop(reports); Ok(()) }
    /// ```
    pub fn open(url: impl Into<String>) -> StoreBuilder {
        StoreBuilder {
            url: url.into(),
            tls: TlsFiles::default(),
            call_timeout: None,
            bugs: StoreBugs::default(),
        }
    }

    /// Names of the elections that have a lease under `prefix` now,
    /// sorted (what `tenure status` lists). Reads only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let memory = tenure::MemoryStore::new();
    /// let store = tenure::Store::memory(&memory);
    /// let election = tenure::Election::builder("jobs").store(&store).build().await?;
    /// let _term = election.campaign().await?;
    /// assert_eq!(store.elections("tenure").await?, ["jobs"]);
    /// let leader = store.leader_of("tenure", "jobs").await?.expect("a leader");
    /// assert_eq!(leader.id, election.id());
    /// # Ok(()) }
    /// ```
    pub async fn elections(&self, prefix: &str) -> Result<Vec<String>> {
        validate_name("key prefix", prefix)?;
        self.inner.elections(prefix).await
    }

    /// [`Store::elections`], node by node: each primary of a Redis store
    /// (`host:port`) with its elections, or why they could not be read, so
    /// that one silent cluster node hides none of the others' (what
    /// `tenure status` lists). An etcd or memory store is one entry.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let memory = tenure::MemoryStore::new();
    /// let store = tenure::Store::memory(&memory);
    /// let election = tenure::Election::builder("jobs").store(&store).build().await?;
    /// let _term = election.campaign().await?;
    /// let nodes = store.elections_by_node("tenure").await?;
    /// assert_eq!(nodes.len(), 1);
    /// assert_eq!(nodes[0].1.as_deref().ok(), Some(&["jobs".to_string()][..]));
    /// # Ok(()) }
    /// ```
    pub async fn elections_by_node(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Result<Vec<String>>)>> {
        validate_name("key prefix", prefix)?;
        self.inner.elections_by_node(prefix).await
    }

    /// Who leads election `name` under `prefix` (`None`: nobody). Reads
    /// only; see [`Store::elections`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::memory(&tenure::MemoryStore::new());
    /// let election = tenure::Election::builder("jobs").store(&store).id("a").build().await?;
    /// assert!(store.leader_of("tenure", "jobs").await?.is_none());
    /// let term = election.campaign().await?;
    /// let leader = store.leader_of("tenure", "jobs").await?.expect("a leads");
    /// assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
    /// # Ok(()) }
    /// ```
    pub async fn leader_of(&self, prefix: &str, name: &str) -> Result<Option<LeaderInfo>> {
        validate_name("key prefix", prefix)?;
        validate_name("election name", name)?;
        let op = Op::Inspect {
            at: Address::new(prefix, name),
        };
        Ok(self
            .inner
            .one(op)
            .await?
            .into_inspect()?
            .map(LeaderInfo::from))
    }

    /// An in-memory store (tests).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let memory = tenure::MemoryStore::new();
    /// let store = tenure::Store::memory(&memory);
    /// let election = tenure::Election::builder("jobs").store(&store).build().await?;
    /// let term = election.campaign().await?;
    /// assert_eq!(memory.holder("jobs").map(|h| h.token), Some(term.token()));
    /// # Ok(()) }
    /// ```
    pub fn memory(store: &MemoryStore) -> Store {
        Store {
            inner: backend::Store::Memory(store.clone()),
        }
    }
}

/// Settings of a [`Store`]; [`StoreBuilder::connect`] connects.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::Store::redis("rediss://tenure:secret@redis.internal:6380")
///     .tls_ca_file("/etc/tenure/redis-ca.pem")
///     .call_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// let election = tenure::Election::builder("reports").store(&store).build().await?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct StoreBuilder {
    url: String,
    tls: TlsFiles,
    /// `None`: 2 s, or the election's when one connects it.
    call_timeout: Option<Duration>,
    bugs: StoreBugs,
}

/// The store at a URL, with the default settings ([`Store::open`]).
impl From<&str> for StoreBuilder {
    fn from(url: &str) -> Self {
        Store::open(url)
    }
}

/// The store at a URL, with the default settings ([`Store::open`]).
impl From<String> for StoreBuilder {
    fn from(url: String) -> Self {
        Store::open(url)
    }
}

/// The store at a URL, with the default settings ([`Store::open`]).
impl From<&String> for StoreBuilder {
    fn from(url: &String) -> Self {
        Store::open(url.as_str())
    }
}

/// Never shows a password: the URL is redacted.
///
/// ```
/// let builder = tenure::Store::open("redis://app:secret@10.0.0.1:6379");
/// assert!(!format!("{builder:?}").contains("secret"));
/// ```
impl std::fmt::Debug for StoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreBuilder")
            .field("url", &crate::redact_url(&self.url))
            .field("tls", &self.tls)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl StoreBuilder {
    /// Verify a `rediss://` server against this CA certificate (PEM file)
    /// instead of the system's roots.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::redis("rediss://redis.internal:6380")
    ///     .tls_ca_file("/etc/tenure/redis-ca.pem")
    ///     .connect()
    ///     .await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca = Some(path.into());
        self
    }

    /// Present this client certificate and key (PEM files) to an
    /// `etcds://` cluster that requires one.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let store = tenure::Store::open("etcds://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
    ///     .tls_ca_file("/etc/tenure/etcd-ca.pem")
    ///     .tls_client_cert_file("/etc/tenure/client.pem", "/etc/tenure/client-key.pem")
    ///     .connect()
    ///     .await?;
    /// # drop(store); Ok(()) }
    /// ```
    pub fn tls_client_cert_file(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.tls.cert = Some(cert.into());
        self.tls.key = Some(key.into());
        self
    }

    /// Upper bound of one round trip on the shared connection (default
    /// 2 s). Each election still bounds its own calls by its own call
    /// timeout.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::{Duration, Instant};
    /// let started = Instant::now();
    /// let refused = tenure::Store::redis("redis://127.0.0.1:1") // nothing listens there
    ///     .call_timeout(Duration::from_millis(200))
    ///     .connect()
    ///     .await;
    /// assert!(refused.is_err());
    /// assert!(started.elapsed() < Duration::from_secs(5));
    /// # }
    /// ```
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// Connect, and check with a PING that the server accepts us. Fails
    /// with [`crate::Error::Unreachable`], [`crate::Error::Auth`] or
    /// [`crate::Error::Tls`] when Redis cannot be used.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let refused = tenure::Store::redis("redis://127.0.0.1:1").connect().await;
    /// match refused {
    ///     Err(err @ tenure::Error::Unreachable { .. }) => assert!(err.is_transient()),
    ///     other => panic!("expected Unreachable, got {other:?}"),
    /// }
    /// # }
    /// ```
    pub async fn connect(self) -> Result<Store> {
        let spec = Connect {
            url: self.url,
            tls: self.tls,
            call_timeout: self.call_timeout.unwrap_or(Duration::from_secs(2)),
            bugs: self.bugs,
        };
        Ok(Store {
            inner: backend::Store::connect(spec).await?,
        })
    }

    /// An election's (or a partition set's) call timeout, unless this
    /// store's own was set, and its failing-mode switches: the builders
    /// connect through here.
    pub(crate) fn with(mut self, call_timeout: Duration, bugs: StoreBugs) -> Self {
        self.call_timeout.get_or_insert(call_timeout);
        self.bugs = bugs;
        self
    }
}
