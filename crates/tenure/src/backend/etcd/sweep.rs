//! The terms this store began, and the sweep that deletes the key of any
//! that nobody renewed for a whole ttl: its key hangs on a session lease
//! that the instance's other terms keep alive, so it would never lapse by
//! itself.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::layout::key_dir;
use super::EtcdStore;

/// A term this store began, for [`EtcdStore::sweep`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Kept {
    pub(super) token: u64,
    /// The revision that created the term's key (and witness).
    pub(super) revision: i64,
    pub(super) lease: i64,
    pub(super) ttl: Duration,
    /// When the last acquire or renewal of it began: its local deadline is
    /// at most this plus the ttl (minus the margin).
    pub(super) last: tokio::time::Instant,
}

impl EtcdStore {
    /// The revision that created term (`key`, `token`), if this store
    /// began it.
    pub(super) fn revision_of(&self, key: &str, token: u64) -> Option<i64> {
        let terms = self.terms_lock();
        terms
            .get(key)
            .filter(|kept| kept.token == token)
            .map(|kept| kept.revision)
    }

    /// Note a term this store has just begun (or adopted).
    pub(super) fn kept(
        &self,
        key: &str,
        token: u64,
        revision: i64,
        lease: i64,
        ttl_ms: u64,
        began: tokio::time::Instant,
    ) {
        let kept = Kept {
            token,
            revision,
            lease,
            ttl: Duration::from_millis(ttl_ms),
            last: began,
        };
        self.terms_lock().insert(key.to_string(), kept);
    }

    /// Note that a renewal of term (`key`, `token`) begins now.
    pub(super) fn renewing(&self, key: &str, token: u64) {
        if let Some(kept) = self.terms_lock().get_mut(key) {
            if kept.token == token {
                kept.last = tokio::time::Instant::now();
            }
        }
    }

    /// Forget term (`key`, `token`): released, or found gone.
    pub(super) fn released(&self, key: &str, token: u64) {
        let mut terms = self.terms_lock();
        if terms.get(key).is_some_and(|kept| kept.token == token) {
            terms.remove(key);
        }
    }

    pub(super) fn terms_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Kept>> {
        self.terms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delete the keys of terms nobody renews any more.
    ///
    /// On Redis, a term that ended without its lease being released (the
    /// release failed, the deadline passed, the handles were dropped while
    /// the store was away) lapses one ttl later. Here its key hangs on the
    /// instance's session lease, which the instance's other terms keep
    /// alive: it would block the election (for this instance too) for as
    /// long as the process runs. So the store remembers the terms it began,
    /// and a term not renewed for a whole ttl, whose local deadline has
    /// therefore passed (no handle of it may act any more), has its key
    /// deleted if it is still that term's on that lease.
    pub async fn sweep(&self) {
        let now = tokio::time::Instant::now();
        let stale: Vec<(String, Kept)> = self
            .terms_lock()
            .iter()
            .filter(|(_, kept)| now > kept.last + kept.ttl)
            .map(|(key, kept)| (key.clone(), *kept))
            .collect();
        for (key, kept) in stale {
            let revision = kept.revision;
            let witness_key = format!("{}/witness", key_dir(&key));
            // The key and witness if the key is still the term's on its
            // lease, else the witness alone if it is still the term's (its
            // key vanished by hand: the term's deadline has passed now).
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
                    Compare::lease(key.clone(), CompareOp::Equal, kept.lease),
                ])
                .and_then([
                    TxnOp::delete(key.clone(), None),
                    TxnOp::delete(witness_key.clone(), None),
                ])
                .or_else([TxnOp::txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(
                                witness_key.clone(),
                                CompareOp::Equal,
                                revision,
                            ),
                            Compare::lease(witness_key.clone(), CompareOp::NotEqual, 0),
                        ])
                        .and_then([TxnOp::delete(witness_key.clone(), None)]),
                )]);
            let swept = self.txn(txn).await;
            match swept {
                Ok(txn) => {
                    if txn.succeeded() {
                        tracing::info!(key = %key, token = kept.token, "deleted the key of a term that ended without releasing it");
                    }
                    self.released(&key, kept.token);
                }
                // Tried again at the next sweep.
                Err(err) => {
                    tracing::debug!(key = %key, error = %err, "cannot delete an ended term's key yet")
                }
            }
        }
    }
}
