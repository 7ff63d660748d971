//! Where leases live: the seam between the election logic and storage.
//!
//! The seam speaks elections, not keys. A [`Store`] carries out atomic
//! operations on leases ([`Op`]: acquire, renew, renew many, resign,
//! inspect, a partition-set member's heartbeat, and the last-run marker
//! that [`crate::Runner::every`] and `tenure run --at-most-every` share),
//! each naming its election by an [`Address`] (key prefix + name), any
//! number of them in one round trip ([`Store::batch`]); a [`Backend`] is one
//! election's view of it, with a stream of hints ([`Notices`]) that the
//! lease changed hands. [`redis`] (one server, Sentinel or Cluster), `etcd`
//! and `zk` (behind the `etcd` and `zookeeper` features) and `postgres`
//! (behind the `postgres` feature) are the production backends, and
//! `sqlite` (behind the `sqlite` feature) the embedded one for processes
//! on one host;
//! [`memory`] is a deterministic in-process stand-in for tests. Nothing
//! outside this module talks to a store, and the backends import only the
//! seam's leaves (`address`, `op`, `options`), never this file: it is the
//! one place that knows every backend.
//!
//! # Adding a backend: the checklist
//!
//! A new store is one folder here and one variant of [`Store`], with no
//! change to the public API:
//!
//! 1. **Connect**: a store type made from a URL, [`TlsFiles`] and a call
//!    timeout, that checks the store can keep leases (reachable,
//!    credentials, permissions, no configuration that could lose them),
//!    each failure one clear line; its scheme in [`Store::connect`]
//!    (behind a cargo feature if it brings heavy dependencies).
//! 2. **Lay out**: a layout file that turns an [`Address`] into the
//!    store's keys or rows (documented on the book's *Keys* page); data
//!    there that tenure did not write is [`crate::Error::ForeignData`] and
//!    never written over.
//! 3. **Operate**: `batch(&[Op])`, one reply per operation, with the
//!    semantics [`Op`] documents. A term is (id, token) in every operation;
//!    a new term's token is strictly larger than every earlier one of the
//!    election, across restarts, rollbacks and failovers; only a retry of
//!    the same attempt adopts a lease under its own id; a store that may
//!    have lost or rolled back leases grants none for the hold-off asked;
//!    a lease that vanishes other than by its holder's release holds the
//!    election for its ttl (a witness beside it).
//! 4. **Hint**: `election(at, needs)` checks the election and returns its
//!    [`Hints`]; they only make hand-over fast, never correct.
//! 5. **List**: `elections(prefix)` and `elections_by_node(prefix)` (for
//!    `tenure status`), and a [`Store::describe`] line without passwords.
//! 6. **Pass**: add a `Fixture` to `tests/it/contract.rs`, and every
//!    promise of the API runs on the new store; give tenure-chaos a
//!    `--store` with the store's own fault kinds, each with a failing-mode
//!    test; write its guarantees page and evidence.

mod address;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
mod op;
mod options;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod redis;
#[cfg(all(feature = "sqlite", target_os = "linux"))]
pub(crate) mod sqlite;
#[cfg(feature = "zookeeper")]
pub(crate) mod zk;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::{Error, Result};
pub(crate) use address::{validate_name, Address};
pub(crate) use op::{Hints, Notices, Op, Reply, RunRecord, RENEW_MANY};
#[cfg(all(feature = "sqlite", target_os = "linux"))]
pub(crate) use options::SqliteBugs;
pub(crate) use options::{Connect, EtcdBugs, Needs, StoreBugs, TlsFiles};

/// A store: where any number of elections keep their leases. Cheap to
/// clone: clones share the connections.
#[derive(Clone)]
pub(crate) enum Store {
    Redis(Arc<redis::RedisShared>),
    #[cfg(feature = "etcd")]
    Etcd(Arc<etcd::EtcdStore>),
    #[cfg(feature = "zookeeper")]
    Zk(Arc<zk::ZkStore>),
    #[cfg(all(feature = "sqlite", target_os = "linux"))]
    Sqlite(Arc<sqlite::SqliteStore>),
    #[cfg(feature = "postgres")]
    Postgres(Arc<postgres::PostgresStore>),
    Memory(memory::MemoryStore),
}

