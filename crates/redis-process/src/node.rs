//! One process of a [`crate::SentinelGroup`] or [`crate::RedisCluster`].
//!
//! Unlike [`crate::RedisServer`], whose settings are all on the command
//! line, a node is started from a configuration file in its own directory,
//! and that file is kept across a kill and a resume. Sentinel insists on a
//! writable file it can rewrite, a data node under Sentinel gets `REPLICAOF`
//! followed by `CONFIG REWRITE`, and a cluster node keeps its identity in
//! `nodes.conf`: restarting from those files is what makes a resumed node
//! come back the way a real one does after a crash (a killed primary as a
//! stale primary, a cluster node with its old ID and epoch), rather than as
//! a fresh process with whatever role it had when the test began.
//!
//! Every method takes `&self` (the process handle sits behind a mutex), so a
//! test can share a topology with other threads and still kill, pause or
//! resume its nodes.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::resp::{self, Value};
use crate::{free_ports, io_err, Error, COMMAND_TIMEOUT, START_TIMEOUT};

/// How long the topology code waits for one reply while polling; shorter
/// than [`COMMAND_TIMEOUT`] so that one slow node does not eat a deadline.
pub(crate) const POLL_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a condition is checked while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The RDB file a data node saves to (and loads at start when present).
const SNAPSHOT: &str = "dump.rdb";

/// What a node is, which decides how it is started and named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A primary or replica watched by Sentinel.
    Data,
    /// A `redis-server --sentinel`.
    Sentinel,
    /// A `cluster-enabled` node.
    Cluster,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Data => "data",
            Kind::Sentinel => "sentinel",
            Kind::Cluster => "cluster",
        }
    }

    fn config_name(self) -> &'static str {
        match self {
            Kind::Sentinel => "sentinel.conf",
            Kind::Data | Kind::Cluster => "redis.conf",
        }
    }
}

/// The ports a node's configuration is written for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    /// The client port.
    pub(crate) port: u16,
    /// The cluster bus port, for cluster nodes.
    pub(crate) bus: Option<u16>,
}

#[derive(Debug, Default)]
struct State {
    child: Option<Child>,
    paused: bool,
    /// Load the saved snapshot at the next resume instead of removing it.
    keep_snapshot: bool,
}

/// A `redis-server` process of a Sentinel group or cluster, on a fixed port
/// of 127.0.0.1, started from a configuration file in its own directory.
///
/// [`Node::kill`] stops it with SIGKILL by PID, [`Node::resume`] starts it
/// again on the same port from the same (possibly rewritten) configuration
/// file, [`Node::pause`] and [`Node::unpause`] send SIGSTOP and SIGCONT.
/// The process is killed and its directory removed when the group or
/// cluster that owns it is dropped.
#[derive(Debug)]
pub struct Node {
    kind: Kind,
    binary: PathBuf,
    ports: Ports,
    dir: PathBuf,
    password: Option<String>,
    /// Commands sent after every start (runtime settings a restart loses).
    setup: Vec<Vec<String>>,
    state: Mutex<State>,
}

impl Node {
    /// Start a new node on free ports: `config` writes its configuration
    /// file for the chosen ports and directory; `setup` commands are sent
    /// after this and every later start. When the port is taken between
    /// choosing it and binding it (another test won the race), the node is
    /// tried again on other ports.
    pub(crate) fn start(
        kind: Kind,
        binary: &Path,
        password: Option<&str>,
        with_bus: bool,
        setup: Vec<Vec<String>>,
        config: impl Fn(Ports, &Path) -> String,
    ) -> Result<Node, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let chosen = free_ports(if with_bus { 2 } else { 1 })?;
            let ports = Ports {
                port: chosen[0],
                bus: chosen.get(1).copied(),
            };
            // Not the name a RedisServer would use: a killed node keeps its
            // directory while its port is free for anyone to take.
            let dir = std::env::temp_dir().join(format!(
                "redis-process-{}-{}-{}",
                std::process::id(),
                kind.name(),
                ports.port
            ));
            std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
            let node = Node {
                kind,
                binary: binary.to_path_buf(),
                ports,
                dir,
                password: password.map(str::to_owned),
                setup: setup.clone(),
                state: Mutex::new(State::default()),
            };
            let file = node.config_file();
            std::fs::write(&file, config(ports, &node.dir))
                .map_err(io_err(format!("writing {}", file.display())))?;
            match node.spawn() {
                Ok(()) => return Ok(node),
                // Dropping the node removes its directory before the retry.
                Err(Error::PortTaken { .. }) if attempt < 3 => {}
                Err(_) if attempt < 3 && node.log_tail(20).contains("Address already in use") => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The client port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.ports.port
    }

