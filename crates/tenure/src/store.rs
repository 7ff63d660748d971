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
use std::sync::Arc;
use std::time::Duration;

use crate::backend::redis::{RedisShared, RedisTarget};
use crate::{MemoryStore, Result};

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
    pub(crate) kind: StoreKind,
}

#[derive(Clone)]
pub(crate) enum StoreKind {
    Redis(Arc<RedisShared>),
    Memory(MemoryStore),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            StoreKind::Redis(shared) => shared.store.target().redacted(),
            StoreKind::Memory(_) => "memory".to_string(),
        };
        f.debug_struct("Store").field("at", &kind).finish()
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
        StoreBuilder {
            url: url.into(),
            tls_ca: None,
            call_timeout: Duration::from_secs(2),
        }
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
            kind: StoreKind::Memory(store.clone()),
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
#[derive(Debug)]
#[must_use]
pub struct StoreBuilder {
    url: String,
    tls_ca: Option<PathBuf>,
    call_timeout: Duration,
}

impl StoreBuilder {
    /// Verify a `rediss://` server against this CA certificate (PEM file)
    /// instead of the system's roots.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_ca = Some(path.into());
        self
    }

    /// Upper bound of one round trip on the shared connection (default
    /// 2 s). Each election still bounds its own calls by its own call
    /// timeout.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Connect, and check with a PING that the server accepts us. Fails
    /// with [`crate::Error::Unreachable`], [`crate::Error::Auth`] or
    /// [`crate::Error::Tls`] when Redis cannot be used.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left behind.
    pub async fn connect(self) -> Result<Store> {
        let target = RedisTarget {
            url: self.url,
            tls_ca: self.tls_ca,
        };
        Ok(Store {
            kind: StoreKind::Redis(RedisShared::connect(target, self.call_timeout).await?),
        })
    }
}
