//! The sqlite topology: one SQLite file that every instance opens
//! (`sqlite://`), and what can happen to that file.
//!
//! No server and no network: no proxies and no link faults. Every fault
//! of instances is kept (kill, pause, graceful, churn, dup-id, and the
//! CLI's), the operator's `delete-lease` deletes the lease row, and the
//! file has faults of its own ([`crate::harness::SQLITE_ONLY`]):
//! - `sqlite-lock`: another program holds the file's write lock (`BEGIN
//!   IMMEDIATE`) for the hold. Renewals wait their busy timeout and fail;
//!   a hold longer than what is left of a term ends it at its deadline,
//!   never later;
//! - `sqlite-delete-file`: the file and its WAL deleted under the running
//!   instances, and a newcomer started at once. Each process opens a new
//!   file, which must grant no term before the leases of the old one have
//!   expired;
//! - `restore-snapshot`: a copy taken (`VACUUM INTO`) while a term leads,
//!   that leader handed over to another, the hold, then the copy put back
//!   (by the seed, in place, its rows over the live file's in one
//!   transaction, or as a file put in the path's place), and a newcomer
//!   started at once. The copy lacks the lease of the term that leads now:
//!   the file must grant no term before that term's deadline
//!   (`--unsafe-bug sqlite-ignore-rollback`: the newcomer is elected beside
//!   it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use crate::instance::ELECTION;
use crate::outage::blocking;

/// How long the harness's own statements wait for the file's write lock.
const BUSY: Duration = Duration::from_secs(10);

/// Tables whose rows a restore in place puts back.
const TABLES: [&str; 7] = [
    "tenure_meta",
    "tenure_sessions",
    "tenure_leases",
    "tenure_witnesses",
    "tenure_tokens",
    "tenure_members",
    "tenure_runs",
];

/// The election's file, in a directory of the run's.
pub struct SqliteFile {
    dir: PathBuf,
}

impl SqliteFile {
    /// A new, empty directory for the file under `out` (what an earlier
    /// run left there is removed).
    pub fn create(out: &Path) -> Result<SqliteFile, String> {
        let dir = out.join("sqlite");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let dir = std::fs::canonicalize(&dir)
            .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
        Ok(SqliteFile { dir })
    }

    fn path(&self) -> PathBuf {
        self.dir.join("election.db")
    }

    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path().display())
    }

    /// The harness's own connection, as an operator's `sqlite3` opens the
    /// file.
    fn open(path: &Path) -> Result<Connection, String> {
        let conn = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        conn.busy_timeout(BUSY)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(conn)
    }

    /// `sqlite-lock`: hold the file's write lock for `hold`.
    pub async fn hold_lock(&self, hold: Duration) -> Result<(), String> {
        let path = self.path();
        blocking("another writer holds the file", move || {
            let conn = SqliteFile::open(&path)?;
            conn.execute_batch("BEGIN IMMEDIATE")
                .map_err(|e| format!("BEGIN IMMEDIATE: {e}"))?;
            std::thread::sleep(hold);
            conn.execute_batch("COMMIT")
                .map_err(|e| format!("COMMIT: {e}"))
        })
        .await
    }

    /// `sqlite-delete-file`: the file and its WAL deleted.
    pub fn delete(&self) -> Result<(), String> {
        for suffix in ["", "-wal", "-shm"] {
            let path = PathBuf::from(format!("{}{suffix}", self.path().display()));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot delete {}: {e}", path.display())),
            }
        }
        Ok(())
    }

    /// A consistent copy of the file as it is now (`VACUUM INTO`).
    pub async fn copy(&self) -> Result<PathBuf, String> {
        let (path, copy) = (self.path(), self.dir.join("older.db"));
        blocking("the file is copied", move || {
            match std::fs::remove_file(&copy) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", copy.display())),
            }
            SqliteFile::open(&path)?
                .execute("VACUUM INTO ?1", [copy.to_string_lossy()])
                .map_err(|e| format!("VACUUM INTO: {e}"))?;
            Ok(copy)
        })
        .await
    }

    /// Put `copy` back: its rows over the live file's in one transaction
    /// (`in_place`), or the copy itself in the path's place.
    pub async fn restore(&self, copy: PathBuf, in_place: bool) -> Result<(), String> {
        if !in_place {
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.path().display()));
            }
            return std::fs::rename(&copy, self.path())
                .map_err(|e| format!("cannot put {} in place: {e}", copy.display()));
        }
        let path = self.path();
        blocking("the copy is restored in place", move || {
            let conn = SqliteFile::open(&path)?;
            conn.execute("ATTACH ?1 AS old", [copy.to_string_lossy()])
                .map_err(|e| format!("ATTACH: {e}"))?;
            let mut script = String::from("BEGIN IMMEDIATE;");
            for table in TABLES {
                script.push_str(&format!(
                    "DELETE FROM main.{table}; INSERT INTO main.{table} SELECT * FROM old.{table};"
                ));
            }
            script.push_str("COMMIT;");
            conn.execute_batch(&script)
                .map_err(|e| format!("restore: {e}"))?;
            drop(conn);
            std::fs::remove_file(&copy)
                .map_err(|e| format!("cannot remove {}: {e}", copy.display()))
        })
        .await
    }

    /// `delete-lease`: the election's lease row deleted by hand (with
    /// `witness_too`, its witness row as well).
    pub async fn delete_lease(&self, witness_too: bool) -> Result<(), String> {
        let path = self.path();
        blocking("the lease is deleted by hand", move || {
            let conn = SqliteFile::open(&path)?;
            let mut tables = vec!["tenure_leases"];
            if witness_too {
                tables.push("tenure_witnesses");
            }
            for table in tables {
                conn.execute(
                    &format!("DELETE FROM {table} WHERE prefix = ?1 AND name = ?2"),
                    [tenure::DEFAULT_PREFIX, ELECTION],
                )
                .map_err(|e| format!("DELETE FROM {table}: {e}"))?;
            }
            Ok::<(), String>(())
        })
        .await
    }
}
