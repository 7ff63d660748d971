//! The embedded store: a SQLite file that processes on one host share
//! (`sqlite:///path/to/file.db`, behind the `sqlite` feature, Linux only).
//!
//! No server: SQLite is compiled in, each batch of operations is one short
//! `BEGIN IMMEDIATE` transaction (WAL mode, a busy timeout bounded by the
//! call timeout, so a busy file is a failed call that is retried, never a
//! stall), and the one host gives what no network store can:
//!
//! - **Exact time** (`clock.rs`): leases expire on `CLOCK_BOOTTIME`, which
//!   every process on the host reads alike; a lease of an earlier boot is
//!   dead.
//! - **Crash takeover without waiting for the ttl** (`locks.rs`): a holder
//!   keeps an OS lock for its term, the kernel drops it the instant the
//!   holder dies, and a follower waiting for it takes over at once. The
//!   same lock, let go by a resign, is the hand-over's notification.
//!
//! One host only: every host would elect a leader of its own from its own
//! file, and a file on a network file system is refused (`file.rs`).

mod clock;
mod file;
mod horizon;
mod locks;
mod ops;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::watch;

use super::op::{Hints, Notices, Op, Reply};
use super::Address;
use crate::machine::{AcquireReply, AcquireRequest};
use crate::{Error, Result};
use clock::Now;
use horizon::Horizon;
use locks::{Locks, Taken};

/// The connection, and the file it is to: (device, inode), see
/// [`SqliteStore::connection`].
struct Open {
    conn: Connection,
    identity: (u64, u64),
}

/// One process's connection to a database file.
pub(crate) struct SqliteStore {
    url: String,
    path: std::path::PathBuf,
    call_timeout: Duration,
    boot: String,
    conn: Arc<Mutex<Open>>,
    locks: Arc<Locks>,
    /// The mark that shows the file went back (see `horizon.rs`).
    horizon: Horizon,
    /// The sessions of this process's batch renewals (see `ops.rs`).
    sessions: Mutex<ops::Sessions>,
    bugs: crate::backend::SqliteBugs,
}

impl SqliteStore {
    /// Open (or create) the file `url` names, checked for leases.
    pub async fn connect(
        url: &str,
        call_timeout: Duration,
        bugs: crate::backend::SqliteBugs,
    ) -> Result<SqliteStore> {
        let url = url.to_string();
        tokio::task::spawn_blocking(move || {
            let path = file::path_of(&url)?;
            let boot = clock::boot_id()?;
            let now = Now::read(&boot)?;
            let conn = file::open(&url, &path, call_timeout, &now)?;
            // One file, one lock directory, however it is named (a
            // symbolic link, a relative path): SQLite resolves links too.
            let path = std::fs::canonicalize(&path).map_err(|err| Error::Unreachable {
                url: url.clone(),
                detail: format!("cannot resolve {}: {err}", path.display()),
            })?;
            let locks = Arc::new(Locks::beside(&url, &path)?);
            let horizon = Horizon::within(locks.dir(), call_timeout);
            let identity = file::identity(&path).ok_or_else(|| Error::Unreachable {
                url: url.clone(),
                detail: format!("{} vanished as it was opened", path.display()),
            })?;
            Ok(SqliteStore {
                url,
                path,
                call_timeout,
                boot,
                conn: Arc::new(Mutex::new(Open { conn, identity })),
                locks,
                horizon,
                sessions: Mutex::new(ops::Sessions::new()),
                bugs,
            })
        })
        .await
        .map_err(|err| Error::internal(format!("opening the SQLite file: {err}")))?
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// An election in this file: followers are woken by its lock.
    pub fn election(&self, at: Address<'_>) -> Result<Hints> {
        let (sender, notices) = watch::channel(Notices::default());
        let watching = self.locks.watch(locks::key(at), sender)?;
        Ok(Hints {
            notices,
            guard: Some(Box::new(watching)),
        })
    }

    /// A duplicate of the OS lock term (`id`, `token`) of the election at
    /// `at` holds (see `locks.rs`), while it holds one.
    pub fn lock_of(&self, at: Address<'_>, id: &str, token: u64) -> Option<std::os::fd::OwnedFd> {
        self.locks.duplicate(&locks::key(at), id, token)
    }

    /// Let go of the locks of terms that lapsed (see `locks.rs`).
    pub fn sweep(&self) {
        self.locks.sweep();
    }

    /// Carry out `ops` in one transaction.
    pub async fn batch(
        self: &Arc<Self>,
        ops: &[Op<'_>],
        round_trips: &AtomicU64,
    ) -> Result<Vec<Result<Reply>>> {
        round_trips.fetch_add(1, Ordering::Relaxed);
        // The blocking pool needs owned operations: the batch is run by
        // index over a copy of its addresses and strings.
        let owned = ops.iter().map(OwnedOp::from).collect::<Vec<_>>();
        let store = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let terms = owned.iter().map(OwnedOp::terms).collect::<Vec<_>>();
            let ops = owned
                .iter()
                .zip(&terms)
                .map(|(op, terms)| op.as_op(terms))
                .collect::<Vec<_>>();
            store.batch_blocking(&ops)
        })
        .await
        .map_err(|err| Error::internal(format!("a SQLite batch: {err}")))?
    }

