//! Renewals on ZooKeeper: a `multi` of existence checks of each term's
//! lease and witness, on the terms' session. The session's own traffic
//! keeps the znodes; the checks prove, through the ensemble's leader, that
//! the session was alive and the znodes there after the caller's send
//! instant. One request renews every term of a batch.

use zookeeper_client as zk;

use super::layout::Paths;
use super::{Address, ZkStore};
use crate::error::copy_error;
use crate::machine::RenewReply;
use crate::{Error, Result};

impl ZkStore {
    pub(super) async fn renew(
        &self,
        at: Address<'_>,
        id: &str,
        token: u64,
        ttl_ms: u64,
    ) -> Result<RenewReply> {
        let paths = self.paths(at)?;
        let mut replies = self.renew_terms(ttl_ms, &[(paths, token)]).await?;
        let reply = replies
            .pop()
            .unwrap_or_else(|| Err(Error::internal("a renewal of one term had no reply")))?;
        if let RenewReply::NotOwner(_) = reply {
            // Who holds it now, for the keeper's message: not this term,
            // whose lease may outlive its witness deleted by hand (its
            // loss is then no take-over by itself).
            let holder = self
                .inspect(at)
                .await
                .ok()
                .flatten()
                .filter(|holder| holder.token != token || holder.id != id);
            return Ok(RenewReply::NotOwner(holder));
        }
        Ok(reply)
    }

    pub(super) async fn renew_many(
        &self,
        prefix: &str,
        _id: &str,
        ttl_ms: u64,
        terms: &[(&str, u64)],
    ) -> Vec<Result<RenewReply>> {
        let mut paths = Vec::with_capacity(terms.len());
        for (name, token) in terms {
            match self.paths(Address::new(prefix, name)) {
                Ok(p) => paths.push((p, *token)),
                Err(err) => return terms.iter().map(|_| Err(copy_error(&err))).collect(),
            }
        }
        match self.renew_terms(ttl_ms, &paths).await {
            Ok(replies) => replies,
            Err(err) => terms.iter().map(|_| Err(copy_error(&err))).collect(),
        }
    }

    /// Renew `terms` (each its paths and token) of the session of
    /// `ttl_ms`: one `multi` for all; a term whose check fails is answered
    /// `NotOwner` and the rest are checked again without it.
    async fn renew_terms(
        &self,
        ttl_ms: u64,
        terms: &[(Paths, u64)],
    ) -> Result<Vec<Result<RenewReply>>> {
        let mut replies: Vec<Option<Result<RenewReply>>> = terms.iter().map(|_| None).collect();
        let Some(client) = self.session_if_open(ttl_ms).await else {
            // No session of this ttl: its terms went with the last one.
            return Ok(terms
                .iter()
                .map(|_| Ok(RenewReply::NotOwner(None)))
                .collect());
        };
        let session = client.session_id().0;
        let mut left: Vec<usize> = Vec::new();
        for (n, (paths, token)) in terms.iter().enumerate() {
            let on_session = self
                .terms_lock()
                .get(&paths.lease)
                .is_some_and(|k| k.token == *token && k.session == session);
            if on_session {
                left.push(n);
            } else {
                replies[n] = Some(Ok(RenewReply::NotOwner(None)));
            }
        }
        while !left.is_empty() {
            let sent = tokio::time::Instant::now();
            match self.check_all(&client, terms, &left).await {
                Ok(()) => {
                    for &n in &left {
                        let (paths, token) = &terms[n];
                        self.renewed(&paths.lease, *token, sent);
                        replies[n] = Some(Ok(RenewReply::Renewed));
                    }
                    left.clear();
                }
                // Two checks per term: the failed one's term. An index the
                // request did not have is the server's error, not a panic.
                Err(Check::Failed(index)) if index / 2 < left.len() => {
                    let n = left.remove(index / 2);
                    replies[n] = Some(Ok(RenewReply::NotOwner(None)));
                }
                Err(Check::Failed(index)) => {
                    let err = Error::ZooKeeper {
                        detail: format!(
                            "a renewal's multi of {} checks failed at index {index}",
                            left.len() * 2
                        ),
                    };
                    for &n in &left {
                        replies[n] = Some(Err(copy_error(&err)));
                    }
                    left.clear();
                }
                Err(Check::Error(err)) => {
                    for &n in &left {
                        replies[n] = Some(Err(copy_error(&err)));
                    }
                    left.clear();
                }
            }
        }
        Ok(replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::internal("a term had no renewal reply"))))
            .collect())
    }

    /// Whether the term `token` still holds the election at `paths`: its
    /// lease and witness checked in one `multi`, through the ensemble's
    /// leader (a read may be answered from a member's stale view).
    pub(super) async fn still_holds(
        &self,
        client: &zk::Client,
        paths: &Paths,
        token: u64,
    ) -> Result<bool> {
        match self
            .check_all(client, &[(paths.clone(), token)], &[0])
            .await
        {
            Ok(()) => Ok(true),
            Err(Check::Failed(_)) => Ok(false),
            Err(Check::Error(err)) => Err(err),
        }
    }

    /// One `multi` checking the lease and witness of each term in `which`.
    async fn check_all(
        &self,
        client: &zk::Client,
        terms: &[(Paths, u64)],
        which: &[usize],
    ) -> std::result::Result<(), Check> {
        let mut multi = client.new_multi_writer();
        for &n in which {
            let (paths, token) = &terms[n];
            multi
                .add_check_version(&paths.lease, -1)
                .and_then(|()| multi.add_check_version(&paths.witness(*token), -1))
                .map_err(|err| Check::Error(self.classify(&paths.lease, err)))?;
        }
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match tokio::time::timeout(self.call_timeout, multi.commit()).await {
            Err(_) => Err(Check::Error(Error::Timeout(self.call_timeout))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(zk::MultiWriteError::OperationFailed {
                index,
                source: zk::Error::NoNode | zk::Error::BadVersion,
            })) => Err(Check::Failed(index)),
            Ok(Err(err)) => {
                let path = which.first().map_or("", |&n| terms[n].0.lease.as_str());
                Err(Check::Error(self.classify(path, err.into())))
            }
        }
    }
}

/// Why [`ZkStore::check_all`] did not renew.
enum Check {
    /// The check at this index of the `multi` failed (its znode is gone).
    Failed(usize),
    /// The request failed as a whole.
    Error(Error),
}
