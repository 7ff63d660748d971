//! Where leases live: the seam between the election logic and storage.
//!
//! A backend offers four atomic operations on one election's lease
//! (acquire, renew, resign, inspect) and a stream of hints that the lease
//! changed hands. [`redis`] is the production backend; [`memory`] is a
//! deterministic in-process stand-in for tests. An etcd backend (lease +
//! revision as the token) fits the same seam: it becomes one more variant of
//! [`Backend`], with no change to the public API.

pub(crate) mod memory;
pub(crate) mod redis;

use tokio::sync::watch;

use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::Result;

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

/// One election's storage.
pub(crate) enum Backend {
    Redis(Box<redis::RedisBackend>),
    Memory(memory::MemoryBackend),
}

impl Backend {
    pub async fn acquire(&self, request: &AcquireRequest<'_>) -> Result<AcquireReply> {
        match self {
            Backend::Redis(b) => b.acquire(request).await,
            Backend::Memory(b) => b.acquire(request).await,
        }
    }

    pub async fn renew(&self, owner: &str, token: u64, ttl_ms: u64) -> Result<RenewReply> {
        match self {
            Backend::Redis(b) => b.renew(owner, token, ttl_ms).await,
            Backend::Memory(b) => b.renew(owner, token, ttl_ms).await,
        }
    }

    pub async fn resign(&self, owner: &str, token: u64) -> Result<bool> {
        match self {
            Backend::Redis(b) => b.resign(owner, token).await,
            Backend::Memory(b) => b.resign(owner, token).await,
        }
    }

    pub async fn inspect(&self) -> Result<Option<Holder>> {
        match self {
            Backend::Redis(b) => b.inspect().await,
            Backend::Memory(b) => b.inspect().await,
        }
    }

    /// Drop the current connection for a new one (after a timeout).
    pub fn reset(&self) {
        match self {
            Backend::Redis(b) => b.reset(),
            Backend::Memory(_) => {}
        }
    }

    pub fn notices(&self) -> watch::Receiver<Notices> {
        match self {
            Backend::Redis(b) => b.notices(),
            Backend::Memory(b) => b.notices(),
        }
    }
}