impl Store {
    /// Connect to the store `spec` names, whichever kind its URL's scheme
    /// says: the one connect path of every builder.
    pub async fn connect(spec: Connect) -> Result<Store> {
        if is_sqlite_url(&spec.url) {
            return connect_sqlite(&spec).await;
        }
        if is_postgres_url(&spec.url) {
            #[cfg(feature = "postgres")]
            return Ok(Store::Postgres(Arc::new(
                postgres::PostgresStore::connect(
                    &spec.url,
                    spec.tls,
                    spec.call_timeout,
                    spec.bugs.postgres,
                )
                .await?,
            )));
            #[cfg(not(feature = "postgres"))]
            return Err(Error::Config(format!(
                "{} is a PostgreSQL URL, but this build of tenure has no PostgreSQL support \
                 (enable the crate's `postgres` feature)",
                crate::redact_url(&spec.url)
            )));
        }
        if is_zk_url(&spec.url) {
            #[cfg(feature = "zookeeper")]
            return Ok(Store::Zk(connect_zk(&spec).await?));
            #[cfg(not(feature = "zookeeper"))]
            return Err(Error::Config(format!(
                "{} is a ZooKeeper URL, but this build of tenure has no ZooKeeper support \
                 (enable the crate's `zookeeper` feature)",
                crate::redact_url(&spec.url)
            )));
        }
        if is_etcd_url(&spec.url) {
            let store = connect_etcd(spec.url, spec.tls, spec.call_timeout, spec.bugs.etcd).await?;
            #[cfg(feature = "etcd")]
            return Ok(Store::Etcd(store));
            #[cfg(not(feature = "etcd"))]
            match *store {}
        }
        let target = redis::RedisTarget {
            tls_ca: spec.tls.for_redis(&spec.url)?,
            url: spec.url,
        };
        let following = if spec.bugs.first_sentinel_only {
            redis::topology::Following::FirstOnly
        } else {
            redis::topology::Following::Every
        };
        Ok(Store::Redis(
            redis::RedisShared::connect(target, spec.call_timeout, following).await?,
        ))
    }

    /// The election at `at` on this store: checked for what it `needs`, and
    /// listening to its announcements.
    pub async fn election(&self, at: Address<'_>, needs: Needs) -> Result<Backend> {
        let hints = match self {
            Store::Redis(shared) => shared.election(at, needs.into()).await?,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.election(at, needs.ttl).await?,
            #[cfg(feature = "zookeeper")]
            Store::Zk(store) => store.election(at, needs.ttl).await?,
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(store) => store.election(at)?,
            #[cfg(feature = "postgres")]
            Store::Postgres(store) => store.election(at),
            Store::Memory(memory) => memory.election(at),
        };
        Ok(Backend::new(self.clone(), at, hints))
    }

    /// Check this store for the partition set whose group is at `group`
    /// (its member set included).
    pub async fn check_partition_set(&self, group: Address<'_>, needs: Needs) -> Result<()> {
        match self {
            Store::Redis(shared) => shared.store.check(group, needs.into()).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.check(group, true, needs.ttl).await,
            #[cfg(feature = "zookeeper")]
            Store::Zk(store) => store.check(group, needs.ttl).await,
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(_) => Ok(()),
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => Ok(()),
            Store::Memory(_) => Ok(()),
        }
    }

    /// Names of the elections that have a lease under `prefix` now, sorted.
    pub async fn elections(&self, prefix: &str) -> Result<Vec<String>> {
        match self {
            Store::Redis(shared) => shared.elections(prefix).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.list_elections(prefix).await,
            #[cfg(feature = "zookeeper")]
            Store::Zk(store) => store.list_elections(prefix).await,
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(store) => store.list_elections(prefix).await,
            #[cfg(feature = "postgres")]
            Store::Postgres(store) => store.list_elections(prefix).await,
            Store::Memory(memory) => Ok(memory.elections()),
        }
    }

