//! The database file: its URL, the file systems it may live on, and the
//! tables tenure owns in it.
//!
//! SQLite's locking is only as good as the file system's: on NFS, SMB or
//! other network file systems both its byte-range locks and the `flock`s
//! that detect a crashed holder can be lost or granted twice, which would
//! give two leaders. Such a file is refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::clock::Now;
use crate::{Error, Result};

/// The schema tenure writes in `tenure_meta`: anything else there is not
/// tenure's.
const SCHEMA: &str = "tenure 3";

/// The schema of files written before sessions (see `ops.rs`), migrated
/// when opened: two columns added, a table and two indexes made; then as
/// [`SCHEMA_2`].
const SCHEMA_1: &str = "tenure 1";

/// The schema of files written before scheduled slots, migrated when
/// opened: the last-run marker gains the last slot claimed.
const SCHEMA_2: &str = "tenure 2";

/// Every table tenure owns, created if missing. Expiries are on the boot
/// clock of the boot named beside them (see `clock.rs`).
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS tenure_meta (
    key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS tenure_leases (
    prefix TEXT NOT NULL, name TEXT NOT NULL,
    owner TEXT NOT NULL, attempt TEXT NOT NULL, token INTEGER NOT NULL,
    ttl_ms INTEGER NOT NULL, boot TEXT NOT NULL, expires INTEGER NOT NULL,
    since_ms INTEGER NOT NULL, locked INTEGER NOT NULL,
    session INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (prefix, name)) STRICT;
CREATE TABLE IF NOT EXISTS tenure_witnesses (
    prefix TEXT NOT NULL, name TEXT NOT NULL,
    owner TEXT NOT NULL, token INTEGER NOT NULL,
    boot TEXT NOT NULL, expires INTEGER NOT NULL, locked INTEGER NOT NULL,
    session INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (prefix, name)) STRICT;
CREATE TABLE IF NOT EXISTS tenure_tokens (
    prefix TEXT NOT NULL, name TEXT NOT NULL, last INTEGER NOT NULL,
    PRIMARY KEY (prefix, name)) STRICT;
CREATE TABLE IF NOT EXISTS tenure_members (
    prefix TEXT NOT NULL, grp TEXT NOT NULL, member TEXT NOT NULL,
    boot TEXT NOT NULL, expires INTEGER NOT NULL,
    PRIMARY KEY (prefix, grp, member)) STRICT;
CREATE TABLE IF NOT EXISTS tenure_runs (
    prefix TEXT NOT NULL, name TEXT NOT NULL, token INTEGER NOT NULL,
    at_ms INTEGER NOT NULL, keep_until_ms INTEGER NOT NULL,
    slot INTEGER,
    PRIMARY KEY (prefix, name)) STRICT;
CREATE TABLE IF NOT EXISTS tenure_sessions (
    prefix TEXT NOT NULL, session INTEGER NOT NULL, owner TEXT NOT NULL,
    ttl_ms INTEGER NOT NULL, boot TEXT NOT NULL, expires INTEGER NOT NULL,
    witness_expires INTEGER NOT NULL,
    PRIMARY KEY (prefix, session)) STRICT;
";

/// The indexes a session's check reads (see `ops.rs`), made once the
/// columns exist (after a migration from [`SCHEMA_1`]).
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS tenure_leases_by_session
    ON tenure_leases (prefix, session, owner, token) WHERE session != 0;
CREATE INDEX IF NOT EXISTS tenure_witnesses_by_session
    ON tenure_witnesses (prefix, session, owner, token) WHERE session != 0;
";

/// The migration from [`SCHEMA_1`]: leases and witnesses may be bound to
/// a session.
const MIGRATE_1: &str = "
ALTER TABLE tenure_leases ADD COLUMN session INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tenure_witnesses ADD COLUMN session INTEGER NOT NULL DEFAULT 0;
";

/// The migration from [`SCHEMA_2`]: the last slot claimed, added unless a
/// file made by an earlier version got the table from [`TABLES`] with it.
/// Processes of the older version that have the file open go on safely:
/// their records keep the column as it is.
const MIGRATE_2: &str = "ALTER TABLE tenure_runs ADD COLUMN slot INTEGER;";

/// One read of every column tenure uses: a table of that name that is
/// not tenure's fails it.
const COLUMNS: &[(&str, &str)] = &[
    (
        "tenure_leases",
        "SELECT prefix, name, owner, attempt, token, ttl_ms, boot, expires, since_ms, locked, \
         session FROM tenure_leases LIMIT 0",
    ),
    (
        "tenure_witnesses",
        "SELECT prefix, name, owner, token, boot, expires, locked, session \
         FROM tenure_witnesses LIMIT 0",
    ),
    (
        "tenure_sessions",
        "SELECT prefix, session, owner, ttl_ms, boot, expires, witness_expires \
         FROM tenure_sessions LIMIT 0",
    ),
    (
        "tenure_tokens",
        "SELECT prefix, name, last FROM tenure_tokens LIMIT 0",
    ),
    (
        "tenure_members",
        "SELECT prefix, grp, member, boot, expires FROM tenure_members LIMIT 0",
    ),
    (
        "tenure_runs",
        "SELECT prefix, name, token, at_ms, keep_until_ms, slot FROM tenure_runs LIMIT 0",
    ),
];

/// The path a `sqlite://` URL names: `sqlite:///abs/path.db` or
/// `sqlite://relative/path.db`.
pub(super) fn path_of(url: &str) -> Result<PathBuf> {
    let bad = |why: &str| Error::Config(format!("{url} is not a SQLite URL: {why}"));
    let rest = url
        .strip_prefix("sqlite://")
        .ok_or_else(|| bad("it must start with sqlite://"))?;
    if rest.contains('?') || rest.contains('#') {
        return Err(bad("it takes no query or fragment"));
    }
    if rest.is_empty() || rest.ends_with('/') {
        return Err(bad("it names no file (sqlite:///path/to/file.db)"));
    }
    if rest.starts_with(":memory:") || rest.starts_with("file:") {
        return Err(bad(
            "it must name a file on disk that every process opens (no :memory: or file: URI)",
        ));
    }
    Ok(PathBuf::from(rest))
}

/// File systems whose locks SQLite and `flock` cannot rely on, by
/// `statfs` magic number.
const NETWORK_FILE_SYSTEMS: &[(u32, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x5346_414F, "AFS"),
    (0x0102_1997, "9P"),
    (0x00C3_6400, "CephFS"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (0x1983_0326, "BeeGFS"),
    // sshfs, virtiofs, GlusterFS and other FUSE file systems: where the
    // file really is cannot be told.
    (0x6573_5546, "FUSE"),
];

/// Refuse a directory on a network file system.
fn local_only(url: &str, dir: &Path) -> Result<()> {
    let stat = nix::sys::statfs::statfs(dir).map_err(|err| Error::Unreachable {
        url: url.to_string(),
        detail: format!("cannot read the file system of {}: {err}", dir.display()),
    })?;
    // The magic numbers are 32 bits; the field is signed on some targets.
    #[allow(clippy::unnecessary_cast)]
    let magic = stat.filesystem_type().0 as u32;
    if let Some((_, name)) = NETWORK_FILE_SYSTEMS.iter().find(|(m, _)| *m == magic) {
        return Err(Error::Unsafe {
            url: url.to_string(),
            detail: format!(
                "{} is on {name}, a network file system, where locks can be lost or granted \
                 twice; put the file on a local disk, or use a network store (PostgreSQL, \
                 Redis, etcd, ZooKeeper) for processes on several hosts",
                dir.display()
            ),
        });
    }
    Ok(())
}

/// Open the database at `path` (created if missing), checked, with
/// tenure's tables; a `busy` timeout bounds each wait for another writer.
pub(super) fn open(url: &str, path: &Path, busy: Duration, now: &Now) -> Result<Connection> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::Unreachable {
            url: url.to_string(),
            detail: format!("the directory {} does not exist", dir.display()),
        });
    }
    local_only(url, &dir)?;
    let unreachable = |err: rusqlite::Error| Error::Unreachable {
        url: url.to_string(),
        detail: crate::error::one_line(&err.to_string()),
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags).map_err(unreachable)?;
    conn.busy_timeout(busy).map_err(unreachable)?;
    // Not a database at all (a text file, say) shows on the first read.
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .map_err(|err| match err.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => Error::ForeignData {
                key: path.display().to_string(),
                detail: crate::error::one_line(&err.to_string()),
            },
            _ => unreachable(err),
        })?;
    if !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(url = %url, journal_mode = %mode, "SQLite refused WAL mode; writers will block readers");
    }
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(unreachable)?;
    tables(&mut conn, url, path, now)?;
    Ok(conn)
}

