//! Announcements: one pub/sub connection per store for every election on
//! it, resubscribed after any disconnect.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::target::RedisTarget;
use super::topology::Topology;
use crate::backend::op::Notices;
use crate::{Error, Result};

/// One pub/sub connection for every election of a store.
///
/// Elections subscribe to their channels as they are built and unsubscribe
/// when dropped ([`Subscription`]); a task owns the connection, hands each
/// message to its channel's [`Notices`], and after any disconnect opens a
/// new connection and subscribes to every channel again. Each
/// (re)subscription counts as a possible missed release, so waiting
/// candidates re-check the lease instead of sleeping through a handover.
pub(crate) struct Subscriber {
    requests: mpsc::UnboundedSender<SubscriberRequest>,
    _stop: DropGuard,
}

pub(crate) enum SubscriberRequest {
    Subscribe {
        channel: String,
        reply: oneshot::Sender<Result<watch::Receiver<Notices>>>,
    },
    Unsubscribe {
        channel: String,
    },
}

/// An election's subscription to its channel; ends when dropped.
pub(crate) struct Subscription {
    channel: String,
    requests: mpsc::UnboundedSender<SubscriberRequest>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.requests.send(SubscriberRequest::Unsubscribe {
            channel: std::mem::take(&mut self.channel),
        });
    }
}

impl Subscriber {
    /// Start the subscriber task (it connects when the first channel is
    /// subscribed).
    pub fn start(topology: Arc<Topology>) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        if topology.is_cluster() {
            tokio::spawn(super::sharded::sharded_loop(
                topology,
                receiver,
                stop.clone(),
            ));
        } else {
            tokio::spawn(subscriber_loop(topology, receiver, stop.clone()));
        }
        Subscriber {
            requests,
            _stop: stop.drop_guard(),
        }
    }

    /// Subscribe to `channel`; fails as the SUBSCRIBE did (a missing
    /// permission, an unreachable server).
    ///
    /// The request is sent at once; the future only waits for the answer,
    /// holding no borrow of the subscriber.
    pub fn subscribe(
        &self,
        channel: &str,
    ) -> impl std::future::Future<Output = Result<(watch::Receiver<Notices>, Subscription)>>
           + Send
           + 'static {
        let (reply, answer) = oneshot::channel();
        let request = SubscriberRequest::Subscribe {
            channel: channel.to_string(),
            reply,
        };
        let sent = self.requests.send(request);
        let (channel, requests) = (channel.to_string(), self.requests.clone());
        async move {
            let gone = || Error::redis("the subscriber task has stopped");
            sent.map_err(|_| gone())?;
            let notices = answer.await.map_err(|_| gone())??;
            Ok((notices, Subscription { channel, requests }))
        }
    }

    /// Whether its task has stopped (the runtime it ran on was shut
    /// down): it takes no subscriptions any more.
    pub fn has_stopped(&self) -> bool {
        self.requests.is_closed()
    }
}

/// The channels subscribed, each with its notices and how many
/// subscriptions share it.
pub(crate) type Channels = HashMap<String, (watch::Sender<Notices>, usize)>;

async fn subscriber_loop(
    topology: Arc<Topology>,
    mut requests: mpsc::UnboundedReceiver<SubscriberRequest>,
    stop: CancellationToken,
) {
    let mut changes = topology.changes();
    let mut state = LoopState {
        channels: HashMap::new(),
        backoff: Duration::from_millis(50),
        warned: false,
    };
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = open_pubsub(&topology) => opened,
        };
        let failure = match opened {
            Ok(pubsub) => {
                let target = topology.target();
                let session = session(pubsub, &mut state, &mut requests, &mut changes, target);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    ended = session => ended.err(),
                }
            }
            Err(err) => Some(err),
        };
        if requests.is_closed() && state.channels.is_empty() {
            return;
        }
        match failure {
            None => tracing::debug!("lease event subscription closed; resubscribing"),
            Some(err) => {
                if !state.warned {
                    tracing::warn!(error = %err, "lease event subscription failed; retrying (handover falls back to lease expiry meanwhile)");
                    state.warned = true;
                }
            }
        }
        if !wait_to_retry(&mut state, &mut requests, &mut changes, &stop).await {
            return;
        }
        state.backoff = (state.backoff * 2).min(Duration::from_secs(2));
    }
}

/// What the subscriber task keeps across connections.
struct LoopState {
    channels: Channels,
    /// Before the next connection attempt.
    backoff: Duration,
    /// Whether this outage was logged (once per outage).
    warned: bool,
}

