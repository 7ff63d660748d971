//! The Redis backend: each lease operation is one server-side script.
//!
//! An election talks to Redis over connections of its own: a
//! [`ConnectionManager`] for the scripts (so renewals never queue behind the
//! application's other traffic, and a dropped connection is re-established
//! in the background without replaying commands) and a pub/sub connection
//! for release notifications. The subscriber task resubscribes by itself
//! after any disconnect and counts each resubscription as a possible missed
//! release, so waiting candidates re-check the lease instead of sleeping
//! through a handover.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::{ErrorKind, RedisError, RedisResult, Script, Value};
use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::connection::{Connection, Endpoint};
use super::{Backend, Notices, Op, Reply, Store};
use crate::keys::Keys;
use crate::machine::{AcquireReply, RenewReply};
use crate::term::Holder;
use crate::{redact_url, Error, Result};

/// A script as sent to Redis: the shared prelude, then the script itself.
macro_rules! script {
    ($file:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!(concat!("scripts/", $file))
        )
    };
}

pub(crate) static ACQUIRE: &str = script!("acquire.lua");
pub(crate) static RENEW: &str = script!("renew.lua");
pub(crate) static RENEW_MANY: &str = script!("renew_many.lua");
pub(crate) static RESIGN: &str = script!("resign.lua");
pub(crate) static INSPECT: &str = script!("inspect.lua");
pub(crate) static MEMBERS: &str = script!("members.lua");
pub(crate) static CHECK: &str = script!("check.lua");

/// How to reach Redis.
#[derive(Debug, Clone)]
pub(crate) struct RedisTarget {
    pub url: String,
    pub tls_ca: Option<std::path::PathBuf>,
}

impl RedisTarget {
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    /// Parse the URL and read the CA file (no network I/O yet). TLS uses
    /// the system's roots unless a CA file is given.
    pub fn endpoint(&self) -> Result<Endpoint> {
        Endpoint::new(self)
    }

    /// Open a [`Connection`] whose calls time out after `call_timeout`,
    /// and check with a PING that the server accepts us.
    pub async fn connect(&self, call_timeout: Duration) -> Result<Connection> {
        let mut conn = self.endpoint()?.connection(call_timeout)?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.classify_first(e))?;
        Ok(conn)
    }

    /// [`RedisTarget::classify`] for the first exchange with a server, with a
    /// hint where a TLS mismatch is the likely cause: a plain Redis never
    /// answers a TLS handshake (the client times out), and a TLS port resets
    /// a client that sends plain commands.
    pub(crate) fn classify_first(&self, err: RedisError) -> Error {
        let tls = self.url.starts_with("rediss:");
        // The server took the connection and closed it (not a refusal);
        // the client reports that in several shapes.
        let text = err.to_string();
        let refused = text.contains("refused");
        let dropped = !refused && err.is_connection_dropped()
            || text.contains("reset by peer")
            || text.contains("closed");
        match self.classify(err) {
            Error::Timeout(_) if tls => Error::Tls {
                url: self.redacted(),
                detail: "no answer to the TLS handshake (if the server does not use TLS on \
                         this port, use redis://)"
                    .into(),
            },
            Error::Unreachable { url, detail } if !tls && dropped => Error::Unreachable {
                url,
                detail: format!(
                    "{detail} (the server closed the connection at once; if it expects TLS, \
                     use rediss://)"
                ),
            },
            other => other,
        }
    }

    /// Turn a client error into the crate's error, naming the URL without
    /// its password.
    pub fn classify(&self, err: RedisError) -> Error {
        classify(err, &self.redacted())
    }
}

