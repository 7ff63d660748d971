//! A partition set's members: one ephemeral znode per member under
//! `/PREFIX/{GROUP}/members`, on the session of the set's ttl, so the
//! session's traffic keeps every member and term of a process at once.

use zookeeper_client as zk;

use super::layout::name_of;
use super::sweep::Kept;
use super::{Address, ZkStore};
use crate::backend::op::Reply;
use crate::Result;

impl ZkStore {
    /// A member's heartbeat (`join`) or farewell; the reply lists the live
    /// members.
    pub(super) async fn heartbeat(
        &self,
        group: Address<'_>,
        member: &str,
        ttl_ms: u64,
        join: bool,
    ) -> Result<Reply> {
        let sent = tokio::time::Instant::now();
        let paths = self.paths(group)?;
        let client = self.session(ttl_ms).await?;
        let path = paths.member(member);
        if join {
            let options = zk::CreateMode::Ephemeral.with_acls(self.acls());
            let value = format!("{}\nmember", super::codec::MAGIC);
            match self
                .call_raw(client.create(&path, value.as_bytes(), &options))
                .await?
            {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(zk::Error::NoNode) => {
                    // The members' znode is missing (first member, or
                    // deleted by hand): make it, and join.
                    self.make_path(&client, &paths.members()).await?;
                    let created = client.create(&path, value.as_bytes(), &options);
                    match self.call_raw(created).await? {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(err) => return Err(self.classify(&path, err)),
                    }
                }
                Err(err) => return Err(self.classify(&path, err)),
            }
            let kept = Kept {
                token: 0,
                ttl_ms,
                session: client.session_id().0,
                renewed: sent,
                paths: paths.clone(),
            };
            self.members_lock().insert(path, kept);
        } else {
            self.members_lock().remove(&path);
            self.delete(&client, &path, None).await?;
        }
        let listed = self
            .call_opt(&paths.members(), client.list_children(&paths.members()))
            .await?;
        let mut members: Vec<String> = listed
            .unwrap_or_default()
            .iter()
            .map(|c| name_of(c))
            .collect();
        members.sort();
        Ok(Reply::Members {
            members,
            phantoms: 0,
        })
    }
}
