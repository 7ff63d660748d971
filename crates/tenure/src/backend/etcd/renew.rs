//! Renewing terms on etcd: one term (a keep-alive of both session leases
//! and a read of its key and witness), or many of one instance at once
//! (the same keep-alives, and transactions of compares only). Apart from
//! acquire and resign, which write.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use futures_util::future::join_all;

use super::codec::{decode, is_term, is_witness_of, nth_kv, witness_value};
use super::layout::{lease_key, witness_key};
use super::session::{witness_session, KeptAlive};
use super::{Address, EtcdStore};
use crate::error::copy_error;
use crate::machine::RenewReply;
use crate::Result;

/// The most terms one transaction of a [`Op::RenewMany`](crate::backend::op::Op::RenewMany) checks (four
/// compares per term: the key's revision and lease, the witness's revision
/// and lease): etcd refuses transactions of more than 128 operations by
/// default (`--max-txn-ops`).
const TERMS_PER_CHECK: usize = 32;

impl EtcdStore {
    pub(super) async fn renew(
        &self,
        at: Address<'_>,
        id: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<RenewReply> {
        let key = lease_key(at)?;
        let witness_key = witness_key(at)?;
        self.renewing(&key, token);
        let witness_id = witness_session(id);
        let lease = self.sessions_lock().get(&(id.to_string(), ttl_ms)).copied();
        let witness = self
            .sessions_lock()
            .get(&(witness_id.clone(), ttl_ms))
            .copied();
        let (Some(lease), Some(witness)) = (lease, witness) else {
            // No session: this store never granted the term.
            return Ok(RenewReply::NotOwner(self.inspect(at).await?));
        };
        let both = Txn::new().and_then([
            TxnOp::get(key.clone(), None),
            TxnOp::get(witness_key.clone(), None),
        ]);
        // The witness's keep-alive first (see `EtcdStore::on_sessions`).
        let (witness_alive, alive, got) = tokio::join!(
            biased;
            self.keep_alive(witness),
            self.keep_alive(lease),
            self.txn(both)
        );
        let got = got?;
        let (alive, witness_alive) = (alive?.0 > 0, witness_alive?.0 > 0);
        if !alive {
            self.forget(id, ttl_ms, lease);
        }
        if !witness_alive {
            self.forget(&witness_id, ttl_ms, witness);
        }
        // A term holds while its key and its witness both live: a witness
        // deleted or revoked by hand ends the term (its release then
        // deletes the key), so that a later delete of the key by hand
        // could never let a candidate in early.
        let witnessed =
            witness_alive && nth_kv(&got, 1).is_some_and(|w| is_witness_of(&w, token, witness));
        match nth_kv(&got, 0) {
            Some(kv) if is_term(&kv, token, lease) && alive && !witnessed => {
                Ok(RenewReply::NotOwner(None))
            }
            Some(kv) if is_term(&kv, token, lease) && alive => {
                let holder = decode(&key, &kv)?;
                if holder.id == id {
                    Ok(RenewReply::Renewed)
                } else {
                    Ok(RenewReply::NotOwner(Some(holder)))
                }
            }
            Some(kv) if alive || !is_term(&kv, token, lease) => {
                Ok(RenewReply::NotOwner(self.holder(&key, &kv).await?))
            }
            _ => Ok(RenewReply::NotOwner(None)),
        }
    }

    /// Renew many terms of `id`: one keep-alive of its session lease, and
    /// transactions of compares only (nothing written) that check each key
    /// is still the one its term created, on that lease.
    pub(super) async fn renew_many(
        &self,
        prefix: &str,
        id: &str,
        ttl_ms: u64,
        terms: &[(&str, u64)],
    ) -> Vec<Result<RenewReply>> {
        let witness_id = witness_session(id);
        let lease = self.sessions_lock().get(&(id.to_string(), ttl_ms)).copied();
        let witness = self
            .sessions_lock()
            .get(&(witness_id.clone(), ttl_ms))
            .copied();
        let (Some(lease), Some(witness)) = (lease, witness) else {
            return terms
                .iter()
                .map(|_| Ok(RenewReply::NotOwner(None)))
                .collect();
        };
        let keys: Vec<Result<(String, String)>> = terms
            .iter()
            .map(|(name, _)| {
                let at = Address::new(prefix, name);
                Ok((lease_key(at)?, witness_key(at)?))
            })
            .collect();
        for ((_, token), key) in terms.iter().zip(&keys) {
            if let Ok((key, _)) = key {
                self.renewing(key, *token);
            }
        }
        let checks = terms
            .chunks(TERMS_PER_CHECK)
            .zip(keys.chunks(TERMS_PER_CHECK))
            .map(|(chunk, keys)| self.check_chunk(id, chunk, keys, lease, witness));
        // The witness's keep-alive first (see `EtcdStore::on_sessions`).
        let (witness_alive, alive, checked) = tokio::join!(
            biased;
            self.keep_alive(witness),
            self.keep_alive(lease),
            join_all(checks)
        );
        let alive = match (alive, witness_alive) {
            (Ok(KeptAlive(ttl)), Ok(KeptAlive(witness_ttl))) => {
                if ttl <= 0 {
                    self.forget(id, ttl_ms, lease);
                }
                if witness_ttl <= 0 {
                    self.forget(&witness_id, ttl_ms, witness);
                }
                ttl > 0 && witness_ttl > 0
            }
            (Err(err), _) | (_, Err(err)) => {
                return terms.iter().map(|_| Err(copy_error(&err))).collect();
            }
        };
        renewed_many(terms, &keys, alive, checked)
    }

    /// One transaction of [`EtcdStore::renew_many`]: whether each term of
    /// `chunk` (with its `keys`) is still ours.
    async fn check_chunk(
        &self,
        id: &str,
        chunk: &[(&str, u64)],
        keys: &[Result<(String, String)>],
        lease: i64,
        witness: i64,
    ) -> Result<Vec<bool>> {
        let mut compares = Vec::with_capacity(chunk.len() * 4);
        for ((_, token), key) in chunk.iter().zip(keys) {
            let Ok((key, witness_key)) = key else {
                continue;
            };
            // A term this store did not begin is checked key by key.
            let revision = self.revision_of(key, *token).unwrap_or(-1);
            compares.push(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            ));
            compares.push(Compare::lease(key.clone(), CompareOp::Equal, lease));
            compares.push(Compare::value(
                witness_key.clone(),
                CompareOp::Equal,
                witness_value(id, *token),
            ));
            compares.push(Compare::lease(
                witness_key.clone(),
                CompareOp::Equal,
                witness,
            ));
        }
        let txn = Txn::new().when(compares);
        let all_ours = self.txn(txn).await.map(|t| t.succeeded());
        match all_ours {
            Ok(true) => Ok(vec![true; chunk.len()]),
            Ok(false) => self.which_are_ours(chunk, keys, lease, witness).await,
            Err(err) => Err(err),
        }
    }

