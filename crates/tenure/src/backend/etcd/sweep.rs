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

/// How long after the sweep began to delete what a pending acquire wrote
/// the store remembers it (at least; four call timeouts if that is
/// longer). While the election's token counter has not moved, the sweep
/// keeps looking for its key (an acquire can still land then: etcd may
/// apply a proposal after the call that made it timed out); beyond it the
/// write is taken never to land. And until then no retry may adopt what
/// it wrote, nor may its own late answer win: a read of the key made
/// before the sweep's delete landed can come back after it, within a call
/// timeout.
const PENDING_AT_MOST: Duration = Duration::from_secs(60);

/// The first wait between two looks of the sweep for an unanswered
/// acquire's key that it did not find; it doubles at each look.
const FIRST_LOOK_AGAIN: Duration = Duration::from_millis(250);

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
    /// The election's witness, and the value it puts there, on
    /// `witness_lease`.
    pub(super) witness: String,
    pub(super) witness_value: String,
    pub(super) witness_lease: i64,
    /// The token counter's key, and the mod revision the transaction
    /// compares it with: once the counter has moved on, the write can no
    /// longer land.
    pub(super) counter: String,
    pub(super) seen: i64,
    pub(super) ttl: Duration,
    /// When the acquire began: its term's local deadline, had it been
    /// won, is at most this plus the ttl.
    pub(super) began: tokio::time::Instant,
    /// What the sweep has done with it so far.
    pub(super) swept: Swept,
}

/// What the sweep has done with a [`Pending`] acquire.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Swept {
    /// The sweep has begun to delete what it wrote (then): from then on no
    /// retry of the same attempt may adopt it, and its own answer may not
    /// win.
    pub(super) doomed: Option<tokio::time::Instant>,
    /// Its write was found (and deleted), or can no longer land: nothing
    /// is left to look for, and only the tombstone stays.
    pub(super) settled: bool,
    /// How often the sweep has looked for it without finding it, and when
    /// it looks again.
    pub(super) looks: u32,
    pub(super) next_look: Option<tokio::time::Instant>,
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

    /// Note that the answer of the acquire pended as `number` was read and
    /// wrote nothing.
    pub(super) fn unpend(&self, number: u64) {
        self.pending_lock().remove(&number);
    }

    /// The answer of the acquire pended as `number` says it won: whether
    /// it may keep its term (then `keep` notes it, while the sweep cannot
    /// look), or not, because the sweep has begun to delete what it wrote
    /// (the answer came back more than a ttl after the acquire began).
    /// An entry no longer there counts as doomed: only the sweep removes
    /// one while its answer is awaited.
    pub(super) fn take_pending(&self, number: Option<u64>, keep: impl FnOnce()) -> bool {
        let mut pending = self.pending_lock();
        if let Some(number) = number {
            if pending
                .get(&number)
                .is_none_or(|p| p.swept.doomed.is_some())
            {
                return false;
            }
            pending.remove(&number);
        }
        keep();
        true
    }

    /// Whether a retry may adopt the term (`key`, `token`) that an
    /// earlier try of its attempt wrote, its answer lost (then `keep`
    /// notes it, while the sweep cannot look): not once the sweep has
    /// begun to delete it. Adopted, it is no longer pending.
    pub(super) fn adopt_pending(&self, key: &str, token: u64, keep: impl FnOnce()) -> bool {
        let mut pending = self.pending_lock();
        let of_term = |p: &Pending| p.key == key && p.token == token;
        if pending
            .values()
            .any(|p| of_term(p) && p.swept.doomed.is_some())
        {
            return false;
        }
        pending.retain(|_, p| !of_term(p));
        keep();
        true
    }

    /// The least token a new try on `key` may take: above every token of
    /// this store's pending tries there (tombstones included) and of its
    /// kept term. So no two tries of this store ever write the same witness
    /// value (it names only the id and the token), and the sweep's
    /// compare of a witness finds the one try's that it looks for.
    pub(super) fn token_floor(&self, key: &str) -> u64 {
        let pending = self
            .pending_lock()
            .values()
            .filter(|p| p.key == key)
            .map(|p| p.token)
            .max()
            .unwrap_or(0);
        let kept = self.terms_lock().get(key).map_or(0, |k| k.token);
        pending.max(kept).saturating_add(1)
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
        let due: Vec<(u64, Pending)> = {
            let mut pending = self.pending_lock();
            let remembered = PENDING_AT_MOST.max(self.call_timeout * 4);
            pending.retain(|_, p| p.swept.doomed.is_none_or(|at| now <= at + remembered));
            pending
                .iter_mut()
                .filter(|(_, p)| {
                    !p.swept.settled
                        && now > p.began + p.ttl
                        && p.swept.next_look.is_none_or(|at| now >= at)
                })
                .map(|(number, p)| {
                    p.swept.doomed.get_or_insert(now);
                    (*number, p.clone())
                })
                .collect()
        };
        for (number, pending) in due {
            let (key, token) = (&pending.key, pending.token);
            let witness_key = &pending.witness;
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
                                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
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
            let swept = match tokio::time::timeout(self.call_timeout, self.txn(txn)).await {
                Ok(Ok(swept)) => swept,
                Ok(Err(err)) => {
                    tracing::debug!(key = %key, error = %err, "cannot look for an unanswered acquire's key yet");
                    self.look_again(number, now);
                    continue;
                }
                Err(_) => {
                    self.look_again(number, now);
                    continue;
                }
            };
            let landed = swept.succeeded();
            if landed {
                tracing::info!(key = %key, token, "deleted the key of an acquire whose answer was never read");
            }
            let counter_moved = nth_kv(&swept, 0).map_or(0, |kv| kv.mod_revision()) != pending.seen;
            if landed || counter_moved {
                if let Some(p) = self.pending_lock().get_mut(&number) {
                    p.swept.settled = true;
                }
            } else {
                self.look_again(number, now);
            }
        }
    }

    /// The sweep did not find what the acquire pended as `number` wrote:
    /// it looks again later, each wait twice the last.
    fn look_again(&self, number: u64, now: tokio::time::Instant) {
        if let Some(p) = self.pending_lock().get_mut(&number) {
            p.swept.looks = p.swept.looks.saturating_add(1);
            p.swept.next_look = Some(now + FIRST_LOOK_AGAIN * (1 << p.swept.looks.min(6)));
        }
    }
}
