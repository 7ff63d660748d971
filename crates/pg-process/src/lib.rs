//! Private PostgreSQL servers for tests, chaos runs and benchmarks.
//!
//! A lease store can only be trusted once it has been run against a real
//! server that crashes, hangs, comes back from a copy of its data and fails
//! over to a replica, so this crate starts the real thing: `initdb` in a
//! temporary directory, then `postgres` on a free port of 127.0.0.1 (never
//! the shared 5432, and no Unix socket), signalled by PID (never by name):
//! the postmaster, and for a pause or a crash each of its children too. The directory is removed when the [`PgServer`] is
//! dropped, so several test binaries can run side by side.
//!
//! PostgreSQL refuses to run as root. When the caller is root (a CI
//! machine, a container), `initdb`, `postgres` and `pg_basebackup` run as
//! the unprivileged user `nobody` (or `$PG_PROCESS_USER`), which owns the
//! directory; nothing else changes.
//!
//! ```no_run
//! let mut pg = pg_process::PgServer::start()?;
//! println!("PostgreSQL at {}", pg.url()); // postgres://postgres@127.0.0.1:PORT/postgres
//! pg.sql("CREATE TABLE t (x int)")?;
//! let copy = pg.backup()?; // the data directory as a snapshot would keep it
//! pg.kill(); // SIGKILL to the whole group
//! pg.restore(&copy)?; // the older data, on the same port
//! # Ok::<(), pg_process::Error>(())
//! ```
//!
//! The superuser `postgres` connects from 127.0.0.1 without a password;
//! every other role needs its password (SCRAM), so tests of credentials and
//! of least-privilege roles see what a production server does.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Gid, Pid, Uid, User};

/// How long a server may take to accept queries after it was started
/// (crash recovery of a restored copy included).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one `psql` call may take.
const SQL_TIMEOUT: Duration = Duration::from_secs(30);

/// What can go wrong while starting, faulting or asking a private server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// PostgreSQL's server binaries are not installed.
    #[error(
        "PostgreSQL not found ({0}): install Debian's postgresql package \
         (scripts/install-deps.sh does), or set PG_BINDIR to the directory of `postgres`"
    )]
    NotInstalled(String),
    /// `initdb`, `pg_basebackup` or the server failed, or did not serve in
    /// time.
    #[error("PostgreSQL on port {port} did not start: {detail}")]
    DidNotStart {
        /// The port it was asked to listen on.
        port: u16,
        /// What was observed, and the last lines of its log.
        detail: String,
    },
    /// A statement failed (`psql`'s message).
    #[error("SQL on port {port} failed: {detail}")]
    Sql {
        /// The server's port.
        port: u16,
        /// What psql printed.
        detail: String,
    },
    /// A wait on the server's state passed its deadline.
    #[error("timed out after {0:?} waiting until {1}")]
    Timeout(Duration, String),
    /// Operating-system error (spawning, files, users).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

/// The directory of `postgres`, `initdb`, `psql` and `pg_basebackup`:
/// `$PG_BINDIR`, else the newest `/usr/lib/postgresql/<version>/bin`
/// (Debian's layout).
pub fn find_bindir() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|err| Error::NotInstalled(format!("{}: {err}", root.display())))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| Error::NotInstalled(format!("no {}/*/bin/postgres", root.display())))
}

/// The user the server runs as: `None` to run as the caller (not root);
/// else `$PG_PROCESS_USER` or `nobody`.
fn server_user() -> Result<Option<(Uid, Gid)>, Error> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let name = std::env::var("PG_PROCESS_USER").unwrap_or_else(|_| "nobody".into());
    let user = User::from_name(&name)
        .map_err(|err| Error::NotInstalled(format!("looking up user {name}: {err}")))?
        .ok_or_else(|| {
            Error::NotInstalled(format!(
                "no user {name} to run PostgreSQL as (it refuses to run as root; set \
                 PG_PROCESS_USER)"
            ))
        })?;
    Ok(Some((user.uid, user.gid)))
}

