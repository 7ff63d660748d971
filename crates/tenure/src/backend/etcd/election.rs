//! A term's beginning and end on etcd: acquire (the transaction that
//! creates the key, its witness and the token counter together), resign,
//! and inspect. Apart from renewals, from the sessions the terms hang on
//! and from the keys' encoding.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};

use super::codec::{
    decode, decode_counter, decode_witness, encode, is_witness_of, new_token, nth_kv, token_of,
    witness_value,
};
use super::layout::{counter_key, lease_key, witness_key};
use super::session::Attached;
use super::sweep::{Pending, Swept};
use super::{Address, EtcdStore};
use crate::machine::{AcquireReply, AcquireRequest};
use crate::term::Holder;
use crate::{Error, Result};

impl EtcdStore {
    pub(super) async fn acquire(
        &self,
        at: Address<'_>,
        request: &AcquireRequest<'_>,
    ) -> Result<AcquireReply> {
        let began = tokio::time::Instant::now();
        let keys = TermKeys {
            key: lease_key(at)?,
            witness: witness_key(at)?,
            counter: counter_key(at)?,
        };
        // A session lease may have expired since it was last used: then the
        // put fails (or its key goes with the lease) and one more try with
        // a new lease follows; so does a try that found the token counter
        // moved on since this store last saw it.
        for _ in 0..3 {
            if let Some(reply) = self.try_acquire(&keys, request, began).await? {
                return Ok(reply);
            }
        }
        Err(Error::Etcd {
            detail: "the lease changed hands twice while acquiring; trying again".into(),
        })
    }

    /// One try of [`EtcdStore::acquire`]: its reply, or `None` to try again.
    async fn try_acquire(
        &self,
        keys: &TermKeys,
        request: &AcquireRequest<'_>,
        began: tokio::time::Instant,
    ) -> Result<Option<AcquireReply>> {
        let (seen, last) = self.counter(&keys.counter);
        let token = if self.bugs.tokens_without_clock {
            last.saturating_add(1)
        } else {
            new_token(last).max(self.token_floor(&keys.key))
        };
        let value = encode(request, token);
        let witness_value = witness_value(request.id, token);
        let pended = std::sync::OnceLock::new();
        // The key, its witness and the counter are written together,
        // only if the counter is still as this store last saw it. Noted
        // as pending until its answer is read: see `sweep`.
        let attach = |lease, witness| {
            let pending = Pending {
                key: keys.key.clone(),
                token,
                value: value.clone(),
                lease,
                witness: keys.witness.clone(),
                witness_value: witness_value.clone(),
                witness_lease: witness,
                counter: keys.counter.clone(),
                seen,
                ttl: Duration::from_millis(request.ttl_ms),
                began,
                swept: Swept::default(),
            };
            let _ = pended.set(self.pend(pending));
            create_term(
                keys,
                seen,
                token,
                (&value, &witness_value),
                (lease, witness),
            )
        };
        let attached = self.on_sessions(request.id, request.ttl_ms, attach).await?;
        #[cfg(test)]
        self.stall_answer().await;
        let unpend = || {
            if let Some(number) = pended.get() {
                self.unpend(*number);
            }
        };
        let Some(attached) = attached else {
            // Refused for a lease gone: nothing was written.
            unpend();
            return Ok(None);
        };
        let txn = &attached.answer;
        if txn.succeeded() {
            return self.created(
                keys,
                request,
                token,
                &attached,
                (began, pended.get().copied()),
            );
        }
        unpend();
        let (found, witness) = (nth_kv(txn, 0), nth_kv(txn, 1));
        match nth_kv(txn, 2) {
            Some(counter) => {
                let value = decode_counter(&keys.counter, &counter)?;
                self.saw_counter(&keys.counter, counter.mod_revision(), value);
            }
            None => self.saw_counter(&keys.counter, 0, last),
        }
        let Some(kv) = found else {
            return self.witnessed(keys, request, witness).await;
        };
        self.held(keys, request, &attached, (&kv, witness.as_ref()), began)
            .await
    }

