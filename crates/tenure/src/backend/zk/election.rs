//! A term's beginning and end on ZooKeeper: acquire (the `multi` that
//! creates the lease, its witness and the next token together), resign and
//! inspect.

use std::time::Duration;

use zookeeper_client as zk;

use super::codec::{decode_counter, decode_lease, decode_witness, encode_counter, encode_lease};
use super::codec::{encode_witness, new_token};
use super::layout::{witness_token, Paths};
use super::sweep::Kept;
use super::{Address, ZkStore};
use crate::machine::{AcquireReply, AcquireRequest};
use crate::term::Holder;
use crate::{Error, Result};

/// What one read of an election found: its lease, its witnesses and its
/// token counter.
struct Seen {
    /// The lease's holder and the session that owns it.
    lease: Option<(Holder, i64)>,
    /// The witnesses' tokens.
    witnesses: Vec<u64>,
    /// The counter and its znode's version (`None`: no `{NAME}` znode).
    counter: Option<(u64, i32)>,
}

impl ZkStore {
    pub(super) async fn acquire(
        &self,
        at: Address<'_>,
        request: &AcquireRequest<'_>,
    ) -> Result<AcquireReply> {
        let began = tokio::time::Instant::now();
        let paths = self.paths(at)?;
        let client = self.session(request.ttl_ms).await?;
        // A try that finds the counter moved on (another candidate's term
        // began meanwhile) reads again.
        for _ in 0..3 {
            if let Some(reply) = self.try_acquire(&client, &paths, request, began).await? {
                return Ok(reply);
            }
        }
        Err(Error::ZooKeeper {
            detail: format!(
                "{}: the lease changed hands twice while acquiring; trying again",
                paths.lease
            ),
        })
    }

    /// One try of [`ZkStore::acquire`]: its reply, or `None` to try again.
    async fn try_acquire(
        &self,
        client: &zk::Client,
        paths: &Paths,
        request: &AcquireRequest<'_>,
        began: tokio::time::Instant,
    ) -> Result<Option<AcquireReply>> {
        let seen = self.read(client, paths).await?;
        let session = client.session_id().0;
        if let Some((holder, owner)) = seen.lease {
            let ours = holder.id == request.id && holder.attempt == request.attempt;
            if ours && owner == session {
                // Our own attempt wrote it before its answer was lost. The
                // read may come from a member's stale view, so the term is
                // adopted only once the ensemble's leader confirms it.
                if !self.still_holds(client, paths, holder.token).await? {
                    return Ok(None);
                }
                self.keep_term(paths, holder.token, request.ttl_ms, session, began);
                return Ok(Some(AcquireReply::Won {
                    token: holder.token,
                }));
            }
            if owner == session && !self.is_kept(&paths.lease, holder.token) {
                // A term of this session that nobody keeps (its keeper
                // ended without a release): it is over; clear it.
                self.clear(client, paths, holder.token).await?;
                return Ok(None);
            }
            return Ok(Some(AcquireReply::Held(holder)));
        }
        let witnessed = seen.witnesses.first().filter(|_| !self.bugs.ignore_witness);
        if let Some(&witness) = witnessed {
            // The lease vanished without its holder's release: held off
            // until its witness goes, with its holder's session or in its
            // release.
            let path = paths.witness(witness);
            let Some((data, stat)) = self.call_opt(&path, client.get_data(&path)).await? else {
                return Ok(None);
            };
            let (wait, owner) = (decode_witness(&path, &data)?, stat.ephemeral_owner);
            if owner == session && !self.is_kept(&paths.lease, witness) {
                // Left by a term of this session that has ended: its
                // keeper stopped, so it holds nobody off.
                self.delete(client, &path, None).await?;
                return Ok(None);
            }
            return Ok(Some(AcquireReply::HoldOff {
                wait: wait + Duration::from_millis(100),
            }));
        }
        self.create_term(client, paths, request, seen.counter, began)
            .await
    }