    /// [`Store::elections`] node by node (a Redis Cluster's primaries; any
    /// other store is one entry).
    pub async fn elections_by_node(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Result<Vec<String>>)>> {
        match self {
            Store::Redis(shared) => shared.elections_by_node(prefix).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => Ok(vec![(
                "etcd".to_string(),
                store.list_elections(prefix).await,
            )]),
            #[cfg(feature = "zookeeper")]
            Store::Zk(store) => Ok(vec![(
                "zookeeper".to_string(),
                store.list_elections(prefix).await,
            )]),
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(store) => Ok(vec![(
                "sqlite".to_string(),
                store.list_elections(prefix).await,
            )]),
            #[cfg(feature = "postgres")]
            Store::Postgres(store) => Ok(vec![(
                "postgres".to_string(),
                store.list_elections(prefix).await,
            )]),
            Store::Memory(memory) => Ok(vec![("memory".to_string(), Ok(memory.elections()))]),
        }
    }

    /// Where this store is, for messages (never with a password).
    pub fn describe(&self) -> String {
        match self {
            Store::Redis(shared) => shared.store.target().redacted(),
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.url().to_string(),
            #[cfg(feature = "zookeeper")]
            Store::Zk(store) => store.url().to_string(),
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(store) => store.url().to_string(),
            #[cfg(feature = "postgres")]
            Store::Postgres(store) => store.url().to_string(),
            Store::Memory(_) => "memory".to_string(),
        }
    }

    /// Carry out `ops` in one round trip: one pipeline on Redis (per node;
    /// a long one in slices, see `RedisStore::pipeline`), one lock on the
    /// memory store. The outer error means the round trip failed as
    /// a whole (no reply: the operations may or may not have run); the inner
    /// ones are each operation's own.
    pub async fn batch(&self, ops: &[Op<'_>]) -> Result<Vec<Result<Reply>>> {
        self.batch_counted(ops, &AtomicU64::new(0), None).await
    }

    /// [`Store::batch`], adding to `round_trips` the pipelines it sends
    /// (one per node it goes to, a retry after a redirection or a script
    /// reload included; on Redis one per slice of a long one). On Redis
    /// the batch waits up to `limit` for its replies instead of the call
    /// timeout; the caller bounds the whole (other stores bound their
    /// calls themselves).
    pub async fn batch_counted(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
        limit: Option<std::time::Duration>,
    ) -> Result<Vec<Result<Reply>>> {
        match self {
            Store::Redis(shared) => shared.store.batch(ops, round_trips, limit).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.batch(ops, round_trips).await,
            #[cfg(feature = "zookeeper")]
            Store::Zk(store) => store.batch(ops, round_trips).await,
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(store) => store.batch(ops, round_trips).await,
            #[cfg(feature = "postgres")]
            Store::Postgres(store) => store.batch(ops, round_trips).await,
            Store::Memory(store) => {
                round_trips.fetch_add(1, Ordering::Relaxed);
                store.batch(ops).await
            }
        }
    }

    /// One operation.
    pub async fn one(&self, op: Op<'_>) -> Result<Reply> {
        let mut replies = self.batch(&[op]).await?;
        replies
            .pop()
            .unwrap_or_else(|| Err(Error::internal("a batch of one had no reply")))
    }

    /// Drop the current connection for a new one (after a timeout: the call
    /// may have run, and the connection may be dead).
    pub fn reset(&self) {
        match self {
            Store::Redis(shared) => shared.store.reset(),
            #[cfg(feature = "postgres")]
            Store::Postgres(store) => store.reset(),
            _ => {}
        }
    }
}

/// Whether `url` names a PostgreSQL server (`postgres://`,
/// `postgresql://`).
pub(crate) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Whether `url` names a SQLite file (`sqlite://`).
pub(crate) fn is_sqlite_url(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// Open the SQLite file `spec` names, and let go of the locks of lapsed
/// terms until the store is dropped.
#[cfg(all(feature = "sqlite", target_os = "linux"))]
async fn connect_sqlite(spec: &Connect) -> Result<Store> {
    if spec.tls.ca.is_some() || spec.tls.cert.is_some() || spec.tls.key.is_some() {
        return Err(Error::Config(format!(
            "TLS files were given for {}, a local SQLite file",
            spec.url
        )));
    }
    let store = Arc::new(
        sqlite::SqliteStore::connect(&spec.url, spec.call_timeout, spec.bugs.sqlite).await?,
    );
    let weak = Arc::downgrade(&store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(store) = weak.upgrade() else { return };
            store.sweep();
        }
    });
    Ok(Store::Sqlite(store))
}

