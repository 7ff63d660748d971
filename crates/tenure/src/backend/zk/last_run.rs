//! The last-run marker on ZooKeeper, aged by the ensemble's clock: a
//! marker's age is the `mtime` of a fresh write to the election's `now`
//! znode less the marker's own `mtime`, both stamped by the ensemble's
//! leader, never by a candidate's clock.

use std::time::Duration;

use zookeeper_client as zk;

use super::codec::{decode_lease, decode_marker, encode_marker};
use super::{Address, ZkStore};
use crate::backend::RunRecord;
use crate::{Error, Result};

impl ZkStore {
    /// How long ago the marker was recorded (`None`: none, or older than
    /// it was kept for).
    pub(super) async fn last_run(&self, at: Address<'_>) -> Result<Option<RunRecord>> {
        let paths = self.paths(at)?;
        let client = self.session(0).await?;
        let marker = paths.last_run();
        // The write comes first: its answer comes after the member this
        // session reads from has applied every earlier write, the
        // marker's included (a read alone may be served from a member
        // that is behind).
        let now = self.ensemble_now(&client, &paths.now()).await?;
        let Some((data, stat)) = self.call_opt(&marker, client.get_data(&marker)).await? else {
            return Ok(None);
        };
        let (keep, slot) = decode_marker(&marker, &data)?;
        let age = Duration::from_millis(u64::try_from(now - stat.mtime).unwrap_or(0));
        Ok((age <= keep).then_some(RunRecord { age, slot }))
    }

    /// The ensemble's clock (ms since the epoch), from a write.
    async fn ensemble_now(&self, client: &zk::Client, path: &str) -> Result<i64> {
        if let Some(stat) = self
            .call_opt(path, client.set_data(path, b"", None))
            .await?
        {
            return Ok(stat.mtime);
        }
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match self.call_raw(client.create(path, b"", &options)).await? {
            Ok((stat, _)) => Ok(stat.mtime),
            // Made by another caller meanwhile: its write is as fresh.
            Err(zk::Error::NodeExists) => Ok(self
                .call(path, client.set_data(path, b"", None))
                .await?
                .mtime),
            Err(err) => Err(self.classify(path, err)),
        }
    }

    /// Record a run now, only if the term (`id`, `token`) holds the lease
    /// (and, with a slot, only after the slot recorded): the marker is
    /// written in one `multi` with checks of the lease's version, of the
    /// term's witness and of the marker's version as read.
    pub(super) async fn record_run(
        &self,
        at: Address<'_>,
        id: &str,
        token: u64,
        keep_ms: u64,
        slot: Option<u64>,
    ) -> Result<bool> {
        let paths = self.paths(at)?;
        let client = self.session(0).await?;
        let found = self.call_opt(&paths.lease, client.get_data(&paths.lease));
        let Some((data, stat)) = found.await? else {
            return Ok(false);
        };
        let holder = decode_lease(&paths.lease, &data, stat.ephemeral_owner)?;
        if holder.id != id || holder.token != token {
            return Ok(false);
        }
        let marker = paths.last_run();
        let previous = self.call_opt(&marker, client.get_data(&marker)).await?;
        let kept_slot = match &previous {
            Some((data, _)) => decode_marker(&marker, data)?.1,
            None => None,
        };
        if let (Some(new), Some(old)) = (slot, kept_slot) {
            if new <= old {
                return Ok(false);
            }
        }
        let value = encode_marker(keep_ms, id, token, slot.or(kept_slot));
        let mut multi = client.new_multi_writer();
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        multi
            .add_check_version(&paths.lease, stat.version)
            .and_then(|()| multi.add_check_version(&paths.witness(token), -1))
            .and_then(|()| match &previous {
                Some((_, was)) => multi.add_set_data(&marker, &value, Some(was.version)),
                None => multi.add_create(&marker, &value, &options),
            })
            .map_err(|err| self.classify(&marker, err))?;
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match tokio::time::timeout(self.call_timeout, multi.commit()).await {
            Err(_) => Err(Error::Timeout(self.call_timeout)),
            Ok(Ok(_)) => Ok(true),
            Ok(Err(zk::MultiWriteError::OperationFailed { index, source })) => match source {
                // The term is over, or another record came first.
                _ if index < 2 => Ok(false),
                zk::Error::BadVersion | zk::Error::NodeExists => Ok(false),
                source => Err(self.classify(&marker, source)),
            },
            Ok(Err(err)) => Err(self.classify(&marker, err.into())),
        }
    }
}
