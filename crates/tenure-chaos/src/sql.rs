//! The postgres topology: one private PostgreSQL server (pg-process),
//! behind a fault-injecting proxy per instance, and what can happen to it.
//!
//! Every fault of instances and of their links is kept (kill, pause,
//! graceful, churn, dup-id, cut, drop, delay, mixed-ttl, the CLI's), the
//! operator's `delete-lease` (and `cut-delete-lease`) deletes the lease
//! row, and the server has faults of its own ([`crate::harness::PG_ONLY`]):
//! - `pg-restart`: the server killed (SIGKILL to the postmaster and every
//!   backend) and started again with its data: leases survive, but a
//!   server process new to the election grants no new term for the
//!   largest ttl;
//! - `pg-pause`: every process of the server stopped (SIGSTOP) for the
//!   hold, as a hung host: a leader's term ends at its deadline, never
//!   later, and nobody is elected meanwhile;
//! - `pg-lock`: another session holds `LOCK TABLE tenure_leases IN ACCESS
//!   EXCLUSIVE MODE` for the hold: every call waits, then times out;
//! - `restore-snapshot`: a copy of the data directory taken while a term
//!   leads (as a filesystem snapshot would), that leader handed over to
//!   another, the hold, then the server killed and started from the copy,
//!   and a newcomer started at once. The copy lacks the lease of the term
//!   that leads now: no term may begin before that term's deadline
//!   (`--unsafe-bug postgres-ignore-epoch`: the newcomer is elected beside
//!   it).

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_process::{Backup, PgServer};

use crate::consensus::{lock, Shared};
use crate::instance::ELECTION;
use crate::outage::blocking;

/// The election's server, its port and URL (kept outside the mutex: a
/// fault may hold the server for a while).
pub struct PgStore {
    server: Shared<PgServer>,
    port: u16,
    url: String,
}

impl PgStore {
    pub async fn start() -> Result<PgStore, String> {
        let server = blocking("starting PostgreSQL", PgServer::start).await?;
        Ok(PgStore {
            port: server.port(),
            url: server.url(),
            server: Arc::new(Mutex::new(server)),
        })
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> Option<u32> {
        lock(&self.server).pid()
    }

    /// `pg-restart`: killed and started again with its data.
    pub async fn restart(&self) -> Result<(), String> {
        let server = self.server.clone();
        blocking("restarting PostgreSQL", move || {
            let mut server = lock(&server);
            server.kill();
            server.resume()
        })
        .await
    }

    /// `pg-pause`: every process stopped for `hold`.
    pub async fn pause(&self, hold: Duration) {
        lock(&self.server).pause();
        tokio::time::sleep(hold).await;
        lock(&self.server).unpause();
    }

    /// `pg-lock`: another session holds the lease table for `hold`.
    pub async fn hold_lock(&self, hold: Duration) -> Result<(), String> {
        let sql = format!(
            "BEGIN; LOCK TABLE tenure_leases IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep({:.3}); \
             COMMIT;",
            hold.as_secs_f64()
        );
        self.psql(sql).await
    }

    /// A copy of the data, as a snapshot of the running server's disk.
    pub async fn back_up(&self) -> Result<Backup, String> {
        let server = self.server.clone();
        blocking("copying PostgreSQL's data", move || lock(&server).backup()).await
    }

    /// The server killed and started from `backup`.
    pub async fn restore(&self, backup: Backup) -> Result<(), String> {
        let server = self.server.clone();
        blocking("restoring PostgreSQL's data", move || {
            lock(&server).restore(&backup)
        })
        .await
    }

    /// The operator deletes the election's lease row (and its witness
    /// row, when `witness_too`).
    pub async fn delete_lease(&self, witness_too: bool) -> Result<(), String> {
        let mut sql = format!("DELETE FROM tenure_leases WHERE name = '{ELECTION}';");
        if witness_too {
            sql.push_str(&format!(
                "DELETE FROM tenure_witnesses WHERE name = '{ELECTION}';"
            ));
        }
        self.psql(sql).await
    }

    /// Run `sql` with `psql`, as an operator would, without holding the
    /// server's mutex.
    async fn psql(&self, sql: String) -> Result<(), String> {
        let port = self.port.to_string();
        blocking("psql", move || {
            let psql = pg_process::find_bindir()
                .map_err(|e| e.to_string())?
                .join("psql");
            let out = Command::new(psql)
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p"])
                .args([
                    port.as_str(),
                    "-U",
                    "postgres",
                    "-d",
                    "postgres",
                    "-c",
                    &sql,
                ])
                .env("PGCONNECT_TIMEOUT", "10")
                .output()
                .map_err(|e| format!("cannot run psql: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        })
        .await
    }
}
