//! Private `redis-server` processes for tests, the demo and the benchmarks.
//!
//! Every process this crate starts listens on a free port of 127.0.0.1, keeps
//! no data on disk (`save ""`, no AOF), works in a directory of its own and
//! is stopped by its PID when the [`RedisServer`] is dropped. It never touches
//! the shared port 6379 and never kills processes by name, so several test
//! binaries can run side by side on one machine.
//!
//! ```no_run
//! let server = redis_process::RedisServer::start()?;
//! println!("redis at {}", server.url());
//! # Ok::<(), redis_process::Error>(())
//! ```
//!
//! Beyond a single server, [`SentinelGroup`] starts a primary, a replica and
//! three sentinels, and [`RedisCluster`] a cluster of primaries and replicas
//! (cluster bus ports chosen free too). Their nodes ([`Node`]) can be killed,
//! resumed on the same port, paused and continued, and each topology offers
//! failovers (and the cluster slot migrations) together with waits on the
//! exact state that follows, so tests of failover handling poll a condition
//! instead of sleeping.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cluster;
mod node;
mod resp;
mod sentinel;

pub use cluster::{slot_of, ClusterBuilder, RedisCluster, SLOTS};
pub use node::Node;
use node::{another_server, port_taken, runs, POLL_REPLY_TIMEOUT};
pub use sentinel::{SentinelBuilder, SentinelGroup};

/// How long a freshly started server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`RedisServer::command`] waits for a reply.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// What can go wrong while starting or talking to a private server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `redis-server` binary is not installed.
    #[error(
        "redis-server was not found on PATH (set REDIS_SERVER to its path, or install it: \
         `apt-get install redis-server` on Debian/Ubuntu, `brew install redis` on macOS)"
    )]
    NotInstalled,
    /// The server process exited or never accepted connections.
    #[error("redis-server on port {port} did not start: {detail}")]
    DidNotStart {
        /// The port it was asked to listen on.
        port: u16,
        /// What was observed (exit status, last log lines).
        detail: String,
    },
    /// Another process answers on the port chosen for a new server: the
    /// port was taken between choosing it and binding it (another test
    /// won the race), or while a killed server was down.
    #[error("port {port} of 127.0.0.1 is served by another process")]
    PortTaken {
        /// The port.
        port: u16,
    },
    /// A command sent with [`RedisServer::command`] got an error reply.
    #[error("redis replied with an error: {0}")]
    Reply(String),
    /// A Sentinel group or cluster did not reach the state being waited for
    /// before the deadline.
    #[error("timed out after {waited:?} waiting until {what}; last seen: {last}")]
    Timeout {
        /// The condition that was awaited.
        what: String,
        /// How long it was awaited.
        waited: Duration,
        /// Why the last check failed.
        last: String,
    },
    /// A Sentinel group or cluster is not in the state an operation needs
    /// (no agreed primary, a port that is not one of its nodes, ...).
    #[error("{0}")]
    Topology(String),
    /// Operating-system error (spawning, sockets, files).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

/// TLS material for a server started with [`Builder::tls`], as PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA certificate that signed `cert` (PEM).
    pub ca: PathBuf,
}

/// Options for a server before it starts.
#[derive(Debug, Default, Clone)]
pub struct Builder {
    password: Option<String>,
    tls: Option<TlsFiles>,
    extra_args: Vec<String>,
}

