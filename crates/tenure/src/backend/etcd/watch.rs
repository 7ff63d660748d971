//! Announcements: an etcd watch on an election's key and witness, opened
//! again after any failure, feeding the election's [`Notices`]. Apart
//! because it is the one long-lived task of the store.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;

use super::EtcdStore;
use crate::backend::op::Notices;
use crate::error::one_line;

impl EtcdStore {
    /// A watch on `key` feeding [`Notices`]: a delete counts as a release,
    /// a creation as a new term. The watch is opened again after any
    /// failure, and each (re)opening counts as a possible missed release.
    /// Dropping the returned guard ends it.
    pub(super) fn watch(
        self: &Arc<Self>,
        keys: Vec<String>,
    ) -> (watch::Receiver<Notices>, WatchGuard) {
        let (sender, receiver) = watch::channel(Notices::default());
        let sender = Arc::new(sender);
        let tasks = keys
            .into_iter()
            .map(|key| self.watch_one(key, sender.clone()))
            .collect();
        (receiver, WatchGuard(tasks))
    }

    /// The task of one key's watch for [`EtcdStore::watch`].
    fn watch_one(
        self: &Arc<Self>,
        key: String,
        sender: Arc<watch::Sender<Notices>>,
    ) -> tokio::task::JoinHandle<()> {
        let client = self.client.clone();
        let url = self.url.clone();
        tokio::spawn(async move {
            let mut failures: u32 = 0;
            loop {
                let opened = client
                    .clone()
                    .watch(key.clone(), Some(WatchOptions::new()))
                    .await;
                match opened {
                    Ok(mut stream) => {
                        loop {
                            match stream.message().await {
                                Ok(Some(answer)) => {
                                    if answer.canceled() {
                                        break;
                                    }
                                    if answer.created() {
                                        // A release may have been missed
                                        // while no watch was open.
                                        failures = 0;
                                        sender.send_modify(|n| n.released += 1);
                                    }
                                    for event in answer.events() {
                                        match event.event_type() {
                                            EventType::Delete => {
                                                sender.send_modify(|n| n.released += 1)
                                            }
                                            EventType::Put => {
                                                if event.kv().is_some_and(|kv| kv.version() == 1) {
                                                    sender.send_modify(|n| n.acquired += 1)
                                                }
                                            }
                                        }
                                    }
                                }
                                Ok(None) => break,
                                Err(err) => {
                                    tracing::debug!(url = %url, error = %one_line(&err.to_string()), "etcd watch ended; opening it again");
                                    break;
                                }
                            }
                        }
                    }
                    Err(err) => {
                        if failures == 0 {
                            tracing::debug!(url = %url, error = %one_line(&err.to_string()), "cannot open the etcd watch; retrying");
                        }
                    }
                }
                failures = failures.saturating_add(1);
                let backoff = Duration::from_millis(50u64.saturating_mul(1 << failures.min(5)));
                tokio::time::sleep(backoff.min(Duration::from_secs(1))).await;
            }
        })
    }
}

/// Ends its watch tasks when dropped.
pub(super) struct WatchGuard(Vec<tokio::task::JoinHandle<()>>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}