/// Map a client error to the crate's error.
pub(crate) fn classify(err: RedisError, url: &str) -> Error {
    let code = err.code().unwrap_or_default();
    let detail = err.detail().unwrap_or_default().to_string();
    if code == "TENUREFOREIGN" {
        let (key, what) = detail.split_once(' ').unwrap_or((detail.as_str(), ""));
        return Error::ForeignData {
            key: key.to_string(),
            detail: what.to_string(),
        };
    }
    if code == "TENURECMD" {
        return classify_command_error(&detail);
    }
    if err.kind() == ErrorKind::Parse && detail.starts_with("Parse error") {
        // The reply was not RESP at all: an HTTP or SSH server, say. The
        // client's message spans lines and quotes bytes.
        return Error::Unreachable {
            url: url.to_string(),
            detail: "the server there does not speak the Redis protocol (check the host and port)"
                .into(),
        };
    }
    let text = crate::error::one_line(&err.to_string());
    if err.kind() == ErrorKind::AuthenticationFailed || matches!(code, "NOAUTH" | "WRONGPASS") {
        return Error::Auth {
            url: url.to_string(),
            detail: text,
        };
    }
    if code == "NOPERM" {
        // "this user has no permissions to run the 'eval' command", or to
        // access a key or channel.
        let command = detail
            .split('\'')
            .nth(1)
            .map_or_else(|| "this operation".to_string(), str::to_uppercase);
        return Error::NoPermission {
            command,
            detail: text,
        };
    }
    let lower = text.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        return Error::Tls {
            url: url.to_string(),
            detail: text,
        };
    }
    if err.is_timeout() {
        return Error::Timeout(Duration::ZERO);
    }
    if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
        return Error::Unreachable {
            url: url.to_string(),
            detail: text,
        };
    }
    Error::from_redis(err)
}

/// A command inside a tenure script failed: `detail` is "COMMAND error",
/// from the prelude's `call`. Missing permissions and renamed commands need
/// a person; anything else (a read-only replica, out of memory) may pass.
fn classify_command_error(detail: &str) -> Error {
    let (command, error) = detail.split_once(' ').unwrap_or((detail, ""));
    // Redis appends " script: SHA, on @user_script:LINE." to script errors.
    let error = error.split(" script: ").next().unwrap_or(error).trim();
    let refused = [
        "can't run this command",
        "can't publish",
        "no permissions",
        "NOPERM",
    ]
    .iter()
    .any(|sign| error.contains(sign));
    if refused {
        return Error::NoPermission {
            command: command.to_string(),
            detail: error.to_string(),
        };
    }
    if error.contains("Unknown Redis command") {
        return Error::NoPermission {
            command: command.to_string(),
            detail: format!(
                "{error} (the command is renamed or disabled in the server's configuration)"
            ),
        };
    }
    Error::redis(format!("{command} failed: {error}"))
}

/// Whether a write was refused because the server is a replica. Only the
/// check when connecting treats this as final: later, a primary demoted by a
/// failover may be promoted back, so lease operations keep retrying.
fn is_read_only(err: &RedisError) -> bool {
    let detail = err.detail().unwrap_or_default();
    match err.code() {
        Some("READONLY") => true,
        Some("TENURECMD") => detail
            .split_once(' ')
            .is_some_and(|(_, error)| error.starts_with("READONLY")),
        _ => false,
    }
}

/// What [`check_store`] looks at besides the election's commands.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StoreChecks {
    /// Also check the commands of partition sets (sorted sets).
    pub partitions: bool,
    /// Accept a server whose eviction policy may delete leases.
    pub allow_eviction: bool,
}

/// Check, once when connecting, that this Redis can keep leases: the user
/// may run every command tenure's scripts run (a missing permission is
/// reported by name now, not half-way through a lease operation later), and
/// no eviction policy may delete a lease under a leader that still believes
/// it leads.
pub(crate) async fn check_store(
    conn: &mut Connection,
    target: &RedisTarget,
    keys: &Keys,
    checks: StoreChecks,
) -> Result<()> {
    let (maxmemory, policy): (u64, String) = Script::new(CHECK)
        .key(&keys.probe)
        .arg(&keys.events)
        .arg(if checks.partitions { "1" } else { "0" })
        .invoke_async(conn)
        .await
        .map_err(|e| {
            if is_read_only(&e) {
                Error::Unsafe {
                    url: target.redacted(),
                    detail: "it is a read-only replica; point tenure at the primary".into(),
                }
            } else {
                target.classify(e)
            }
        })?;
    if maxmemory > 0 && policy != "noeviction" && !checks.allow_eviction {
        return Err(Error::Unsafe {
            url: target.redacted(),
            detail: format!(
                "maxmemory is {maxmemory} bytes with maxmemory-policy {policy}, so Redis may \
                 evict a lease while its leader still leads, and another instance would be \
                 elected at once; set maxmemory-policy noeviction (or maxmemory 0) on the Redis \
                 that holds tenure's keys, or allow eviction explicitly (allow_eviction, \
                 --allow-eviction) if fencing tokens protect every write"
            ),
        });
    }
    if maxmemory > 0 && policy != "noeviction" {
        tracing::warn!(url = %target.redacted(), %policy, "eviction allowed: an evicted lease lets a second leader in while the first still believes it leads");
    }
    Ok(())
}

