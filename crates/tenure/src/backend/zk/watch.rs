//! Announcements on ZooKeeper: a one-shot watch on the election's lease,
//! set again after each event. A deletion (a release, or the holder's
//! session expiring) counts as a release and wakes followers at once; a
//! creation is a new term. Each new watch after a lost one also counts as
//! a release, since one may have been missed meanwhile. Hints only: the
//! lease is the truth.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

use super::{Address, ZkStore};
use crate::backend::op::{Hints, Notices};
use crate::Result;

/// Stops the watching task when dropped.
struct Watching(tokio::task::JoinHandle<()>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ZkStore {
    /// An election on this ensemble: checked, and a watch on its lease.
    pub async fn election(self: &Arc<Self>, at: Address<'_>, ttl: Duration) -> Result<Hints> {
        self.check(at, ttl).await?;
        let lease = self.paths(at)?.lease;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let (sender, notices) = watch::channel(Notices::default());
        let task = tokio::spawn(watch_lease(Arc::downgrade(self), lease, ttl_ms, sender));
        Ok(Hints {
            notices,
            guard: Some(Box::new(Watching(task))),
        })
    }
}

/// Watch `lease` for as long as the store lives and anyone listens.
async fn watch_lease(
    store: Weak<ZkStore>,
    lease: String,
    ttl_ms: u64,
    sender: watch::Sender<Notices>,
) {
    let mut first = true;
    // Each failed try may leave a session behind (one that reached another
    // ensemble, or whose timeout the ensemble would not grant, expires
    // only a ttl later): tries slow down to one per renew interval.
    let fastest = Duration::from_millis(100);
    let slowest = Duration::from_millis(ttl_ms / 3).max(fastest);
    let mut retry = fastest;
    loop {
        let Some(strong) = store.upgrade() else {
            return;
        };
        let watched = match strong.session(ttl_ms).await {
            Ok(client) => set_watch(&strong, &client, &lease).await,
            Err(_) => None,
        };
        drop(strong);
        let Some(watcher) = watched else {
            first = false;
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(slowest);
            continue;
        };
        retry = fastest;
        if !first {
            sender.send_modify(|n| n.released += 1);
        }
        let event = watcher.changed().await;
        match event.event_type {
            zk::EventType::NodeDeleted => sender.send_modify(|n| n.released += 1),
            zk::EventType::NodeCreated => sender.send_modify(|n| n.acquired += 1),
            _ => {}
        }
        if sender.is_closed() {
            return;
        }
        // The next watch after a session event counts as a release; one
        // after a node event is just the next watch.
        first = event.event_type != zk::EventType::Session;
    }
}

async fn set_watch(
    store: &ZkStore,
    client: &zk::Client,
    lease: &str,
) -> Option<zk::OneshotWatcher> {
    store
        .call(lease, client.check_and_watch_stat(lease))
        .await
        .ok()
        .map(|(_, watcher)| watcher)
}
