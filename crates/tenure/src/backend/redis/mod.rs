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

pub(crate) mod connection;
pub(crate) mod keys;
pub(crate) mod routed;
pub(crate) mod sharded;
pub(crate) mod topology;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::{ErrorKind, RedisError, RedisResult, Script, Value};
use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Address, Backend, Notices, Op, Reply, Store};
use crate::error::copy_error;
use crate::machine::{AcquireReply, RenewReply};
use crate::term::Holder;
use crate::{redact_url, Error, Result};
use connection::{Connection, Endpoint};
use keys::Keys;
use topology::{reply_addr, slot_of, tag_of_slot, Following, Node, Topology};

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
pub(crate) static LAST_RUN: &str = script!("last_run.lua");
pub(crate) static RECORD_RUN: &str = script!("record_run.lua");
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
        return Error::NotTheStore {
            url: url.to_string(),
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
pub(crate) fn is_read_only(err: &RedisError) -> bool {
    refused_with(err, "READONLY")
}

/// Whether a write was refused because the server is no primary that may
/// take it: a replica (`READONLY`), or a Sentinel primary that lost the
/// replicas `min-replicas-to-write` asks for (`NOREPLICAS`), as a primary
/// just failed over from does.
pub(crate) fn is_not_writable(err: &RedisError) -> bool {
    refused_with(err, "READONLY") || refused_with(err, "NOREPLICAS")
}

/// Whether `err` is the error `code`, from Redis or from a command inside
/// a tenure script.
fn refused_with(err: &RedisError, code: &str) -> bool {
    let detail = err.detail().unwrap_or_default();
    match err.code() {
        Some(c) if c == code => true,
        Some("TENURECMD") => detail
            .split_once(' ')
            .is_some_and(|(_, error)| error.starts_with(code)),
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
    sharded: bool,
) -> Result<()> {
    let (maxmemory, policy): (u64, String) = Script::new(&for_topology(CHECK, sharded))
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

/// A script as the store runs it: on a cluster (`sharded`), announcements
/// use sharded pub/sub (`SPUBLISH`), so they stay on the election's shard
/// (see [`sharded`]).
pub(crate) fn for_topology(code: &str, sharded: bool) -> String {
    if sharded {
        code.replace("call('PUBLISH',", "call('SPUBLISH',")
    } else {
        code.to_string()
    }
}

/// How many times one batch follows `MOVED`/`ASK` redirections, reloads
/// scripts or waits out `TRYAGAIN` before its remaining operations fail.
const MAX_ROUNDS: usize = 5;

/// A Redis store as a [`Store`]: the [`Topology`] (one server, Sentinel or
/// Cluster) and the scripts, shared by every election and partition set
/// that uses it.
///
/// Each node has one connection for lease operations, of tenure's own (so
/// renewals never queue behind the application's other traffic, and a
/// dropped connection is re-established without replaying commands).
/// Announcements go over separate pub/sub connections ([`Subscriber`]).
pub(crate) struct RedisStore {
    topology: Arc<Topology>,
    scripts: Scripts,
}

struct Scripts {
    acquire: Script,
    renew: Script,
    renew_many: Script,
    resign: Script,
    inspect: Script,
    members: Script,
    last_run: Script,
    record_run: Script,
}

impl Scripts {
    fn all(&self) -> [&Script; 8] {
        [
            &self.acquire,
            &self.renew,
            &self.renew_many,
            &self.resign,
            &self.inspect,
            &self.members,
            &self.last_run,
            &self.record_run,
        ]
    }
}

/// One command of a batch: the slot it goes to, and the command.
struct Call {
    slot: u16,
    cmd: redis::Cmd,
}

/// What became of one [`Call`].
enum Outcome {
    /// The server's reply, or its error reply.
    Reply(RedisResult<Value>),
    /// No reply: the node could not be found or did not answer. The call
    /// may or may not have run.
    Failed(Error),
}

/// Where a call goes next, when not simply to its slot's node.
#[derive(Clone)]
struct Redirect {
    node: Arc<Node>,
    /// An `ASK` redirection: send `ASKING` first.
    asking: bool,
}

/// One part of an operation: most operations are one call; a
/// [`Op::RenewMany`] on a cluster is one call per slot of its terms.
struct Part {
    op: usize,
    /// For a split [`Op::RenewMany`]: the terms (indices) this call renews.
    terms: Option<Vec<usize>>,
}

impl RedisStore {
    /// Find the store's nodes ([`Topology::connect`]).
    pub async fn connect(
        target: RedisTarget,
        call_timeout: Duration,
        following: Following,
    ) -> Result<Self> {
        let topology = Topology::connect(target, call_timeout, following).await?;
        let sharded = topology.is_cluster();
        let script = |code: &str| Script::new(&for_topology(code, sharded));
        Ok(RedisStore {
            topology,
            scripts: Scripts {
                acquire: script(ACQUIRE),
                renew: script(RENEW),
                renew_many: script(RENEW_MANY),
                resign: script(RESIGN),
                inspect: script(INSPECT),
                members: script(MEMBERS),
                last_run: script(LAST_RUN),
                record_run: script(RECORD_RUN),
            },
        })
    }

    pub fn target(&self) -> &RedisTarget {
        self.topology.target()
    }

    pub fn topology(&self) -> &Arc<Topology> {
        &self.topology
    }

    /// [`check_store`] on the node that serves the election at `at`.
    pub async fn check(&self, at: Address<'_>, checks: StoreChecks) -> Result<()> {
        let keys = &Keys::of(at);
        let node = self.topology.node_for(slot_of(&keys.probe)).await?;
        let sharded = self.topology.is_cluster();
        let result = check_store(&mut node.conn(), self.target(), keys, checks, sharded).await;
        if let Err(Error::Unreachable { .. } | Error::NotTheStore { .. } | Error::Timeout(_)) =
            &result
        {
            self.topology.failed(&node);
        }
        result
    }

    /// Start over on new connections (after a timeout: the call may have
    /// run, and the connection may be dead).
    pub fn reset(&self) {
        self.topology.reset();
    }

    /// The prefix's epoch key for an election whose lease is `lease`: the
    /// prefix-wide key on one server; on a cluster, where a script may only
    /// touch keys of one slot, a key per slot (tagged to share the
    /// election's slot), so the hold-off of a name new to a node counts
    /// from when that node first served the slot.
    fn prefix_epoch(&self, keys: &Keys) -> String {
        if !self.topology.is_cluster() {
            return keys.prefix_epoch.clone();
        }
        let prefix = keys
            .prefix_epoch
            .strip_suffix(":epoch")
            .unwrap_or(&keys.prefix_epoch);
        format!(
            "{prefix}:{{{}}}:slot-epoch",
            tag_of_slot(slot_of(&keys.lease))
        )
    }

    /// The script call of one operation (of some terms of a
    /// [`Op::RenewMany`]): the only place each script's KEYS and ARGV are
    /// laid out.
    fn command(&self, op: &Op<'_>, terms: Option<&[usize]>) -> redis::Cmd {
        fn evalsha(script: &Script, keys: &[&str]) -> redis::Cmd {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
            cmd
        }
        match *op {
            Op::Heartbeat {
                group,
                member,
                ttl_ms,
                join,
            } => {
                let keys = Keys::of(group);
                let mut cmd = evalsha(&self.scripts.members, &[&keys.members]);
                cmd.arg(member)
                    .arg(ttl_ms)
                    .arg(if join { "1" } else { "0" });
                cmd
            }
            Op::Acquire { at, request } => {
                let keys = &Keys::of(at);
                let prefix_epoch = self.prefix_epoch(keys);
                let mut cmd = evalsha(
                    &self.scripts.acquire,
                    &[
                        &keys.lease,
                        &keys.token,
                        &keys.epoch,
                        &prefix_epoch,
                        &keys.witness,
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
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => {
                let keys = &Keys::of(at);
                let prefix_epoch = self.prefix_epoch(keys);
                let mut cmd = evalsha(
                    &self.scripts.renew,
                    &[&keys.lease, &keys.witness, &prefix_epoch],
                );
                // The epoch's ttl as an acquire would set it for this ttl.
                let epoch_ttl_ms =
                    (crate::machine::AUX_TTL.as_millis() as u64).max(ttl_ms.saturating_mul(10));
                cmd.arg(id).arg(token).arg(ttl_ms).arg(epoch_ttl_ms);
                if announce {
                    cmd.arg(&keys.events);
                }
                cmd
            }
            Op::RenewMany {
                prefix,
                id,
                ttl_ms,
                terms: all,
            } => {
                let chosen: Vec<&(&str, u64)> = match terms {
                    Some(indices) => indices.iter().map(|i| &all[*i]).collect(),
                    None => all.iter().collect(),
                };
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(self.scripts.renew_many.get_hash())
                    .arg(chosen.len() * 2);
                for (name, _) in &chosen {
                    let at = Address::new(prefix, name);
                    cmd.arg(Keys::lease_of(at)).arg(Keys::witness_of(at));
                }
                cmd.arg(id).arg(ttl_ms);
                for (_, token) in &chosen {
                    cmd.arg(token);
                }
                cmd
            }
            Op::Resign { at, id, token } => {
                let keys = Keys::of(at);
                let mut cmd = evalsha(&self.scripts.resign, &[&keys.lease, &keys.witness]);
                cmd.arg(id).arg(token).arg(&keys.events);
                cmd
            }
            Op::Inspect { at } => evalsha(&self.scripts.inspect, &[&Keys::lease_of(at)]),
            Op::LastRun { at } => evalsha(&self.scripts.last_run, &[&Keys::of(at).last_run]),
            Op::RecordRun {
                at,
                id,
                token,
                keep_ms,
            } => {
                let keys = Keys::of(at);
                let mut cmd = evalsha(&self.scripts.record_run, &[&keys.lease, &keys.last_run]);
                cmd.arg(id).arg(token).arg(keep_ms);
                cmd
            }
        }
    }

    /// The hash slot an operation is routed by: its lease's (a group's
    /// member set's, for a heartbeat; the first term's, for many).
    fn routing_slot(op: &Op<'_>) -> u16 {
        match *op {
            Op::Heartbeat { group, .. } => slot_of(&Keys::of(group).members),
            Op::Acquire { at, .. }
            | Op::Renew { at, .. }
            | Op::Resign { at, .. }
            | Op::Inspect { at }
            | Op::LastRun { at }
            | Op::RecordRun { at, .. } => slot_of(&Keys::lease_of(at)),
            Op::RenewMany { prefix, terms, .. } => terms.first().map_or(0, |(name, _)| {
                slot_of(&Keys::lease_of(Address::new(prefix, name)))
            }),
        }
    }

    /// Read the reply of one operation (of some of its terms).
    fn reply(&self, op: &Op<'_>, terms: Option<usize>, value: Value, url: &str) -> Result<Reply> {
        Ok(match op {
            Op::Heartbeat { .. } => {
                let (members, phantoms) = parse_members(value, url)?;
                Reply::Members { members, phantoms }
            }
            Op::Acquire { .. } => Reply::Acquire(parse_acquire(value, url)?),
            Op::Renew { .. } => Reply::Renew(parse_renew(value, url)?),
            Op::RenewMany { terms: all, .. } => {
                Reply::RenewMany(parse_renew_many(value, terms.unwrap_or(all.len()), url)?)
            }
            Op::Resign { .. } => Reply::Resign(ReplyReader { url }.int(&value)? == 1),
            Op::Inspect { .. } => Reply::Inspect(parse_inspect(value, url)?),
            Op::LastRun { .. } => Reply::LastRun(parse_last_run(value, url)?),
            Op::RecordRun { .. } => Reply::RecordRun(ReplyReader { url }.int(&value)? == 1),
        })
    }

    /// Carry out `ops`: one pipeline per node (a single server and Sentinel
    /// have one), all nodes at once. On a cluster a [`Op::RenewMany`] is
    /// split by slot (a script may only touch keys of one slot), and
    /// operations redirected by `MOVED`/`ASK` are sent again where they
    /// belong. Scripts missing after a restart (NOSCRIPT) are loaded, and
    /// only the operations that found them missing are sent again, so
    /// nothing runs twice.
    ///
    /// The outer error means that no operation got any reply; otherwise
    /// each operation has its own result.
    pub async fn batch(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
    ) -> Result<Vec<Result<Reply>>> {
        let cluster = self.topology.is_cluster();
        let mut parts = Vec::with_capacity(ops.len());
        let mut calls = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::RenewMany { prefix, terms, .. } if cluster => {
                    let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
                    for (t, (name, _)) in terms.iter().enumerate() {
                        let slot = slot_of(&Keys::lease_of(Address::new(prefix, name)));
                        by_slot.entry(slot).or_default().push(t);
                    }
                    for (slot, indices) in by_slot {
                        calls.push(Call {
                            slot,
                            cmd: self.command(op, Some(&indices)),
                        });
                        parts.push(Part {
                            op: i,
                            terms: Some(indices),
                        });
                    }
                }
                _ => {
                    // Outside a cluster there is one node: no slot to compute
                    // on the renewal path.
                    let slot = if cluster { Self::routing_slot(op) } else { 0 };
                    calls.push(Call {
                        slot,
                        cmd: self.command(op, None),
                    });
                    parts.push(Part { op: i, terms: None });
                }
            }
        }
        let outcomes = self.run(&calls, round_trips).await?;
        // Redacted once: a cluster batch may hold thousands of replies.
        let url = self.target().redacted();
        let mut replies: Vec<Option<Result<Reply>>> = (0..ops.len()).map(|_| None).collect();
        let mut many: HashMap<usize, Vec<Option<Result<RenewReply>>>> = HashMap::new();
        for (part, outcome) in parts.into_iter().zip(outcomes) {
            let op = &ops[part.op];
            let result = match outcome {
                Outcome::Reply(Ok(value)) => {
                    self.reply(op, part.terms.as_ref().map(Vec::len), value, &url)
                }
                Outcome::Reply(Err(err)) => Err(self.target().classify(err)),
                Outcome::Failed(err) => Err(err),
            };
            match (part.terms, op) {
                (Some(indices), Op::RenewMany { terms, .. }) => {
                    let slots = many
                        .entry(part.op)
                        .or_insert_with(|| (0..terms.len()).map(|_| None).collect());
                    match result.and_then(Reply::into_renew_many) {
                        Ok(results) => {
                            for (t, r) in indices.into_iter().zip(results) {
                                slots[t] = Some(r);
                            }
                        }
                        Err(err) => {
                            for t in indices {
                                slots[t] = Some(Err(copy_error(&err)));
                            }
                        }
                    }
                }
                _ => replies[part.op] = Some(result),
            }
        }
        for (i, slots) in many {
            let results = slots
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(Error::redis("internal: a renewal had no call"))))
                .collect();
            replies[i] = Some(Ok(Reply::RenewMany(results)));
        }
        Ok(replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::redis("internal: an operation had no call"))))
            .collect())
    }

    /// Send `calls` to their nodes, following redirections (see
    /// [`RedisStore::batch`]).
    async fn run(&self, calls: &[Call], round_trips: &AtomicU64) -> Result<Vec<Outcome>> {
        let mut outcomes: Vec<Option<Outcome>> = (0..calls.len()).map(|_| None).collect();
        let mut redirects: Vec<Option<Redirect>> = vec![None; calls.len()];
        let mut answered = false;
        let mut first_failure: Option<Error> = None;
        let fail = |first: &mut Option<Error>, err: Error| {
            let copy = copy_error(&err);
            if first.is_none() {
                *first = Some(err);
            }
            Outcome::Failed(copy)
        };
        for _round in 0..MAX_ROUNDS {
            let mut groups: Vec<(Arc<Node>, Vec<usize>)> = Vec::new();
            for i in 0..calls.len() {
                if outcomes[i].is_some() {
                    continue;
                }
                let node = match &redirects[i] {
                    Some(redirect) => redirect.node.clone(),
                    None => match self.topology.node_for(calls[i].slot).await {
                        Ok(node) => node,
                        Err(err) => {
                            outcomes[i] = Some(fail(&mut first_failure, err));
                            continue;
                        }
                    },
                };
                match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                    Some((_, members)) => members.push(i),
                    None => groups.push((node, vec![i])),
                }
            }
            if groups.is_empty() {
                break;
            }
            let sent = groups.iter().map(|(node, members)| {
                let commands: Vec<(&redis::Cmd, bool)> = members
                    .iter()
                    .map(|i| {
                        let asking = redirects[*i].as_ref().is_some_and(|r| r.asking);
                        (&calls[*i].cmd, asking)
                    })
                    .collect();
                self.pipeline(node, commands)
            });
            round_trips.fetch_add(groups.len() as u64, Ordering::Relaxed);
            let results = futures_util::future::join_all(sent).await;
            let mut reload: Vec<Arc<Node>> = Vec::new();
            let mut wait = false;
            for ((node, members), result) in groups.into_iter().zip(results) {
                let values = match result {
                    Ok(values) => values,
                    Err(err) => {
                        self.topology.failed(&node);
                        for i in members {
                            outcomes[i] = Some(fail(&mut first_failure, copy_error(&err)));
                        }
                        first_failure.get_or_insert(err);
                        continue;
                    }
                };
                answered = true;
                for (i, value) in members.into_iter().zip(values) {
                    let err = match value {
                        Ok(value) => {
                            outcomes[i] = Some(Outcome::Reply(Ok(value)));
                            continue;
                        }
                        Err(err) => err,
                    };
                    if let Some((addr, slot)) = err.redirect_node() {
                        let addr = reply_addr(addr, &node.addr);
                        let asking = err.kind() == ErrorKind::Server(redis::ServerErrorKind::Ask);
                        let target = if asking {
                            self.topology.node_at(&addr)
                        } else {
                            self.topology.moved(slot, &addr)
                        };
                        match target {
                            Ok(target) => {
                                redirects[i] = Some(Redirect {
                                    node: target,
                                    asking,
                                })
                            }
                            Err(e) => outcomes[i] = Some(Outcome::Failed(e)),
                        }
                    } else if is_noscript(&err) {
                        if !reload.iter().any(|n| Arc::ptr_eq(n, &node)) {
                            reload.push(node.clone());
                        }
                    } else if err.kind() == ErrorKind::Server(redis::ServerErrorKind::TryAgain) {
                        // Keys of one script half-way through a slot migration.
                        wait = true;
                    } else {
                        if is_not_writable(&err) {
                            // A Sentinel primary demoted under us, or one
                            // whose replicas followed a new primary: ask
                            // every sentinel again.
                            self.topology.failed(&node);
                        }
                        outcomes[i] = Some(Outcome::Reply(Err(err)));
                    }
                }
            }
            for node in reload {
                let mut conn = node.conn();
                for script in self.scripts.all() {
                    if let Err(err) = script.prepare_invoke().load_async(&mut conn).await {
                        // The operations that needed it fail with this error,
                        // not with a misleading "too many redirections".
                        let err = self.target().classify(err);
                        for i in 0..calls.len() {
                            let waiting = outcomes[i].is_none()
                                && redirects[i]
                                    .as_ref()
                                    .is_none_or(|r| Arc::ptr_eq(&r.node, &node));
                            if waiting && self.topology.serves(calls[i].slot, &node) {
                                outcomes[i] = Some(Outcome::Failed(copy_error(&err)));
                            }
                        }
                        break;
                    }
                }
            }
            if wait {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if !answered {
            if let Some(err) = first_failure {
                return Err(err);
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    Outcome::Failed(Error::redis(format!(
                        "gave up after {MAX_ROUNDS} redirections (MOVED/ASK/TRYAGAIN); the \
                         cluster is being resharded"
                    )))
                })
            })
            .collect())
    }

    /// One pipeline to one node; `(command, asking)` pairs, where `asking`
    /// sends `ASKING` first (its reply is dropped).
    async fn pipeline(
        &self,
        node: &Node,
        commands: Vec<(&redis::Cmd, bool)>,
    ) -> Result<Vec<RedisResult<Value>>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (command, asking) in &commands {
            if *asking {
                pipe.add_command(redis::cmd("ASKING"));
            }
            pipe.add_command((*command).clone());
        }
        let mut results = pipe
            .query_async::<Vec<RedisResult<Value>>>(&mut node.conn())
            .await
            .map_err(|e| self.target().classify(e))?
            .into_iter();
        let mut out = Vec::with_capacity(commands.len());
        for (_, asking) in commands {
            if asking {
                results.next();
            }
            out.push(
                results
                    .next()
                    .unwrap_or_else(|| Err(RedisError::from((ErrorKind::Io, "missing reply")))),
            );
        }
        Ok(out)
    }
}

fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A Redis store and its subscriber: everything elections and partition
/// sets on one Redis share.
pub(crate) struct RedisShared {
    pub store: Arc<RedisStore>,
    /// Started by the first election (partition sets have no followers to
    /// wake, and open no pub/sub connection).
    subscriber: std::sync::OnceLock<Subscriber>,
}

impl From<super::Needs> for StoreChecks {
    fn from(needs: super::Needs) -> Self {
        StoreChecks {
            partitions: needs.partitions,
            allow_eviction: needs.allow_eviction,
        }
    }
}

impl RedisShared {
    pub async fn connect(
        target: RedisTarget,
        call_timeout: Duration,
        following: Following,
    ) -> Result<Arc<Self>> {
        let store = RedisStore::connect(target, call_timeout, following).await?;
        Ok(Arc::new(RedisShared {
            store: Arc::new(store),
            subscriber: std::sync::OnceLock::new(),
        }))
    }

    /// An election on this Redis: checked (permissions, eviction), and
    /// subscribed to its announcements.
    pub async fn election(
        self: &Arc<Self>,
        at: Address<'_>,
        checks: StoreChecks,
    ) -> Result<Backend> {
        self.store.check(at, checks).await?;
        let events = Keys::of(at).events;
        let subscriber = self
            .subscriber
            .get_or_init(|| Subscriber::start(self.store.topology().clone()));
        let (notices, subscription) = subscriber.subscribe(&events).await?;
        Ok(Backend::new(
            Store::Redis(self.clone()),
            at,
            notices,
            Some(Box::new((subscription, self.clone()))),
        ))
    }