    /// [`EtcdStore::try_acquire`] when its transaction created the term
    /// `token`: won, or `None` if the session lease was found gone.
    fn created(
        &self,
        keys: &TermKeys,
        request: &AcquireRequest<'_>,
        token: u64,
        attached: &Attached,
        (began, pended): (tokio::time::Instant, Option<u64>),
    ) -> Result<Option<AcquireReply>> {
        let txn = &attached.answer;
        let revision = txn.header().map_or(0, |h| h.revision());
        token_of(revision, &keys.key)?;
        self.saw_counter(&keys.counter, revision, token);
        if !attached.alive {
            // Put on a lease expiring meanwhile: what went on the other
            // lease stays pending, adopted by a retry of this attempt or
            // deleted by the sweep.
            return Ok(None);
        }
        let keep = || {
            self.kept(
                &keys.key,
                token,
                revision,
                attached.lease,
                request.ttl_ms,
                began,
            );
        };
        if !self.take_pending(pended, keep) {
            // Answered over a ttl late: the sweep is deleting its key.
            return Ok(None);
        }
        Ok(Some(AcquireReply::Won { token }))
    }

    /// [`EtcdStore::try_acquire`] when the key is gone: held off while its
    /// term's `witness` is there, else `None` (try again).
    async fn witnessed(
        &self,
        keys: &TermKeys,
        request: &AcquireRequest<'_>,
        witness: Option<KeyValue>,
    ) -> Result<Option<AcquireReply>> {
        let Some(witness) = witness else {
            // Free, but the counter had moved on (or the key was
            // deleted between the compare and the gets, which are
            // one transaction): try again with what was read.
            return Ok(None);
        };
        // The key vanished without its holder's release (deleted
        // or revoked by hand): its holder may still be acting
        // until its witness runs out, or until it releases the
        // witness, having stopped (announced by the watch).
        decode_witness(&keys.witness, &witness)?;
        let Some(wait) = self.ttl_left(witness.lease()).await? else {
            return Ok(None);
        };
        let ttl = Duration::from_millis(request.ttl_ms.max(request.hold_off_ms));
        Ok(Some(AcquireReply::HoldOff {
            wait: wait.min(ttl + Duration::from_secs(1)),
        }))
    }

    /// [`EtcdStore::try_acquire`] when the key `kv` is there: held, ours
    /// (adopted), or `None` when its lease has just expired.
    async fn held(
        &self,
        keys: &TermKeys,
        request: &AcquireRequest<'_>,
        attached: &Attached,
        (kv, witness): (&KeyValue, Option<&KeyValue>),
        began: tokio::time::Instant,
    ) -> Result<Option<AcquireReply>> {
        let (lease, alive) = (attached.lease, attached.alive);
        let holder = self.holder(&keys.key, kv).await?;
        // (A follower whose session lapsed finds the key held all the
        // same, and needs no new lease until it is free.) Adopted only
        // whole: its key and its witness, both on this instance's live
        // session leases (a witness whose lease expired meanwhile is gone,
        // and a term without it could let a candidate in early).
        let witnessed = |token| {
            witness
                .zip(attached.witness)
                .is_some_and(|(w, on)| is_witness_of(w, token, on))
        };
        let ours = holder.as_ref().is_some_and(|h| {
            h.id == request.id
                && h.attempt == request.attempt
                && kv.lease() == lease
                && alive
                && witnessed(h.token)
        });
        match holder {
            // Our own attempt wrote it before its answer was lost: the
            // keep-alive above has just renewed it. (Unless the sweep has
            // begun to delete it: then it is not ours to adopt.)
            Some(h) if ours => {
                let keep = || {
                    self.kept(
                        &keys.key,
                        h.token,
                        kv.create_revision(),
                        lease,
                        request.ttl_ms,
                        began,
                    );
                };
                if !self.adopt_pending(&keys.key, h.token, keep) {
                    return Ok(None);
                }
                Ok(Some(AcquireReply::Won { token: h.token }))
            }
            Some(h) => Ok(Some(AcquireReply::Held(h))),
            None => Ok(None),
        }
    }

    /// Who holds `key`, from its entry and its lease's ttl (`None` when the
    /// lease has just expired).
    pub(super) async fn holder(&self, key: &str, kv: &KeyValue) -> Result<Option<Holder>> {
        let decoded = decode(key, kv)?;
        let Some(ttl_left) = self.ttl_left(kv.lease()).await? else {
            return Ok(None);
        };
        Ok(Some(Holder {
            ttl_left,
            ..decoded
        }))
    }