    /// The connection, to the file the path names now. A file deleted
    /// (or replaced) under an open connection goes on taking its writes,
    /// unseen by anyone who opens the path afterwards: a leader renewing
    /// there would lead beside one elected in the new file. So every batch
    /// checks first, and opens the new file (made anew if there is none):
    /// the old file's leaders find their leases gone, and the new file
    /// grants no lease for its first ttl (the hold-off in `ops.rs`), by
    /// when every renewal they sent to the old file has run out.
    fn connection(&self) -> Result<std::sync::MutexGuard<'_, Open>> {
        let mut open = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if file::identity(&self.path) != Some(open.identity) {
            tracing::warn!(url = %self.url, "the SQLite file was deleted or replaced; opening the new one");
            let now = Now::read(&self.boot)?;
            let conn = file::open(&self.url, &self.path, self.call_timeout, &now)?;
            let identity = file::identity(&self.path).ok_or_else(|| Error::Sqlite {
                detail: format!("{} vanished as it was opened", self.path.display()),
            })?;
            *open = Open { conn, identity };
        }
        Ok(open)
    }

    fn batch_blocking(&self, ops: &[Op<'_>]) -> Result<Vec<Result<Reply>>> {
        self.locks.sweep();
        let mut taken: Vec<Option<Taken>> = ops
            .iter()
            .map(|op| match op {
                Op::Acquire { at, request } => {
                    let key = locks::key(*at);
                    if self.locks.watched(&key) {
                        self.locks.before_acquire(&key, request.id, request.attempt)
                    } else {
                        None
                    }
                }
                _ => None,
            })
            .collect();
        let mut open = self.connection()?;
        let tx = open
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mark = self.horizon.read()?;
        let now = Now::read(&self.boot)?;
        let (generation, rolled_back) =
            ops::count(&tx, mark.as_ref(), &now, self.bugs.ignore_rollback)?;
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let mut cx = ops::Context {
            now: &now,
            ignore_rollback: self.bugs.ignore_rollback,
            rolled_back,
            alone: ops.len() == 1,
            sessions: &mut sessions,
        };
        let locks: Vec<Option<i64>> = taken
            .iter()
            .map(|taken| taken.as_ref().map(Taken::inode))
            .collect();
        let replies = match ops::apply_batch(&tx, ops, &mut cx, &locks) {
            Ok(replies) => replies,
            Err(err) => {
                // Rolled back: what the sessions bound is checked anew.
                forget(&mut sessions);
                return Err(err);
            }
        };
        // The mark covers the leases given before anyone can see them: a
        // raise after the commit could come after a rollback (see
        // `horizon.rs`).
        let until = ops
            .iter()
            .zip(&replies)
            .filter_map(|(op, (reply, _))| lease_given(op, reply))
            .max()
            .map(|ttl| now.plus(ttl));
        let committed = match until {
            Some(_) => self.horizon.raise(&now.boot, 0, until),
            None => Ok(()),
        }
        .and_then(|()| Ok(tx.commit()?));
        if let Err(err) = committed {
            forget(&mut sessions);
            return Err(err);
        }
        drop(sessions);
        drop(open);
        // The locks first: a resign lets go of its lock at once, so that a
        // candidate trying it meanwhile gets it (and records it in its
        // lease: a term won without it is not woken for by followers).
        let unlocked: Vec<bool> = taken.iter().map(Option::is_none).collect();
        for ((op, (reply, seen)), taken) in ops.iter().zip(&replies).zip(taken.iter_mut()) {
            self.after(op, reply, *seen, taken.take());
        }
        if let Err(err) = self.horizon.raise(&now.boot, generation, None) {
            // Committed all the same: a mark left behind only hides the
            // next rollback (see `horizon.rs`).
            tracing::warn!(url = %self.url, error = %err, "cannot raise the SQLite file's mark");
        }
        for ((op, (reply, _)), unlocked) in ops.iter().zip(&replies).zip(unlocked) {
            if let (
                Op::Acquire { at, request },
                Reply::Acquire(AcquireReply::Won { token }),
                true,
            ) = (op, reply, unlocked)
            {
                self.lock_after_win(*at, request, *token);
            }
        }
        Ok(replies.into_iter().map(|(reply, _)| Ok(reply)).collect())
    }

    /// A term of a watched election that won without its lock (the last
    /// holder was letting go of it as the candidate tried it, or a paused
    /// holder keeps it): the lock is tried again now, and once taken it is
    /// recorded in the term's lease and witness, so that followers wait
    /// for it and a crash of this holder is seen at once. Without that, a
    /// resign of this term would wake nobody: followers would wait for its
    /// lease to expire. Best effort: a lock still held elsewhere, or a
    /// failed update, leaves the term as it was (unlocked).
    fn lock_after_win(&self, at: Address<'_>, request: &AcquireRequest<'_>, token: u64) {
        let key = locks::key(at);
        if !self.locks.watched(&key) {
            return;
        }
        let Some(taken) = self.locks.before_acquire(&key, request.id, request.attempt) else {
            return;
        };
        let inode = taken.inode();
        let ttl = Duration::from_millis(request.ttl_ms);
        self.locks.after_acquire(
            &key,
            request.id,
            request.attempt,
            ttl,
            Some(token),
            Some(taken),
        );
        let recorded = self.connection().and_then(|mut open| {
            let tx = open
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            ops::record_lock(&tx, at, request.id, token, inode)?;
            tx.commit()?;
            Ok(())
        });
        if let Err(err) = recorded {
            tracing::debug!(url = %self.url, error = %err, "a term's lock taken after its win was not recorded");
        }
    }

    /// The locks' part of an operation that committed.
    fn after(&self, op: &Op<'_>, reply: &Reply, seen: ops::Seen, taken: Option<Taken>) {
        match (op, reply) {
            (Op::Acquire { at, request }, Reply::Acquire(answer)) => {
                let key = locks::key(*at);
                let won = match answer {
                    AcquireReply::Won { token } => Some(*token),
                    _ => None,
                };
                let ttl = Duration::from_millis(request.ttl_ms);
                self.locks
                    .after_acquire(&key, request.id, request.attempt, ttl, won, taken);
                if seen.held_locked {
                    self.locks.arm(&key);
                }
            }
            (
                Op::Renew {
                    at,
                    id,
                    token,
                    ttl_ms,
                    ..
                },
                Reply::Renew(crate::machine::RenewReply::Renewed),
            ) => {
                let ttl = Duration::from_millis(*ttl_ms);
                self.locks.renewed(&locks::key(*at), id, *token, ttl);
            }
            (
                Op::RenewMany {
                    prefix,
                    id,
                    ttl_ms,
                    terms,
                },
                Reply::RenewMany(replies),
            ) => {
                // A partition set takes no locks, but an election of the
                // same name in this process may have: kept up to date, so
                // the sweep never lets go of a lock under a live term.
                let ttl = Duration::from_millis(*ttl_ms);
                for ((name, token), reply) in terms.iter().zip(replies) {
                    if matches!(reply, Ok(crate::machine::RenewReply::Renewed)) {
                        let at = Address::new(prefix, name);
                        self.locks.renewed(&locks::key(at), id, *token, ttl);
                    }
                }
            }
            (Op::Resign { at, id, token }, _) => {
                self.locks.released(&locks::key(*at), id, *token);
            }
            _ => {}
        }
    }

    /// The elections under `prefix` with a live lease.
    pub async fn list_elections(self: &Arc<Self>, prefix: &str) -> Result<Vec<String>> {
        let store = Arc::clone(self);
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || {
            let mut open = store.connection()?;
            let tx = open
                .conn
                .transaction_with_behavior(TransactionBehavior::Deferred)?;
            let now = Now::read(&store.boot)?;
            ops::elections(&tx, &prefix, &now)
        })
        .await
        .map_err(|err| Error::internal(format!("listing SQLite elections: {err}")))?
    }
}