/// A Redis server (single node) as a [`Store`]: one connection for lease
/// operations, the scripts, and the reset and reload logic, shared by
/// every election and partition set that uses it.
///
/// The connection is a [`Connection`] of tenure's own (so renewals
/// never queue behind the application's other traffic, and a dropped
/// connection is re-established in the background without replaying
/// commands). Announcements go over separate pub/sub connections
/// ([`subscribe`]).
pub(crate) struct RedisStore {
    target: RedisTarget,
    call_timeout: Duration,
    endpoint: Endpoint,
    /// Replaced by [`RedisStore::reset`] after a timeout.
    conn: std::sync::Mutex<Connection>,
    scripts: Scripts,
}

struct Scripts {
    acquire: Script,
    renew: Script,
    renew_many: Script,
    resign: Script,
    inspect: Script,
    members: Script,
}

impl RedisStore {
    /// Connect and check with a PING that the server accepts us.
    pub async fn connect(target: RedisTarget, call_timeout: Duration) -> Result<Self> {
        let endpoint = target.endpoint()?;
        let mut conn = endpoint.connection(call_timeout)?;
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| target.classify_first(e))?;
        Ok(RedisStore {
            target,
            endpoint,
            call_timeout,
            conn: std::sync::Mutex::new(conn),
            scripts: Scripts {
                acquire: Script::new(ACQUIRE),
                renew: Script::new(RENEW),
                renew_many: Script::new(RENEW_MANY),
                resign: Script::new(RESIGN),
                inspect: Script::new(INSPECT),
                members: Script::new(MEMBERS),
            },
        })
    }

    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    /// [`check_store`] on this store's connection.
    pub async fn check(&self, keys: &Keys, checks: StoreChecks) -> Result<()> {
        check_store(&mut self.conn(), &self.target, keys, checks).await
    }

    fn conn(&self) -> Connection {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Start over on a new connection. A call that timed out says nothing
    /// about the connection (the client does not reconnect on timeouts), and
    /// a silently dead connection would otherwise fail every later call.
    pub fn reset(&self) {
        match self.endpoint.connection(self.call_timeout) {
            Ok(fresh) => *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh,
            Err(err) => tracing::warn!(error = %err, "cannot open a new Redis connection"),
        }
    }

    /// The script call of one operation: the only place each script's KEYS
    /// and ARGV are laid out.
    fn command(&self, op: &Op<'_>) -> redis::Cmd {
        fn evalsha(script: &Script, keys: &[&str]) -> redis::Cmd {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
            cmd
        }
        match *op {
            Op::Heartbeat {
                keys,
                member,
                ttl_ms,
                join,
                ..
            } => {
                let mut cmd = evalsha(&self.scripts.members, &[&keys.members]);
                cmd.arg(member)
                    .arg(ttl_ms)
                    .arg(if join { "1" } else { "0" });
                cmd
            }
            Op::Acquire { keys, request, .. } => {
                let mut cmd = evalsha(
                    &self.scripts.acquire,
                    &[
                        &keys.lease,
                        &keys.token,
                        &keys.epoch,
                        &keys.probe,
                        &keys.prefix_epoch,
                    ],
                );
                cmd.arg(request.id)
                    .arg(request.ttl_ms)
                    .arg(&keys.events)
                    .arg(request.attempt)
                    .arg(request.hold_off_ms)
                    .arg(request.aux_ttl_ms());
                cmd
            }
            Op::Renew {
                keys,
                id,
                token,
                ttl_ms,
                announce,
                ..
            } => {
                let mut cmd = evalsha(&self.scripts.renew, &[&keys.lease]);
                cmd.arg(id).arg(token).arg(ttl_ms);
                if announce {
                    cmd.arg(&keys.events);
                }
                cmd
            }
            Op::RenewMany {
                id, ttl_ms, terms, ..
            } => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.scripts.renew_many.get_hash()).arg(terms.len());
                for (_, lease, _) in terms {
                    cmd.arg(lease);
                }
                cmd.arg(id).arg(ttl_ms);
                for (_, _, token) in terms {
                    cmd.arg(token);
                }
                cmd
            }
            Op::Resign {
                keys, id, token, ..
            } => {
                let mut cmd = evalsha(&self.scripts.resign, &[&keys.lease]);
                cmd.arg(id).arg(token).arg(&keys.events);
                cmd
            }
            Op::Inspect { keys, .. } => evalsha(&self.scripts.inspect, &[&keys.lease]),
        }
    }

    /// Read the reply of one operation.
    fn reply(&self, op: &Op<'_>, value: Value) -> Result<Reply> {
        let url = self.target.redacted();
        Ok(match op {
            Op::Heartbeat { .. } => {
                let (members, phantoms) = parse_members(value, &url)?;
                Reply::Members { members, phantoms }
            }
            Op::Acquire { .. } => Reply::Acquire(parse_acquire(value, &url)?),
            Op::Renew { .. } => Reply::Renew(parse_renew(value, &url)?),
            Op::RenewMany { terms, .. } => {
                Reply::RenewMany(parse_renew_many(value, terms.len(), &url)?)
            }
            Op::Resign { .. } => Reply::Resign(ReplyReader { url: &url }.int(&value)? == 1),
            Op::Inspect { .. } => Reply::Inspect(parse_inspect(value, &url)?),
        })
    }

    /// Carry out `ops` in one pipeline. Scripts missing after a Redis
    /// restart (NOSCRIPT) are loaded, and only the operations that found
    /// them missing are sent again, so nothing runs twice.
    pub async fn batch(&self, ops: &[Op<'_>]) -> Result<Vec<Result<Reply>>> {
        let commands: Vec<redis::Cmd> = ops.iter().map(|op| self.command(op)).collect();
        let mut conn = self.conn();
        let mut results = self.pipeline(&mut conn, commands.iter()).await?;
        let missing: Vec<usize> = (0..results.len())
            .filter(|i| is_noscript(&results[*i]))
            .collect();
        if !missing.is_empty() {
            for script in [
                &self.scripts.acquire,
                &self.scripts.renew,
                &self.scripts.renew_many,
                &self.scripts.resign,
                &self.scripts.inspect,
                &self.scripts.members,
            ] {
                script
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .map_err(|e| self.target.classify(e))?;
            }
            let again = self
                .pipeline(&mut conn, missing.iter().map(|i| &commands[*i]))
                .await?;
            for (i, result) in missing.into_iter().zip(again) {
                results[i] = result;
            }
        }
        Ok(ops
            .iter()
            .zip(results)
            .map(|(op, result)| match result {
                Ok(value) => self.reply(op, value),
                Err(err) => Err(self.target.classify(err)),
            })
            .collect())
    }

    async fn pipeline<'c>(
        &self,
        conn: &mut Connection,
        commands: impl Iterator<Item = &'c redis::Cmd>,
    ) -> Result<Vec<RedisResult<Value>>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for command in commands {
            pipe.add_command(command.clone());
        }
        pipe.query_async::<Vec<RedisResult<Value>>>(conn)
            .await
            .map_err(|e| self.target.classify(e))
    }
}

