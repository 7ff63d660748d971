//! Where leases live: the seam between the election logic and storage.
//!
//! A [`Store`] carries out atomic operations on leases ([`Op`]: acquire,
//! renew, resign, inspect, a partition-set member's heartbeat, and the
//! last-run marker that [`crate::Runner::every`] and `tenure run
//! --at-most-every` share), any
//! number of them in one round trip ([`Store::batch`]), and a [`Backend`]
//! is one election's view of it, with a stream of hints that the lease
//! changed hands. [`redis`] (one server, Sentinel or Cluster) and `etcd`
//! (behind the `etcd` feature: a lease per instance, the key's creating
//! revision as the token) are the production backends; [`memory`] is a
//! deterministic in-process stand-in for tests. Nothing outside this module
//! talks to a store. A new store is one more variant of [`Store`], with no
//! change to the public API (the book's *Architecture* page says what it
//! takes).

mod address;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
pub(crate) mod redis;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::{Error, Result};
pub(crate) use address::{validate_name, Address};

/// The most terms one [`Op::RenewMany`] carries: large enough that a set
/// of 100,000 partitions renews in 100 commands, small enough that one
/// script call keeps Redis busy for only a few milliseconds.
pub(crate) const RENEW_MANY: usize = 1_000;

/// Counters of lease events seen on the notification channel. They are
/// hints: a missed message costs at most one TTL of waiting, because the
/// lease itself stays the source of truth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Notices {
    /// Releases announced, plus one per (re)subscription, since a release
    /// may have been missed while unsubscribed.
    pub released: u64,
    /// New terms announced.
    pub acquired: u64,
    /// Renewals announced, and the ttl (ms) the last one set: the lease
    /// will not expire before that long after the announcement arrived.
    pub renewed: u64,
    pub renewed_ttl_ms: u64,
}

/// One operation on the store, addressed by election (or group): an
/// [`Address`], never a key. [`Store::batch`] carries out any number of
/// them in one round trip, and a single operation is a batch of one, so
/// each operation's layout (on Redis, the scripts' KEYS and ARGV) is written
/// exactly once, in the backend.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// A partition-set member's heartbeat (`join`), or its farewell; the
    /// reply lists the live members.
    Heartbeat {
        group: Address<'a>,
        member: &'a str,
        ttl_ms: u64,
        join: bool,
    },
    Acquire {
        at: Address<'a>,
        request: AcquireRequest<'a>,
    },
    /// Renew the term (id, token). `announce` publishes `renewed:` so that
    /// followers stay quiet (elections; partition sets have no followers).
    Renew {
        at: Address<'a>,
        id: &'a str,
        token: u64,
        ttl_ms: u64,
        announce: bool,
    },
    /// Renew many terms of instance `id` at once, each (election name,
    /// token) under `prefix`, without announcements (partition sets): one
    /// operation per up to [`RENEW_MANY`] terms instead of one per term.
    RenewMany {
        prefix: &'a str,
        id: &'a str,
        ttl_ms: u64,
        terms: &'a [(&'a str, u64)],
    },
    Resign {
        at: Address<'a>,
        id: &'a str,
        token: u64,
    },
    Inspect {
        at: Address<'a>,
    },
    /// How long ago the election's last successful run was recorded, by
    /// the store's own clock (`None`: none is remembered).
    LastRun {
        at: Address<'a>,
    },
    /// Record a successful run now, only if the lease is held by exactly
    /// the term (id, token); remembered for at least `keep_ms`. A record
    /// of any other term (a stale one included) is refused: `false`.
    RecordRun {
        at: Address<'a>,
        id: &'a str,
        token: u64,
        keep_ms: u64,
    },
}

/// The reply to one [`Op`].
#[derive(Debug)]
pub(crate) enum Reply {
    Members {
        members: Vec<String>,
        phantoms: u64,
    },
    Acquire(AcquireReply),
    Renew(RenewReply),
    /// One result per term of a [`Op::RenewMany`], in its order.
    RenewMany(Vec<Result<RenewReply>>),
    Resign(bool),
    Inspect(Option<Holder>),
    LastRun(Option<std::time::Duration>),
    RecordRun(bool),
}

