//! A partition set's members: each a key on its instance's session lease,
//! joined (or left) by a heartbeat that answers with the live members.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::layout::members_prefix;
use super::session::Attached;
use super::{Address, EtcdStore, Reply};
use crate::{Error, Result};

impl EtcdStore {
    pub(super) async fn heartbeat(
        &self,
        group: Address<'_>,
        member: &str,
        ttl_ms: u64,
        join: bool,
    ) -> Result<Reply> {
        let prefix = members_prefix(group)?;
        let key = format!("{prefix}{member}");
        if join {
            // Written when missing or on another lease (one of an earlier
            // process with this id, or a lease gone since).
            let join = |lease| {
                Txn::new()
                    .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
                    .or_else([TxnOp::put(
                        key.clone(),
                        "",
                        Some(PutOptions::new().with_lease(lease)),
                    )])
            };
            for _ in 0..2 {
                if let Some(Attached { alive: true, .. }) =
                    self.on_session(member, ttl_ms, join).await?
                {
                    return self.members(&prefix).await;
                }
            }
            Err(Error::Etcd {
                detail: "the session lease kept expiring while joining".into(),
            })
        } else {
            let key = key.as_str();
            self.call(|mut c| async move { c.delete(key, None).await })
                .await?;
            self.members(&prefix).await
        }
    }

    /// The live members under `prefix`: keys on a lease (ours all are);
    /// keys without one were not written by tenure and are not counted.
    async fn members(&self, prefix: &str) -> Result<Reply> {
        let mut members = Vec::new();
        let mut phantoms = 0;
        for kv in self.keys_under(prefix).await? {
            match (
                kv.lease(),
                kv.key_str().ok().and_then(|k| k.strip_prefix(prefix)),
            ) {
                (lease, Some(member)) if lease != 0 && !member.is_empty() => {
                    members.push(member.to_string())
                }
                _ => phantoms += 1,
            }
        }
        Ok(Reply::Members { members, phantoms })
    }
}
