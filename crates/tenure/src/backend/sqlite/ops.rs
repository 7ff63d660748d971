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
use crate::backend::op::{Op, Reply};
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
        .prepare_cached(
            "SELECT owner, attempt, token, ttl_ms, boot, expires, since_ms, locked \
             FROM tenure_leases WHERE prefix = ?1 AND name = ?2",
        )?
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

/// Carry out `op` in `tx` at `now` (`ignore_rollback`: see [`count`]).
pub(super) fn apply(
    tx: &Transaction<'_>,
    op: &Op<'_>,
    now: &Now,
    lock: Option<i64>,
    ignore_rollback: bool,
) -> Result<(Reply, Seen)> {
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
        } => Reply::RenewMany(renew_many(tx, prefix, id, ttl_ms, terms, now)?),
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
        } => Reply::RecordRun(record_run(tx, at, id, token, keep_ms, now)?),
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
                "UPDATE tenure_leases SET expires = ?3, ttl_ms = ?4, locked = ?5 \
                 WHERE prefix = ?1 AND name = ?2",
            )?
            .execute(params![
                at.prefix,
                at.name,
                expires,
                int(request.ttl_ms),
                locked
            ])?;
            witness(tx, at, request.id, lease.token, now, expires, locked)?;
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
        .prepare_cached(
            "SELECT token, boot, expires, locked FROM tenure_witnesses \
             WHERE prefix = ?1 AND name = ?2",
        )?
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
         since_ms, locked) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (prefix, name) DO UPDATE SET owner = excluded.owner, \
         attempt = excluded.attempt, token = excluded.token, ttl_ms = excluded.ttl_ms, \
         boot = excluded.boot, expires = excluded.expires, since_ms = excluded.since_ms, \
         locked = excluded.locked",
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
    witness(tx, at, request.id, token, now, expires, lock.unwrap_or(0))?;
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
/// committed. A file whose generation is below the mark went back to an
/// older copy: it grants no new term until the mark's expiry, the latest
/// any lease of it was given, has passed (unless `ignore`, the unsafe
/// switch of a failing-mode test).
pub(super) fn count(
    tx: &Transaction<'_>,
    mark: Option<&Mark>,
    now: &Now,
    ignore: bool,
) -> Result<i64> {
    let generation = meta(tx, "generation")?
        .and_then(|g| g.parse::<i64>().ok())
        .unwrap_or(0);
    let marked = mark.map_or(0, |m| m.generation);
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
    Ok(next)
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

/// Set the witness of term (`id`, `token`): it outlives a lease deleted
/// by hand, and only its holder's release removes it.
fn witness(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    now: &Now,
    expires: i64,
    locked: i64,
) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO tenure_witnesses (prefix, name, owner, token, boot, expires, locked) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (prefix, name) DO UPDATE SET \
         owner = excluded.owner, token = excluded.token, boot = excluded.boot, \
         expires = excluded.expires, locked = excluded.locked",
    )?
    .execute(params![
        at.prefix,
        at.name,
        id,
        int(token),
        now.boot,
        expires,
        locked
    ])?;
    Ok(())
}

/// Renew many terms of instance `id` at once (a partition set's): two
/// statements for the whole batch, one over the leases and one over their
/// witnesses, each joined with the terms given as one JSON array (a
/// statement per term cost about 8 % of a core for 10,000 partitions).
/// The terms drive the join (`CROSS JOIN` fixes the order), so that each
/// is looked up by the primary key: with the table outside, SQLite's
/// planner scanned it (the set lost its terms to slow renewals).
/// A term the first statement did not renew (lost, taken, expired) is
/// told apart by [`renew`], one by one: rare.
fn renew_many(
    tx: &Transaction<'_>,
    prefix: &str,
    id: &str,
    ttl_ms: u64,
    terms: &[(&str, u64)],
    now: &Now,
) -> Result<Vec<Result<RenewReply>>> {
    let expires = now.plus(ttl_ms);
    let given: Vec<(&str, i64)> = terms.iter().map(|(n, t)| (*n, int(*t))).collect();
    let json = serde_json::to_string(&given)
        .map_err(|err| crate::Error::internal(format!("the terms as JSON: {err}")))?;
    // Each term renewed, by name (a name has one lease): its token and
    // its lock.
    let mut renewed: std::collections::HashMap<String, (i64, i64)> =
        std::collections::HashMap::new();
    {
        let mut update = tx.prepare_cached(
            "UPDATE tenure_leases SET expires = ?1, ttl_ms = ?2 WHERE rowid IN \
             (SELECT lease.rowid FROM json_each(?7) AS given CROSS JOIN tenure_leases AS lease \
             WHERE lease.prefix = ?3 AND lease.name = given.value ->> 0 \
             AND lease.token = given.value ->> 1 AND lease.owner = ?4 AND lease.boot = ?5 \
             AND lease.expires > ?6) \
             RETURNING name, token, locked",
        )?;
        let rows = update.query_map(
            params![expires, int(ttl_ms), prefix, id, now.boot, now.ms, json],
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
            renewed.insert(name, (token, locked));
        }
    }
    // The witnesses of the terms renewed, and of those only: a witness
    // outliving its lease would hold the election for nothing.
    let mut witnessed = std::collections::HashSet::new();
    if !renewed.is_empty() {
        let pairs: Vec<(&str, i64)> = renewed.iter().map(|(n, (t, _))| (n.as_str(), *t)).collect();
        let json = serde_json::to_string(&pairs)
            .map_err(|err| crate::Error::internal(format!("the terms as JSON: {err}")))?;
        let mut update = tx.prepare_cached(
            "UPDATE tenure_witnesses SET expires = ?1, boot = ?2 WHERE rowid IN \
             (SELECT witness.rowid FROM json_each(?5) AS given \
             CROSS JOIN tenure_witnesses AS witness \
             WHERE witness.prefix = ?3 AND witness.name = given.value ->> 0 \
             AND witness.token = given.value ->> 1 AND witness.owner = ?4) \
             RETURNING name",
        )?;
        let rows = update.query_map(params![expires, now.boot, prefix, id, json], |r| {
            r.get::<_, String>(0)
        })?;
        for row in rows {
            witnessed.insert(row?);
        }
    }
    let mut replies = Vec::with_capacity(terms.len());
    for (name, token) in terms {
        let at = Address::new(prefix, name);
        let reply = match renewed.get(*name) {
            // The same name under another token (a stale term) was not.
            Some((renewed_token, locked)) if *renewed_token == int(*token) => {
                if !witnessed.contains(*name) {
                    // A witness deleted by hand: set again.
                    witness(tx, at, id, *token, now, expires, *locked)?;
                }
                RenewReply::Renewed
            }
            _ => renew(tx, at, id, *token, ttl_ms, now)?,
        };
        replies.push(Ok(reply));
    }
    Ok(replies)
}

