//! The Redis store: batches of operations, each one script call, sent as
//! one pipeline per node, with `MOVED`/`ASK` redirections followed and
//! scripts reloaded after a restart.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use redis::{Script, Value};

use super::checks::{check_store, for_topology, StoreChecks};
use super::keys::Keys;
use super::scripts::{
    parse_acquire, parse_inspect, parse_last_run, parse_members, parse_renew, parse_renew_many,
    ReplyReader, Scripts, ACQUIRE, ACQUIRE_MANY, INSPECT, LAST_RUN, MEMBERS, RECORD_RUN, RENEW,
    RENEW_MANY, RESIGN,
};
use super::target::RedisTarget;
use super::topology::{slot_of, tag_of_slot, Following, Topology};
use crate::backend::address::Address;
use crate::backend::op::{Op, Reply};
use crate::error::copy_error;
use crate::machine::{AcquireRequest, RenewReply};
use crate::{Error, Result};
use send::Outcome;

mod send;

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

/// One call of a batch: the slot it goes to, and which part of which
/// operations it carries out. Its command is built only when it is sent
/// ([`RedisStore::call_command`]): a partition set's 100,000 renewals are
/// never all in memory as commands at once.
struct Call {
    slot: u16,
    part: Part,
}

/// One part of an operation, or several operations: most operations are
/// one call; a [`Op::RenewMany`] on a cluster is one call per slot of its
/// terms; a run of [`Op::Acquire`]s is one call per [`ACQUISITIONS_PER_CALL`] of
/// them (per slot, on a cluster).
struct Part {
    op: usize,
    /// For a split [`Op::RenewMany`]: the terms (indices) this call renews.
    terms: Option<Vec<usize>>,
    /// For `acquire_many.lua`: the operations (indices) it acquires, `op`
    /// the first.
    acquires: Option<Vec<usize>>,
}