fn is_noscript(result: &RedisResult<Value>) -> bool {
    matches!(result, Err(e) if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript))
}

/// A Redis store and its subscriber: everything elections and partition
/// sets on one Redis share.
pub(crate) struct RedisShared {
    pub store: Arc<RedisStore>,
    pub subscriber: Subscriber,
}

impl RedisShared {
    pub async fn connect(target: RedisTarget, call_timeout: Duration) -> Result<Arc<Self>> {
        let store = RedisStore::connect(target, call_timeout).await?;
        let subscriber = Subscriber::start(store.target().clone());
        Ok(Arc::new(RedisShared {
            store: Arc::new(store),
            subscriber,
        }))
    }

    /// An election on this Redis: checked (permissions, eviction), and
    /// subscribed to its announcements.
    pub async fn election(
        self: &Arc<Self>,
        name: &str,
        keys: Keys,
        checks: StoreChecks,
    ) -> Result<Backend> {
        self.store.check(&keys, checks).await?;
        let (notices, subscription) = self.subscriber.subscribe(&keys.events).await?;
        Ok(Backend::new(
            Store::Redis(self.store.clone()),
            name.to_string(),
            keys,
            notices,
            Some(Box::new((subscription, self.clone()))),
        ))
    }
}

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

enum SubscriberRequest {
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
    pub fn start(target: RedisTarget) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        tokio::spawn(subscriber_loop(target, receiver, stop.clone()));
        Subscriber {
            requests,
            _stop: stop.drop_guard(),
        }
    }

    /// Subscribe to `channel`; fails as the SUBSCRIBE did (a missing
    /// permission, an unreachable server).
    pub async fn subscribe(
        &self,
        channel: &str,
    ) -> Result<(watch::Receiver<Notices>, Subscription)> {
        let (reply, answer) = oneshot::channel();
        let request = SubscriberRequest::Subscribe {
            channel: channel.to_string(),
            reply,
        };
        let gone = || Error::redis("the subscriber task has stopped");
        self.requests.send(request).map_err(|_| gone())?;
        let notices = answer.await.map_err(|_| gone())??;
        Ok((
            notices,
            Subscription {
                channel: channel.to_string(),
                requests: self.requests.clone(),
            },
        ))
    }
}