    /// A connection for the application's own commands, on this store's
    /// topology (shared with its elections).
    pub fn connection(&self) -> routed::Connection {
        routed::Connection::on(self.store.topology().clone())
    }

    /// Every primary with the elections it holds under `prefix`.
    pub async fn elections_by_node(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Result<Vec<String>>)>> {
        routed::list_elections_by_node(&self.connection(), prefix).await
    }

    /// Names of all elections with a live lease under `prefix`, sorted, read
    /// with `SCAN` (never `KEYS`) on every primary. Fails when any primary
    /// cannot be read, naming it; [`RedisShared::elections_by_node`] lists
    /// what can be.
    pub async fn elections(&self, prefix: &str) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for (node, listed) in self.elections_by_node(prefix).await? {
            match listed {
                Ok(found) => names.extend(found),
                // A person must act on these (a missing ACL permission,
                // foreign data): they are returned as they are.
                Err(err) if !err.is_transient() => return Err(err),
                Err(err) => {
                    return Err(Error::Unreachable {
                        url: node,
                        detail: format!("cannot list its elections: {err}"),
                    })
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
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
            tokio::spawn(sharded::sharded_loop(topology, receiver, stop.clone()));
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
pub(crate) type Channels = HashMap<String, (watch::Sender<Notices>, usize)>;

async fn subscriber_loop(
    topology: Arc<Topology>,
    mut requests: mpsc::UnboundedReceiver<SubscriberRequest>,
    stop: CancellationToken,
) {
    let target = topology.target().clone();
    let mut changes = topology.changes();
    let mut channels: Channels = HashMap::new();
    let mut backoff = Duration::from_millis(50);
    let mut warned = false;
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = open_pubsub(&topology) => opened,
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
                    changes.borrow_and_update();
                    loop {
                        tokio::select! {
                            // Sentinel named another primary: follow it.
                            _ = changes.changed() => return Ok(()),
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
                                            if dropped {
                                                // Subscribed with the rest on the next connection.
                                                let _ = reply.send(Ok(accept(&mut channels, channel)));
                                                return Ok(());
                                            }
                                            let _ = reply.send(Err(target.classify(err)));
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
        // Until the next connection, new subscriptions are taken and made on
        // it: announcements are hints, and an election being built must
        // neither wait for an outage nor fail because of one (it finds the
        // lease by itself meanwhile; the resubscription counts as a
        // possible missed release). A new Sentinel primary ends the wait.
        let retry = tokio::time::sleep(backoff);
        tokio::pin!(retry);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = &mut retry => break,
                _ = changes.changed() => break,
                request = requests.recv() => match request {
                    None => return,
                    Some(SubscriberRequest::Subscribe { channel, reply }) => {
                        let _ = reply.send(Ok(accept(&mut channels, channel)));
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

/// Parse the reply of `last_run.lua`: the age of the last run, if any.
pub(crate) fn parse_last_run(reply: Value, url: &str) -> Result<Option<Duration>> {
    let r = ReplyReader { url };
    let items = r.array(reply, 0)?;
    match items.first() {
        None => Ok(None),
        Some(age) => Ok(Some(Duration::from_millis(r.uint(age)?))),
    }
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
