//! Sending a batch's calls to their nodes: one pipeline per node per
//! round, `MOVED`/`ASK` redirections followed, scripts loaded again where
//! a node lost them (NOSCRIPT), `TRYAGAIN` waited out, for at most
//! [`MAX_ROUNDS`] rounds. Apart from the store, because how a call finds
//! its node is one concern and what the call is, another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, Value};
use tokio::time::Instant;

use super::super::target::is_not_writable;
use super::super::topology::{reply_addr, Node};
use super::{Call, RedisStore};
use crate::backend::Op;
use crate::error::copy_error;
use crate::{Error, Result};

/// How many times one batch follows `MOVED`/`ASK` redirections, reloads
/// scripts or waits out `TRYAGAIN` before its remaining operations fail.
const MAX_ROUNDS: usize = 5;

/// What became of one [`Call`].
pub(super) enum Outcome {
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

impl RedisStore {
    /// Send `calls` to their nodes, following redirections (see
    /// [`RedisStore::batch`]).
    pub(super) async fn run(
        &self,
        ops: &[Op<'_>],
        calls: &[Call],
        round_trips: &AtomicU64,
        limit: Option<Duration>,
    ) -> Result<Vec<Outcome>> {
        let mut progress = Progress::new(calls.len());
        // One deadline for the whole batch, its redirections included.
        let deadline = limit.map(|limit| (Instant::now(), limit));
        for _round in 0..MAX_ROUNDS {
            let groups = self.group_by_node(calls, &mut progress).await;
            if groups.is_empty() {
                break;
            }
            let sent = groups.iter().map(|(node, members)| {
                let commands: Vec<(usize, bool)> = members
                    .iter()
                    .map(|i| {
                        let asking = progress.redirects[*i].as_ref().is_some_and(|r| r.asking);
                        (*i, asking)
                    })
                    .collect();
                self.pipeline(node, ops, calls, commands, deadline, round_trips)
            });
            let results = futures_util::future::join_all(sent).await;
            // Once any node answered, the batch has replies of its own and
            // the calls a broken connection left unanswered fail one by
            // one, as transient errors (see `Progress::unanswered`).
            progress.answered |= results.iter().any(|(values, _)| !values.is_empty());
            let mut next = NextRound::default();
            for ((node, members), (values, broken)) in groups.into_iter().zip(results) {
                let answered = values.len();
                for (i, value) in members.iter().zip(values) {
                    self.take_reply(*i, &node, value, &mut progress, &mut next);
                }
                let Some(broken) = broken else { continue };
                // A slice not sent for want of time says nothing of the
                // connection.
                if broken.sent {
                    self.topology.failed(&node);
                }
                for i in &members[answered..] {
                    if progress.answered {
                        progress.unanswered(*i, &broken.err);
                    } else {
                        progress.fail(*i, copy_error(&broken.err));
                    }
                }
            }
            for node in next.reload {
                self.reload_scripts(calls, &node, &mut progress).await;
            }
            if next.wait {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        progress.finish()
    }

    /// The calls still without an outcome, grouped by the node each goes
    /// to (its redirection's, or its slot's); a call whose node cannot be
    /// found fails.
    async fn group_by_node(
        &self,
        calls: &[Call],
        progress: &mut Progress,
    ) -> Vec<(Arc<Node>, Vec<usize>)> {
        let mut groups: Vec<(Arc<Node>, Vec<usize>)> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            if progress.outcomes[i].is_some() {
                continue;
            }
            let node = match &progress.redirects[i] {
                Some(redirect) => redirect.node.clone(),
                None => match self.topology.node_for(call.slot).await {
                    Ok(node) => node,
                    Err(err) => {
                        progress.fail(i, err);
                        continue;
                    }
                },
            };
            match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                Some((_, members)) => members.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        groups
    }

    /// Call `i`'s reply from `node`: its outcome, or a redirection, a
    /// script to reload or a wait (`TRYAGAIN`) before the next round.
    fn take_reply(
        &self,
        i: usize,
        node: &Arc<Node>,
        value: RedisResult<Value>,
        progress: &mut Progress,
        next: &mut NextRound,
    ) {
        let err = match value {
            Ok(value) => {
                progress.outcomes[i] = Some(Outcome::Reply(Ok(value)));
                return;
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
                    progress.redirects[i] = Some(Redirect {
                        node: target,
                        asking,
                    })
                }
                Err(e) => progress.outcomes[i] = Some(Outcome::Failed(e)),
            }
        } else if is_noscript(&err) {
            if !next.reload.iter().any(|n| Arc::ptr_eq(n, node)) {
                next.reload.push(node.clone());
            }
        } else if err.kind() == ErrorKind::Server(redis::ServerErrorKind::TryAgain) {
            // Keys of one script half-way through a slot migration.
            next.wait = true;
        } else {
            if is_not_writable(&err) {
                // A Sentinel primary demoted under us, or one whose
                // replicas followed a new primary: ask every sentinel again.
                self.topology.failed(node);
            }
            progress.outcomes[i] = Some(Outcome::Reply(Err(err)));
        }
    }

    /// Load every script on `node` (it answered NOSCRIPT: restarted, or
    /// flushed). If it cannot be loaded, the calls waiting for it fail with
    /// that error, not with a misleading "too many redirections".
    async fn reload_scripts(&self, calls: &[Call], node: &Arc<Node>, progress: &mut Progress) {
        let mut conn = node.conn();
        for script in self.scripts.all() {
            if let Err(err) = script.prepare_invoke().load_async(&mut conn).await {
                let err = self.target().classify(err);
                for (i, call) in calls.iter().enumerate() {
                    let waiting = progress.outcomes[i].is_none()
                        && progress.redirects[i]
                            .as_ref()
                            .is_none_or(|r| Arc::ptr_eq(&r.node, node));
                    if waiting && self.topology.serves(call.slot, node) {
                        progress.outcomes[i] = Some(Outcome::Failed(copy_error(&err)));
                    }
                }
                return;
            }
        }
    }

    /// One pipeline to one node of `commands`, calls (indices into
    /// `calls`, of the batch `ops`) paired with whether to send `ASKING`
    /// first (its reply is dropped). It waits until `deadline` for the
    /// replies, or the connection's call timeout, and adds each round trip
    /// it makes to `round_trips`. Returns the replies of the calls
    /// answered, in order, and what ended the pipeline before the rest
    /// were (the rest may or may not have run).
    ///
    /// A long pipeline (a partition set's renewals or acquisitions: 100,000
    /// of them) is written in slices of about [`SLICE_ARGS`] arguments,
    /// each built and sent when the one before is answered, all within one
    /// deadline (`deadline`: the limit, counted from the batch's start;
    /// without one, each slice has the connection's own call timeout).
    /// The server works through a slice in milliseconds and waits one
    /// round trip between two; in exchange the client holds one
    /// slice's commands, their encoding and its copy in the connection's
    /// write buffer (which keeps its size while the connection lives)
    /// instead of all of them: that was about 60 MB of the peak RSS of a
    /// set of 100,000 partitions.
    async fn pipeline(
        &self,
        node: &Node,
        ops: &[Op<'_>],
        calls: &[Call],
        commands: Vec<(usize, bool)>,
        deadline: Option<(Instant, Duration)>,
        round_trips: &AtomicU64,
    ) -> (Vec<RedisResult<Value>>, Option<Broken>) {
        let conn = node.conn();
        let mut out = Vec::with_capacity(commands.len());
        let mut rest = &commands[..];
        while !rest.is_empty() {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            // A caller's limit is one deadline for every slice; a slice
            // with no time left is not sent (a timeout would still let
            // it run, its outcome unknown).
            let mut conn = match deadline {
                None => conn.clone(),
                Some((start, limit)) => match limit.saturating_sub(start.elapsed()) {
                    left if left.is_zero() => {
                        let err = Error::Timeout(limit);
                        return (out, Some(Broken { err, sent: false }));
                    }
                    left => conn.within(left),
                },
            };
            let (mut args, mut taken) = (0, 0);
            for (i, asking) in rest {
                if taken > 0 && args >= SLICE_ARGS {
                    break;
                }
                let cmd = self.call_command(ops, &calls[*i].part);
                args += cmd.args_iter().count();
                if *asking {
                    pipe.add_command(redis::cmd("ASKING"));
                }
                pipe.add_command(cmd);
                taken += 1;
            }
            let (slice, after) = rest.split_at(taken);
            rest = after;
            round_trips.fetch_add(1, Ordering::Relaxed);
            let mut results = match pipe.query_async::<Vec<RedisResult<Value>>>(&mut conn).await {
                Ok(results) => results.into_iter(),
                Err(err) => {
                    let err = self.target().classify(err);
                    return (out, Some(Broken { err, sent: true }));
                }
            };
            for (_, asking) in slice {
                if *asking {
                    results.next();
                }
                out.push(
                    results
                        .next()
                        .unwrap_or_else(|| Err(RedisError::from((ErrorKind::Io, "missing reply")))),
                );
            }
        }
        (out, None)
    }
}

/// About how many arguments one slice of a pipeline carries before the
/// next call starts another (see [`RedisStore::pipeline`]): 30,000 are
/// 10,000 renewals on one server (ten `renew_many.lua` calls, about a
/// megabyte), or about 3,750 on a cluster, where each slot's renewals are
/// a call of their own.
const SLICE_ARGS: usize = 30_000;

/// What ended a node's pipeline before every call was answered.
struct Broken {
    err: Error,
    /// Whether the slice it ended was sent: a slice left unsent for want of
    /// time says nothing of the connection.
    sent: bool,
}

/// Where the calls of one batch stand, across its rounds (see
/// [`RedisStore::run`]).
struct Progress {
    outcomes: Vec<Option<Outcome>>,
    redirects: Vec<Option<Redirect>>,
    /// Whether any node answered at all.
    answered: bool,
    /// The first error of a call that got no answer: the batch's error
    /// when no node answered.
    first_failure: Option<Error>,
}

impl Progress {
    fn new(calls: usize) -> Self {
        Progress {
            outcomes: (0..calls).map(|_| None).collect(),
            redirects: vec![None; calls],
            answered: false,
            first_failure: None,
        }
    }

    /// Call `i` got no answer: `err`.
    fn fail(&mut self, i: usize, err: Error) {
        let copy = copy_error(&err);
        self.first_failure.get_or_insert(err);
        self.outcomes[i] = Some(Outcome::Failed(copy));
    }

    /// Call `i` got no answer because its node's pipeline ended with `err`
    /// while the batch has answers of its own (earlier slices, or other
    /// nodes): its outcome is unknown, and whatever ended the connection
    /// (a TLS alert of a server going down, a refused login on
    /// reconnecting) says nothing of this call, so it fails as a transient
    /// error, as a batch that got no answer at all does.
    fn unanswered(&mut self, i: usize, err: &Error) {
        let failed = if err.is_transient() {
            copy_error(err)
        } else {
            Error::redis(format!("no reply: {err}"))
        };
        self.outcomes[i] = Some(Outcome::Failed(failed));
    }

    /// Every call's outcome (a call still without one gave up after
    /// [`MAX_ROUNDS`]), or the first failure if no node answered.
    fn finish(self) -> Result<Vec<Outcome>> {
        if !self.answered {
            if let Some(err) = self.first_failure {
                return Err(err);
            }
        }
        Ok(self
            .outcomes
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
}

/// What a round leaves for the next: nodes to load the scripts on, and
/// whether to wait out a slot migration first.
#[derive(Default)]
struct NextRound {
    reload: Vec<Arc<Node>>,
    wait: bool,
}

fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript)
}
