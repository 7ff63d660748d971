//! Announcements on a Redis Cluster: sharded pub/sub.
//!
//! On a cluster the scripts announce with `SPUBLISH` on the election's
//! channel, which shares the election's `{NAME}` hash tag: the message
//! stays on the shard that holds the lease instead of being broadcast over
//! the cluster bus to every node, as `PUBLISH` would be. Subscribers must
//! then `SSUBSCRIBE` on the node that serves the channel's slot, and follow
//! the slot when it moves.
//!
//! One task owns one RESP3 connection per node that serves a subscribed
//! channel (the redis crate's RESP2 pub/sub connection has no
//! `SSUBSCRIBE`; on RESP3, messages arrive as push frames). A channel
//! loses its home when the server unsubscribes it (its slot moved away:
//! Redis sends `sunsubscribe`) or its node's connection drops; it is then
//! subscribed again where the slot map says, with a backoff while the
//! cluster settles, and each such move counts as a possible missed
//! release: waiting candidates look at the lease instead of sleeping
//! through a hand-over. Announcements stay hints: a lost one costs at most
//! the lease's ttl.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::pubsub::{deliver_payload, unsubscribe, Channels, SubscriberRequest};
use super::target::RedisTarget;
use super::topology::{reply_addr, slot_of, Topology};
use crate::backend::op::Notices;
use crate::{Error, Result};

/// How long opening a connection or one (un)subscription may take.
const LIMIT: Duration = Duration::from_secs(5);

/// A push frame and the node it came from.
type Push = (String, PushInfo);

struct Shards {
    topology: Arc<Topology>,
    pushes: mpsc::UnboundedSender<Push>,
    channels: Channels,
    /// The node (address) each subscribed channel is subscribed on.
    placed: HashMap<String, String>,
    /// One connection per node with subscribed channels.
    sessions: HashMap<String, MultiplexedConnection>,
    /// Channels wanted but subscribed nowhere at the moment.
    homeless: HashSet<String>,
}

impl Shards {
    /// Subscribe `channel` on the node that serves its slot, following one
    /// `MOVED` redirection; the node's address.
    async fn place(&mut self, channel: &str) -> Result<String> {
        let slot = slot_of(channel);
        let mut node = self.topology.node_for(slot).await?;
        for _ in 0..3 {
            let addr = node.addr.clone();
            let mut conn = match self.sessions.get(&addr) {
                Some(conn) => conn.clone(),
                None => {
                    let target = RedisTarget {
                        url: format!("{}?protocol=resp3", node.target.url),
                        tls_ca: node.target.tls_ca.clone(),
                    };
                    let pushes = self.pushes.clone();
                    let from = addr.clone();
                    let sender = move |info: PushInfo| pushes.send((from.clone(), info));
                    let opened = target.endpoint()?.push_connection(LIMIT, sender).await;
                    match opened {
                        Ok(conn) => {
                            self.sessions.insert(addr.clone(), conn.clone());
                            conn
                        }
                        Err(err) => {
                            self.topology.failed(&node);
                            return Err(target.classify_first(err));
                        }
                    }
                }
            };
            let reply = redis::cmd("SSUBSCRIBE")
                .arg(channel)
                .query_async::<Value>(&mut conn)
                .await;
            match reply {
                // The confirmation names the channel. The redis client takes
                // any (s)unsubscribe push for the reply of the command in
                // flight, and Redis sends one unasked when a slot moves away:
                // anything else means this subscription is unconfirmed.
                Ok(reply) if confirms(&reply, channel) => return Ok(addr),
                Ok(other) => {
                    tracing::debug!(%channel, node = %addr, reply = ?other, "SSUBSCRIBE not confirmed; starting over on a new connection");
                    self.sessions.remove(&addr);
                    continue;
                }
                Err(err) => {
                    if let Some((to, slot)) = err.redirect_node() {
                        let to = reply_addr(to, &addr);
                        self.drop_idle_session(&addr);
                        node = self.topology.moved(slot, &to)?;
                        continue;
                    }
                    if err.is_io_error() || err.is_connection_dropped() || err.is_timeout() {
                        self.sessions.remove(&addr);
                        self.topology.failed(&node);
                    }
                    return Err(self.topology.target().classify(err));
                }
            }
        }
        Err(Error::Unreachable {
            url: self.topology.target().redacted(),
            detail: format!(
                "the subscription of {channel} was not confirmed (its slot keeps moving)"
            ),
        })
    }

    /// Close the connection to `addr` if no channel is subscribed there.
    fn drop_idle_session(&mut self, addr: &str) {
        if !self.placed.values().any(|a| a == addr) {
            self.sessions.remove(addr);
        }
    }

    /// `channel` is subscribed nowhere now: a release may be missed until
    /// it is subscribed again.
    fn lose(&mut self, channel: &str) {
        if let Some(addr) = self.placed.remove(channel) {
            self.drop_idle_session(&addr);
        }
        if let Some((notices, _)) = self.channels.get(channel) {
            notices.send_modify(|n| n.released += 1);
            self.homeless.insert(channel.to_string());
        }
    }