    /// The `multi` that begins a term on a free election: the next token,
    /// the lease and its witness; `None` when the counter moved on or the
    /// lease was taken meanwhile (try again).
    async fn create_term(
        &self,
        client: &zk::Client,
        paths: &Paths,
        request: &AcquireRequest<'_>,
        counter: Option<(u64, i32)>,
        began: tokio::time::Instant,
    ) -> Result<Option<AcquireReply>> {
        let session = client.session_id().0;
        let last = counter.map_or(0, |(last, _)| last);
        let token = if self.bugs.tokens_without_clock {
            last.saturating_add(1)
        } else {
            new_token(last)
        };
        let acls = self.acls();
        let mut multi = client.new_multi_writer();
        let persistent = zk::CreateMode::Persistent.with_acls(acls);
        let ephemeral = zk::CreateMode::Ephemeral.with_acls(acls);
        let prepared = (|| {
            match counter {
                Some((_, version)) => {
                    multi.add_set_data(&paths.dir, &encode_counter(token), Some(version))?
                }
                None => multi.add_create(&paths.dir, &encode_counter(token), &persistent)?,
            }
            multi.add_create(&paths.lease, &encode_lease(request, token), &ephemeral)?;
            let witness = encode_witness(request.id, token, request.ttl_ms);
            multi.add_create(&paths.witness(token), &witness, &ephemeral)
        })();
        prepared.map_err(|err| self.classify(&paths.lease, err))?;
        // Kept from before it is sent: if it commits but its answer never
        // comes back (a timeout, a cancelled campaign, a lost connection),
        // the sweep still deletes the term a ttl later, and no other
        // acquire of this store takes the lease for a term nobody keeps.
        if !self.pend_term(paths, token, request.ttl_ms, session, began) {
            return Ok(None);
        }
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let committed = tokio::time::timeout(self.call_timeout, multi.commit()).await;
        match committed {
            Err(_) => Err(Error::Timeout(self.call_timeout)),
            Ok(Ok(_)) => Ok(Some(AcquireReply::Won { token })),
            Ok(Err(zk::MultiWriteError::OperationFailed { source, .. }))
                if matches!(
                    source,
                    zk::Error::NodeExists | zk::Error::BadVersion | zk::Error::NoNode
                ) =>
            {
                // Definitely not created: nothing to keep.
                self.forget_term(&paths.lease, token);
                if source == zk::Error::NoNode {
                    // The prefix's znode is gone (deleted by hand).
                    self.make_path(client, &paths.root).await?;
                }
                Ok(None)
            }
            Ok(Err(err)) => Err(self.classify(&paths.lease, err.into())),
        }
    }