/// One pub/sub connection's life: subscribe to every channel (counting a
/// possible missed release on each), then deliver messages and serve
/// requests until the connection ends, a request fails it, or Sentinel
/// names another primary (`Ok`: reconnect at once).
async fn session(
    pubsub: redis::aio::PubSub,
    state: &mut LoopState,
    requests: &mut mpsc::UnboundedReceiver<SubscriberRequest>,
    changes: &mut watch::Receiver<u64>,
    target: &RedisTarget,
) -> Result<()> {
    let (mut sink, mut stream) = pubsub.split();
    for channel in state.channels.keys() {
        sink.subscribe(channel)
            .await
            .map_err(|e| target.classify(e))?;
    }
    // A release may have happened while we were not subscribed.
    for (notices, _) in state.channels.values() {
        notices.send_modify(|n| n.released += 1);
    }
    if !state.channels.is_empty() {
        tracing::debug!(
            channels = state.channels.len(),
            "subscribed to lease events"
        );
    }
    state.backoff = Duration::from_millis(50);
    state.warned = false;
    changes.borrow_and_update();
    loop {
        tokio::select! {
            // Sentinel named another primary: follow it.
            _ = changes.changed() => return Ok(()),
            message = stream.next() => match message {
                Some(message) => deliver(&state.channels, &message),
                None => return Ok(()),
            },
            request = requests.recv() => match request {
                None => return Ok(()),
                Some(SubscriberRequest::Subscribe { channel, reply }) => {
                    if let Some((notices, count)) = state.channels.get_mut(&channel) {
                        *count += 1;
                        let _ = reply.send(Ok(notices.subscribe()));
                        continue;
                    }
                    match sink.subscribe(&channel).await {
                        Ok(()) => {
                            let (notices, receiver) = watch::channel(Notices::default());
                            state.channels.insert(channel, (notices, 1));
                            let _ = reply.send(Ok(receiver));
                        }
                        Err(err) if err.is_connection_dropped() || err.is_io_error() => {
                            // Subscribed with the rest on the next connection.
                            let _ = reply.send(Ok(accept(&mut state.channels, channel)));
                            return Ok(());
                        }
                        Err(err) => {
                            let _ = reply.send(Err(target.classify(err)));
                        }
                    }
                }
                Some(SubscriberRequest::Unsubscribe { channel }) => {
                    unsubscribe(&mut state.channels, &channel);
                    if !state.channels.contains_key(&channel) {
                        let _ = sink.unsubscribe(&channel).await;
                    }
                }
            },
        }
    }
}

/// Until the next connection attempt (the backoff, or a new Sentinel
/// primary), new subscriptions are taken and made on it: announcements are
/// hints, and an election being built must neither wait for an outage nor
/// fail because of one (it finds the lease by itself meanwhile; the
/// resubscription counts as a possible missed release). `false`: stop.
async fn wait_to_retry(
    state: &mut LoopState,
    requests: &mut mpsc::UnboundedReceiver<SubscriberRequest>,
    changes: &mut watch::Receiver<u64>,
    stop: &CancellationToken,
) -> bool {
    let retry = tokio::time::sleep(state.backoff);
    tokio::pin!(retry);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = &mut retry => return true,
            _ = changes.changed() => return true,
            request = requests.recv() => match request {
                None => return false,
                Some(SubscriberRequest::Subscribe { channel, reply }) => {
                    let _ = reply.send(Ok(accept(&mut state.channels, channel)));
                }
                Some(SubscriberRequest::Unsubscribe { channel }) => {
                    unsubscribe(&mut state.channels, &channel);
                }
            },
        }
    }
}

/// Take a subscription to `channel` (one more, if it has some already).
pub(crate) fn accept(channels: &mut Channels, channel: String) -> watch::Receiver<Notices> {
    let (notices, count) = channels
        .entry(channel)
        .or_insert_with(|| (watch::channel(Notices::default()).0, 0));
    *count += 1;
    notices.subscribe()
}

pub(crate) fn unsubscribe(channels: &mut Channels, channel: &str) {
    if let Some((_, count)) = channels.get_mut(channel) {
        *count -= 1;
        if *count == 0 {
            channels.remove(channel);
        }
    }
}

/// Hand one message to its channel's notices.
fn deliver(channels: &Channels, message: &redis::Msg) {
    deliver_payload(
        channels,
        message.get_channel_name(),
        message.get_payload_bytes(),
    );
}

/// Hand one message (`payload` on `channel`) to its channel's notices.
pub(crate) fn deliver_payload(channels: &Channels, channel: &str, payload: &[u8]) {
    let Some((notices, _)) = channels.get(channel) else {
        return;
    };
    if payload.starts_with(b"released:") {
        notices.send_modify(|n| n.released += 1);
    } else if payload.starts_with(b"acquired:") {
        notices.send_modify(|n| n.acquired += 1);
    } else if let Some(ttl_ms) = renewed_ttl_ms(payload) {
        notices.send_modify(|n| {
            n.renewed += 1;
            n.renewed_ttl_ms = ttl_ms;
        });
    }
}

/// Open a pub/sub connection to the primary (on a cluster, to any node:
/// `PUBLISH` reaches every node's subscribers).
async fn open_pubsub(topology: &Topology) -> Result<redis::aio::PubSub> {
    let node = topology.primary().await?;
    let limit = Duration::from_secs(5);
    match node.endpoint.pubsub(limit).await {
        Ok(pubsub) => Ok(pubsub),
        Err(err) => {
            topology.failed(&node);
            Err(topology.target().classify(err))
        }
    }
}

/// The ttl of a `renewed:TOKEN:TTL` announcement.
fn renewed_ttl_ms(payload: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(payload.strip_prefix(b"renewed:")?).ok()?;
    text.rsplit(':').next()?.parse().ok()
}
