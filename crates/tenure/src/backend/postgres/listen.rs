//! The store's one listening session: `LISTEN tenure`, each notification
//! turned into its election's [`Notices`].
//!
//! Notifications are hints (see the module above): one missed while the
//! session was down costs a follower at most a wait for the lease's
//! expiry, so every (re)connection counts as a release for every election
//! (`released` + 1), and followers look at the lease again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::{Target, Tls};
use crate::backend::op::{Hints, Notices};

/// How often the listening session is checked with a query: a session
/// whose server went away without closing it hears nothing, and is opened
/// again.
const CHECK_EVERY: Duration = Duration::from_secs(5);

type Key = (String, String);

/// One backend's notices, by the id its subscription was given.
type Senders = Vec<(u64, watch::Sender<Notices>)>;

/// The elections of this process on the store, each with the senders of
/// its notices (one per backend asked for it).
#[derive(Default)]
pub(crate) struct Registry {
    next: AtomicU64,
    elections: Mutex<HashMap<Key, Senders>>,
}

impl Registry {
    /// The notices of election (`prefix`, `name`), until the guard returned
    /// with them is dropped.
    pub fn subscribe(self: &Arc<Self>, prefix: &str, name: &str) -> Hints {
        let (sender, notices) = watch::channel(Notices::default());
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (prefix.to_string(), name.to_string());
        self.elections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_default()
            .push((id, sender));
        Hints {
            notices,
            guard: Some(Box::new(Subscription {
                registry: self.clone(),
                key,
                id,
            })),
        }
    }

    /// A notification's payload: `["kind", "prefix", "name", ttl]`.
    /// Anything else (another program on the channel) is ignored.
    fn dispatch(&self, payload: &str) {
        let Ok((kind, prefix, name, ttl)) =
            serde_json::from_str::<(String, String, String, u64)>(payload)
        else {
            tracing::debug!(payload, "ignored a notification tenure did not send");
            return;
        };
        let elections = self
            .elections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(senders) = elections.get(&(prefix, name)) else {
            return;
        };
        for (_, sender) in senders {
            sender.send_modify(|notices| match kind.as_str() {
                "released" => notices.released += 1,
                "acquired" => notices.acquired += 1,
                "renewed" => {
                    notices.renewed += 1;
                    notices.renewed_ttl_ms = ttl;
                }
                _ => {}
            });
        }
    }

    /// The session was (re)opened: any release may have been missed.
    fn resubscribed(&self) {
        let elections = self
            .elections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for senders in elections.values() {
            for (_, sender) in senders {
                sender.send_modify(|notices| notices.released += 1);
            }
        }
    }
}

/// Keeps one backend's notices coming; dropping it unsubscribes.
struct Subscription {
    registry: Arc<Registry>,
    key: Key,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut elections = self
            .registry
            .elections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(senders) = elections.get_mut(&self.key) {
            senders.retain(|(id, _)| *id != self.id);
            if senders.is_empty() {
                elections.remove(&self.key);
            }
        }
    }
}

/// Listen until `stop`, opening the session again whenever it ends.
pub(crate) async fn run(target: Arc<Target>, registry: Arc<Registry>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let session = async {
            match &target.tls {
                Tls::Plain => listen(&target, &registry, tokio_postgres::NoTls).await,
                Tls::Rustls(tls) => listen(&target, &registry, tls.clone()).await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            heard = session => {
                if heard {
                    backoff = Duration::from_millis(50);
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// One listening session, until it breaks; whether it got as far as
/// listening.
async fn listen<T>(target: &Target, registry: &Registry, tls: T) -> bool
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    // Named apart from the calls' sessions, for pg_stat_activity.
    let mut config = target.config.clone();
    let name = format!(
        "{} listen",
        config.get_application_name().unwrap_or("tenure")
    );
    config.application_name(name);
    let opened = tokio::time::timeout(target.call_timeout, config.connect(tls)).await;
    let Ok(Ok((client, mut connection))) = opened else {
        return false;
    };
    let (sender, mut messages) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = stream.next().await {
            if sender.send(message).is_err() {
                return;
            }
        }
    });
    let listening =
        tokio::time::timeout(target.call_timeout, client.batch_execute("LISTEN tenure"))
            .await
            .is_ok_and(|done| done.is_ok());
    if !listening {
        driver.abort();
        return false;
    }
    registry.resubscribed();
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.reset();
    loop {
        tokio::select! {
            message = messages.recv() => match message {
                Some(AsyncMessage::Notification(note)) => registry.dispatch(note.payload()),
                Some(_) => {}
                None => break,
            },
            _ = check.tick() => {
                let alive = tokio::time::timeout(target.call_timeout, client.simple_query("SELECT 1"))
                    .await
                    .is_ok_and(|done| done.is_ok());
                if !alive {
                    break;
                }
            }
        }
    }
    driver.abort();
    true
}