/// Forget what the sessions bound, after a batch that did not commit: the
/// next renewal of each takes the slow path (see `ops.rs`).
fn forget(sessions: &mut ops::Sessions) {
    for session in sessions.values_mut() {
        session.bound = None;
        session.expires = None;
    }
}

/// The ttl of the leases `op` gave or extended, as `reply` says, if any.
fn lease_given(op: &Op<'_>, reply: &Reply) -> Option<u64> {
    use crate::machine::RenewReply::Renewed;
    match (op, reply) {
        (Op::Acquire { request, .. }, Reply::Acquire(AcquireReply::Won { .. })) => {
            Some(request.ttl_ms)
        }
        (Op::Renew { ttl_ms, .. }, Reply::Renew(Renewed)) => Some(*ttl_ms),
        (Op::RenewMany { ttl_ms, .. }, Reply::RenewMany(replies))
            if replies.iter().any(|r| matches!(r, Ok(Renewed))) =>
        {
            Some(*ttl_ms)
        }
        _ => None,
    }
}

/// An [`Op`] that owns its strings, to cross into the blocking pool.
enum OwnedOp {
    Heartbeat {
        group: (String, String),
        member: String,
        ttl_ms: u64,
        join: bool,
    },
    Acquire {
        at: (String, String),
        id: String,
        attempt: String,
        ttl_ms: u64,
        hold_off_ms: u64,
    },
    Renew {
        at: (String, String),
        id: String,
        token: u64,
        ttl_ms: u64,
        announce: bool,
    },
    RenewMany {
        prefix: String,
        id: String,
        ttl_ms: u64,
        terms: Vec<(String, u64)>,
    },
    Resign {
        at: (String, String),
        id: String,
        token: u64,
    },
    Inspect {
        at: (String, String),
    },
    LastRun {
        at: (String, String),
    },
    RecordRun {
        at: (String, String),
        id: String,
        token: u64,
        keep_ms: u64,
        slot: Option<u64>,
    },
}