/// A PgBouncer in front of a [`PgServer`], in transaction mode
/// ([`PgServer::start_pooler`]), killed on drop.
#[derive(Debug)]
pub struct Pooler {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Pooler {
    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PgBouncer: `$PGBOUNCER`, else `pgbouncer` on the `PATH` or in
/// `/usr/sbin` (Debian's).
fn find_pgbouncer() -> Result<PathBuf, Error> {
    tenure_test_support::find_binary("PGBOUNCER", "pgbouncer")
        .or_else(|| {
            let debian = Path::new("/usr/sbin/pgbouncer");
            debian.is_file().then(|| debian.to_path_buf())
        })
        .ok_or_else(|| {
            Error::NotInstalled(
                "no pgbouncer: install Debian's pgbouncer package (scripts/install-deps.sh \
                 does), or set PGBOUNCER"
                    .into(),
            )
        })
}

/// A copy of a server's data directory, as a filesystem snapshot taken
/// while it ran would keep it ([`PgServer::backup`]).
#[derive(Debug)]
pub struct Backup {
    dir: PathBuf,
}

/// A private PostgreSQL server (primary or streaming replica), killed and
/// its directory removed on drop.
#[derive(Debug)]
pub struct PgServer {
    bindir: PathBuf,
    user: Option<(Uid, Gid)>,
    port: u16,
    /// Holds `data/`, `postgres.log` and backups.
    dir: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// Numbers the directories of one process's servers and backups.
static NEXT: AtomicU32 = AtomicU32::new(0);

impl PgServer {
    /// `initdb` and start a primary on a free loopback port, and wait until
    /// it accepts queries.
    pub fn start() -> Result<PgServer, Error> {
        let mut server = PgServer::new()?;
        server.run(
            &server.bin("initdb"),
            &[
                "-D",
                "data",
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
        )?;
        server.write_hba()?;
        server.spawn()?;
        Ok(server)
    }

    fn new() -> Result<PgServer, Error> {
        let bindir = find_bindir()?;
        let user = server_user()?;
        let port = tenure_test_support::ports::free_port(&[5432])
            .map_err(io_err("finding a free port"))?;
        let dir = std::env::temp_dir().join(format!(
            "pg-process-{}-{}-{port}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let server = PgServer {
            bindir,
            user,
            port,
            dir,
            child: None,
            paused: false,
        };
        server.chown(&server.dir)?;
        Ok(server)
    }

    /// Start a streaming replica of this server (`pg_basebackup -R`) on a
    /// free port, and wait until it accepts queries (read-only).
    pub fn start_replica(&self) -> Result<PgServer, Error> {
        let mut replica = PgServer::new()?;
        let port = self.port.to_string();
        replica.run(
            &replica.bin("pg_basebackup"),
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                "data",
                "-R",
                "-X",
                "stream",
                "--no-sync",
                // At once, not spread over checkpoint_completion_target.
                "--checkpoint=fast",
            ],
        )?;
        replica.spawn()?;
        Ok(replica)
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Start a PgBouncer in front of this server, in transaction mode
    /// (a server connection per transaction, as most poolers are run), on
    /// a free port; the superuser connects through it without a password.
    pub fn start_pooler(&self) -> Result<Pooler, Error> {
        let binary = find_pgbouncer()?;
        let port = tenure_test_support::ports::free_port(&[5432, 6432])
            .map_err(io_err("finding a free port"))?;
        let dir = self.dir.with_file_name(format!(
            "pg-process-pooler-{}-{}-{port}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        self.chown(&dir)?;
        let users = dir.join("userlist.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n")
            .map_err(io_err(format!("writing {}", users.display())))?;
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {}\npool_mode = transaction\n\
                 max_client_conn = 500\ndefault_pool_size = 20\n\
                 ignore_startup_parameters = extra_float_digits\n",
                self.port,
                users.display()
            ),
        )
        .map_err(io_err(format!("writing {}", ini.display())))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("pgbouncer.log"))
            .map_err(io_err("opening pgbouncer.log"))?;
        let log_err = log.try_clone().map_err(io_err("opening pgbouncer.log"))?;
        let mut command = Command::new(&binary);
        command
            .arg(&ini)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        if let Some((uid, gid)) = self.user {
            command.uid(uid.as_raw()).gid(gid.as_raw());
        }
        let child = command
            .spawn()
            .map_err(io_err(format!("starting {}", binary.display())))?;
        let mut pooler = Pooler {
            port,
            dir,
            child: Some(child),
        };
        let started = Instant::now();
        let port_text = port.to_string();
        loop {
            let exited = pooler
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log =
                    std::fs::read_to_string(pooler.dir.join("pgbouncer.log")).unwrap_or_default();
                return Err(Error::DidNotStart {
                    port,
                    detail: format!("pgbouncer exited with {status}: {}", log.trim()),
                });
            }
            let ready = Command::new(self.bin("psql"))
                .args(["-X", "-A", "-t", "-q", "-h", "127.0.0.1", "-p", &port_text])
                .args(["-U", "postgres", "-d", "postgres", "-c", "SELECT 1"])
                .env("PGCONNECT_TIMEOUT", "5")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return Ok(pooler);
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::Timeout(START_TIMEOUT, "pgbouncer answers".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The postmaster's process id, or `None` while the server is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`: the superuser, who
    /// needs no password from 127.0.0.1.
    pub fn url(&self) -> String {
        self.url_as("postgres", None)
    }

    /// A URL for role `user`, with its password if given.
    pub fn url_as(&self, user: &str, password: Option<&str>) -> String {
        match password {
            Some(password) => format!(
                "postgres://{user}:{password}@127.0.0.1:{}/postgres",
                self.port
            ),
            None => format!("postgres://{user}@127.0.0.1:{}/postgres", self.port),
        }
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Run `sql` as the superuser with `psql` and return what it printed
    /// (unaligned, tuples only: one row a line, columns split by `|`).
    pub fn sql(&self, sql: &str) -> Result<String, Error> {
        let port = self.port.to_string();
        let mut child = Command::new(self.bin("psql"))
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-c", sql])
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err("starting psql"))?;
        let started = Instant::now();
        loop {
            if child
                .try_wait()
                .map_err(io_err("waiting for psql"))?
                .is_some()
            {
                break;
            }
            if started.elapsed() > SQL_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout(SQL_TIMEOUT, format!("psql ran {sql:?}")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let output = child
            .wait_with_output()
            .map_err(io_err("reading psql's output"))?;
        if !output.status.success() {
            return Err(Error::Sql {
                port: self.port,
                detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// SIGKILL to the postmaster and every backend (a crash; the data on
    /// disk stays). [`PgServer::resume`] starts the server again.
    pub fn kill(&mut self) {
        let processes = self.processes();
        for pid in &processes {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.paused = false;
        // A new postmaster refuses to start while backends of the old one
        // hold its shared memory.
        wait_gone(&processes);
    }

    /// A fast shutdown (SIGINT: sessions ended, a checkpoint written), then
    /// wait for it.
    pub fn stop(&mut self) {
        if self.paused {
            self.signal(Signal::SIGCONT);
            self.paused = false;
        }
        let processes = self.processes();
        self.signal(Signal::SIGINT);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        wait_gone(&processes);
    }

    /// Start the server again after [`PgServer::kill`] or
    /// [`PgServer::stop`], with its data, on the same port.
    pub fn resume(&mut self) -> Result<(), Error> {
        if self.child.is_none() {
            self.spawn()?;
        }
        Ok(())
    }

    /// SIGSTOP to every process of the server: it accepts connections (the
    /// kernel does) but answers nothing, as a hung host.
    pub fn pause(&mut self) {
        self.signal(Signal::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT after [`PgServer::pause`].
    pub fn unpause(&mut self) {
        self.signal(Signal::SIGCONT);
        self.paused = false;
    }

    /// A copy of the data directory taken while every process of the
    /// server is stopped for a moment (SIGSTOP): what a filesystem or VM
    /// snapshot of a running server keeps. Restored, it starts with crash
    /// recovery, at the state of the moment it was taken.
    pub fn backup(&mut self) -> Result<Backup, Error> {
        let target = self
            .dir
            .join(format!("backup-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let was_paused = self.paused;
        if !was_paused {
            self.pause();
        }
        let copied = copy_dir(&self.data_dir(), &target);
        if !was_paused {
            self.unpause();
        }
        copied?;
        Ok(Backup { dir: target })
    }

    /// Kill the server, put `backup` in place of its data directory, and
    /// start it again on the same port.
    pub fn restore(&mut self, backup: &Backup) -> Result<(), Error> {
        self.kill();
        let data = self.data_dir();
        std::fs::remove_dir_all(&data).map_err(io_err(format!("removing {}", data.display())))?;
        copy_dir(&backup.dir, &data)?;
        // The copy names the postmaster it was taken under.
        let _ = std::fs::remove_file(data.join("postmaster.pid"));
        self.spawn()
    }

    /// Promote this replica (`pg_promote()`), and wait until it accepts
    /// writes.
    pub fn promote(&self) -> Result<(), Error> {
        self.sql("SELECT pg_promote(true, 60)")?;
        self.wait_until("the promoted replica accepts writes", || {
            Ok(self.sql("SELECT pg_is_in_recovery()")? == "f")
        })
    }

    /// Wait until this replica has replayed everything `primary` has
    /// written so far.
    pub fn wait_caught_up(&self, primary: &PgServer) -> Result<(), Error> {
        let lsn = primary.sql("SELECT pg_current_wal_lsn()")?;
        self.wait_until("the replica replayed the primary's writes", || {
            Ok(self.sql(&format!(
                "SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"
            ))? == "t")
        })
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    fn wait_until(
        &self,
        what: &str,
        mut ready: impl FnMut() -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if ready().unwrap_or(false) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Error::Timeout(START_TIMEOUT, what.to_string()))
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.bindir.join(name)
    }

    fn command(&self, binary: &Path) -> Command {
        let mut command = Command::new(binary);
        command.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            // std drops the supplementary groups too when it sets the uid.
            command.uid(uid.as_raw()).gid(gid.as_raw());
        }
        command
    }

    /// Run a helper (`initdb`, `pg_basebackup`) to completion, killed
    /// after [`START_TIMEOUT`] (a base backup from a server that stopped
    /// answering would wait for ever).
    fn run(&self, binary: &Path, args: &[&str]) -> Result<(), Error> {
        let mut child = self
            .command(binary)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err(format!("running {}", binary.display())))?;
        let started = Instant::now();
        while child
            .try_wait()
            .map_err(io_err(format!("waiting for {}", binary.display())))?
            .is_none()
        {
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Timeout(
                    START_TIMEOUT,
                    format!("{} finished", binary.display()),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let output = child
            .wait_with_output()
            .map_err(io_err(format!("reading {}'s output", binary.display())))?;
        if !output.status.success() {
            return Err(Error::DidNotStart {
                port: self.port,
                detail: format!(
                    "{} failed: {}",
                    binary.display(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            });
        }
        Ok(())
    }

    /// The superuser from 127.0.0.1 without a password (and for
    /// replication); every other role with its password.
    fn write_hba(&self) -> Result<(), Error> {
        let path = self.data_dir().join("pg_hba.conf");
        std::fs::write(
            &path,
            "host all postgres 127.0.0.1/32 trust\n\
             host replication postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
        )
        .map_err(io_err(format!("writing {}", path.display())))
    }

    fn spawn(&mut self) -> Result<(), Error> {
        let log_path = self.dir.join("postgres.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err(format!("opening {}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_err(format!("opening {}", log_path.display())))?;
        let port = self.port.to_string();
        let mut child = self
            .command(&self.bin("postgres"))
            .args(["-D", "data", "-p", &port])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            // Test servers: the page cache is enough (a killed process
            // loses nothing; only the host's crash would), and CI disks
            // are slow.
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=200"])
            .args(["-c", "wal_level=replica", "-c", "max_wal_senders=4"])
            .args(["-c", "hot_standby=on"])
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .map_err(io_err("starting postgres"))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Error::DidNotStart {
                    port: self.port,
                    detail: format!("exited with {status}; log: {}", self.log_tail()),
                });
            }
            if self.sql("SELECT 1").is_ok() {
                break;
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.wait();
                return Err(Error::DidNotStart {
                    port: self.port,
                    detail: format!(
                        "no answer after {START_TIMEOUT:?}; log: {}",
                        self.log_tail()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// SIGSTOP and SIGCONT go to every process of the server; the others
    /// to the postmaster, which passes them on.
    fn signal(&self, signal: Signal) {
        let every = matches!(signal, Signal::SIGSTOP | Signal::SIGCONT);
        let processes = if every {
            self.processes()
        } else {
            self.pid()
                .map(|pid| Pid::from_raw(pid as i32))
                .into_iter()
                .collect()
        };
        for pid in processes {
            // An error means the process is gone already.
            let _ = kill(pid, signal);
        }
    }

    /// The postmaster and its children (each backend is in a session of
    /// its own, so a process group would miss them).
    fn processes(&self) -> Vec<Pid> {
        let Some(postmaster) = self.pid() else {
            return Vec::new();
        };
        let mut found = vec![Pid::from_raw(postmaster as i32)];
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return found;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            if stat_of(pid).is_some_and(|(ppid, _)| ppid == postmaster as i32) {
                found.push(Pid::from_raw(pid));
            }
        }
        found
    }

    fn chown(&self, path: &Path) -> Result<(), Error> {
        if let Some((uid, gid)) = self.user {
            nix::unistd::chown(path, Some(uid), Some(gid)).map_err(|err| Error::Io {
                context: format!("giving {} to the server's user", path.display()),
                source: err.into(),
            })?;
        }
        Ok(())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The parent and state of process `pid` (`/proc/PID/stat`).
fn stat_of(pid: i32) -> Option<(i32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Wait until every process of `processes` has exited (a zombie counts
/// as exited: its parent reaps it in its own time).
fn wait_gone(processes: &[Pid]) {
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        let alive = processes.iter().any(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|_| stat_of(pid.as_raw()))
                .is_some_and(|(_, state)| state != 'Z')
        });
        if !alive {
            return;
        }
        for pid in processes {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `cp -a`: files, modes and owners (the server's user) kept.
fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .map_err(io_err("running cp"))?;
    if !status.success() {
        return Err(Error::Io {
            context: format!("copying {} to {}", from.display(), to.display()),
            source: std::io::Error::other(format!("cp exited with {status}")),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_keeps_its_data_across_a_kill_and_goes_back_with_a_restore() {
        let mut pg = PgServer::start().expect("postgres starts");
        pg.sql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
            .expect("create");
        let copy = pg.backup().expect("backup");
        pg.sql("INSERT INTO t VALUES (2)").expect("insert");
        pg.kill();
        assert!(
            pg.sql("SELECT 1").is_err(),
            "a killed server answers nothing"
        );
        pg.resume().expect("resume");
        assert_eq!(pg.sql("SELECT count(*) FROM t").expect("count"), "2");
        pg.restore(&copy).expect("restore");
        assert_eq!(pg.sql("SELECT count(*) FROM t").expect("count"), "1");
    }

    #[test]
    fn a_replica_follows_and_is_promoted() {
        let pg = PgServer::start().expect("postgres starts");
        pg.sql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
            .expect("create");
        let replica = pg.start_replica().expect("replica starts");
        replica.wait_caught_up(&pg).expect("caught up");
        assert_eq!(replica.sql("SELECT count(*) FROM t").expect("count"), "1");
        assert!(
            replica.sql("INSERT INTO t VALUES (2)").is_err(),
            "read-only"
        );
        replica.promote().expect("promote");
        replica.sql("INSERT INTO t VALUES (2)").expect("writable");
    }

    #[test]
    fn a_pooler_in_transaction_mode_forwards_queries() {
        let pg = PgServer::start().expect("postgres starts");
        let pooler = pg.start_pooler().expect("pgbouncer starts");
        let port = pooler.port().to_string();
        let out = Command::new(pg.bin("psql"))
            .args([
                "-X",
                "-A",
                "-t",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
            ])
            .args(["-d", "postgres", "-c", "SHOW port"])
            .output()
            .expect("psql runs");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            pg.port().to_string(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn other_roles_need_their_password() {
        let pg = PgServer::start().expect("postgres starts");
        pg.sql("CREATE ROLE alice LOGIN PASSWORD 'pw'")
            .expect("role");
        let port = pg.port().to_string();
        let status = Command::new(pg.bin("psql"))
            .args([
                "-X",
                "-w",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "alice",
                "-d",
                "postgres",
            ])
            .args(["-c", "SELECT 1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("psql runs");
        assert!(!status.success(), "no password, no entry");
    }
}