fn renew(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    ttl_ms: u64,
    now: &Now,
) -> Result<RenewReply> {
    // The common case in two statements: the lease, then its witness.
    let expires = now.plus(ttl_ms);
    let locked: Option<i64> = tx
        .prepare_cached(
            "UPDATE tenure_leases SET expires = ?3, ttl_ms = ?4 WHERE prefix = ?1 AND name = ?2 \
             AND owner = ?5 AND token = ?6 AND boot = ?7 AND expires > ?8 RETURNING locked",
        )?
        .query_row(
            params![
                at.prefix,
                at.name,
                expires,
                int(ttl_ms),
                id,
                int(token),
                now.boot,
                now.ms
            ],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(locked) = locked {
        let witnessed = tx
            .prepare_cached(
                "UPDATE tenure_witnesses SET expires = ?3, boot = ?4 \
                 WHERE prefix = ?1 AND name = ?2 AND owner = ?5 AND token = ?6",
            )?
            .execute(params![
                at.prefix,
                at.name,
                expires,
                now.boot,
                id,
                int(token)
            ])?;
        if witnessed == 0 {
            witness(tx, at, id, token, now, expires, locked)?;
        }
        return Ok(RenewReply::Renewed);
    }
    match lease(tx, at)?.filter(|l| l.live(now)) {
        Some(lease) if lease.owner == id && lease.token == token => {
            let expires = now.plus(ttl_ms);
            tx.prepare_cached(
                "UPDATE tenure_leases SET expires = ?3, ttl_ms = ?4 \
                 WHERE prefix = ?1 AND name = ?2",
            )?
            .execute(params![at.prefix, at.name, expires, int(ttl_ms)])?;
            witness(tx, at, id, token, now, expires, lease.locked)?;
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

fn last_run(tx: &Transaction<'_>, at: Address<'_>, now: &Now) -> Result<Option<Duration>> {
    let run: Option<(i64, i64)> = tx
        .prepare_cached(
            "SELECT at_ms, keep_until_ms FROM tenure_runs WHERE prefix = ?1 AND name = ?2",
        )?
        .query_row(params![at.prefix, at.name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(run
        .filter(|(_, keep_until)| *keep_until > now.wall_ms)
        .map(|(at_ms, _)| Duration::from_millis(uint(now.wall_ms.saturating_sub(at_ms)))))
}

/// As `last_run.lua`: only the term holding the lease records, and never
/// over a newer term's record.
fn record_run(
    tx: &Transaction<'_>,
    at: Address<'_>,
    id: &str,
    token: u64,
    keep_ms: u64,
    now: &Now,
) -> Result<bool> {
    let holds = lease(tx, at)?.is_some_and(|l| l.live(now) && l.owner == id && l.token == token);
    let newer: bool = tx
        .prepare_cached(
            "SELECT token > ?3 FROM tenure_runs WHERE prefix = ?1 AND name = ?2 \
             AND keep_until_ms > ?4",
        )?
        .query_row(params![at.prefix, at.name, int(token), now.wall_ms], |r| {
            r.get(0)
        })
        .optional()?
        .unwrap_or(false);
    if !holds || newer {
        return Ok(false);
    }
    tx.prepare_cached(
        "INSERT INTO tenure_runs (prefix, name, token, at_ms, keep_until_ms) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (prefix, name) DO UPDATE SET \
         token = excluded.token, at_ms = excluded.at_ms, keep_until_ms = excluded.keep_until_ms",
    )?
    .execute(params![
        at.prefix,
        at.name,
        int(token),
        now.wall_ms,
        now.wall_ms.saturating_add(int(keep_ms))
    ])?;
    Ok(true)
}

/// The elections under `prefix` with a live lease, sorted.
pub(super) fn elections(tx: &Transaction<'_>, prefix: &str, now: &Now) -> Result<Vec<String>> {
    let mut query = tx.prepare_cached(
        "SELECT name FROM tenure_leases WHERE prefix = ?1 AND boot = ?2 AND expires > ?3 \
         ORDER BY name",
    )?;
    let names = query
        .query_map(params![prefix, now.boot, now.ms], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(names)
}