impl Builder {
    /// Require this password for the `default` user (`requirepass`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Serve TLS only (the plain TCP port is disabled); clients need not
    /// present certificates.
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Extra `redis-server` arguments, e.g. `["--user", "alice on >pw ~* +@all"]`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Start the server on a free loopback port and wait until it accepts
    /// connections.
    /// When the port is taken between choosing it and binding it (another
    /// test won the race), the server is tried again on another port.
    pub fn start(self) -> Result<RedisServer, Error> {
        let binary = find_redis_server()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port()?;
            let dir =
                std::env::temp_dir().join(format!("redis-process-{}-{}", std::process::id(), port));
            std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
            let mut server = RedisServer {
                binary: binary.clone(),
                builder: self.clone(),
                port,
                dir,
                child: None,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                // Dropping the server removes its directory before the retry.
                Err(Error::PortTaken { .. }) if attempt < 3 => {}
                Err(Error::DidNotStart { detail, .. })
                    if attempt < 3 && detail.contains("Address already in use") => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A running private `redis-server`, stopped (SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    builder: Builder,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Start a plain server (no password, no TLS) on a free loopback port.
    pub fn start() -> Result<Self, Error> {
        Builder::default().start()
    }

    /// Options for a server with a password, TLS or extra arguments.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, or `None` while it is stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A URL for clients: `redis://127.0.0.1:PORT` (`rediss://` with TLS),
    /// with the password when one was set.
    pub fn url(&self) -> String {
        let scheme = if self.builder.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        match &self.builder.password {
            Some(password) => format!("{scheme}://:{password}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// Kill the server (SIGKILL, so nothing is saved) and start a new one on
    /// the same port: every key is lost, as after a crash without persistence.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill();
        self.spawn()
    }

    /// Kill the server now (SIGKILL by PID). [`RedisServer::resume`] starts it
    /// again, empty, on the same port.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors mean the process is already gone, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the server again after [`RedisServer::kill`] (empty, same port).
    pub fn resume(&mut self) -> Result<(), Error> {
        if self.child.is_none() {
            self.spawn()?;
        }
        Ok(())
    }

    /// Send one command over a fresh plain-TCP connection (authenticating
    /// first when a password is set) and return the reply as text, an
    /// array's items one per line. Used for fault injection such as
    /// `CLIENT PAUSE`; not available with TLS.
    pub fn command(&self, args: &[&str]) -> Result<String, Error> {
        let password = self.builder.password.as_deref();
        resp::render(resp::call(self.port, password, args, COMMAND_TIMEOUT)?)
    }

    fn spawn(&mut self) -> Result<(), Error> {
        let mut command = Command::new(&self.binary);
        command
            .current_dir(&self.dir)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir".as_ref(), self.dir.as_os_str()])
            .args(["--logfile", "redis.log", "--daemonize", "no"])
            .args(["--enable-debug-command", "local"]);
        match &self.builder.tls {
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .args(["--tls-cert-file".as_ref(), tls.cert.as_os_str()])
                    .args(["--tls-key-file".as_ref(), tls.key.as_os_str()])
                    .args(["--tls-ca-cert-file".as_ref(), tls.ca.as_os_str()])
                    .args(["--tls-auth-clients", "no"]);
            }
            None => {
                command.args(["--port", &self.port.to_string()]);
            }
        }
        if let Some(password) = &self.builder.password {
            command.args(["--requirepass", password]);
        }
        command
            .args(&self.builder.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command
            .spawn()
            .map_err(io_err(format!("starting {}", self.binary.display())))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Error::DidNotStart {
                    port: self.port,
                    detail: format!("exited with {status}; log: {}", self.log_tail()),
                });
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                if self.builder.tls.is_some() {
                    break;
                }
                // Whoever accepted may be another process on the port, with
                // ours about to exit for it: only our own process id will do.
                let password = self.builder.password.as_deref();
                let asked =
                    resp::call(self.port, password, &["INFO", "server"], POLL_REPLY_TIMEOUT);
                match asked {
                    Ok(info) if runs(&info, child.id()) => break,
                    answer if another_server(&answer) => {
                        return Err(port_taken(child, self.port));
                    }
                    // Not serving yet: look again.
                    _ => {}
                }
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::DidNotStart {
                    port: self.port,
                    detail: format!(
                        "no connection after {START_TIMEOUT:?}; log: {}",
                        self.log_tail()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        if self.builder.tls.is_none() {
            // Accepting TCP is not yet serving while a large dataset loads;
            // ours is always empty, but a PING makes the contract explicit.
            self.command(&["PING"])?;
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// `find_redis_server`, `free_port` and `free_ports` are the code of
// `tenure_test_support::{find_binary, ports}`, kept here: this crate is
// published (the `tenure` command's demo uses it), and a published crate
// cannot depend on the unpublished test-support crate.

/// Find `redis-server`: `$REDIS_SERVER`, then each directory of `$PATH`,
/// then the usual system locations.
pub fn find_redis_server() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let found = path_dirs
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/usr/bin"), Path::new("/usr/local/bin")])
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file());
    found.ok_or(Error::NotInstalled)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io_err("finding a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io_err("finding a free port"))?
        .port();
    Ok(port)
}

/// `count` distinct ports of 127.0.0.1 that were free a moment ago: every
/// listener is held until all are chosen, so none is handed out twice.
pub(crate) fn free_ports(count: usize) -> Result<Vec<u16>, Error> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind(("127.0.0.1", 0)).map_err(io_err("finding a free port")))
        .collect::<Result<Vec<_>, _>>()?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(io_err("finding a free port"))
        })
        .collect()
}
