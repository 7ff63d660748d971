//! The terms this store began, and the sweep that deletes the key of any
//! that nobody renewed for a whole ttl: its key hangs on a session lease
//! that the instance's other terms keep alive, so it would never lapse by
//! itself.
//!
//! The same goes for a term whose acquire was sent but whose answer never
//! came back to it: the call timed out, or its caller dropped it (a
//! campaign cancelled, a semaphore giving up the permits it no longer
//! needs). If the write landed, its key hangs on the session lease too,
//! held by a term that nobody knows of. So every acquire is noted as
//! *pending* before it is sent, and the sweep looks for the keys of those
//! whose answer was never read.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::codec::nth_kv;
use super::layout::key_dir;
use super::EtcdStore;

/// How long after its acquire began the sweep keeps looking for a
/// pending term's key while the election's token counter has not moved
/// (an acquire can still land while it has not: etcd may apply a
/// proposal after the call that made it timed out). Beyond it the write is
/// taken never to land.
const PENDING_AT_MOST: Duration = Duration::from_secs(60);

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

/// An acquire sent whose answer has not been read (see the module docs):
/// what its transaction writes, if it lands.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The election's key, and the token of the term it would begin.
    pub(super) key: String,
    pub(super) token: u64,
    /// The value it puts at the election's key, on `lease`.
    pub(super) value: String,
    pub(super) lease: i64,
    /// The value it puts at the election's witness, on `witness_lease`.
    pub(super) witness_value: String,
    pub(super) witness_lease: i64,
    /// The token counter's key, and the mod revision the transaction
    /// compares it with: once the counter has moved on, the write can no
    /// longer land.
    pub(super) counter: String,
    pub(super) seen: i64,
    pub(super) ttl: Duration,
    /// Set when the sweep is about to delete what it wrote: from then on
    /// a retry of the same attempt may not adopt it.
    pub(super) doomed: bool,
    /// When the acquire began: its term's local deadline, had it been
    /// won, is at most this plus the ttl.
    pub(super) began: tokio::time::Instant,
}

impl EtcdStore {
    /// Note that an acquire is about to be sent; the number to
    /// [`EtcdStore::unpend`] it by.
    pub(super) fn pend(&self, pending: Pending) -> u64 {
        let number = self
            .pended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.pending_lock().insert(number, pending);
        number
    }

    /// Note that the answer of the acquire pended as `number` was read:
    /// whatever it did, its caller knows.
    pub(super) fn unpend(&self, number: u64) {
        self.pending_lock().remove(&number);
    }

    /// Whether a retry may adopt the term (`key`, `token`) that an
    /// earlier try of its attempt wrote, its answer lost: not once the
    /// sweep has begun to delete it. Adopted, it is no longer pending.
    pub(super) fn adopt_pending(&self, key: &str, token: u64) -> bool {
        let mut pending = self.pending_lock();
        let of_term = |p: &Pending| p.key == key && p.token == token;
        if pending.values().any(|p| of_term(p) && p.doomed) {
            return false;
        }
        pending.retain(|_, p| !of_term(p));
        true
    }

    fn pending_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

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
        self.sweep_kept().await;
        self.sweep_pending().await;
    }

    /// [`EtcdStore::sweep`] of the terms whose acquire was answered.
    async fn sweep_kept(&self) {
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

impl EtcdStore {
    /// [`EtcdStore::sweep`] of the acquires whose answer was never read,
    /// once a ttl has passed since they began (a term they won would be
    /// past its local deadline, and nobody was told of it anyway): the
    /// key and witness such an acquire wrote are deleted, or the witness
    /// alone when the key was deleted by hand since. An acquire is
    /// forgotten once its write is found, or can no longer land.
    async fn sweep_pending(&self) {
        let now = tokio::time::Instant::now();
        let due: Vec<(u64, Pending)> = self
            .pending_lock()
            .iter_mut()
            .filter(|(_, p)| now > p.began + p.ttl)
            .map(|(number, p)| {
                p.doomed = true;
                (*number, p.clone())
            })
            .collect();
        for (number, pending) in due {
            let (key, token) = (&pending.key, pending.token);
            let witness_key = format!("{}/witness", key_dir(key));
            let txn = Txn::new()
                .when([
                    Compare::value(key.clone(), CompareOp::Equal, pending.value.clone()),
                    Compare::lease(key.clone(), CompareOp::Equal, pending.lease),
                ])
                .and_then([
                    TxnOp::delete(key.clone(), None),
                    TxnOp::delete(witness_key.clone(), None),
                ])
                .or_else([
                    TxnOp::get(pending.counter.clone(), None),
                    TxnOp::txn(
                        Txn::new()
                            .when([
                                Compare::value(
                                    witness_key.clone(),
                                    CompareOp::Equal,
                                    pending.witness_value.clone(),
                                ),
                                Compare::lease(
                                    witness_key.clone(),
                                    CompareOp::Equal,
                                    pending.witness_lease,
                                ),
                            ])
                            .and_then([TxnOp::delete(witness_key.clone(), None)]),
                    ),
                ]);
            let swept = match self.txn(txn).await {
                Ok(swept) => swept,
                Err(err) => {
                    tracing::debug!(key = %key, error = %err, "cannot look for an unanswered acquire's key yet");
                    continue;
                }
            };
            let landed = swept.succeeded();
            if landed {
                tracing::info!(key = %key, token, "deleted the key of an acquire whose answer was never read");
            }
            let counter_moved = nth_kv(&swept, 0).map_or(0, |kv| kv.mod_revision()) != pending.seen;
            if landed || counter_moved || now > pending.began + PENDING_AT_MOST {
                self.unpend(number);
            }
        }
    }
}