/// Make tenure's tables if missing, and check them: a file made now
/// records its birth (see `born` in `ops.rs`).
fn tables(conn: &mut Connection, url: &str, path: &Path, now: &Now) -> Result<()> {
    let unreachable = |err: rusqlite::Error| Error::Unreachable {
        url: url.to_string(),
        detail: crate::error::one_line(&err.to_string()),
    };
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unreachable)?;
    tx.execute_batch(TABLES)
        .map_err(|err| foreign(path, &err))?;
    let schema: Option<String> = tx
        .query_row(
            "SELECT value FROM tenure_meta WHERE key = 'schema'",
            [],
            |row| row.get(0),
        )
        .map(Some)
        .or_else(|err| match err {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            err => Err(err),
        })
        .map_err(|err| foreign(path, &err))?;
    let migrations: &[&str] = match schema.as_deref() {
        Some(SCHEMA_1) => {
            // Processes of the older version that have the file open go
            // on safely: they never bind a lease to a session, and read a
            // bound lease's far expiry as its own (they wait longer); a
            // lease they take over keeps its `session`, which the session's
            // owner never touches since the owner differs (see `ops.rs`).
            &[MIGRATE_1, MIGRATE_2]
        }
        Some(SCHEMA_2) => &[MIGRATE_2],
        _ => &[],
    };
    if let (Some(from), false) = (schema.as_deref(), migrations.is_empty()) {
        for &migration in migrations {
            let has_slot = tx.prepare("SELECT slot FROM tenure_runs LIMIT 0").is_ok();
            if migration == MIGRATE_2 && has_slot {
                continue;
            }
            tx.execute_batch(migration)
                .map_err(|err| foreign(path, &err))?;
        }
        tx.execute(
            "UPDATE tenure_meta SET value = ?1 WHERE key = 'schema'",
            rusqlite::params![SCHEMA],
        )
        .map_err(|err| foreign(path, &err))?;
        tracing::info!(url = %url, from, to = SCHEMA, "migrated the SQLite file's schema");
    }
    match schema.as_deref() {
        Some(SCHEMA | SCHEMA_1 | SCHEMA_2) => {}
        Some(other) => {
            return Err(Error::ForeignData {
                key: format!("{} (table tenure_meta)", path.display()),
                detail: format!("schema {other:?}, not {SCHEMA:?}"),
            })
        }
        None => {
            // A new file: leases it might once have held are unknown, so
            // it grants none for a while (see `born` in `ops.rs`).
            tx.execute(
                "INSERT INTO tenure_meta (key, value) VALUES ('schema', ?1), \
                 ('born_boot', ?2), ('born_ms', ?3)",
                rusqlite::params![SCHEMA, now.boot, now.ms.to_string()],
            )
            .map_err(|err| foreign(path, &err))?;
        }
    }
    tx.execute_batch(INDEXES)
        .map_err(|err| foreign(path, &err))?;
    for (table, query) in COLUMNS {
        tx.prepare(query).map_err(|err| Error::ForeignData {
            key: format!("{} (table {table})", path.display()),
            detail: crate::error::one_line(&err.to_string()),
        })?;
    }
    tx.commit().map_err(unreachable)?;
    Ok(())
}

/// The (device, inode) the path names now.
pub(super) fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino()))
}

fn foreign(path: &Path, err: &rusqlite::Error) -> Error {
    Error::ForeignData {
        key: path.display().to_string(),
        detail: crate::error::one_line(&err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_file() {
        assert_eq!(path_of("sqlite:///tmp/a.db").ok(), Some("/tmp/a.db".into()));
        assert_eq!(path_of("sqlite://a.db").ok(), Some("a.db".into()));
        for bad in [
            "sqlite://",
            "sqlite:///tmp/",
            "sqlite:///a.db?mode=ro",
            "file:///a.db",
        ] {
            assert!(matches!(path_of(bad), Err(Error::Config(_))), "{bad}");
        }
    }
}
