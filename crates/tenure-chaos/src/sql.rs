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
//!   it);
//! - `pg-failover`: a streaming replica made (`pg_basebackup`) and caught
//!   up, then, by the seed, either left streaming or cut off from the
//!   server (a replica that fell behind); whoever leads hands over, the
//!   hold, then the server killed, the replica promoted and every
//!   instance's proxy turned to it (as a virtual IP or a DNS name would
//!   move), and a newcomer started at once. A replica cut off lacks the
//!   lease of the term that leads: no term may begin on it before that
//!   term's deadline. From then on the promoted replica is the store, and
//!   every later fault acts on it.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_process::{Backup, PgServer};

use crate::consensus::{lock, Shared};
use crate::instance::ELECTION;
use crate::outage::blocking;

/// How long a replica cut off from the server may take to stop its WAL
/// receiver.
const RECEIVER_STOP: Duration = Duration::from_secs(30);

/// The election's server, and its port and URL (kept outside the server's
/// mutex, which a fault may hold for a while; a failover changes them).
pub struct PgStore {
    server: Shared<PgServer>,
    address: Mutex<(u16, String)>,
}

impl PgStore {
    pub async fn start() -> Result<PgStore, String> {
        let server = blocking("starting PostgreSQL", PgServer::start).await?;
        Ok(PgStore {
            address: Mutex::new((server.port(), server.url())),
            server: Arc::new(Mutex::new(server)),
        })
    }

    pub fn url(&self) -> String {
        lock(&self.address).1.clone()
    }

    pub fn port(&self) -> u16 {
        lock(&self.address).0
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

    /// `pg-failover`, before the failover: a streaming replica of the
    /// server, caught up; with `cut_off`, then cut off from the server
    /// (its WAL receiver stopped), so that it replays nothing written from
    /// now on.
    pub async fn start_replica(&self, cut_off: bool) -> Result<PgServer, String> {
        let server = self.server.clone();
        blocking("starting a PostgreSQL replica", move || {
            let replica = {
                let primary = lock(&server);
                let replica = primary.start_replica().map_err(|e| e.to_string())?;
                replica
                    .wait_caught_up(&primary)
                    .map_err(|e| e.to_string())?;
                replica
            };
            if cut_off {
                replica
                    .sql("ALTER SYSTEM SET primary_conninfo = ''")
                    .and_then(|_| replica.sql("SELECT pg_reload_conf()"))
                    .map_err(|e| e.to_string())?;
                let since = Instant::now();
                while replica
                    .sql("SELECT count(*) FROM pg_stat_wal_receiver")
                    .map_err(|e| e.to_string())?
                    != "0"
                {
                    if since.elapsed() > RECEIVER_STOP {
                        return Err(format!(
                            "the replica still streams {RECEIVER_STOP:?} after it was cut off"
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Ok(replica)
        })
        .await
    }

    /// `pg-failover`: the server killed and `replica` promoted; from now
    /// on the replica is the store, which every later fault acts on.
    /// Returns its port, which the instances' proxies must be turned to.
    pub async fn fail_over(&self, replica: PgServer) -> Result<u16, String> {
        let server = self.server.clone();
        let address = blocking("failing over to the replica", move || {
            let mut serving = lock(&server);
            serving.kill();
            if let Err(err) = replica.promote() {
                return Err(format!(
                    "the replica was not promoted: {err}; its log: {}",
                    replica.log_tail()
                ));
            }
            let address = (replica.port(), replica.url());
            // The old server's data directory goes with it.
            drop(std::mem::replace(&mut *serving, replica));
            Ok::<_, String>(address)
        })
        .await?;
        let port = address.0;
        *lock(&self.address) = address;
        Ok(port)
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
        let port = self.port().to_string();
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
