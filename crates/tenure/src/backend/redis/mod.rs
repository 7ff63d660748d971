//! The Redis backend: each lease operation is one server-side script.
//!
//! An election talks to Redis over connections of its own: a
//! [`ConnectionManager`] for the scripts (so renewals never queue behind the
//! application's other traffic, and a dropped connection is re-established
//! in the background without replaying commands) and a pub/sub connection
//! for release notifications. The subscriber task resubscribes by itself
//! after any disconnect and counts each resubscription as a possible missed
//! release, so waiting candidates re-check the lease instead of sleeping
//! through a handover.

pub(crate) mod checks;
pub(crate) mod connection;
pub(crate) mod keys;
pub(crate) mod pubsub;
pub(crate) mod routed;
pub(crate) mod scripts;
pub(crate) mod sharded;
pub(crate) mod store;
pub(crate) mod target;
pub(crate) mod topology;

use std::sync::Arc;
use std::time::Duration;

use crate::backend::address::Address;
use crate::backend::op::Hints;
use crate::backend::options::Needs;
use crate::{Error, Result};
pub(crate) use checks::StoreChecks;
use keys::Keys;
use pubsub::Subscriber;
pub(crate) use store::RedisStore;
pub(crate) use target::{classify, RedisTarget};
use topology::Following;

/// A Redis store and its subscriber: everything elections and partition
/// sets on one Redis share.
pub(crate) struct RedisShared {
    pub store: Arc<RedisStore>,
    /// Started by the first election (partition sets have no followers to
    /// wake, and open no pub/sub connection), and again by the next one if
    /// its task has stopped (the runtime it ran on was shut down).
    subscriber: std::sync::Mutex<Option<Subscriber>>,
}

impl From<Needs> for StoreChecks {
    fn from(needs: Needs) -> Self {
        StoreChecks {
            partitions: needs.partitions,
            allow_eviction: needs.allow_eviction,
        }
    }
}

impl RedisShared {
    pub async fn connect(
        target: RedisTarget,
        call_timeout: Duration,
        following: Following,
    ) -> Result<Arc<Self>> {
        let store = RedisStore::connect(target, call_timeout, following).await?;
        Ok(Arc::new(RedisShared {
            store: Arc::new(store),
            subscriber: std::sync::Mutex::new(None),
        }))
    }

    /// An election on this Redis: checked (permissions, eviction), and
    /// subscribed to its announcements.
    pub async fn election(self: &Arc<Self>, at: Address<'_>, checks: StoreChecks) -> Result<Hints> {
        self.store.check(at, checks).await?;
        let events = Keys::events_of(at);
        let subscribed = {
            let mut subscriber = self.subscriber.lock().unwrap_or_else(|p| p.into_inner());
            let running = subscriber.as_ref().filter(|s| !s.has_stopped());
            let subscriber = match running {
                Some(running) => running,
                None => subscriber.insert(Subscriber::start(self.store.topology().clone())),
            };
            subscriber.subscribe(&events)
        };
        let (notices, subscription) = subscribed.await?;
        Ok(Hints {
            notices,
            guard: Some(Box::new((subscription, self.clone()))),
        })
    }

    /// A connection for the application's own commands, on this store's
    /// topology (shared with its elections).
    pub fn connection(&self) -> routed::Connection {
        routed::Connection::on(self.store.topology().clone())
    }

    /// Every primary with the elections it holds under `prefix`.
    pub async fn elections_by_node(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Result<Vec<String>>)>> {
        routed::list_elections_by_node(&self.connection(), prefix).await
    }

    /// Names of all elections with a live lease under `prefix`, sorted, read
    /// with `SCAN` (never `KEYS`) on every primary. Fails when any primary
    /// cannot be read, naming it; [`RedisShared::elections_by_node`] lists
    /// what can be.
    pub async fn elections(&self, prefix: &str) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for (node, listed) in self.elections_by_node(prefix).await? {
            match listed {
                Ok(found) => names.extend(found),
                // A person must act on these (a missing ACL permission,
                // foreign data): they are returned as they are.
                Err(err) if !err.is_transient() => return Err(err),
                Err(err) => {
                    return Err(Error::Unreachable {
                        url: node,
                        detail: format!("cannot list its elections: {err}"),
                    })
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }
}