/// The channels subscribed, each with its notices and how many
/// subscriptions share it.
type Channels = HashMap<String, (watch::Sender<Notices>, usize)>;

async fn subscriber_loop(
    target: RedisTarget,
    mut requests: mpsc::UnboundedReceiver<SubscriberRequest>,
    stop: CancellationToken,
) {
    let mut channels: Channels = HashMap::new();
    let mut backoff = Duration::from_millis(50);
    let mut warned = false;
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = open_pubsub(&target) => opened,
        };
        let failure = match opened {
            Ok(pubsub) => {
                let (mut sink, mut stream) = pubsub.split();
                let session = async {
                    for channel in channels.keys() {
                        sink.subscribe(channel)
                            .await
                            .map_err(|e| target.classify(e))?;
                    }
                    // A release may have happened while we were not subscribed.
                    for (notices, _) in channels.values() {
                        notices.send_modify(|n| n.released += 1);
                    }
                    if !channels.is_empty() {
                        tracing::debug!(channels = channels.len(), "subscribed to lease events");
                    }
                    backoff = Duration::from_millis(50);
                    warned = false;
                    loop {
                        tokio::select! {
                            message = stream.next() => match message {
                                Some(message) => deliver(&channels, &message),
                                None => return Ok::<(), Error>(()),
                            },
                            request = requests.recv() => match request {
                                None => return Ok(()),
                                Some(SubscriberRequest::Subscribe { channel, reply }) => {
                                    if let Some((notices, count)) = channels.get_mut(&channel) {
                                        *count += 1;
                                        let _ = reply.send(Ok(notices.subscribe()));
                                        continue;
                                    }
                                    match sink.subscribe(&channel).await {
                                        Ok(()) => {
                                            let (notices, receiver) = watch::channel(Notices::default());
                                            channels.insert(channel, (notices, 1));
                                            let _ = reply.send(Ok(receiver));
                                        }
                                        Err(err) => {
                                            let dropped = err.is_connection_dropped() || err.is_io_error();
                                            let _ = reply.send(Err(target.classify(err)));
                                            if dropped {
                                                return Ok(());
                                            }
                                        }
                                    }
                                }
                                Some(SubscriberRequest::Unsubscribe { channel }) => {
                                    unsubscribe(&mut channels, &channel);
                                    if !channels.contains_key(&channel) {
                                        let _ = sink.unsubscribe(&channel).await;
                                    }
                                }
                            },
                        }
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    ended = session => ended.err(),
                }
            }
            Err(err) => Some(err),
        };
        if requests.is_closed() && channels.is_empty() {
            return;
        }
        match failure {
            None => tracing::debug!("lease event subscription closed; resubscribing"),
            Some(err) => {
                if !warned {
                    tracing::warn!(error = %err, "lease event subscription failed; retrying (handover falls back to lease expiry meanwhile)");
                    warned = true;
                }
            }
        }
        // Until the next connection, answer new subscriptions with the
        // failure: an election being built must not wait for an outage.
        let retry = tokio::time::sleep(backoff);
        tokio::pin!(retry);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = &mut retry => break,
                request = requests.recv() => match request {
                    None => return,
                    Some(SubscriberRequest::Subscribe { reply, .. }) => {
                        let _ = reply.send(Err(Error::Unreachable {
                            url: target.redacted(),
                            detail: "the pub/sub connection is down".into(),
                        }));
                    }
                    Some(SubscriberRequest::Unsubscribe { channel }) => {
                        unsubscribe(&mut channels, &channel);
                    }
                },
            }
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