/// The most acquisitions one `acquire_many.lua` call carries: the server
/// reads its process epoch (two INFO calls, most of an acquisition's cost)
/// once per call, and a call of a hundred keeps Redis busy for about a
/// millisecond.
const ACQUISITIONS_PER_CALL: usize = 100;

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
                acquire_many: script(ACQUIRE_MANY),
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

    /// The prefix's epoch key for the election at `at`, whose lease is
    /// `lease`: the prefix-wide key on one server; on a cluster, where a
    /// script may only touch keys of one slot, a key per slot (tagged to
    /// share the election's slot), so the hold-off of a name new to a node
    /// counts from when that node first served the slot.
    fn prefix_epoch(&self, at: Address<'_>, lease: &str) -> String {
        if !self.topology.is_cluster() {
            return Keys::prefix_epoch_of(at.prefix);
        }
        format!(
            "{}:{{{}}}:slot-epoch",
            at.prefix,
            tag_of_slot(slot_of(lease))
        )
    }

    /// The script call of one operation (of some terms of a
    /// [`Op::RenewMany`]): the only place each script's KEYS and ARGV are
    /// laid out.
    fn command(&self, op: &Op<'_>, terms: Option<&[usize]>) -> redis::Cmd {
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
            Op::Acquire { at, request } => self.acquire_command(at, &request),
            Op::Renew {
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => self.renew_command(at, (id, token), ttl_ms, announce),
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
                self.renew_many_command(prefix, id, ttl_ms, &chosen)
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
                slot,
            } => {
                let keys = Keys::of(at);
                let mut cmd = evalsha(&self.scripts.record_run, &[&keys.lease, &keys.last_run]);
                cmd.arg(id).arg(token).arg(keep_ms);
                cmd.arg(slot.map_or_else(String::new, |slot| slot.to_string()));
                cmd
            }
        }
    }

    /// `acquire.lua` for the election at `at`.
    fn acquire_command(&self, at: Address<'_>, request: &AcquireRequest<'_>) -> redis::Cmd {
        self.acquisitions(&self.scripts.acquire, &[(at, request)])
    }

    /// `acquire_many.lua` for the acquisitions `indices` of `ops` (each an
    /// [`Op::Acquire`]).
    fn acquire_many_command(&self, ops: &[Op<'_>], indices: &[usize]) -> redis::Cmd {
        let chosen: Vec<(Address<'_>, &AcquireRequest<'_>)> = indices
            .iter()
            .filter_map(|&i| match &ops[i] {
                Op::Acquire { at, request } => Some((*at, request)),
                _ => None,
            })
            .collect();
        self.acquisitions(&self.scripts.acquire_many, &chosen)
    }

    /// `script` (acquire.lua, or acquire_many.lua for several) on the
    /// elections `chosen`: the one place an acquisition's 5 keys and 6
    /// arguments are laid out, each election's keys, then each one's
    /// arguments, in order.
    fn acquisitions(
        &self,
        script: &Script,
        chosen: &[(Address<'_>, &AcquireRequest<'_>)],
    ) -> redis::Cmd {
        let keys: Vec<(Keys, String)> = chosen
            .iter()
            .map(|(at, _)| {
                let keys = Keys::of(*at);
                let prefix_epoch = self.prefix_epoch(*at, &keys.lease);
                (keys, prefix_epoch)
            })
            .collect();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len() * 5);
        for (keys, prefix_epoch) in &keys {
            cmd.arg(&keys.lease)
                .arg(&keys.token)
                .arg(&keys.epoch)
                .arg(prefix_epoch)
                .arg(&keys.witness);
        }
        for ((keys, _), (_, request)) in keys.iter().zip(chosen) {
            cmd.arg(request.id)
                .arg(request.ttl_ms)
                .arg(&keys.events)
                .arg(request.attempt)
                .arg(request.hold_off_ms)
                .arg(request.aux_ttl_ms());
        }
        cmd
    }

    /// `renew.lua` for the term (id, token) of the election at `at`;
    /// `announce` publishes the renewal on the election's channel.
    fn renew_command(
        &self,
        at: Address<'_>,
        (id, token): (&str, u64),
        ttl_ms: u64,
        announce: bool,
    ) -> redis::Cmd {
        // The renewal path: only the keys the script takes are built.
        let (lease, witness) = (Keys::lease_of(at), Keys::witness_of(at));
        let prefix_epoch = self.prefix_epoch(at, &lease);
        let mut cmd = evalsha(&self.scripts.renew, &[&lease, &witness, &prefix_epoch]);
        // The epoch's ttl as an acquire would set it for this ttl.
        let epoch_ttl_ms =
            (crate::machine::AUX_TTL.as_millis() as u64).max(ttl_ms.saturating_mul(10));
        cmd.arg(id).arg(token).arg(ttl_ms).arg(epoch_ttl_ms);
        if announce {
            cmd.arg(Keys::events_of(at));
        }
        cmd
    }

    /// `renew_many.lua` for the `chosen` terms (name, token) of instance
    /// `id` under `prefix`: a lease and a witness key per term.
    fn renew_many_command(
        &self,
        prefix: &str,
        id: &str,
        ttl_ms: u64,
        chosen: &[&(&str, u64)],
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.scripts.renew_many.get_hash())
            .arg(chosen.len() * 2);
        for (name, _) in chosen {
            let at = Address::new(prefix, name);
            cmd.arg(Keys::lease_of(at)).arg(Keys::witness_of(at));
        }
        cmd.arg(id).arg(ttl_ms);
        for (_, token) in chosen {
            cmd.arg(token);
        }
        cmd
    }

    /// The hash slot an operation is routed by: its lease's (a group's
    /// member set's, for a heartbeat; the first term's, for many).
    fn routing_slot(op: &Op<'_>) -> u16 {
        match *op {
            // Every key of a name shares its slot.
            Op::Heartbeat { group, .. } => slot_of(&Keys::lease_of(group)),
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
    /// Each pipeline waits up to `limit` for its replies (the call timeout
    /// if `None`). The outer error means that no operation got any reply;
    /// otherwise each operation has its own result.
    pub async fn batch(
        &self,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
        limit: Option<Duration>,
    ) -> Result<Vec<Result<Reply>>> {
        let calls = self.plan(ops);
        let outcomes = self.run(ops, &calls, round_trips, limit).await?;
        Ok(self.gather(ops, calls, outcomes))
    }

    /// The command of one call of the batch `ops`.
    fn call_command(&self, ops: &[Op<'_>], part: &Part) -> redis::Cmd {
        match &part.acquires {
            Some(indices) => self.acquire_many_command(ops, indices),
            None => self.command(&ops[part.op], part.terms.as_deref()),
        }
    }

    /// The calls that carry out `ops`, and which part of which operation
    /// each call is: one call per operation, but a [`Op::RenewMany`] on a
    /// cluster is one call per slot of its terms.
    fn plan(&self, ops: &[Op<'_>]) -> Vec<Call> {
        let cluster = self.topology.is_cluster();
        let mut calls = Vec::with_capacity(ops.len());
        // A run of acquisitions, by slot (one slot outside a cluster),
        // waiting to be sent as acquire_many calls when the run ends.
        let mut run: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Acquire { .. } = op {
                let slot = if cluster { Self::routing_slot(op) } else { 0 };
                match run.iter_mut().find(|(s, _)| *s == slot) {
                    Some((_, indices)) => indices.push(i),
                    None => run.push((slot, vec![i])),
                }
                continue;
            }
            Self::plan_acquisitions(&mut run, &mut calls);
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
                            part: Part {
                                op: i,
                                terms: Some(indices),
                                acquires: None,
                            },
                        });
                    }
                }
                _ => {
                    // Outside a cluster there is one node: no slot to compute
                    // on the renewal path.
                    let slot = if cluster { Self::routing_slot(op) } else { 0 };
                    calls.push(Call {
                        slot,
                        part: Part {
                            op: i,
                            terms: None,
                            acquires: None,
                        },
                    });
                }
            }
        }
        Self::plan_acquisitions(&mut run, &mut calls);
        calls
    }

    /// The calls of a run of acquisitions (`run`, by slot; emptied): one
    /// `acquire.lua` call for an acquisition alone in its slot, else one
    /// `acquire_many.lua` call per [`ACQUISITIONS_PER_CALL`]. Only a run is grouped,
    /// so no acquisition moves past another operation of the batch.
    fn plan_acquisitions(run: &mut Vec<(u16, Vec<usize>)>, calls: &mut Vec<Call>) {
        for (slot, indices) in run.drain(..) {
            for chunk in indices.chunks(ACQUISITIONS_PER_CALL) {
                let acquires = match chunk {
                    [_] => None,
                    _ => Some(chunk.to_vec()),
                };
                calls.push(Call {
                    slot,
                    part: Part {
                        op: chunk[0],
                        terms: None,
                        acquires,
                    },
                });
            }
        }
    }

    /// Each operation's reply, from the outcomes of its calls (as
    /// [`RedisStore::plan`] made them): a split renewal's terms are put
    /// back in their order.
    fn gather(
        &self,
        ops: &[Op<'_>],
        calls: Vec<Call>,
        outcomes: Vec<Outcome>,
    ) -> Vec<Result<Reply>> {
        // Redacted once: a cluster batch may hold thousands of replies.
        let url = self.target().redacted();
        let mut replies: Vec<Option<Result<Reply>>> = (0..ops.len()).map(|_| None).collect();
        let mut many: HashMap<usize, Vec<Option<Result<RenewReply>>>> = HashMap::new();
        for (part, outcome) in calls.into_iter().map(|call| call.part).zip(outcomes) {
            if let Some(indices) = part.acquires {
                for (i, result) in indices
                    .iter()
                    .zip(self.acquired(indices.len(), outcome, &url))
                {
                    replies[*i] = Some(result);
                }
                continue;
            }
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
                .map(|r| r.unwrap_or_else(|| Err(Error::internal("a renewal had no call"))))
                .collect();
            replies[i] = Some(Ok(Reply::RenewMany(results)));
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::internal("an operation had no call"))))
            .collect()
    }
}

impl RedisStore {
    /// The replies of an `acquire_many.lua` call of `n` acquisitions: each
    /// its own result (a stray key fails its own election only), or the
    /// call's error for all.
    fn acquired(&self, n: usize, outcome: Outcome, url: &str) -> Vec<Result<Reply>> {
        let all = |err: Error| (0..n).map(|_| Err(copy_error(&err))).collect();
        let value = match outcome {
            Outcome::Reply(Ok(value)) => value,
            Outcome::Reply(Err(err)) => return all(self.target().classify(err)),
            Outcome::Failed(err) => return all(err),
        };
        let reader = ReplyReader { url };
        let items = match reader.array(value, n) {
            Ok(items) if items.len() == n => items,
            Ok(items) => {
                return all(
                    reader.unexpected(&format!("{} replies to {n} acquisitions", items.len()))
                )
            }
            Err(err) => return all(err),
        };
        items
            .into_iter()
            .map(|item| match item {
                Value::ServerError(err) => Err(self.target().classify(err.into())),
                value => parse_acquire(value, url).map(Reply::Acquire),
            })
            .collect()
    }
}

/// `EVALSHA` of `script` on `keys`; the caller adds the arguments.
fn evalsha(script: &Script, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    cmd
}
