//! Each operation of the seam as SQL, inside the one `BEGIN IMMEDIATE`
//! transaction of its batch: the same rules as the Redis scripts and the
//! memory store, on rows instead of keys.
//!
//! One addition: `lock`, the lock file (its inode) whose OS lock the
//! caller holds, if it holds the election's (see `locks.rs`). A lease
//! written under that same lock (`locked`, the inode) whose lock the
//! caller now holds belongs to a holder that let go of the lock, which it
//! does only once it stopped leading, or died: it is taken over at once,
//! with no wait for its expiry. A lock file deleted and made anew has
//! another inode, so a lock on it says nothing of a holder of the old.

use std::time::Duration;

use rusqlite::{params, OptionalExtension, Transaction};

use super::clock::Now;
use super::horizon::Mark;
use crate::backend::op::{Op, Reply, RunRecord};
use crate::backend::Address;
use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::Result;

/// A lease row.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub owner: String,
    pub attempt: String,
    pub token: u64,
    pub ttl_ms: u64,
    pub boot: String,
    pub expires: i64,
    pub since_ms: u64,
    /// The inode of the lock file whose lock its holder kept (0: none).
    pub locked: i64,
}

/// A lease's (or witness's) expiry as it stands: its own, or, bound to a
/// live session of its owner, the earlier of the two. A bound row whose
/// session row is missing (deleted by hand) lives until its own, far
/// expiry: a vanished session counts as a crash, never as a release.
/// `{t}` is the row's table alias, `s` the session's (a `LEFT JOIN` of
/// `session_of!`), `{c}` the session's column: `expires` for leases,
/// `witness_expires` for witnesses, so that one value edited by hand
/// still leaves the other holding the election, as a lease edited by
/// hand leaves its witness.
macro_rules! expiry_of {
    ($t:literal, $c:literal) => {
        concat!(
            "(CASE WHEN ",
            $t,
            ".session = 0 OR s.",
            $c,
            " IS NULL THEN ",
            $t,
            ".expires ",
            "ELSE min(",
            $t,
            ".expires, s.",
            $c,
            ") END)"
        )
    };
}

/// The session a row is bound to, if it is its owner's of the same boot.
macro_rules! session_of {
    ($t:literal) => {
        concat!(
            " LEFT JOIN tenure_sessions AS s ON s.prefix = ",
            $t,
            ".prefix AND s.session = ",
            $t,
            ".session AND s.owner = ",
            $t,
            ".owner AND s.boot = ",
            $t,
            ".boot "
        )
    };
}

/// How far ahead, in ttls, a lease bound to a session is written: it is
/// written again (bound anew) once less than half of that is left, so a
/// partition set writes its rows once per `HORIZON_TTLS / 2` ttls
/// instead of every interval.
const HORIZON_TTLS: i64 = 20;

/// What one process bound to one of its sessions, as last committed: the
/// check of [`renew_many`]'s fast path. Kept in memory by the store; lost
/// (a failed batch) it only costs a slow path.
#[derive(Debug)]
pub(super) struct Bound {
    /// Each term bound: name → token.
    pub terms: std::collections::HashMap<String, u64>,
    /// The sum of the tokens' low 32 bits (SQLite's `sum()` fails on an
    /// overflow; this one cannot).
    pub token_sum: i64,
    /// The boot they were bound in, and the far expiry they were given.
    pub boot: String,
    pub horizon: i64,
}

impl Lease {
    fn live(&self, now: &Now) -> bool {
        now.before(&self.boot, self.expires)
    }

    fn holder(&self, now: &Now) -> Holder {
        Holder {
            id: self.owner.clone(),
            token: self.token,
            ttl_left: now.until(self.expires),
            since_ms: self.since_ms,
            attempt: self.attempt.clone(),
            ttl: Duration::from_millis(self.ttl_ms),
        }
    }
}