fn own(at: Address<'_>) -> (String, String) {
    (at.prefix.to_string(), at.name.to_string())
}

fn address(at: &(String, String)) -> Address<'_> {
    Address::new(&at.0, &at.1)
}

impl From<&Op<'_>> for OwnedOp {
    fn from(op: &Op<'_>) -> Self {
        match *op {
            Op::Heartbeat {
                group,
                member,
                ttl_ms,
                join,
            } => OwnedOp::Heartbeat {
                group: own(group),
                member: member.to_string(),
                ttl_ms,
                join,
            },
            Op::Acquire { at, request } => OwnedOp::Acquire {
                at: own(at),
                id: request.id.to_string(),
                attempt: request.attempt.to_string(),
                ttl_ms: request.ttl_ms,
                hold_off_ms: request.hold_off_ms,
            },
            Op::Renew {
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => OwnedOp::Renew {
                at: own(at),
                id: id.to_string(),
                token,
                ttl_ms,
                announce,
            },
            Op::RenewMany {
                prefix,
                id,
                ttl_ms,
                terms,
            } => OwnedOp::RenewMany {
                prefix: prefix.to_string(),
                id: id.to_string(),
                ttl_ms,
                terms: terms
                    .iter()
                    .map(|(name, token)| (name.to_string(), *token))
                    .collect(),
            },
            Op::Resign { at, id, token } => OwnedOp::Resign {
                at: own(at),
                id: id.to_string(),
                token,
            },
            Op::Inspect { at } => OwnedOp::Inspect { at: own(at) },
            Op::LastRun { at } => OwnedOp::LastRun { at: own(at) },
            Op::RecordRun {
                at,
                id,
                token,
                keep_ms,
                slot,
            } => OwnedOp::RecordRun {
                at: own(at),
                id: id.to_string(),
                token,
                keep_ms,
                slot,
            },
        }
    }
}