/// Without the `sqlite` feature (or off Linux), a SQLite URL is a
/// configuration error.
#[cfg(not(all(feature = "sqlite", target_os = "linux")))]
async fn connect_sqlite(spec: &Connect) -> Result<Store> {
    Err(Error::Config(format!(
        "{} is a SQLite URL, but this build of tenure has no SQLite support (it needs Linux \
         and the crate's `sqlite` feature)",
        spec.url
    )))
}

/// Whether `url` names a ZooKeeper ensemble (`zk://`).
pub(crate) fn is_zk_url(url: &str) -> bool {
    url.starts_with("zk://") || url.starts_with("zks://")
}

/// Connect to the ZooKeeper ensemble `spec` names, and sweep the terms
/// that ended without a release until the store is dropped.
#[cfg(feature = "zookeeper")]
async fn connect_zk(spec: &Connect) -> Result<Arc<zk::ZkStore>> {
    if spec.tls.ca.is_some() || spec.tls.cert.is_some() || spec.tls.key.is_some() {
        return Err(Error::Config(format!(
            "TLS files were given, but TLS to ZooKeeper is not supported yet ({})",
            crate::redact_url(&spec.url)
        )));
    }
    let store = Arc::new(zk::ZkStore::connect(&spec.url, spec.call_timeout, spec.bugs.zk).await?);
    zk::start_sweep(&store);
    Ok(store)
}

/// Whether `url` names an etcd cluster (`etcd://`, `etcds://`).
pub(crate) fn is_etcd_url(url: &str) -> bool {
    url.starts_with("etcd://") || url.starts_with("etcds://")
}

/// Connect to the etcd cluster at `url`.
#[cfg(feature = "etcd")]
pub(crate) async fn connect_etcd(
    url: String,
    tls: TlsFiles,
    call_timeout: std::time::Duration,
    bugs: EtcdBugs,
) -> Result<Arc<etcd::EtcdStore>> {
    let target = etcd::EtcdTarget {
        url,
        tls_ca: tls.ca,
        tls_cert: tls.cert,
        tls_key: tls.key,
        bugs,
    };
    let store = Arc::new(etcd::EtcdStore::connect(target, call_timeout).await?);
    // Sweeps the keys of terms that ended without a release, until the
    // store is dropped (see `EtcdStore::sweep`).
    let weak = Arc::downgrade(&store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(store) = weak.upgrade() else { return };
            store.sweep().await;
        }
    });
    Ok(store)
}

/// Without the `etcd` feature, an etcd URL is a configuration error.
#[cfg(not(feature = "etcd"))]
pub(crate) async fn connect_etcd(
    url: String,
    _tls: TlsFiles,
    _call_timeout: std::time::Duration,
    _bugs: EtcdBugs,
) -> Result<Arc<NoEtcd>> {
    Err(Error::Config(format!(
        "{} is an etcd URL, but this build of tenure has no etcd support (enable the \
         crate's `etcd` feature)",
        crate::redact_url(&url)
    )))
}

/// Stands in for the etcd store in builds without it.
#[cfg(not(feature = "etcd"))]
pub(crate) enum NoEtcd {}