/// What one operation found, besides its reply, for the locks.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Seen {
    /// An acquire found the election held by a term under its lock: the
    /// election's watchers wait for that lock.
    pub held_locked: bool,
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn uint(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(super) fn lease(tx: &Transaction<'_>, at: Address<'_>) -> Result<Option<Lease>> {
    let row = tx
        .prepare_cached(concat!(
            "SELECT l.owner, l.attempt, l.token, l.ttl_ms, l.boot, ",
            expiry_of!("l", "expires"),
            ", l.since_ms, l.locked FROM tenure_leases AS l",
            session_of!("l"),
            "WHERE l.prefix = ?1 AND l.name = ?2"
        ))?
        .query_row(params![at.prefix, at.name], |r| {
            Ok(Lease {
                owner: r.get(0)?,
                attempt: r.get(1)?,
                token: uint(r.get(2)?),
                ttl_ms: uint(r.get(3)?),
                boot: r.get(4)?,
                expires: r.get(5)?,
                since_ms: uint(r.get(6)?),
                locked: r.get(7)?,
            })
        })
        .optional()?;
    Ok(row)
}

/// This process's sessions (see [`renew_many`]), by prefix, id, ttl and
/// the first name renewed (a batch beyond `RENEW_CHUNK` terms is one of
/// several, each with a session of its own).
pub(super) type Sessions = std::collections::HashMap<(String, String, u64, String), Session>;

/// Carry out a batch's `ops` in `tx` (`locks`: as [`apply`]'s, one per
/// operation): each in turn, but the renewals of one prefix, id and ttl
/// (a partition set's, `RENEW_MANY` to an operation) all at once, where
/// the first of them stands, so that they share one session.
pub(super) fn apply_batch(
    tx: &Transaction<'_>,
    ops: &[Op<'_>],
    cx: &mut Context<'_>,
    locks: &[Option<i64>],
) -> Result<Vec<(Reply, Seen)>> {
    type Group<'a> = (&'a str, &'a str, u64);
    let mut groups: Vec<(Group<'_>, Vec<usize>)> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        if let Op::RenewMany {
            prefix, id, ttl_ms, ..
        } = *op
        {
            let key = (prefix, id, ttl_ms);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(index),
                None => groups.push((key, vec![index])),
            }
        }
    }
    let mut replies: Vec<Option<(Reply, Seen)>> = (0..ops.len()).map(|_| None).collect();
    for (index, op) in ops.iter().enumerate() {
        if replies[index].is_some() {
            continue;
        }
        let Op::RenewMany { .. } = op else {
            replies[index] = Some(apply(tx, op, cx, locks.get(index).copied().flatten())?);
            continue;
        };
        let Some((_, members)) = groups.iter().find(|(_, m)| m.first() == Some(&index)) else {
            continue;
        };
        let parts: Vec<_> = members
            .iter()
            .filter_map(|i| match ops[*i] {
                Op::RenewMany {
                    prefix,
                    id,
                    ttl_ms,
                    terms,
                } => Some((prefix, id, ttl_ms, terms)),
                _ => None,
            })
            .collect();
        let answers = renew_all(tx, &parts, cx)?;
        for (i, answer) in members.iter().zip(answers) {
            replies[*i] = Some((Reply::RenewMany(answer), Seen::default()));
        }
    }
    replies
        .into_iter()
        .map(|r| r.ok_or_else(|| crate::Error::internal("a SQLite batch left an operation out")))
        .collect()
}

