//! One ensemble per URL. The client connects to any host of the URL and
//! moves to another when its connection breaks; a host list that spans two
//! ensembles (a typo, a host reused) would let processes that reached
//! different ensembles each grant a term of the same election at once. So
//! the store marks the ensemble with a random id, `CHROOT/tenure-ensemble`,
//! and at connect asks every host of the URL for it: a host that answers
//! for another ensemble is refused, with one line naming it. A host that
//! does not answer is skipped (a minority of members may be down).

use std::time::Duration;

use zookeeper_client as zk;

use super::codec::MAGIC;
use super::ZkStore;
use crate::{Error, Result};

impl ZkStore {
    fn mark_path(&self) -> String {
        format!("{}/tenure-ensemble", self.url.chroot)
    }

    /// Check that every host of the URL that answers belongs to the
    /// ensemble `reader` reached.
    pub(super) async fn one_ensemble(&self, reader: &zk::Client) -> Result<()> {
        let hosts: Vec<&str> = self.url.hosts.split(',').collect();
        if hosts.len() < 2 {
            return Ok(());
        }
        let path = self.mark_path();
        let mark = match self.read_mark(reader, &path).await? {
            Some(mark) => mark,
            None => self.make_mark(reader, &path).await?,
        };
        *self.mark.lock().unwrap_or_else(|e| e.into_inner()) = Some(mark.clone());
        for host in hosts {
            let timeout = Duration::from_secs(10);
            let Ok(client) = self.open_on(host, timeout, false).await else {
                continue;
            };
            let theirs = self.read_mark(&client, &path).await?;
            if theirs.as_deref() != Some(mark.as_str()) {
                return Err(Error::Unsafe {
                    url: self.url.redacted.clone(),
                    detail: format!(
                        "{host} answers for another ZooKeeper ensemble than the one first \
                         reached (its {path} is {}, not {mark}): list the members of one \
                         ensemble only",
                        theirs.as_deref().unwrap_or("missing")
                    ),
                });
            }
        }
        Ok(())
    }

    /// Check that a new session reached the ensemble the store first
    /// reached (its client moved to another host meanwhile, or the old
    /// session expired there).
    pub(super) async fn same_ensemble(&self, client: &zk::Client) -> Result<()> {
        let known = self.mark.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(mark) = known else { return Ok(()) };
        let path = self.mark_path();
        let theirs = self.read_mark(client, &path).await?;
        if theirs.as_deref() == Some(mark.as_str()) {
            return Ok(());
        }
        Err(Error::Unsafe {
            url: self.url.redacted.clone(),
            detail: format!(
                "a new session reached another ZooKeeper ensemble than the one first reached \
                 (its {path} is {}, not {mark}): list the members of one ensemble only",
                theirs.as_deref().unwrap_or("missing")
            ),
        })
    }

    /// The mark as `client`'s member knows it after catching up with the
    /// ensemble's leader (`sync`).
    async fn read_mark(&self, client: &zk::Client, path: &str) -> Result<Option<String>> {
        let parent = match path.rsplit_once('/') {
            Some(("", _)) | None => "/",
            Some((parent, _)) => parent,
        };
        self.call(parent, client.sync(parent)).await?;
        let Some((data, _)) = self.call_opt(path, client.get_data(path)).await? else {
            return Ok(None);
        };
        let text = String::from_utf8(data).map_err(|_| self.foreign_mark(path))?;
        match text
            .strip_prefix(MAGIC)
            .and_then(|t| t.strip_prefix("\nensemble\n"))
        {
            Some(id) => Ok(Some(id.to_string())),
            None => Err(self.foreign_mark(path)),
        }
    }

    /// Create the mark, or read the one another process made first.
    async fn make_mark(&self, client: &zk::Client, path: &str) -> Result<String> {
        // Under a chroot no one has used yet, the chroot's znodes first.
        if let Some((parent, _)) = path
            .rsplit_once('/')
            .filter(|(parent, _)| !parent.is_empty())
        {
            self.make_path(client, parent).await?;
        }
        let id = format!("{:032x}", rand::random::<u128>());
        let data = format!("{MAGIC}\nensemble\n{id}");
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        match self
            .call_raw(client.create(path, data.as_bytes(), &options))
            .await?
        {
            Ok(_) => Ok(id),
            Err(zk::Error::NodeExists) => self
                .read_mark(client, path)
                .await?
                .ok_or_else(|| Error::internal(format!("{path} vanished as it was read"))),
            Err(err) => Err(self.classify(path, err)),
        }
    }

    fn foreign_mark(&self, path: &str) -> Error {
        Error::ForeignData {
            key: path.to_string(),
            detail: "it is not tenure's ensemble mark".into(),
        }
    }
}