    fn on_push(&mut self, from: &str, push: PushInfo) {
        let text = |value: Option<&Value>| match value {
            Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::SimpleString(text)) => Some(text.clone()),
            _ => None,
        };
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                let (Some(channel), Some(Value::BulkString(payload))) =
                    (text(push.data.first()), push.data.get(1))
                else {
                    return;
                };
                deliver_payload(&self.channels, &channel, payload);
            }
            PushKind::SUnsubscribe => {
                // Sent by the server when the channel's slot moved away (and
                // as the answer to our own SUNSUBSCRIBE, for a channel no
                // longer wanted: then there is nothing to do).
                let Some(channel) = text(push.data.first()) else {
                    return;
                };
                if self.placed.get(&channel).map(String::as_str) == Some(from) {
                    tracing::debug!(%channel, node = %from, "shard channel moved away; subscribing where its slot is now");
                    self.topology.slots_changed();
                    self.lose(&channel);
                }
            }
            PushKind::Disconnection => {
                self.sessions.remove(from);
                let lost: Vec<String> = self
                    .placed
                    .iter()
                    .filter(|(_, addr)| addr.as_str() == from)
                    .map(|(channel, _)| channel.clone())
                    .collect();
                if !lost.is_empty() {
                    tracing::debug!(node = %from, channels = lost.len(), "shard subscription connection lost; resubscribing");
                    self.topology.slots_changed();
                }
                for channel in lost {
                    self.lose(&channel);
                }
            }
            _ => {}
        }
    }

    /// Subscribe every homeless channel again; whether all found a home.
    async fn rehome(&mut self) -> bool {
        let channels: Vec<String> = self.homeless.iter().cloned().collect();
        for channel in channels {
            match self.place(&channel).await {
                Ok(addr) => {
                    self.homeless.remove(&channel);
                    self.placed.insert(channel, addr);
                }
                Err(err) => {
                    tracing::debug!(%channel, error = %err, "shard channel not subscribed yet");
                }
            }
        }
        self.homeless.is_empty()
    }

    async fn drop_channel(&mut self, channel: &str) {
        unsubscribe(&mut self.channels, channel);
        if self.channels.contains_key(channel) {
            return;
        }
        self.homeless.remove(channel);
        if let Some(addr) = self.placed.remove(channel) {
            if let Some(conn) = self.sessions.get(&addr) {
                let mut conn = conn.clone();
                let _ = redis::cmd("SUNSUBSCRIBE")
                    .arg(channel)
                    .query_async::<Value>(&mut conn)
                    .await;
            }
            self.drop_idle_session(&addr);
        }
    }
}

/// Whether `reply` confirms the subscription of `channel`.
fn confirms(reply: &Value, channel: &str) -> bool {
    let (kind_ok, data) = match reply {
        Value::Push { kind, data } => (*kind == PushKind::SSubscribe, data.as_slice()),
        // RESP2-shaped confirmations: ["ssubscribe", channel, count].
        Value::Array(items) => match items.first() {
            Some(Value::BulkString(kind)) => {
                (kind.eq_ignore_ascii_case(b"ssubscribe"), &items[1..])
            }
            _ => (false, &items[..0]),
        },
        _ => (false, &[][..]),
    };
    kind_ok && matches!(data.first(), Some(Value::BulkString(name)) if name == channel.as_bytes())
}

/// The subscriber task of a cluster store (see the module docs).
pub(crate) async fn sharded_loop(
    topology: Arc<Topology>,
    mut requests: mpsc::UnboundedReceiver<SubscriberRequest>,
    stop: CancellationToken,
) {
    let (pushes, mut incoming) = mpsc::unbounded_channel::<Push>();
    let mut shards = Shards {
        topology,
        pushes,
        channels: HashMap::new(),
        placed: HashMap::new(),
        sessions: HashMap::new(),
        homeless: HashSet::new(),
    };
    let mut backoff = Duration::from_millis(50);
    let retry = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(retry);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            request = requests.recv() => match request {
                None => return,
                Some(SubscriberRequest::Subscribe { channel, reply }) => {
                    if let Some((notices, count)) = shards.channels.get_mut(&channel) {
                        *count += 1;
                        let _ = reply.send(Ok(notices.subscribe()));
                        continue;
                    }
                    match shards.place(&channel).await {
                        Ok(addr) => {
                            let (notices, receiver) = watch::channel(Notices::default());
                            shards.channels.insert(channel.clone(), (notices, 1));
                            shards.placed.insert(channel, addr);
                            let _ = reply.send(Ok(receiver));
                        }
                        // Its node is down or moving: subscribed when it
                        // settles (announcements are hints; see sharded_loop).
                        Err(err) if err.is_transient() => {
                            tracing::debug!(%channel, error = %err, "shard channel not subscribed yet");
                            let (notices, receiver) = watch::channel(Notices::default());
                            shards.channels.insert(channel.clone(), (notices, 1));
                            shards.homeless.insert(channel);
                            let _ = reply.send(Ok(receiver));
                            backoff = Duration::from_millis(50);
                            retry.as_mut().reset(tokio::time::Instant::now() + backoff);
                        }
                        Err(err) => {
                            let _ = reply.send(Err(err));
                        }
                    }
                }
                Some(SubscriberRequest::Unsubscribe { channel }) => {
                    shards.drop_channel(&channel).await;
                }
            },
            Some((from, push)) = incoming.recv() => {
                let had_homeless = !shards.homeless.is_empty();
                shards.on_push(&from, push);
                if !had_homeless && !shards.homeless.is_empty() {
                    backoff = Duration::from_millis(50);
                    retry.as_mut().reset(tokio::time::Instant::now() + backoff);
                }
            }
            _ = &mut retry, if !shards.homeless.is_empty() => {
                if shards.rehome().await {
                    backoff = Duration::from_millis(50);
                } else {
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    retry.as_mut().reset(tokio::time::Instant::now() + backoff);
                }
            }
        }
    }
}