    /// After a check of a chunk failed: which of its terms are still ours,
    /// key by key.
    async fn which_are_ours(
        &self,
        chunk: &[(&str, u64)],
        keys: &[Result<(String, String)>],
        lease: i64,
        witness: i64,
    ) -> Result<Vec<bool>> {
        let gets = chunk.iter().zip(keys).map(|((_, token), key)| async move {
            let Ok((key, witness_key)) = key else {
                return Ok(false);
            };
            let both = Txn::new().and_then([
                TxnOp::get(key.clone(), None),
                TxnOp::get(witness_key.clone(), None),
            ]);
            let got = self.txn(both).await?;
            Ok(
                nth_kv(&got, 0).is_some_and(|kv| is_term(&kv, *token, lease))
                    && nth_kv(&got, 1).is_some_and(|w| is_witness_of(&w, *token, witness)),
            )
        });
        join_all(gets).await.into_iter().collect()
    }
}

/// The replies of [`EtcdStore::renew_many`] to `terms` (with their
/// `keys`), from whether both session leases are `alive` and what each
/// chunk's check found.
fn renewed_many(
    terms: &[(&str, u64)],
    keys: &[Result<(String, String)>],
    alive: bool,
    checked: Vec<Result<Vec<bool>>>,
) -> Vec<Result<RenewReply>> {
    let mut replies = Vec::with_capacity(terms.len());
    for (chunk, checked) in terms.chunks(TERMS_PER_CHECK).zip(checked) {
        match checked {
            Ok(ours) => replies.extend(ours.into_iter().map(|ours| {
                Ok(if ours && alive {
                    RenewReply::Renewed
                } else {
                    RenewReply::NotOwner(None)
                })
            })),
            Err(err) => replies.extend(chunk.iter().map(|_| Err(copy_error(&err)))),
        }
    }
    for (reply, key) in replies.iter_mut().zip(keys) {
        if let Err(err) = key {
            *reply = Err(copy_error(err));
        }
    }
    replies
}