    /// The cluster bus port, for a cluster node.
    pub fn bus_port(&self) -> Option<u16> {
        self.ports.bus
    }

    /// The process id, or `None` while the node is killed.
    pub fn pid(&self) -> Option<u32> {
        let mut state = self.state();
        if running(&mut state) {
            state.child.as_ref().map(Child::id)
        } else {
            None
        }
    }

    /// Whether the process is alive (paused counts as alive).
    pub fn is_running(&self) -> bool {
        running(&mut self.state())
    }

    /// Whether the process is stopped by [`Node::pause`].
    pub fn is_paused(&self) -> bool {
        self.state().paused
    }

    /// The node's working directory (configuration file, log, snapshot).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The configuration file the node starts from (`redis.conf`, or
    /// `sentinel.conf` for a sentinel); Redis may have rewritten it.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join(self.kind.config_name())
    }

    /// The last `lines` lines of the node's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Send one command over a fresh connection (authenticating first when
    /// the node has a password) and return the reply as text, an array's
    /// items one per line. Waits up to 30 s for the reply, so do not send
    /// to a paused node unless that is the point.
    pub fn command(&self, args: &[&str]) -> Result<String, Error> {
        resp::render(self.call(args, COMMAND_TIMEOUT)?)
    }

    /// Kill the process now (SIGKILL by PID; a paused process dies too).
    /// [`Node::resume`] starts it again without its data.
    pub fn kill(&self) {
        let mut state = self.state();
        if let Some(mut child) = state.child.take() {
            // Errors mean the process is already gone, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
        state.paused = false;
        state.keep_snapshot = false;
    }

    /// `SAVE` a snapshot of the node's data, then kill it (SIGKILL by PID):
    /// the next [`Node::resume`] loads that snapshot, as a server with RDB
    /// persistence would after a crash right after a save. Only for data and
    /// cluster nodes (a sentinel has no data), running and not paused.
    pub fn kill_keep_snapshot(&self) -> Result<(), Error> {
        self.command(&["SAVE"])?;
        self.kill();
        self.state().keep_snapshot = true;
        Ok(())
    }

    /// Start the node again after [`Node::kill`], on the same port and from
    /// the same configuration file, and wait until it answers `PING`. Its
    /// data is gone unless it was killed with [`Node::kill_keep_snapshot`].
    /// Does nothing when the node is running.
    pub fn resume(&self) -> Result<(), Error> {
        if self.is_running() {
            return Ok(());
        }
        let keep = std::mem::take(&mut self.state().keep_snapshot);
        if !keep && self.kind != Kind::Sentinel {
            // A replica's full sync leaves the primary's snapshot here.
            let _ = std::fs::remove_file(self.dir.join(SNAPSHOT));
        }
        self.spawn()
    }

    /// Stop the process with SIGSTOP: it keeps its port and connections but
    /// answers nothing until [`Node::unpause`]. A sentinel stopped for more
    /// than two seconds enters TILT mode when it continues, and acts on
    /// nothing for [`crate::SentinelBuilder::tilt_period`].
    pub fn pause(&self) -> Result<(), Error> {
        self.signal(Signal::SIGSTOP)?;
        self.state().paused = true;
        Ok(())
    }

    /// Let a paused process run again (SIGCONT).
    pub fn unpause(&self) -> Result<(), Error> {
        self.signal(Signal::SIGCONT)?;
        self.state().paused = false;
        Ok(())
    }

    /// Running and not paused: a node the topology code can ask things.
    pub(crate) fn is_live(&self) -> bool {
        let mut state = self.state();
        running(&mut state) && !state.paused
    }

    /// One command, reply kept structured, waiting up to `timeout`.
    pub(crate) fn call(&self, args: &[&str], timeout: Duration) -> Result<Value, Error> {
        resp::call(self.port(), self.password.as_deref(), args, timeout)
    }

    /// Like [`Node::call`] with the polling timeout, an error reply as `Err`.
    pub(crate) fn ask(&self, args: &[&str]) -> Result<Value, Error> {
        match self.call(args, POLL_REPLY_TIMEOUT)? {
            Value::Error(e) => Err(Error::Reply(format!(
                "{} on port {}: {e}",
                args.first().copied().unwrap_or_default(),
                self.port()
            ))),
            value => Ok(value),
        }
    }

    /// `master_repl_offset`: how far into the replication stream a primary
    /// has written, or a replica has applied.
    pub(crate) fn repl_offset(&self) -> Result<u64, Error> {
        let info = self.ask(&["INFO", "replication"])?;
        info_field(info.text().unwrap_or_default(), "master_repl_offset")
            .and_then(|o| o.parse().ok())
            .ok_or_else(|| {
                Error::Topology(format!("{} reports no master_repl_offset", self.port()))
            })
    }

    fn signal(&self, signal: Signal) -> Result<(), Error> {
        let pid = self.pid().ok_or_else(|| {
            Error::Topology(format!(
                "cannot send {signal} to the node on port {}: it is not running",
                self.port()
            ))
        })?;
        let pid = i32::try_from(pid)
            .map_err(|_| Error::Topology(format!("process id {pid} does not fit a pid_t")))?;
        kill(Pid::from_raw(pid), signal)
            .map_err(|errno| io_err(format!("sending {signal} to {pid}"))(errno.into()))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn spawn(&self) -> Result<(), Error> {
        let mut command = Command::new(&self.binary);
        command.current_dir(&self.dir).arg(self.config_file());
        if self.kind == Kind::Sentinel {
            command.arg("--sentinel");
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = command
            .spawn()
            .map_err(io_err(format!("starting {}", self.binary.display())))?;
        let started = Instant::now();
        let mut last = String::from("no connection yet");
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(self.did_not_start(format!("exited with {status}")));
            }
            if TcpStream::connect(("127.0.0.1", self.port())).is_ok() {
                // Accepting connections is not yet serving while a snapshot
                // loads (`-LOADING`); PING says when it is.
                // Whoever answers may be another process on the port, with
                // ours about to exit for it: only our own process id will do.
                match self.call(&["PING"], POLL_REPLY_TIMEOUT) {
                    Ok(Value::Simple(pong)) if pong == "PONG" => {
                        match self.call(&["INFO", "server"], POLL_REPLY_TIMEOUT) {
                            Ok(info) if runs(&info, child.id()) => break,
                            answer if another_server(&answer) => {
                                return Err(port_taken(child, self.port()))
                            }
                            answer => last = format!("INFO answered {answer:?}"),
                        }
                    }
                    answer if another_server(&answer) => {
                        return Err(port_taken(child, self.port()))
                    }
                    Ok(other) => last = format!("PING answered {other:?}"),
                    Err(e) => last = e.to_string(),
                }
            }
            if started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(
                    self.did_not_start(format!("not serving after {START_TIMEOUT:?} ({last})"))
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        {
            let mut state = self.state();
            state.child = Some(child);
            state.paused = false;
        }
        for command in &self.setup {
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            self.ask(&args)?;
        }
        Ok(())
    }

    fn did_not_start(&self, what: String) -> Error {
        Error::DidNotStart {
            port: self.port(),
            detail: format!("{what}; log: {}", self.log_tail(3).replace('\n', " | ")),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the child is alive, reaping it when it has exited on its own.
fn running(state: &mut State) -> bool {
    match state.child.as_mut().map(Child::try_wait) {
        Some(Ok(None)) => true,
        Some(_) => {
            state.child = None;
            state.paused = false;
            false
        }
        None => false,
    }
}

/// Whether `info`, the answer to `INFO server`, comes from process `pid`.
pub(crate) fn runs(info: &Value, pid: u32) -> bool {
    info_field(info.text().unwrap_or_default(), "process_id") == Some(pid.to_string())
}

/// Whether an answer on the port of a process just started (asked with its
/// password, if any) can only come from another process: `INFO` of
/// another process, or a password that is not ours.
pub(crate) fn another_server(answer: &Result<Value, Error>) -> bool {
    match answer {
        Ok(Value::Bulk(Some(_))) => true,
        Ok(Value::Error(e)) => e.starts_with("NOAUTH"),
        // Our AUTH refused.
        Err(Error::Reply(_)) => true,
        _ => false,
    }
}

/// Stop `child`, which cannot bind `port`, and say why.
pub(crate) fn port_taken(mut child: Child, port: u16) -> Error {
    let _ = child.kill();
    let _ = child.wait();
    Error::PortTaken { port }
}

/// The value of `field` in `INFO` text (`field:value` lines).
pub(crate) fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|value| value.trim().to_owned())
}

/// Wait until each of `replicas` has applied the replication stream up to
/// where `primary` is now: every write `primary` acknowledged before the
/// call is then on every replica.
pub(crate) fn wait_for_offset(
    primary: &Node,
    replicas: &[&Node],
    timeout: Duration,
) -> Result<(), Error> {
    let target = primary.repl_offset()?;
    let what = format!(
        "the replicas of {} have applied its writes (offset {target})",
        primary.port()
    );
    poll(timeout, &what, || {
        for replica in replicas {
            let offset = replica.repl_offset()?;
            if offset < target {
                return not_yet(format!("{} is at offset {offset}", replica.port()));
            }
        }
        Ok(())
    })
}

/// Why a condition being waited for does not hold yet. Errors talking to a
/// node (refused while it restarts, a timeout while it is busy) are reasons
/// to keep waiting, not to give up, so they convert into this.
#[derive(Debug)]
pub(crate) struct NotYet(pub(crate) String);

impl From<Error> for NotYet {
    fn from(e: Error) -> Self {
        NotYet(e.to_string())
    }
}

/// Shorthand for a failed check: `return not_yet(format!(...))`.
pub(crate) fn not_yet<T>(why: impl Into<String>) -> Result<T, NotYet> {
    Err(NotYet(why.into()))
}

/// Check `condition` every [`POLL_INTERVAL`] until it holds or `timeout`
/// has passed; the error names `what` was awaited and why the last check
/// failed.
pub(crate) fn poll<T>(
    timeout: Duration,
    what: &str,
    mut condition: impl FnMut() -> Result<T, NotYet>,
) -> Result<T, Error> {
    let started = Instant::now();
    loop {
        match condition() {
            Ok(value) => return Ok(value),
            Err(NotYet(why)) if started.elapsed() >= timeout => {
                return Err(Error::Timeout {
                    what: what.to_owned(),
                    waited: started.elapsed(),
                    last: why,
                })
            }
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// The lines every node's configuration starts with.
pub(crate) fn common_config(ports: Ports, dir: &Path) -> String {
    let dir = quote(&dir.to_string_lossy());
    format!(
        "port {}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile redis.log\n",
        ports.port
    )
}

/// A configuration-file argument in double quotes, so spaces and quotes in
/// passwords or paths survive.
pub(crate) fn quote(value: &str) -> String {
    let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}