fn unsubscribe(channels: &mut Channels, channel: &str) {
    if let Some((_, count)) = channels.get_mut(channel) {
        *count -= 1;
        if *count == 0 {
            channels.remove(channel);
        }
    }
}

/// Hand one message to its channel's notices.
fn deliver(channels: &Channels, message: &redis::Msg) {
    let Some((notices, _)) = channels.get(message.get_channel_name()) else {
        return;
    };
    let payload = message.get_payload_bytes();
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

/// Open a pub/sub connection.
async fn open_pubsub(target: &RedisTarget) -> Result<redis::aio::PubSub> {
    let endpoint = target.endpoint()?;
    let limit = Duration::from_secs(5);
    endpoint.pubsub(limit).await.map_err(|e| target.classify(e))
}

/// The ttl of a `renewed:TOKEN:TTL` announcement.
fn renewed_ttl_ms(payload: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(payload.strip_prefix(b"renewed:")?).ok()?;
    text.rsplit(':').next()?.parse().ok()
}

/// Reads script replies, naming the server in errors.
struct ReplyReader<'a> {
    url: &'a str,
}

impl ReplyReader<'_> {
    fn unexpected(&self, what: &str) -> Error {
        Error::redis(format!(
            "unexpected reply from Redis: {what} (is {} a Redis server?)",
            self.url
        ))
    }

    fn array(&self, value: Value, min_len: usize) -> Result<Vec<Value>> {
        match value {
            Value::Array(items) if items.len() >= min_len => Ok(items),
            other => Err(self.unexpected(&format!("{other:?}"))),
        }
    }

    fn int(&self, value: &Value) -> Result<i64> {
        match value {
            Value::Int(n) => Ok(*n),
            other => Err(self.unexpected(&format!("{other:?} where an integer was expected"))),
        }
    }

    fn uint(&self, value: &Value) -> Result<u64> {
        let n = self.int(value)?;
        u64::try_from(n).map_err(|_| self.unexpected(&format!("negative number {n}")))
    }

    fn text(&self, value: &Value) -> Result<String> {
        match value {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Value::SimpleString(s) => Ok(s.clone()),
            other => Err(self.unexpected(&format!("{other:?} where a string was expected"))),
        }
    }
}