    /// Read the lease, the witnesses and the counter in one request.
    async fn read(&self, client: &zk::Client, paths: &Paths) -> Result<Seen> {
        let mut reader = client.new_multi_reader();
        let added = reader
            .add_get_data(&paths.lease)
            .and_then(|()| reader.add_get_data(&paths.dir))
            .and_then(|()| reader.add_get_children(&paths.dir));
        added.map_err(|err| self.classify(&paths.lease, err))?;
        let results = self.call(&paths.lease, reader.commit()).await?;
        let mut seen = Seen {
            lease: None,
            witnesses: Vec::new(),
            counter: None,
        };
        for (n, result) in results.into_iter().enumerate() {
            match (n, result) {
                (0, zk::MultiReadResult::Data { data, stat }) => {
                    let holder = decode_lease(&paths.lease, &data, stat.ephemeral_owner)?;
                    seen.lease = Some((holder, stat.ephemeral_owner));
                }
                (1, zk::MultiReadResult::Data { data, stat }) => {
                    seen.counter = Some((decode_counter(&paths.dir, &data)?, stat.version));
                }
                (2, zk::MultiReadResult::Children { children }) => {
                    seen.witnesses = children.iter().filter_map(|c| witness_token(c)).collect();
                }
                (
                    _,
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    },
                ) => {}
                (_, zk::MultiReadResult::Error { err }) => {
                    return Err(self.classify(&paths.lease, err))
                }
                (_, other) => {
                    return Err(Error::internal(format!(
                        "ZooKeeper answered a read of {} with {other:?}",
                        paths.lease
                    )))
                }
            }
        }
        Ok(seen)
    }

    /// Delete the lease and the witness of the term `token` of `client`'s
    /// session, each only if it is still that term's and that session's.
    ///
    /// The token alone does not say whose they are: tokens come from the
    /// clock, so two candidates that read the same counter in the same
    /// millisecond compute the same one, and only one `multi` commits. A
    /// loser whose answer was lost (a cancelled campaign, a timeout) keeps
    /// its pending term for the sweep; clearing by token, that sweep
    /// deleted the winner's lease and witness a ttl later, and a third
    /// candidate was elected while the winner still led.
    pub(super) async fn clear(&self, client: &zk::Client, paths: &Paths, token: u64) -> Result<()> {
        let session = client.session_id().0;
        let found = self.call_opt(&paths.lease, client.get_data(&paths.lease));
        if let Some((data, stat)) = found.await? {
            let holder = decode_lease(&paths.lease, &data, stat.ephemeral_owner)?;
            if holder.token == token && stat.ephemeral_owner == session {
                self.delete(client, &paths.lease, Some(stat.version))
                    .await?;
            }
        }
        let witness = paths.witness(token);
        if let Some((_, stat)) = self.call_opt(&witness, client.get_data(&witness)).await? {
            if stat.ephemeral_owner == session {
                self.delete(client, &witness, Some(stat.version)).await?;
            }
        }
        self.forget_term(&paths.lease, token);
        Ok(())
    }

    /// Delete `path` (gone already is fine).
    pub(super) async fn delete(
        &self,
        client: &zk::Client,
        path: &str,
        version: Option<i32>,
    ) -> Result<bool> {
        Ok(self
            .call_opt(path, client.delete(path, version))
            .await?
            .is_some())
    }

    /// Release the term (`id`, `token`): its lease if it still holds it,
    /// and its witness in any case (the caller has stopped acting).
    pub(super) async fn resign(&self, at: Address<'_>, id: &str, token: u64) -> Result<bool> {
        let paths = self.paths(at)?;
        let client = match self.kept_ttl(&paths.lease, token) {
            Some(ttl_ms) => self.session(ttl_ms).await?,
            None => self.session(0).await?,
        };
        let mut released = false;
        if self.kept_ttl(&paths.lease, token).is_some() {
            // One request: while the term's witness is there, no other
            // term can hold the lease, so the lease is this term's.
            released = self.release(&client, &paths, token, None).await?;
        }
        let found = match released {
            true => None,
            false => {
                self.call_opt(&paths.lease, client.get_data(&paths.lease))
                    .await?
            }
        };
        if let Some((data, stat)) = found {
            let holder = decode_lease(&paths.lease, &data, stat.ephemeral_owner)?;
            if holder.id == id && holder.token == token {
                released = self
                    .release(&client, &paths, token, Some(stat.version))
                    .await?;
            }
        }
        if !released {
            self.delete(&client, &paths.witness(token), None).await?;
        }
        self.forget_term(&paths.lease, token);
        Ok(released)
    }

    /// Delete the lease (at `version`, if given) and the witness of the
    /// term `token` in one `multi`: whether both were there.
    async fn release(
        &self,
        client: &zk::Client,
        paths: &Paths,
        token: u64,
        version: Option<i32>,
    ) -> Result<bool> {
        let mut multi = client.new_multi_writer();
        multi
            .add_delete(&paths.witness(token), None)
            .and_then(|()| multi.add_delete(&paths.lease, version))
            .map_err(|err| self.classify(&paths.lease, err))?;
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match tokio::time::timeout(self.call_timeout, multi.commit()).await {
            Err(_) => Err(Error::Timeout(self.call_timeout)),
            Ok(Ok(_)) => Ok(true),
            Ok(Err(zk::MultiWriteError::OperationFailed { .. })) => Ok(false),
            Ok(Err(err)) => Err(self.classify(&paths.lease, err.into())),
        }
    }

    /// Who holds the election now.
    pub(super) async fn inspect(&self, at: Address<'_>) -> Result<Option<Holder>> {
        let paths = self.paths(at)?;
        let client = self.session(0).await?;
        match self
            .call_opt(&paths.lease, client.get_data(&paths.lease))
            .await?
        {
            Some((data, stat)) => decode_lease(&paths.lease, &data, stat.ephemeral_owner).map(Some),
            None => Ok(None),
        }
    }

    fn keep_term(
        &self,
        paths: &Paths,
        token: u64,
        ttl_ms: u64,
        session: i64,
        renewed: tokio::time::Instant,
    ) {
        let kept = Kept {
            token,
            ttl_ms,
            session,
            renewed,
            paths: paths.clone(),
        };
        self.terms_lock().insert(paths.lease.clone(), kept);
    }
}