    /// Delete the key if it is still the term (`id`, `token`): the owner
    /// is read first, and the delete goes ahead only if the key has not
    /// changed since (its `mod_revision` is still the term's). The term's
    /// witness goes with it; and when the key is gone already (deleted or
    /// revoked by hand), the witness is deleted on its own: this is the
    /// holder's release, made after it stopped, which lets the next
    /// candidate in without waiting for the witness to run out.
    pub(super) async fn resign(&self, at: Address<'_>, id: &str, token: u64) -> Result<bool> {
        let key = lease_key(at)?;
        let witness_key = witness_key(at)?;
        // Forgotten only once the store has answered: a resign that failed
        // (the cluster unreachable) may have left the key on the session
        // lease, which the instance's other terms keep alive; the sweep
        // deletes it a ttl after the term's last renewal.
        let released = self.delete_term(&key, &witness_key, id, token).await?;
        self.released(&key, token);
        if !released {
            self.delete_witness(&witness_key, id, token).await?;
        }
        Ok(released)
    }

    /// Delete the key and witness of term (`id`, `token`) if the key is
    /// still that term's.
    async fn delete_term(
        &self,
        key: &str,
        witness_key: &str,
        id: &str,
        token: u64,
    ) -> Result<bool> {
        let delete = |compares: Vec<Compare>| {
            Txn::new()
                .when(compares)
                .and_then([TxnOp::delete(key, None), TxnOp::delete(witness_key, None)])
        };
        // A term this store began for `id` is on `id`'s session lease: one
        // transaction checks both halves of the term, (id by its lease,
        // token by the revision), and deletes.
        let kept = self.terms_lock().get(key).copied();
        let session = |ttl: Duration| {
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            self.sessions_lock().get(&(id.to_string(), ttl_ms)).copied()
        };
        if let Some(kept) = kept.filter(|k| k.token == token && session(k.ttl) == Some(k.lease)) {
            let txn = delete(vec![
                Compare::mod_revision(key, CompareOp::Equal, kept.revision),
                Compare::lease(key, CompareOp::Equal, kept.lease),
            ]);
            return Ok(self.txn(txn).await?.succeeded());
        }
        let Some(kv) = self.get(key).await? else {
            return Ok(false);
        };
        let holder = decode(key, &kv)?;
        if holder.token != token || holder.id != id || kv.mod_revision() != kv.create_revision() {
            return Ok(false);
        }
        let txn = delete(vec![Compare::mod_revision(
            key,
            CompareOp::Equal,
            kv.mod_revision(),
        )]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Delete the witness of the term (`id`, `token`) if it is still
    /// there (its key is gone): its value names the term's owner and
    /// token, so no other term's witness is touched, nor this one by
    /// anyone but its owner.
    async fn delete_witness(&self, witness_key: &str, id: &str, token: u64) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::value(
                witness_key,
                CompareOp::Equal,
                witness_value(id, token),
            )])
            .and_then([TxnOp::delete(witness_key, None)]);
        self.txn(txn).await?;
        Ok(())
    }

    /// The token counter at `counter_key` as last seen: (its mod
    /// revision, 0 when it was missing; its value).
    fn counter(&self, counter_key: &str) -> (i64, u64) {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.get(counter_key).copied().unwrap_or((0, 0))
    }

    /// Remember the token counter as read or written at `revision`.
    fn saw_counter(&self, counter_key: &str, revision: i64, value: u64) {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.insert(counter_key.to_string(), (revision, value));
    }

    pub(super) async fn inspect(&self, at: Address<'_>) -> Result<Option<Holder>> {
        let key = lease_key(at)?;
        match self.get(&key).await? {
            Some(kv) => self.holder(&key, &kv).await,
            None => Ok(None),
        }
    }
}

/// The keys of one election's term: its key, witness and token counter.
struct TermKeys {
    key: String,
    witness: String,
    counter: String,
}

/// The transaction of [`EtcdStore::try_acquire`]: the term's key and
/// witness (`values`) put on the session leases (`leases`), and the
/// counter set to `token`, only if neither key exists and the counter is
/// still at revision `seen`; else the three are read.
fn create_term(
    keys: &TermKeys,
    seen: i64,
    token: u64,
    (value, witness_value): (&str, &str),
    (lease, witness): (i64, i64),
) -> Txn {
    let TermKeys {
        key,
        witness: witness_key,
        counter: counter_key,
    } = keys;
    Txn::new()
        .when([
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Compare::create_revision(witness_key.clone(), CompareOp::Equal, 0),
            Compare::mod_revision(counter_key.clone(), CompareOp::Equal, seen),
        ])
        .and_then([
            TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::put(
                witness_key.clone(),
                witness_value,
                Some(PutOptions::new().with_lease(witness)),
            ),
            TxnOp::put(counter_key.clone(), token.to_string(), None),
        ])
        .or_else([
            TxnOp::get(key.clone(), None),
            TxnOp::get(witness_key.clone(), None),
            TxnOp::get(counter_key.clone(), None),
        ])
}