impl OwnedOp {
    /// The terms of a [`Op::RenewMany`], borrowed (empty for the others).
    fn terms(&self) -> Vec<(&str, u64)> {
        match self {
            OwnedOp::RenewMany { terms, .. } => terms
                .iter()
                .map(|(name, token)| (name.as_str(), *token))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The operation again, borrowing from `self` (and `terms`, from
    /// [`OwnedOp::terms`]).
    fn as_op<'a>(&'a self, terms: &'a [(&'a str, u64)]) -> Op<'a> {
        match self {
            OwnedOp::Heartbeat {
                group,
                member,
                ttl_ms,
                join,
            } => Op::Heartbeat {
                group: address(group),
                member,
                ttl_ms: *ttl_ms,
                join: *join,
            },
            OwnedOp::Acquire {
                at,
                id,
                attempt,
                ttl_ms,
                hold_off_ms,
            } => Op::Acquire {
                at: address(at),
                request: AcquireRequest {
                    id,
                    attempt,
                    ttl_ms: *ttl_ms,
                    hold_off_ms: *hold_off_ms,
                },
            },
            OwnedOp::Renew {
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => Op::Renew {
                at: address(at),
                id,
                token: *token,
                ttl_ms: *ttl_ms,
                announce: *announce,
            },
            OwnedOp::RenewMany {
                prefix, id, ttl_ms, ..
            } => Op::RenewMany {
                prefix,
                id,
                ttl_ms: *ttl_ms,
                terms,
            },
            OwnedOp::Resign { at, id, token } => Op::Resign {
                at: address(at),
                id,
                token: *token,
            },
            OwnedOp::Inspect { at } => Op::Inspect { at: address(at) },
            OwnedOp::LastRun { at } => Op::LastRun { at: address(at) },
            OwnedOp::RecordRun {
                at,
                id,
                token,
                keep_ms,
                slot,
            } => Op::RecordRun {
                at: address(at),
                id,
                token: *token,
                keep_ms: *keep_ms,
                slot: *slot,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::RenewReply;

    fn acquire<'a>(at: Address<'a>, id: &'a str, attempt: &'a str) -> Op<'a> {
        Op::Acquire {
            at,
            request: AcquireRequest {
                id,
                attempt,
                ttl_ms: 10_000,
                hold_off_ms: 10_000,
            },
        }
    }

    /// A store on a file of its own, and a raw connection to the file.
    struct Fixture {
        dir: std::path::PathBuf,
        store: SqliteStore,
        raw: Connection,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = std::env::temp_dir().join(format!(
                "tenure-unit-sqlite-{}-{:x}",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::create_dir_all(&dir).expect("a directory");
            let path = dir.join("t.db");
            let url = format!("sqlite://{}", path.display());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let store = runtime
                .block_on(SqliteStore::connect(
                    &url,
                    Duration::from_secs(60),
                    Default::default(),
                ))
                .expect("the file opens");
            let raw = Connection::open(&path).expect("a raw connection");
            // No hold-off: the file is not new to anyone here.
            raw.execute("DELETE FROM tenure_meta WHERE key = 'born_boot'", [])
                .expect("forget the birth");
            Fixture { dir, store, raw }
        }
    }

    fn one(store: &SqliteStore, op: Op<'_>) -> Reply {
        let mut replies = store.batch_blocking(&[op]).expect("the batch runs");
        replies.pop().expect("a reply").expect("the op runs")
    }

    /// A retry of an attempt (after its campaign gave up, say) that wins
    /// just as the attempt's earlier term is released keeps the lock its
    /// lease records: else followers would take over a live term.
    #[test]
    fn a_retry_that_wins_as_its_attempt_is_released_keeps_the_lock() {
        let Fixture { dir, store, raw } = Fixture::new();
        let store = Arc::new(store);
        let at = Address::new("t", "e");
        let _hints = store.election(at).expect("watched");
        let Reply::Acquire(AcquireReply::Won { token: first }) = one(&store, acquire(at, "a", "x"))
        else {
            panic!("a wins");
        };
        // Another writer holds the file while the term is released and
        // the same attempt acquires again.
        raw.execute_batch("BEGIN IMMEDIATE").expect("hold the file");
        let releasing = std::thread::spawn({
            let store = Arc::clone(&store);
            move || {
                let resign = Op::Resign {
                    at,
                    id: "a",
                    token: first,
                };
                one(&store, resign)
            }
        });
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let limit = std::time::Instant::now() + Duration::from_secs(30);
            while !done() {
                assert!(std::time::Instant::now() < limit, "never: {what}");
                std::thread::yield_now();
            }
        };
        until(
            "the release waits for the file, holding the connection",
            &|| store.conn.try_lock().is_err(),
        );
        let retrying = std::thread::spawn({
            let store = Arc::clone(&store);
            move || one(&store, acquire(at, "a", "x"))
        });
        let key = locks::key(at);
        until("the retry has a share of the lock", &|| {
            store.locks.shares(&key) >= 2
        });
        raw.execute_batch("COMMIT").expect("let go of the file");
        assert!(matches!(
            releasing.join().expect("no panic"),
            Reply::Resign(true)
        ));
        let Reply::Acquire(AcquireReply::Won { token: second }) =
            retrying.join().expect("no panic")
        else {
            panic!("the retry wins");
        };
        assert!(second > first);
        // Its lease is recorded as locked, so the lock must be held.
        let other = store.locks.file_of(&key);
        assert!(
            rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                .is_err(),
            "the lock of a live locked term is free"
        );
        let renew = Op::Renew {
            at,
            id: "a",
            token: second,
            ttl_ms: 10_000,
            announce: false,
        };
        assert!(matches!(
            one(&store, renew),
            Reply::Renew(RenewReply::Renewed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A partition set's renewals in one batch: each term's own answer,
    /// whether it was renewed, taken by another, or had its witness
    /// deleted by hand (set again).
    #[test]
    fn many_renewals_answer_each_term() {
        let Fixture { dir, store, raw } = Fixture::new();
        let names = ["p\"0", "p\\1", "p 2", "p 3"];
        let mut tokens = Vec::new();
        for name in names {
            let Reply::Acquire(AcquireReply::Won { token }) =
                one(&store, acquire(Address::new("t", name), "a", "x"))
            else {
                panic!("a wins {name}");
            };
            tokens.push(token);
        }
        // The second is taken over by b (its lease ended by hand first),
        // the third's witness is deleted by hand.
        raw.execute("DELETE FROM tenure_leases WHERE name = ?1", [names[1]])
            .expect("delete");
        raw.execute(
            "UPDATE tenure_witnesses SET expires = 0 WHERE name = ?1",
            [names[1]],
        )
        .expect("expire");
        let Reply::Acquire(AcquireReply::Won { .. }) =
            one(&store, acquire(Address::new("t", names[1]), "b", "y"))
        else {
            panic!("b wins");
        };
        raw.execute("DELETE FROM tenure_witnesses WHERE name = ?1", [names[2]])
            .expect("delete");
        // The fourth's lease has expired: its witness must not be extended.
        raw.execute(
            "UPDATE tenure_leases SET expires = 0 WHERE name = ?1",
            [names[3]],
        )
        .expect("expire");
        let witness_expiry = |name: &str| -> i64 {
            raw.query_row(
                "SELECT expires FROM tenure_witnesses WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .expect("a witness")
        };
        let fourth_witness = witness_expiry(names[3]);
        let mut terms: Vec<(&str, u64)> =
            names.iter().copied().zip(tokens.iter().copied()).collect();
        // A stale term of the first name, besides its live one.
        terms.push((names[0], tokens[0] - 1));
        let Reply::RenewMany(replies) = one(
            &store,
            Op::RenewMany {
                prefix: "t",
                id: "a",
                ttl_ms: 10_000,
                terms: &terms,
            },
        ) else {
            panic!("a reply per term");
        };
        let replies: Vec<RenewReply> = replies.into_iter().map(|r| r.expect("ok")).collect();
        assert!(matches!(replies[0], RenewReply::Renewed), "{replies:?}");
        assert!(
            matches!(&replies[1], RenewReply::NotOwner(Some(holder)) if holder.id == "b"),
            "{replies:?}"
        );
        assert!(matches!(replies[2], RenewReply::Renewed), "{replies:?}");
        assert!(
            matches!(replies[3], RenewReply::NotOwner(None)),
            "{replies:?}"
        );
        assert_eq!(witness_expiry(names[3]), fourth_witness, "not extended");
        assert!(
            matches!(&replies[4], RenewReply::NotOwner(Some(holder)) if holder.token == tokens[0]),
            "{replies:?}"
        );
        let witnessed: i64 = raw
            .query_row(
                "SELECT count(*) FROM tenure_witnesses WHERE name = ?1 AND owner = 'a'",
                [names[2]],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(witnessed, 1, "the witness is set again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn renew_many<'a>(terms: &'a [(&'a str, u64)], ttl_ms: u64) -> Op<'a> {
        Op::RenewMany {
            prefix: "t",
            id: "a",
            ttl_ms,
            terms,
        }
    }

    fn answers(reply: Reply) -> Vec<RenewReply> {
        let Reply::RenewMany(replies) = reply else {
            panic!("a reply per term");
        };
        replies.into_iter().map(|r| r.expect("ok")).collect()
    }

    /// Three terms of `a`, won with a 10 s lease.
    fn three_terms(store: &SqliteStore) -> Vec<(&'static str, u64)> {
        ["p0", "p1", "p2"]
            .into_iter()
            .map(|name| {
                let Reply::Acquire(AcquireReply::Won { token }) =
                    one(store, acquire(Address::new("t", name), "a", "x"))
                else {
                    panic!("a wins {name}");
                };
                (name, token)
            })
            .collect()
    }

    /// A partition set's rows are bound to its session: renewing it
    /// writes the session's row only, a session row deleted by hand holds
    /// its rows (a crash, not a release), and a session that lapsed takes
    /// its rows with it at its own expiry (not their far one), never to
    /// be revived by a late renewal.
    #[test]
    fn a_session_keeps_its_rows_and_lapses_with_them() {
        let Fixture { dir, store, raw } = Fixture::new();
        let terms = three_terms(&store);
        let ttl_ms = 400;
        let expiries = || -> Vec<i64> {
            let mut query = raw
                .prepare("SELECT expires FROM tenure_leases ORDER BY name")
                .expect("a query");
            let rows = query.query_map([], |r| r.get(0)).expect("rows");
            rows.map(|r| r.expect("a row")).collect()
        };
        let session_expiry = || -> i64 {
            raw.query_row("SELECT expires FROM tenure_sessions", [], |r| r.get(0))
                .expect("one session")
        };
        let all_renewed = |replies: Vec<RenewReply>| {
            assert!(
                replies.iter().all(|r| matches!(r, RenewReply::Renewed)),
                "{replies:?}"
            );
        };
        all_renewed(answers(one(&store, renew_many(&terms, ttl_ms))));
        let bound = expiries();
        let first = session_expiry();
        all_renewed(answers(one(&store, renew_many(&terms, ttl_ms))));
        assert_eq!(expiries(), bound, "the rows are not written again");
        assert!(session_expiry() >= first, "the session is renewed");
        // Its session row deleted by hand: the rows live on (b is told the
        // lease is held), and the next renewal sets the session again.
        raw.execute("DELETE FROM tenure_sessions", [])
            .expect("delete");
        let held = one(&store, acquire(Address::new("t", "p0"), "b", "y"));
        assert!(
            matches!(&held, Reply::Acquire(AcquireReply::Held(holder)) if holder.id == "a"),
            "{held:?}"
        );
        all_renewed(answers(one(&store, renew_many(&terms, ttl_ms))));
        // A confirm of one term renews it within the session: no row is
        // written again.
        all_renewed(answers(one(&store, renew_many(&terms[1..2], ttl_ms))));
        all_renewed(answers(one(&store, renew_many(&terms, ttl_ms))));
        assert_eq!(expiries().len(), 3);
        let rebound = expiries();
        all_renewed(answers(one(&store, renew_many(&terms[1..2], ttl_ms))));
        all_renewed(answers(one(&store, renew_many(&terms, ttl_ms))));
        assert_eq!(expiries(), rebound, "a confirm rewrote the set's rows");
        // No renewal for longer than the ttl: the rows lapse with the
        // session. Its row deleted by hand after that leaves them to their
        // far expiry (b is told they are held), but a late renewal revives
        // none of them, and b takes one over.
        let lapsed = std::time::Instant::now() + Duration::from_millis(ttl_ms + 50);
        std::thread::sleep(lapsed - std::time::Instant::now());
        raw.execute("DELETE FROM tenure_sessions", [])
            .expect("delete");
        let replies = answers(one(&store, renew_many(&terms, ttl_ms)));
        assert!(
            replies
                .iter()
                .all(|r| matches!(r, RenewReply::NotOwner(None))),
            "{replies:?}"
        );
        let taken = one(&store, acquire(Address::new("t", "p0"), "b", "y"));
        assert!(
            matches!(taken, Reply::Acquire(AcquireReply::Won { .. })),
            "{taken:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A lease an older version took over keeps its `session` (it knows
    /// no such column): the session's owner, lapsing, leaves it alone.
    #[test]
    fn a_lease_taken_over_by_an_older_version_outlives_the_lapsed_session() {
        let Fixture { dir, store, raw } = Fixture::new();
        let terms = three_terms(&store);
        let ttl_ms = 400;
        let replies = answers(one(&store, renew_many(&terms, ttl_ms)));
        assert!(replies.iter().all(|r| matches!(r, RenewReply::Renewed)));
        // As an older version's takeover writes it: owner, token and
        // expiry, the session column untouched.
        raw.execute(
            "UPDATE tenure_leases SET owner = 'old', token = token + 1, \
             expires = expires + 600000 WHERE name = 'p0'",
            [],
        )
        .expect("an older version's takeover");
        let lapsed = std::time::Instant::now() + Duration::from_millis(ttl_ms + 50);
        std::thread::sleep(lapsed - std::time::Instant::now());
        let _ = answers(one(&store, renew_many(&terms, ttl_ms)));
        let found = one(
            &store,
            Op::Inspect {
                at: Address::new("t", "p0"),
            },
        );
        assert!(
            matches!(&found, Reply::Inspect(Some(holder)) if holder.id == "old"),
            "{found:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A bound lease deleted by hand is seen at the next renewal (its term
    /// is lost), while its witness holds the election; a term the set no
    /// longer renews leaves the session, to expire within a ttl.
    #[test]
    fn a_bound_lease_deleted_by_hand_is_lost_and_its_witness_holds() {
        let Fixture { dir, store, raw } = Fixture::new();
        let terms = three_terms(&store);
        let ttl_ms = 10_000;
        for _ in 0..2 {
            let replies = answers(one(&store, renew_many(&terms, ttl_ms)));
            assert!(replies.iter().all(|r| matches!(r, RenewReply::Renewed)));
        }
        raw.execute("DELETE FROM tenure_leases WHERE name = 'p1'", [])
            .expect("delete");
        let replies = answers(one(&store, renew_many(&terms, ttl_ms)));
        assert!(matches!(replies[0], RenewReply::Renewed), "{replies:?}");
        assert!(
            matches!(replies[1], RenewReply::NotOwner(None)),
            "{replies:?}"
        );
        assert!(matches!(replies[2], RenewReply::Renewed), "{replies:?}");
        let held_off = one(&store, acquire(Address::new("t", "p1"), "b", "y"));
        assert!(
            matches!(held_off, Reply::Acquire(AcquireReply::HoldOff { .. })),
            "{held_off:?}"
        );
        // p2 given up: it leaves the session, with at most a ttl left.
        let kept = [terms[0]];
        let heartbeat = Op::Heartbeat {
            group: Address::new("t", "g"),
            member: "a",
            ttl_ms,
            join: true,
        };
        let mut cycle = store
            .batch_blocking(&[heartbeat, renew_many(&kept, ttl_ms)])
            .expect("the batch runs");
        let replies = answers(cycle.pop().expect("a reply").expect("the op runs"));
        assert!(matches!(replies[0], RenewReply::Renewed), "{replies:?}");
        let (session, ttl_left) = match one(
            &store,
            Op::Inspect {
                at: Address::new("t", "p2"),
            },
        ) {
            Reply::Inspect(Some(holder)) => {
                let session: i64 = raw
                    .query_row(
                        "SELECT session FROM tenure_leases WHERE name = 'p2'",
                        [],
                        |r| r.get(0),
                    )
                    .expect("p2's lease");
                (session, holder.ttl_left)
            }
            other => panic!("p2 is still held until it expires: {other:?}"),
        };
        assert_eq!(session, 0, "p2 left the session");
        assert!(ttl_left <= Duration::from_millis(ttl_ms), "{ttl_left:?}");
        // The session's lease expiry edited by hand: every lease of it
        // ends, but the witnesses hold the elections.
        raw.execute("UPDATE tenure_sessions SET expires = 0", [])
            .expect("edit");
        let held_off = one(&store, acquire(Address::new("t", "p0"), "b", "y"));
        assert!(
            matches!(held_off, Reply::Acquire(AcquireReply::HoldOff { .. })),
            "{held_off:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Open the file at `url` (`raw` is a plain connection to it) on a
    /// runtime of its own, and check that it is then of the current schema.
    fn migrated(url: &str, raw: &Connection) -> (tokio::runtime::Runtime, SqliteStore) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let store = runtime
            .block_on(SqliteStore::connect(
                url,
                Duration::from_secs(60),
                Default::default(),
            ))
            .expect("the file opens");
        let schema: String = raw
            .query_row(
                "SELECT value FROM tenure_meta WHERE key = 'schema'",
                [],
                |r| r.get(0),
            )
            .expect("a schema");
        assert_eq!(schema, "tenure 3");
        (runtime, store)
    }

    /// A file of the schema before sessions is migrated when opened, its
    /// leases kept.
    #[test]
    fn a_file_of_the_first_schema_is_migrated() {
        let dir = std::env::temp_dir().join(format!(
            "tenure-unit-sqlite-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("t.db");
        let boot = clock::boot_id().expect("a boot id");
        let now = Now::read(&boot).expect("now");
        let raw = Connection::open(&path).expect("a raw connection");
        raw.execute_batch(
            "CREATE TABLE tenure_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
             CREATE TABLE tenure_leases (prefix TEXT NOT NULL, name TEXT NOT NULL,
                 owner TEXT NOT NULL, attempt TEXT NOT NULL, token INTEGER NOT NULL,
                 ttl_ms INTEGER NOT NULL, boot TEXT NOT NULL, expires INTEGER NOT NULL,
                 since_ms INTEGER NOT NULL, locked INTEGER NOT NULL,
                 PRIMARY KEY (prefix, name)) STRICT;
             CREATE TABLE tenure_witnesses (prefix TEXT NOT NULL, name TEXT NOT NULL,
                 owner TEXT NOT NULL, token INTEGER NOT NULL, boot TEXT NOT NULL,
                 expires INTEGER NOT NULL, locked INTEGER NOT NULL,
                 PRIMARY KEY (prefix, name)) STRICT;
             INSERT INTO tenure_meta VALUES ('schema', 'tenure 1');",
        )
        .expect("a file of schema 1");
        raw.execute(
            "INSERT INTO tenure_leases VALUES ('t', 'e', 'old', 'x', 7, 60000, ?1, ?2, 0, 0)",
            rusqlite::params![boot, now.plus(60_000)],
        )
        .expect("a lease");
        let url = format!("sqlite://{}", path.display());
        let (_runtime, store) = migrated(&url, &raw);
        let found = one(
            &store,
            Op::Inspect {
                at: Address::new("t", "e"),
            },
        );
        assert!(
            matches!(&found, Reply::Inspect(Some(holder)) if holder.id == "old" && holder.token == 7),
            "{found:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file of the schema before scheduled slots is migrated when
    /// opened: its last-run marker stays, and gains the slot column.
    #[test]
    fn a_file_of_the_second_schema_gains_slots() {
        let Fixture { dir, store, raw } = Fixture::new();
        drop(store);
        raw.execute_batch(
            "ALTER TABLE tenure_runs DROP COLUMN slot;
             UPDATE tenure_meta SET value = 'tenure 2' WHERE key = 'schema';
             INSERT INTO tenure_runs VALUES ('t', 'e', 7, 0, 9000000000000000);",
        )
        .expect("a file of schema 2");
        let url = format!("sqlite://{}", dir.join("t.db").display());
        let (_runtime, store) = migrated(&url, &raw);
        let found = one(
            &store,
            Op::LastRun {
                at: Address::new("t", "e"),
            },
        );
        assert!(
            matches!(&found, Reply::LastRun(Some(run)) if run.slot.is_none()),
            "{found:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A term that won while the election's lock was still held (its last
    /// holder letting go of it) takes the lock once it is free and records
    /// it in its lease, so that followers wait for it; while it is held
    /// elsewhere, the lease says the term holds none.
    #[test]
    fn a_term_won_without_its_lock_takes_it_once_free() {
        let Fixture { dir, store, raw } = Fixture::new();
        let at = Address::new("t", "e");
        let _hints = store.election(at).expect("watched");
        let key = locks::key(at);
        let other = store.locks.file_of(&key);
        let try_lock = |file: &std::fs::File| {
            rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        };
        assert!(try_lock(&other), "the lock is free");
        let Reply::Acquire(AcquireReply::Won { token }) = one(&store, acquire(at, "a", "x")) else {
            panic!("a wins");
        };
        let locked = |table: &str| -> i64 {
            raw.query_row(
                &format!("SELECT locked FROM {table} WHERE name = 'e'"),
                [],
                |r| r.get(0),
            )
            .expect("a row")
        };
        assert_eq!(locked("tenure_leases"), 0, "won without the lock");
        drop(other);
        let request = AcquireRequest {
            id: "a",
            attempt: "x",
            ttl_ms: 10_000,
            hold_off_ms: 10_000,
        };
        store.lock_after_win(at, &request, token);
        assert_ne!(locked("tenure_leases"), 0, "the lease records the lock");
        assert_eq!(locked("tenure_leases"), locked("tenure_witnesses"));
        assert!(
            !try_lock(&store.locks.file_of(&key)),
            "the term holds its lock"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