/// One `RenewMany`: prefix, id, ttl and terms.
type RenewPart<'a> = (&'a str, &'a str, u64, &'a [(&'a str, u64)]);

/// The renewals `parts` (of one prefix, id and ttl) at once, through
/// their session; the replies split back, one list per part.
fn renew_all(
    tx: &Transaction<'_>,
    parts: &[RenewPart<'_>],
    cx: &mut Context<'_>,
) -> Result<Vec<Vec<Result<RenewReply>>>> {
    let Some((prefix, id, ttl_ms, _)) = parts.first().copied() else {
        return Ok(Vec::new());
    };
    let terms: Vec<(&str, u64)> = parts.iter().flat_map(|p| p.3.iter().copied()).collect();
    let split = |all: Vec<Result<RenewReply>>| {
        let mut all = all.into_iter();
        parts
            .iter()
            .map(|p| all.by_ref().take(p.3.len()).collect())
            .collect()
    };
    // A few terms of a larger session (a `confirm()`): checked within it.
    let within = cx.sessions.iter_mut().find(|((p, i, t, _), session)| {
        p == prefix
            && i == id
            && *t == ttl_ms
            && session.bound.as_ref().is_some_and(|b| {
                terms.len() <= CONFIRM_MOST
                    && terms.len() < b.terms.len()
                    && terms
                        .iter()
                        .all(|(n, token)| b.terms.get(*n) == Some(token))
            })
    });
    if let (Some((_, session)), false, true) = (within, cx.rolled_back, cx.alone) {
        if let Some(replies) = confirm_within(tx, prefix, id, ttl_ms, &terms, cx.now, session)? {
            return Ok(split(replies));
        }
    }
    let first = terms.first().map_or("", |t| t.0).to_string();
    if cx.sessions.len() > MAX_SESSIONS {
        // Sets that came and went: their sessions lapse in the file.
        cx.sessions.clear();
    }
    let session = cx
        .sessions
        .entry((prefix.to_string(), id.to_string(), ttl_ms, first))
        .or_insert_with(Session::new);
    let all = renew_many(
        tx,
        prefix,
        id,
        ttl_ms,
        &terms,
        cx.now,
        session,
        cx.rolled_back,
    )?;
    Ok(split(all))
}

/// A renewal of a few of the terms bound to `session`, alone in its batch
/// (a partition's `confirm()`, between two of its set's renewals): the session renewed,
/// if it is live and far from its horizon, and each term's lease and
/// witness found bound to it, by its primary key. The session's other
/// rows are renewed with it, as an early renewal would: they are this
/// process's too. `None` if any of that fails: the caller renews them on
/// their own.
fn confirm_within(
    tx: &Transaction<'_>,
    prefix: &str,
    id: &str,
    ttl_ms: u64,
    terms: &[(&str, u64)],
    now: &Now,
    session: &mut Session,
) -> Result<Option<Vec<Result<RenewReply>>>> {
    let Some(bound) = &session.bound else {
        return Ok(None);
    };
    let expires = now.plus(ttl_ms);
    if bound.boot != now.boot || bound.horizon <= expires {
        return Ok(None);
    }
    if !renew_session(tx, prefix, session.number, id, ttl_ms, now)? {
        return Ok(None);
    }
    session.expires = Some((now.boot.clone(), expires));
    for (name, token) in terms {
        for table in ["tenure_leases", "tenure_witnesses"] {
            let found: i64 = tx
                .prepare_cached(&format!(
                    "SELECT count(*) FROM {table} WHERE prefix = ?1 AND name = ?2 \
                     AND token = ?3 AND owner = ?4 AND session = ?5 AND boot = ?6 \
                     AND expires >= ?7"
                ))?
                .query_row(
                    params![
                        prefix,
                        name,
                        int(*token),
                        id,
                        session.number,
                        now.boot,
                        bound.horizon
                    ],
                    |r| r.get(0),
                )?;
            if found != 1 {
                return Ok(None);
            }
        }
    }
    Ok(Some(
        terms.iter().map(|_| Ok(RenewReply::Renewed)).collect(),
    ))
}

/// The most terms renewed within a larger session (see [`confirm_within`]).
const CONFIRM_MOST: usize = 16;

/// The most sessions one process keeps in memory.
const MAX_SESSIONS: usize = 1024;

/// What a batch's operations share: the file's count (see [`count`]) and
/// this process's sessions.
pub(super) struct Context<'a> {
    pub now: &'a Now,
    /// `ignore_rollback`: see [`count`].
    pub ignore_rollback: bool,
    /// The file went back to an older copy (see [`count`]).
    pub rolled_back: bool,
    /// The batch is this one operation: a partition's `confirm()`, when it
    /// renews (a set's renewals come with its heartbeat).
    pub alone: bool,
    pub sessions: &'a mut Sessions,
}

/// Carry out `op` in `tx` (`lock`: the inode whose lock the caller holds).
pub(super) fn apply(
    tx: &Transaction<'_>,
    op: &Op<'_>,
    cx: &mut Context<'_>,
    lock: Option<i64>,
) -> Result<(Reply, Seen)> {
    let now = cx.now;
    let ignore_rollback = cx.ignore_rollback;
    let mut seen = Seen::default();
    let reply = match *op {
        Op::Heartbeat {
            group,
            member,
            ttl_ms,
            join,
        } => heartbeat(tx, group, member, ttl_ms, join, now)?,
        Op::Acquire { at, request } => {
            let (reply, held_locked) = acquire(tx, at, &request, now, lock, ignore_rollback)?;
            seen.held_locked = held_locked;
            Reply::Acquire(reply)
        }
        Op::Renew {
            at,
            id,
            token,
            ttl_ms,
            ..
        } => Reply::Renew(renew(tx, at, id, token, ttl_ms, now)?),
        Op::RenewMany {
            prefix,
            id,
            ttl_ms,
            terms,
        } => {
            let mut replies = renew_all(tx, &[(prefix, id, ttl_ms, terms)], cx)?;
            Reply::RenewMany(replies.pop().unwrap_or_default())
        }
        Op::Resign { at, id, token } => Reply::Resign(resign(tx, at, id, token, now)?),
        Op::Inspect { at } => Reply::Inspect(
            lease(tx, at)?
                .filter(|l| l.live(now))
                .map(|l| l.holder(now)),
        ),
        Op::LastRun { at } => Reply::LastRun(last_run(tx, at, now)?),
        Op::RecordRun {
            at,
            id,
            token,
            keep_ms,
            slot,
        } => Reply::RecordRun(record_run(tx, at, id, token, keep_ms, slot, now)?),
    };
    Ok((reply, seen))
}

/// As `acquire.lua`, plus the lock: a live lease of another term is
/// reported, unless it was written under the lock the caller now holds;
/// a lease of this same attempt is adopted; a new file grants nothing for
/// the hold-off, nor one that went back to an older copy (unless
/// `ignore_rollback`); a witness of a lease that vanished holds the
/// election until it runs out; else a new term begins.
fn acquire(
    tx: &Transaction<'_>,
    at: Address<'_>,
    request: &AcquireRequest<'_>,
    now: &Now,
    lock: Option<i64>,
    ignore_rollback: bool,
) -> Result<(AcquireReply, bool)> {
    // Whether a term written under lock `locked` has let go of it.
    let let_go = |locked: i64| locked != 0 && lock == Some(locked);
    let current = lease(tx, at)?.filter(|l| l.live(now));
    let mut dead_holder = None;
    if let Some(lease) = current {
        if lease.owner == request.id && lease.attempt == request.attempt {
            let expires = now.plus(request.ttl_ms);
            // Locked only if this retry holds the lock now.
            let locked = lock.unwrap_or(0);
            tx.prepare_cached(
                "UPDATE tenure_leases SET expires = ?3, ttl_ms = ?4, locked = ?5, session = 0 \
                 WHERE prefix = ?1 AND name = ?2",
            )?
            .execute(params![
                at.prefix,
                at.name,
                expires,
                int(request.ttl_ms),
                locked
            ])?;
            witness(tx, at, request.id, lease.token, now, expires, locked, 0)?;
            return Ok((AcquireReply::Won { token: lease.token }, false));
        }
        if !let_go(lease.locked) {
            let locked = lease.locked != 0;
            return Ok((AcquireReply::Held(lease.holder(now)), locked));
        }
        // Its holder let go of the lock: it stopped leading, or died.
        dead_holder = Some(lease.token);
    }
    if let Some(wait) = hold_off(tx, request, now, ignore_rollback)? {
        return Ok((AcquireReply::HoldOff { wait }, false));
    }
    let witnessed: Option<(u64, String, i64, i64)> = tx
        .prepare_cached(concat!(
            "SELECT w.token, w.boot, ",
            expiry_of!("w", "witness_expires"),
            ", w.locked FROM tenure_witnesses AS w",
            session_of!("w"),
            "WHERE w.prefix = ?1 AND w.name = ?2"
        ))?
        .query_row(params![at.prefix, at.name], |r| {
            Ok((uint(r.get(0)?), r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    if let Some((token, boot, expires, locked)) = witnessed {
        let released_lock = let_go(locked) || dead_holder == Some(token);
        if now.before(&boot, expires) && !released_lock {
            // The lease vanished without its holder's release (deleted by
            // hand): nobody leads until its holder surely stopped.
            return Ok((
                AcquireReply::HoldOff {
                    wait: now.until(expires),
                },
                false,
            ));
        }
    }
    begin_term(tx, at, request, now, lock)
}

/// Begin a new term of `request` on the free election at `at`: the next
/// token, the lease and its witness, locked under `lock` if it is held.
fn begin_term(
    tx: &Transaction<'_>,
    at: Address<'_>,
    request: &AcquireRequest<'_>,
    now: &Now,
    lock: Option<i64>,
) -> Result<(AcquireReply, bool)> {
    let last: Option<i64> = tx
        .prepare_cached("SELECT last FROM tenure_tokens WHERE prefix = ?1 AND name = ?2")?
        .query_row(params![at.prefix, at.name], |r| r.get(0))
        .optional()?;
    // Above every earlier token, and above the wall clock's milliseconds:
    // a file restored from a backup (an older counter) still gives rising
    // tokens.
    // Above the lease and witness it replaces too, should the counter
    // have been lost (a power cut with `synchronous=NORMAL`) while the
    // wall clock stepped back.
    let replaced = current_tokens(tx, at)?;
    let token = last
        .unwrap_or(0)
        .max(replaced)
        .saturating_add(1)
        .max(now.wall_ms);
    tx.prepare_cached(
        "INSERT INTO tenure_tokens (prefix, name, last) VALUES (?1, ?2, ?3) \
         ON CONFLICT (prefix, name) DO UPDATE SET last = excluded.last",
    )?
    .execute(params![at.prefix, at.name, token])?;
    let expires = now.plus(request.ttl_ms);
    tx.prepare_cached(
        "INSERT INTO tenure_leases (prefix, name, owner, attempt, token, ttl_ms, boot, expires, \
         since_ms, locked, session) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0) \
         ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, \
         attempt = excluded.attempt, token = excluded.token, ttl_ms = excluded.ttl_ms, \
         boot = excluded.boot, expires = excluded.expires, since_ms = excluded.since_ms, \
         locked = excluded.locked, session = 0",
    )?
    .execute(params![
        at.prefix,
        at.name,
        request.id,
        request.attempt,
        token,
        int(request.ttl_ms),
        now.boot,
        expires,
        now.wall_ms,
        lock.unwrap_or(0)
    ])?;
    let token = uint(token);
    witness(
        tx,
        at,
        request.id,
        token,
        now,
        expires,
        lock.unwrap_or(0),
        0,
    )?;
    Ok((AcquireReply::Won { token }, false))
}

/// The largest token of the election's lease and witness rows, live or not.
fn current_tokens(tx: &Transaction<'_>, at: Address<'_>) -> Result<i64> {
    let largest: Option<i64> = tx
        .prepare_cached(
            "SELECT max(token) FROM (SELECT token FROM tenure_leases WHERE prefix = ?1 AND \
             name = ?2 UNION ALL SELECT token FROM tenure_witnesses WHERE prefix = ?1 AND \
             name = ?2)",
        )?
        .query_row(params![at.prefix, at.name], |r| r.get(0))?;
    Ok(largest.unwrap_or(0))
}

fn meta(tx: &Transaction<'_>, key: &str) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached("SELECT value FROM tenure_meta WHERE key = ?1")?
        .query_row(params![key], |r| r.get(0))
        .optional()?)
}

fn set_meta(tx: &Transaction<'_>, key: &str, value: &str) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO tenure_meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![key, value])?;
    Ok(())
}

/// How long the file grants no new term, if it does not now: one created
/// less than the hold-off ago (in this boot) may have replaced one that
/// held leases whose holders still act (deleted and made anew, say), as a
/// restarted Redis may; one that went back to an older copy (see
/// [`count`]) lost leases whose holders act until the mark's expiry.
fn hold_off(
    tx: &Transaction<'_>,
    request: &AcquireRequest<'_>,
    now: &Now,
    ignore_rollback: bool,
) -> Result<Option<Duration>> {
    let mut until: Option<i64> = None;
    if let (Some(boot), Some(born)) = (meta(tx, "born_boot")?, meta(tx, "born_ms")?) {
        if let Ok(born) = born.parse::<i64>() {
            let hold_off = request.ttl_ms.max(request.hold_off_ms);
            let born_until = born.saturating_add(int(hold_off));
            if now.before(&boot, born_until) {
                until = Some(born_until);
            }
        }
    }
    if let (Some(boot), Some(held), false) = (
        meta(tx, "held_boot")?,
        meta(tx, "held_until")?,
        ignore_rollback,
    ) {
        if let Ok(held) = held.parse::<i64>() {
            if now.before(&boot, held) {
                until = Some(until.unwrap_or(held).max(held));
            }
        }
    }
    Ok(until.map(|until| now.until(until)))
}

/// Count a batch in the file, against the mark kept outside it (see
/// `horizon.rs`); the batch's generation, to raise the mark to once it
/// committed, and whether the file went back. A file whose generation is below the mark went back to an
/// older copy: it grants no new term until the mark's expiry, the latest
/// any lease of it was given, has passed (unless `ignore`, the unsafe
/// switch of a failing-mode test).
pub(super) fn count(
    tx: &Transaction<'_>,
    mark: Option<&Mark>,
    now: &Now,
    ignore: bool,
) -> Result<(i64, bool)> {
    let generation = meta(tx, "generation")?
        .and_then(|g| g.parse::<i64>().ok())
        .unwrap_or(0);
    let marked = mark.map_or(0, |m| m.generation);
    let rolled_back = generation < marked;
    if let Some(mark) = mark.filter(|m| generation < m.generation && !ignore) {
        if now.before(&mark.boot, mark.until) {
            tracing::warn!(
                generation,
                mark = mark.generation,
                wait_ms = now.until(mark.until).as_millis() as u64,
                "the SQLite file is new or went back to an older copy; no new term until every \
                 lease it may have lost has expired"
            );
            let held = match (meta(tx, "held_boot")?, meta(tx, "held_until")?) {
                (Some(boot), Some(held)) if boot == now.boot => {
                    held.parse::<i64>().unwrap_or(0).max(mark.until)
                }
                _ => mark.until,
            };
            set_meta(tx, "held_boot", &now.boot)?;
            set_meta(tx, "held_until", &held.to_string())?;
        }
    }
    let next = generation.max(marked).saturating_add(1);
    set_meta(tx, "generation", &next.to_string())?;
    Ok((next, rolled_back))
}

/// Record that term (`id`, `token`) holds the lock file of inode `inode`
/// (taken after it won), in its lease and witness if they are still its.
pub(super) fn record_lock(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    inode: i64,
) -> Result<()> {
    for table in ["tenure_leases", "tenure_witnesses"] {
        tx.prepare_cached(&format!(
            "UPDATE {table} SET locked = ?5 WHERE prefix = ?1 AND name = ?2 AND owner = ?3 \
             AND token = ?4 AND locked = 0"
        ))?
        .execute(params![at.prefix, at.name, id, int(token), inode])?;
    }
    Ok(())
}

/// Set the witness of term (`id`, `token`), bound to `session` (0: none):
/// it outlives a lease deleted by hand, and only its holder's release
/// removes it.
#[allow(clippy::too_many_arguments)]
fn witness(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    now: &Now,
    expires: i64,
    locked: i64,
    session: i64,
) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO tenure_witnesses (prefix, name, owner, token, boot, expires, locked, \
         session) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (prefix, name) DO UPDATE \
         SET owner = excluded.owner, token = excluded.token, boot = excluded.boot, \
         expires = excluded.expires, locked = excluded.locked, session = excluded.session",
    )?
    .execute(params![
        at.prefix,
        at.name,
        id,
        int(token),
        now.boot,
        expires,
        locked,
        session
    ])?;
    Ok(())
}

/// The session of one process's batch renewals (one per prefix, id and
/// ttl): a random number no other process binds to, and what this process
/// last bound to it.
#[derive(Debug)]
pub(super) struct Session {
    pub number: i64,
    pub bound: Option<Bound>,
    /// The session's expiry as this process last wrote it (boot, expiry),
    /// unless a batch failed since.
    pub expires: Option<(String, i64)>,
}

impl Session {
    pub fn new() -> Session {
        Session {
            number: (rand::random::<u64>() >> 1).max(1) as i64,
            bound: None,
            expires: None,
        }
    }
}

/// The low 32 bits of each token, summed.
fn token_sum<'a>(tokens: impl Iterator<Item = &'a u64>) -> i64 {
    tokens.map(|t| int(t & 0xFFFF_FFFF)).sum()
}

/// Renew many terms of instance `id` at once (a partition set's).
///
/// Writing every lease and witness each interval cost 8–9 % of a core
/// for 10,000 partitions, so the rows are bound to a **session** instead:
/// a row of `tenure_sessions` this process renews, one row per interval,
/// while each bound lease and witness carries a far expiry (the horizon,
/// [`HORIZON_TTLS`] ttls ahead) and lives until the earlier of the two
/// (`expiry_of!`). A session that lapsed takes its rows with it; a
/// session row deleted by hand leaves them to their horizon (a crash, not
/// a release).
///
/// The fast path, when the terms are those bound last time (`bound`) and
/// their horizon is more than half away: the session renewed if it is
/// live, then one count of the rows bound to it (and of their witnesses),
/// by an index, against `bound`: anything deleted, taken over, restored
/// or edited shows as a different count or token sum. Otherwise (and
/// after a rollback of the file) the slow path binds every live term
/// anew, one statement over all of them joined with the terms as JSON,
/// and unbinds what it no longer renews. A term it did not renew (lost,
/// taken, expired) is told apart by [`renew`], one by one: rare.
#[allow(clippy::too_many_arguments)]
fn renew_many(
    tx: &Transaction<'_>,
    prefix: &str,
    id: &str,
    ttl_ms: u64,
    terms: &[(&str, u64)],
    now: &Now,
    session: &mut Session,
    rolled_back: bool,
) -> Result<Vec<Result<RenewReply>>> {
    let expires = now.plus(ttl_ms);
    let number = session.number;
    if let Some(bound) = session.bound.take() {
        if !rolled_back && fast_path(tx, prefix, id, ttl_ms, terms, now, number, &bound)? {
            session.bound = Some(bound);
            session.expires = Some((now.boot.clone(), expires));
            return Ok(terms.iter().map(|_| Ok(RenewReply::Renewed)).collect());
        }
    }
    // The session, live from here on: one that lapsed first gives its
    // rows the expiry they had, so that renewing it revives none: the
    // leases by its `expires`, the witnesses by its `witness_expires`.
    // A session row gone (deleted by hand) that this process last saw
    // lapse is taken as lapsed then.
    let found: Option<(String, i64, i64)> = tx
        .prepare_cached(
            "SELECT boot, expires, witness_expires FROM tenure_sessions \
             WHERE prefix = ?1 AND session = ?2",
        )?
        .query_row(params![prefix, number], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let last = match (&found, &session.expires) {
        (Some(row), _) => Some(row.clone()),
        (None, Some((boot, until))) => Some((boot.clone(), *until, *until)),
        (None, None) => None,
    };
    if let Some((boot, leases_until, witnesses_until)) = &last {
        for (table, until) in [
            ("tenure_leases", leases_until),
            ("tenure_witnesses", witnesses_until),
        ] {
            if now.before(boot, *until) {
                continue;
            }
            tx.prepare_cached(&format!(
                "UPDATE {table} SET session = 0, expires = min(expires, ?3) \
                 WHERE prefix = ?1 AND session = ?2 AND session != 0 AND owner = ?5 \
                 AND boot = ?4"
            ))?
            .execute(params![prefix, number, until, boot, id])?;
        }
    }
    if found.is_none() {
        // A new session: the lapsed ones of this prefix go, once no row
        // can still be bound to them (past their horizon).
        tx.prepare_cached(
            "DELETE FROM tenure_sessions WHERE prefix = ?1 \
             AND (boot != ?2 OR max(expires, witness_expires) + ttl_ms * ?3 < ?4)",
        )?
        .execute(params![prefix, now.boot, HORIZON_TTLS, now.ms])?;
    }
    tx.prepare_cached(
        "INSERT INTO tenure_sessions (prefix, session, owner, ttl_ms, boot, expires, \
         witness_expires) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
         ON CONFLICT (prefix, session) DO UPDATE SET owner = excluded.owner, \
         ttl_ms = excluded.ttl_ms, boot = excluded.boot, expires = excluded.expires, \
         witness_expires = excluded.witness_expires",
    )?
    .execute(params![prefix, number, id, int(ttl_ms), now.boot, expires])?;
    session.expires = Some((now.boot.clone(), expires));
    let horizon = now.plus(ttl_ms.saturating_mul(HORIZON_TTLS as u64));
    let given: Vec<(&str, i64)> = terms.iter().map(|(n, t)| (*n, int(*t))).collect();
    let json = serde_json::to_string(&given)
        .map_err(|err| crate::Error::internal(format!("the terms as JSON: {err}")))?;
    // Each live term bound, by name (a name has one lease): its token and
    // its lock. The terms drive the join (`CROSS JOIN` fixes the order),
    // so that each is looked up by the primary key: with the table
    // outside, SQLite's planner scanned it.
    let mut renewed: std::collections::HashMap<String, (u64, i64)> =
        std::collections::HashMap::new();
    {
        let mut update = tx.prepare_cached(concat!(
            "UPDATE tenure_leases SET expires = ?1, ttl_ms = ?2, session = ?3 WHERE rowid IN ",
            "(SELECT l.rowid FROM json_each(?4) AS given CROSS JOIN tenure_leases AS l",
            session_of!("l"),
            "WHERE l.prefix = ?5 AND l.name = given.value ->> 0 ",
            "AND l.token = given.value ->> 1 AND l.owner = ?6 AND l.boot = ?7 AND ",
            expiry_of!("l", "expires"),
            " > ?8) RETURNING name, token, locked"
        ))?;
        let rows = update.query_map(
            params![
                horizon,
                int(ttl_ms),
                number,
                json,
                prefix,
                id,
                now.boot,
                now.ms
            ],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            },
        )?;
        for row in rows {
            let (name, token, locked) = row?;
            renewed.insert(name, (uint(token), locked));
        }
    }
    // The witnesses of the terms renewed, and of those only: a witness
    // outliving its lease would hold the election for nothing.
    let mut witnessed = std::collections::HashSet::new();
    if !renewed.is_empty() {
        let pairs: Vec<(&str, i64)> = renewed
            .iter()
            .map(|(n, (t, _))| (n.as_str(), int(*t)))
            .collect();
        let json = serde_json::to_string(&pairs)
            .map_err(|err| crate::Error::internal(format!("the terms as JSON: {err}")))?;
        let mut update = tx.prepare_cached(
            "UPDATE tenure_witnesses SET expires = ?1, boot = ?2, session = ?3 WHERE rowid IN \
             (SELECT w.rowid FROM json_each(?4) AS given CROSS JOIN tenure_witnesses AS w \
             WHERE w.prefix = ?5 AND w.name = given.value ->> 0 \
             AND w.token = given.value ->> 1 AND w.owner = ?6) \
             RETURNING name",
        )?;
        let rows = update.query_map(params![horizon, now.boot, number, json, prefix, id], |r| {
            r.get::<_, String>(0)
        })?;
        for row in rows {
            witnessed.insert(row?);
        }
    }
    // What this session no longer renews (a term resigned or given up)
    // leaves it, to expire with the session's current expiry at latest.
    // (Told by name, not by an older horizon: two bindings within one
    // millisecond give the same.)
    let names = serde_json::to_string(&renewed.keys().collect::<Vec<_>>())
        .map_err(|err| crate::Error::internal(format!("the terms as JSON: {err}")))?;
    for table in ["tenure_leases", "tenure_witnesses"] {
        tx.prepare_cached(&format!(
            "UPDATE {table} SET session = 0, expires = min(expires, ?3) \
             WHERE prefix = ?1 AND session = ?2 AND session != 0 AND owner = ?5 \
             AND name NOT IN (SELECT value FROM json_each(?4))"
        ))?
        .execute(params![prefix, number, expires, names, id])?;
    }
    let mut replies = Vec::with_capacity(terms.len());
    let mut bound = std::collections::HashMap::with_capacity(renewed.len());
    for (name, token) in terms {
        let at = Address::new(prefix, name);
        let reply = match renewed.get(*name) {
            // The same name under another token (a stale term) was not.
            Some((renewed_token, locked)) if renewed_token == token => {
                if !witnessed.contains(*name) {
                    // A witness deleted by hand: set again.
                    witness(tx, at, id, *token, now, horizon, *locked, number)?;
                }
                bound.insert((*name).to_string(), *token);
                RenewReply::Renewed
            }
            _ => renew(tx, at, id, *token, ttl_ms, now)?,
        };
        replies.push(Ok(reply));
    }
    session.bound = Some(Bound {
        token_sum: token_sum(bound.values()),
        terms: bound,
        boot: now.boot.clone(),
        horizon,
    });
    Ok(replies)
}

/// Renew session `number` of (`id`, `ttl_ms`) by one ttl from `now`,
/// if it is live: whether it was.
fn renew_session(
    tx: &Transaction<'_>,
    prefix: &str,
    number: i64,
    id: &str,
    ttl_ms: u64,
    now: &Now,
) -> Result<bool> {
    let renewed = tx
        .prepare_cached(
            "UPDATE tenure_sessions SET expires = ?6, witness_expires = ?6 \
             WHERE prefix = ?1 AND session = ?2 AND owner = ?3 AND ttl_ms = ?4 AND boot = ?5 \
             AND expires > ?7 AND witness_expires > ?7",
        )?
        .execute(params![
            prefix,
            number,
            id,
            int(ttl_ms),
            now.boot,
            now.plus(ttl_ms),
            now.ms
        ])?;
    Ok(renewed == 1)
}

/// [`renew_many`]'s fast path: whether `terms` are exactly those `bound`
/// to session `number`, far from their horizon, and all there, with the
/// session live; then it is renewed, and so are they.
#[allow(clippy::too_many_arguments)]
fn fast_path(
    tx: &Transaction<'_>,
    prefix: &str,
    id: &str,
    ttl_ms: u64,
    terms: &[(&str, u64)],
    now: &Now,
    number: i64,
    bound: &Bound,
) -> Result<bool> {
    let half = int(ttl_ms.saturating_mul(HORIZON_TTLS as u64) / 2);
    if bound.boot != now.boot
        || bound.horizon.saturating_sub(now.ms) <= half
        || terms.len() != bound.terms.len()
        || !terms
            .iter()
            .all(|(name, token)| bound.terms.get(*name) == Some(token))
        // A name given twice, another left out, shows here.
        || token_sum(terms.iter().map(|(_, token)| token)) != bound.token_sum
    {
        return Ok(false);
    }
    if !renew_session(tx, prefix, number, id, ttl_ms, now)? {
        return Ok(false);
    }
    let want = (int(bound.terms.len() as u64), bound.token_sum);
    for table in ["tenure_leases", "tenure_witnesses"] {
        let found: (i64, i64) = tx
            .prepare_cached(&format!(
                "SELECT count(*), coalesce(sum(token & 4294967295), 0) FROM {table} \
                 WHERE prefix = ?1 AND session = ?2 AND session != 0 AND owner = ?3 \
                 AND boot = ?4 AND expires >= ?5"
            ))?
            .query_row(params![prefix, number, id, now.boot, bound.horizon], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
        if found != want {
            return Ok(false);
        }
    }
    Ok(true)
}

fn renew(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    ttl_ms: u64,
    now: &Now,
) -> Result<RenewReply> {
    match lease(tx, at)?.filter(|l| l.live(now)) {
        Some(lease) if lease.owner == id && lease.token == token => {
            // Renewed on its own, it leaves any session it was bound to.
            let expires = now.plus(ttl_ms);
            tx.prepare_cached(
                "UPDATE tenure_leases SET expires = ?3, ttl_ms = ?4, session = 0 \
                 WHERE prefix = ?1 AND name = ?2",
            )?
            .execute(params![at.prefix, at.name, expires, int(ttl_ms)])?;
            witness(tx, at, id, token, now, expires, lease.locked, 0)?;
            Ok(RenewReply::Renewed)
        }
        Some(lease) => Ok(RenewReply::NotOwner(Some(lease.holder(now)))),
        None => Ok(RenewReply::NotOwner(None)),
    }
}

/// The holder's release: of its lease, or, when the lease vanished some
/// other way, of its witness alone. `true` only if the lease was ours.
fn resign(tx: &Transaction<'_>, at: Address<'_>, id: &str, token: u64, now: &Now) -> Result<bool> {
    let lease = lease(tx, at)?.filter(|l| l.owner == id && l.token == token);
    let ours = lease.as_ref().is_some_and(|l| l.live(now));
    if lease.is_some() {
        tx.prepare_cached("DELETE FROM tenure_leases WHERE prefix = ?1 AND name = ?2")?
            .execute(params![at.prefix, at.name])?;
    }
    tx.prepare_cached(
        "DELETE FROM tenure_witnesses WHERE prefix = ?1 AND name = ?2 AND owner = ?3 \
         AND token = ?4",
    )?
    .execute(params![at.prefix, at.name, id, int(token)])?;
    Ok(ours)
}

fn heartbeat(
    tx: &Transaction<'_>,
    group: Address<'_>,
    member: &str,
    ttl_ms: u64,
    join: bool,
    now: &Now,
) -> Result<Reply> {
    tx.prepare_cached(
        "DELETE FROM tenure_members WHERE prefix = ?1 AND grp = ?2 \
         AND (boot != ?3 OR expires <= ?4)",
    )?
    .execute(params![group.prefix, group.name, now.boot, now.ms])?;
    if join {
        tx.prepare_cached(
            "INSERT INTO tenure_members (prefix, grp, member, boot, expires) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (prefix, grp, member) DO UPDATE SET \
             boot = excluded.boot, expires = excluded.expires",
        )?
        .execute(params![
            group.prefix,
            group.name,
            member,
            now.boot,
            now.plus(ttl_ms)
        ])?;
    } else {
        tx.prepare_cached(
            "DELETE FROM tenure_members WHERE prefix = ?1 AND grp = ?2 AND member = ?3",
        )?
        .execute(params![group.prefix, group.name, member])?;
    }
    let mut query = tx.prepare_cached(
        "SELECT member FROM tenure_members WHERE prefix = ?1 AND grp = ?2 ORDER BY member",
    )?;
    let members = query
        .query_map(params![group.prefix, group.name], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(Reply::Members {
        members,
        phantoms: 0,
    })
}

fn last_run(tx: &Transaction<'_>, at: Address<'_>, now: &Now) -> Result<Option<RunRecord>> {
    let run: Option<(i64, i64, Option<i64>)> = tx
        .prepare_cached(
            "SELECT at_ms, keep_until_ms, slot FROM tenure_runs WHERE prefix = ?1 AND name = ?2",
        )?
        .query_row(params![at.prefix, at.name], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    Ok(run
        .filter(|(_, keep_until, _)| *keep_until > now.wall_ms)
        .map(|(at_ms, _, slot)| RunRecord {
            age: Duration::from_millis(uint(now.wall_ms.saturating_sub(at_ms))),
            slot: slot.map(uint),
        }))
}

/// As `record_run.lua`: only the term holding the lease records, never
/// over a newer term's record, and a slot only after the one recorded.
fn record_run(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    keep_ms: u64,
    slot: Option<u64>,
    now: &Now,
) -> Result<bool> {
    let holds = lease(tx, at)?.is_some_and(|l| l.live(now) && l.owner == id && l.token == token);
    let kept: Option<(bool, Option<i64>)> = tx
        .prepare_cached(
            "SELECT token > ?3, slot FROM tenure_runs WHERE prefix = ?1 AND name = ?2 \
             AND keep_until_ms > ?4",
        )?
        .query_row(params![at.prefix, at.name, int(token), now.wall_ms], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let newer = kept.is_some_and(|(newer, _)| newer);
    let kept_slot = kept.and_then(|(_, slot)| slot).map(uint);
    let slot_taken = matches!((slot, kept_slot), (Some(new), Some(old)) if new <= old);
    if !holds || newer || slot_taken {
        return Ok(false);
    }
    tx.prepare_cached(
        "INSERT INTO tenure_runs (prefix, name, token, at_ms, keep_until_ms, slot) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (prefix, name) DO UPDATE SET \
         token = excluded.token, at_ms = excluded.at_ms, \
         keep_until_ms = excluded.keep_until_ms, slot = excluded.slot",
    )?
    .execute(params![
        at.prefix,
        at.name,
        int(token),
        now.wall_ms,
        now.wall_ms.saturating_add(int(keep_ms)),
        slot.or(kept_slot).map(int),
    ])?;
    Ok(true)
}

/// The elections under `prefix` with a live lease, sorted.
pub(super) fn elections(tx: &Transaction<'_>, prefix: &str, now: &Now) -> Result<Vec<String>> {
    let mut query = tx.prepare_cached(concat!(
        "SELECT l.name FROM tenure_leases AS l",
        session_of!("l"),
        "WHERE l.prefix = ?1 AND l.boot = ?2 AND ",
        expiry_of!("l", "expires"),
        " > ?3 ORDER BY l.name"
    ))?;
    let names = query
        .query_map(params![prefix, now.boot, now.ms], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(names)
}