/// The longest a last-run record is kept: a hundred years.
pub(crate) const MAX_KEEP_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// [`Op::RecordRun`] on `store` (for elections and partition sets alike).
pub(crate) async fn record_run(
    store: &Store,
    at: Address<'_>,
    id: &str,
    token: u64,
    keep: std::time::Duration,
    slot: Option<u64>,
) -> Result<bool> {
    let op = Op::RecordRun {
        at,
        id,
        token,
        slot,
        // A keep of zero would delete the marker at once on Redis; one past
        // what Redis accepts (a signed 64-bit expiry) would leave it with
        // none. "Once ever" is a hundred years.
        keep_ms: u64::try_from(keep.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, MAX_KEEP_MS),
    };
    store.one(op).await?.into_record_run()
}

/// Where a term's OS lock comes from, for [`crate::Leadership::lock_fd`].
#[cfg(unix)]
pub(crate) type LockSource = Box<dyn Fn() -> Option<std::os::fd::OwnedFd> + Send + Sync>;

/// One election's storage: its store, its address, and its announcements.
pub(crate) struct Backend {
    store: Store,
    prefix: String,
    name: String,
    notices: watch::Receiver<Notices>,
    /// Keeps the subscription to the election's announcements (and what
    /// it needs) alive; dropping it unsubscribes.
    _subscription: Option<Box<dyn Send + Sync>>,
}

impl Backend {
    pub fn new(store: Store, at: Address<'_>, hints: Hints) -> Self {
        Backend {
            store,
            prefix: at.prefix.to_string(),
            name: at.name.to_string(),
            notices: hints.notices,
            _subscription: hints.guard,
        }
    }

    fn at(&self) -> Address<'_> {
        Address::new(&self.prefix, &self.name)
    }

    pub async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<AcquireReply> {
        let op = Op::Acquire {
            at: self.at(),
            request: *request,
        };
        self.store.one(op).await?.into_acquire()
    }

    pub async fn renew(&self, id: &str, token: u64, ttl_ms: u64) -> Result<RenewReply> {
        let op = Op::Renew {
            at: self.at(),
            id,
            token,
            ttl_ms,
            announce: true,
        };
        self.store.one(op).await?.into_renew()
    }

    pub async fn resign(&self, id: &str, token: u64) -> Result<bool> {
        let op = Op::Resign {
            at: self.at(),
            id,
            token,
        };
        self.store.one(op).await?.into_resign()
    }

    pub async fn inspect(&self) -> Result<Option<Holder>> {
        let op = Op::Inspect { at: self.at() };
        self.store.one(op).await?.into_inspect()
    }

    pub async fn last_run(&self) -> Result<Option<RunRecord>> {
        let op = Op::LastRun { at: self.at() };
        self.store.one(op).await?.into_last_run()
    }

    pub async fn record_run(
        &self,
        id: &str,
        token: u64,
        keep: std::time::Duration,
        slot: Option<u64>,
    ) -> Result<bool> {
        record_run(&self.store, self.at(), id, token, keep, slot).await
    }

    /// Drop the current connection for a new one (after a timeout).
    pub fn reset(&self) {
        self.store.reset();
    }

    /// Where term (`id`, `token`) finds its OS lock, on a store that has
    /// them (SQLite).
    #[cfg(unix)]
    pub fn lock_source(&self, id: &str, token: u64) -> Option<LockSource> {
        match &self.store {
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(store) => {
                let store = Arc::downgrade(store);
                let (prefix, name, id) = (self.prefix.clone(), self.name.clone(), id.to_string());
                Some(Box::new(move || {
                    store
                        .upgrade()?
                        .lock_of(Address::new(&prefix, &name), &id, token)
                }))
            }
            _ => {
                let _ = (id, token);
                None
            }
        }
    }

    pub fn notices(&self) -> watch::Receiver<Notices> {
        self.notices.clone()
    }

    /// Whether the store announces new terms. SQLite does not: a follower
    /// there learns of a release from the term's OS lock, and nobody
    /// waits on a new term.
    pub fn announces_terms(&self) -> bool {
        match &self.store {
            #[cfg(all(feature = "sqlite", target_os = "linux"))]
            Store::Sqlite(_) => false,
            _ => true,
        }
    }
}