/// Parse the reply of `acquire.lua`.
pub(crate) fn parse_acquire(reply: Value, url: &str) -> Result<AcquireReply> {
    let r = ReplyReader { url };
    let items = r.array(reply, 7)?;
    let won = r.int(&items[0])?;
    let holder = Holder {
        token: r.uint(&items[1])?,
        owner: r.text(&items[2])?,
        ttl_left: Duration::from_millis(r.uint(&items[3])?),
        since_ms: r.uint(&items[4])?,
        attempt: r.text(&items[5])?,
        ttl: Duration::from_millis(r.uint(&items[6])?),
    };
    Ok(match won {
        1 => AcquireReply::Won {
            token: holder.token,
        },
        2 => AcquireReply::HoldOff {
            wait: holder.ttl_left,
        },
        _ => AcquireReply::Held(holder),
    })
}

/// Parse the reply of `renew.lua`.
pub(crate) fn parse_renew(reply: Value, url: &str) -> Result<RenewReply> {
    let r = ReplyReader { url };
    let items = r.array(reply, 1)?;
    if r.int(&items[0])? == 1 {
        return Ok(RenewReply::Renewed);
    }
    if items.len() < 4 {
        return Ok(RenewReply::NotOwner(None));
    }
    Ok(RenewReply::NotOwner(Some(Holder {
        owner: r.text(&items[1])?,
        token: r.uint(&items[2])?,
        ttl_left: Duration::from_millis(r.uint(&items[3])?),
        since_ms: 0,
        attempt: String::new(),
        ttl: Duration::ZERO,
    })))
}

/// Parse the reply of `renew_many.lua`: one result per term, in order; an
/// entry about foreign data becomes that term's [`Error::ForeignData`].
pub(crate) fn parse_renew_many(
    reply: Value,
    terms: usize,
    url: &str,
) -> Result<Vec<Result<RenewReply>>> {
    let r = ReplyReader { url };
    let items = r.array(reply, terms)?;
    if items.len() != terms {
        return Err(r.unexpected(&format!("{} results for {terms} renewals", items.len())));
    }
    items
        .into_iter()
        .map(|item| {
            let entry = match &item {
                Value::Int(1) => return Ok(Ok(RenewReply::Renewed)),
                Value::Int(0) => return Ok(Ok(RenewReply::NotOwner(None))),
                Value::Array(entry) => entry,
                other => {
                    return Err(r.unexpected(&format!("{other:?} where a renewal was expected")))
                }
            };
            match entry.first().map(|code| r.int(code)).transpose()? {
                Some(-1) => {
                    let text = |i: usize| entry.get(i).map(|v| r.text(v)).transpose();
                    Ok(Err(Error::ForeignData {
                        key: text(1)?.unwrap_or_default(),
                        detail: text(2)?.unwrap_or_default(),
                    }))
                }
                // An entry that cannot be read fails its own term only.
                _ => Ok(parse_renew(item, url)),
            }
        })
        .collect()
}

/// Parse the reply of `members.lua`: the live members and the number of
/// phantom entries.
pub(crate) fn parse_members(reply: Value, url: &str) -> Result<(Vec<String>, u64)> {
    let r = ReplyReader { url };
    let mut items = r.array(reply, 2)?;
    let phantoms = r.uint(&items[1])?;
    let members = match items.swap_remove(0) {
        Value::Array(members) => members
            .iter()
            .map(|member| r.text(member))
            .collect::<Result<Vec<_>>>()?,
        other => return Err(r.unexpected(&format!("{other:?} where the members were expected"))),
    };
    Ok((members, phantoms))
}

/// Parse the reply of `inspect.lua`.
pub(crate) fn parse_inspect(reply: Value, url: &str) -> Result<Option<Holder>> {
    let r = ReplyReader { url };
    let items = r.array(reply, 0)?;
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() < 6 {
        return Err(r.unexpected("an inspect reply with fewer than 6 items"));
    }
    Ok(Some(Holder {
        owner: r.text(&items[0])?,
        token: r.uint(&items[1])?,
        ttl_left: Duration::from_millis(r.uint(&items[2])?),
        since_ms: r.uint(&items[3])?,
        attempt: r.text(&items[4])?,
        ttl: Duration::from_millis(r.uint(&items[5])?),
    }))
}