impl Reply {
    fn mismatch(self) -> Error {
        Error::internal(format!("unexpected reply {self:?}"))
    }

    pub fn into_members(self) -> Result<(Vec<String>, u64)> {
        match self {
            Reply::Members { members, phantoms } => Ok((members, phantoms)),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_acquire(self) -> Result<AcquireReply> {
        match self {
            Reply::Acquire(reply) => Ok(reply),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_renew(self) -> Result<RenewReply> {
        match self {
            Reply::Renew(reply) => Ok(reply),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_renew_many(self) -> Result<Vec<Result<RenewReply>>> {
        match self {
            Reply::RenewMany(replies) => Ok(replies),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_resign(self) -> Result<bool> {
        match self {
            Reply::Resign(released) => Ok(released),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_inspect(self) -> Result<Option<Holder>> {
        match self {
            Reply::Inspect(holder) => Ok(holder),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_last_run(self) -> Result<Option<std::time::Duration>> {
        match self {
            Reply::LastRun(age) => Ok(age),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_record_run(self) -> Result<bool> {
        match self {
            Reply::RecordRun(recorded) => Ok(recorded),
            other => Err(other.mismatch()),
        }
    }
}

/// A store: where any number of elections keep their leases. Cheap to
/// clone: clones share the connections.
#[derive(Clone)]
pub(crate) enum Store {
    Redis(Arc<redis::RedisShared>),
    #[cfg(feature = "etcd")]
    Etcd(Arc<etcd::EtcdStore>),
    Memory(memory::MemoryStore),
}

/// How to reach a store, as a builder was told: every store of every kind
/// is connected by [`Store::connect`] from one of these.
#[derive(Debug)]
pub(crate) struct Connect {
    pub url: String,
    pub tls: TlsFiles,
    /// The bound of one round trip.
    pub call_timeout: std::time::Duration,
    pub bugs: StoreBugs,
}

/// Fixed bugs of the stores that hidden, **unsafe** builder switches turn
/// back on, so that tenure-chaos's failing-mode tests can show its checker
/// catches them. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StoreBugs {
    pub etcd: EtcdBugs,
    /// Sentinel: only the first sentinel of the URL is listened to and
    /// asked for the primary (issue 22).
    pub first_sentinel_only: bool,
}

/// What an election or a partition set needs of its store, checked once
/// when it is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    /// A partition set: the group's member set too.
    pub partitions: bool,
    /// Accept a store that may evict leases (Redis' eviction policies).
    pub allow_eviction: bool,
    /// The ttl the leases will have (etcd counts whole seconds).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub ttl: std::time::Duration,
}

impl Store {
    /// Connect to the store `spec` names, whichever kind its URL's scheme
    /// says: the one connect path of every builder.
    pub async fn connect(spec: Connect) -> Result<Store> {
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
        match self {
            Store::Redis(shared) => shared.election(at, needs.into()).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.election(at, needs.ttl).await,
            Store::Memory(memory) => Ok(memory.backend(at)),
        }
    }

    /// Check this store for the partition set whose group is at `group`
    /// (its member set included).
    pub async fn check_partition_set(&self, group: Address<'_>, needs: Needs) -> Result<()> {
        match self {
            Store::Redis(shared) => shared.store.check(group, needs.into()).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.check(group, true, needs.ttl).await,
            Store::Memory(_) => Ok(()),
        }
    }

    /// Names of the elections that have a lease under `prefix` now, sorted.
    pub async fn elections(&self, prefix: &str) -> Result<Vec<String>> {
        match self {
            Store::Redis(shared) => shared.elections(prefix).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.list_elections(prefix).await,
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
            Store::Memory(memory) => Ok(vec![("memory".to_string(), Ok(memory.elections()))]),
        }
    }

    /// Where this store is, for messages (never with a password).
    pub fn describe(&self) -> String {
        match self {
            Store::Redis(shared) => shared.store.target().redacted(),
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.url().to_string(),
            Store::Memory(_) => "memory".to_string(),
        }
    }

    /// Carry out `ops` in one round trip: one pipeline on Redis, one lock
    /// on the memory store. The outer error means the round trip failed as
    /// a whole (no reply: the operations may or may not have run); the inner
    /// ones are each operation's own.
    pub async fn batch(&self, ops: &[Op<'_>]) -> Result<Vec<Result<Reply>>> {
        self.batch_counted(ops, &AtomicU64::new(0)).await
    }

    /// [`Store::batch`], adding to `round_trips` the pipelines it sends
    /// (one per node it goes to, a retry after a redirection or a
    /// script reload included).
    pub async fn batch_counted(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
    ) -> Result<Vec<Result<Reply>>> {
        match self {
            Store::Redis(shared) => shared.store.batch(ops, round_trips).await,
            #[cfg(feature = "etcd")]
            Store::Etcd(store) => store.batch(ops, round_trips).await,
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
        if let Store::Redis(shared) = self {
            shared.store.reset();
        }
    }
}

/// TLS files a builder was given: a CA certificate to verify the store
/// against, and (etcd only) a client certificate and its key.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub cert: Option<std::path::PathBuf>,
    pub key: Option<std::path::PathBuf>,
}

impl TlsFiles {
    /// The CA file for a Redis URL, which takes no client certificate
    /// (Redis authenticates with a password or an ACL user).
    pub fn for_redis(self, url: &str) -> Result<Option<std::path::PathBuf>> {
        if self.cert.is_some() || self.key.is_some() {
            return Err(Error::Config(format!(
                "a client certificate is for etcds:// clusters only; {} is a Redis URL",
                crate::redact_url(url)
            )));
        }
        Ok(self.ca)
    }
}

/// Fixed bugs of the etcd backend that hidden, **unsafe** builder switches
/// turn back on (see `ElectionBuilder::unsafe_etcd_tokens_without_clock` and
/// `unsafe_etcd_no_hedges`), so that tenure-chaos's failing-mode tests can
/// show its checker catches them. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EtcdBugs {
    /// A term's token is the counter's last value plus one, without the
    /// candidate's clock: a restore from an older backup rolls the counter
    /// back and the tokens of earlier terms are issued again, as the
    /// revision tokens before issue 22 were.
    pub tokens_without_clock: bool,
    /// A call is sent once and waits for its answer, never hedged to
    /// another member: a paused minority member holds the calls the
    /// balanced client gives it, and costs leaders their terms.
    pub no_hedges: bool,
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
) -> Result<bool> {
    let op = Op::RecordRun {
        at,
        id,
        token,
        // A keep of zero would delete the marker at once on Redis; one past
        // what Redis accepts (a signed 64-bit expiry) would leave it with
        // none. "Once ever" is a hundred years.
        keep_ms: u64::try_from(keep.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, MAX_KEEP_MS),
    };
    store.one(op).await?.into_record_run()
}

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
    pub fn new(
        store: Store,
        at: Address<'_>,
        notices: watch::Receiver<Notices>,
        subscription: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        Backend {
            store,
            prefix: at.prefix.to_string(),
            name: at.name.to_string(),
            notices,
            _subscription: subscription,
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

    pub async fn last_run(&self) -> Result<Option<std::time::Duration>> {
        let op = Op::LastRun { at: self.at() };
        self.store.one(op).await?.into_last_run()
    }

    pub async fn record_run(
        &self,
        id: &str,
        token: u64,
        keep: std::time::Duration,
    ) -> Result<bool> {
        record_run(&self.store, self.at(), id, token, keep).await
    }

    /// Drop the current connection for a new one (after a timeout).
    pub fn reset(&self) {
        self.store.reset();
    }

    pub fn notices(&self) -> watch::Receiver<Notices> {
        self.notices.clone()
    }
}
