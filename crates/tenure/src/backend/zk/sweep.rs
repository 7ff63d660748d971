//! The terms and members this store began, and their sweep.
//!
//! A term's znodes hang on a session that every other term of its ttl
//! keeps alive, so a term that ends without its release reaching the
//! ensemble (the release timed out, the deadline passed while the
//! ensemble was away) would hold its election for as long as the process
//! lives. The store remembers each term it began, with the instant of its
//! last renewal, and deletes the znodes of any that nobody renewed for a
//! whole ttl: by then its deadline has passed, so its keeper has stopped.
//! Members of a partition set that nobody heartbeat for a ttl go the same
//! way.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::layout::Paths;
use super::ZkStore;

/// A term (or a member) this store began.
#[derive(Debug, Clone)]
pub(super) struct Kept {
    pub token: u64,
    pub ttl_ms: u64,
    /// The session its znodes are on.
    pub session: i64,
    /// About when its last successful renewal (or heartbeat) was sent.
    pub renewed: Instant,
    pub paths: Paths,
}

impl Kept {
    fn lapsed(&self, now: Instant) -> bool {
        now >= self.renewed + Duration::from_millis(self.ttl_ms)
    }
}

impl ZkStore {
    pub(super) fn terms_lock(&self) -> MutexGuard<'_, HashMap<String, Kept>> {
        self.terms.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn members_lock(&self) -> MutexGuard<'_, HashMap<String, Kept>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the term `token` of the lease at `lease` is one this store
    /// keeps.
    pub(super) fn is_kept(&self, lease: &str, token: u64) -> bool {
        self.terms_lock()
            .get(lease)
            .is_some_and(|k| k.token == token)
    }

    /// The ttl of the kept term `token` at `lease`.
    pub(super) fn kept_ttl(&self, lease: &str, token: u64) -> Option<u64> {
        let terms = self.terms_lock();
        terms
            .get(lease)
            .filter(|k| k.token == token)
            .map(|k| k.ttl_ms)
    }

    /// Keep the term `token` at `paths` from before its `multi` is sent;
    /// `false` (keep nothing) while another term of that lease is kept on
    /// `session` and has not lapsed: an acquire of this store under way,
    /// or a term not yet released.
    pub(super) fn pend_term(
        &self,
        paths: &Paths,
        token: u64,
        ttl_ms: u64,
        session: i64,
        began: Instant,
    ) -> bool {
        let mut terms = self.terms_lock();
        if let Some(kept) = terms.get(&paths.lease) {
            if kept.session == session && !kept.lapsed(Instant::now()) {
                return false;
            }
        }
        let kept = Kept {
            token,
            ttl_ms,
            session,
            renewed: began,
            paths: paths.clone(),
        };
        terms.insert(paths.lease.clone(), kept);
        true
    }

    pub(super) fn forget_term(&self, lease: &str, token: u64) {
        let mut terms = self.terms_lock();
        if terms.get(lease).is_some_and(|k| k.token == token) {
            terms.remove(lease);
        }
    }

    /// Note that the term `token` at `lease` was renewed by a request sent
    /// at `sent`.
    pub(super) fn renewed(&self, lease: &str, token: u64, sent: Instant) {
        if let Some(kept) = self.terms_lock().get_mut(lease) {
            if kept.token == token && kept.renewed < sent {
                kept.renewed = sent;
            }
        }
    }

    /// Delete the znodes of every term nobody renewed for a ttl, and of
    /// every member nobody heartbeat for one.
    pub(super) async fn sweep(&self) {
        let now = Instant::now();
        let lapsed: Vec<Kept> = self
            .terms_lock()
            .values()
            .filter(|k| k.lapsed(now))
            .cloned()
            .collect();
        for kept in lapsed {
            let Some(client) = self.session_if_open(kept.ttl_ms).await else {
                self.forget_term(&kept.paths.lease, kept.token);
                continue;
            };
            if client.session_id().0 != kept.session {
                // Its session expired, and its znodes with it.
                self.forget_term(&kept.paths.lease, kept.token);
                continue;
            }
            if let Err(err) = self.clear(&client, &kept.paths, kept.token).await {
                tracing::debug!(lease = %kept.paths.lease, error = %err, "sweep failed; next time");
            }
        }
        let members: Vec<(String, Kept)> = self
            .members_lock()
            .iter()
            .filter(|(_, k)| k.lapsed(now))
            .map(|(path, k)| (path.clone(), k.clone()))
            .collect();
        for (path, kept) in members {
            if let Some(client) = self.session_if_open(kept.ttl_ms).await {
                if client.session_id().0 == kept.session
                    && self.delete(&client, &path, None).await.is_err()
                {
                    continue;
                }
            }
            self.members_lock().remove(&path);
        }
    }
}

/// Sweep `store` every 250 ms until it is dropped.
pub(crate) fn start(store: &Arc<ZkStore>) {
    let weak = Arc::downgrade(store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(store) = weak.upgrade() else { return };
            store.sweep().await;
        }
    });
}
