//! Announcements on ZooKeeper: a one-shot watch on the election's lease,
//! set again after each event. A deletion (a release, or the holder's
//! session expiring) counts as a release and wakes followers at once; a
//! creation is a new term. A new watch after a lost one, and one that
//! finds the lease gone without having seen it deleted, also count as a
//! release, since a follower may have missed one meanwhile. Hints only:
//! the lease is the truth.

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
        // The first watch is set before any campaign of this election reads
        // the lease, so a release between that read and the watch cannot
        // go unheard.
        let first = match self.session(ttl_ms).await {
            Ok(client) => set_watch(self, &client, &lease).await,
            Err(_) => None,
        };
        let watching = watch_lease(Arc::downgrade(self), lease, ttl_ms, first, sender);
        let task = tokio::spawn(watching);
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
    mut watched: Option<(bool, zk::OneshotWatcher)>,
    sender: watch::Sender<Notices>,
) {
    // Whether a release may have been missed before the next watch is
    // set: after a lost session or a failed try, nothing was watched.
    let mut missed = watched.is_none();
    // Whether the last event was the lease's deletion (already counted).
    let mut after_delete = false;
    // Each failed try may leave a session behind (one that reached another
    // ensemble, or whose timeout the ensemble would not grant, expires
    // only a ttl later): tries slow down to one per renew interval.
    let fastest = Duration::from_millis(100);
    let slowest = Duration::from_millis(ttl_ms / 3).max(fastest);
    let mut retry = fastest;
    loop {
        if watched.is_none() {
            let Some(strong) = store.upgrade() else {
                return;
            };
            watched = match strong.session(ttl_ms).await {
                Ok(client) => set_watch(&strong, &client, &lease).await,
                Err(_) => None,
            };
        }
        let Some((present, watcher)) = watched.take() else {
            missed = true;
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(slowest);
            continue;
        };
        retry = fastest;
        // A follower may have read the lease before this watch was set: a
        // lease found gone is a release it may not have heard of, unless
        // the deletion that woke this loop was counted already.
        if missed || (!present && !after_delete) {
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
        // The next watch after a session event counts as a release.
        missed = event.event_type == zk::EventType::Session;
        after_delete = event.event_type == zk::EventType::NodeDeleted;
    }
}

/// A watch on `lease`, and whether the lease was there when it was set.
async fn set_watch(
    store: &ZkStore,
    client: &zk::Client,
    lease: &str,
) -> Option<(bool, zk::OneshotWatcher)> {
    store
        .call(lease, client.check_and_watch_stat(lease))
        .await
        .ok()
        .map(|(stat, watcher)| (stat.is_some(), watcher))
}
