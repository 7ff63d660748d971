//! One `etcd` process of an [`crate::EtcdCluster`].
//!
//! A member keeps its ports and its data directory for the life of the
//! cluster, whatever happens to its process: that is what lets a killed
//! member come back as the same raft member (same ID, same log) rather than
//! as a stranger, the way a real one does after a crash. The process handle
//! sits behind a mutex so that pausing and asking a member work through a
//! shared reference, from any thread.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::http;
use crate::{io_err, Error};

/// The log file in a member's data directory: etcd's stdout and stderr.
const LOG: &str = "etcd.log";

/// How long one health or status request may take while polling. etcd
/// answers `/health` within a second even without a leader; the rest is
/// margin for a loaded machine.
pub(crate) const POLL_REPLY_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Default)]
struct State {
    child: Option<Child>,
    paused: bool,
}

/// A member's process, ports and data directory.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) index: usize,
    pub(crate) client_port: u16,
    pub(crate) peer_port: u16,
    /// `--listen-metrics-urls`: plain HTTP `/health` and `/metrics`, also
    /// when the client port speaks TLS only.
    pub(crate) metrics_port: u16,
    /// Whether the client port speaks TLS.
    pub(crate) tls: bool,
    /// `--data-dir`; also holds [`LOG`].
    pub(crate) dir: PathBuf,
    state: Mutex<State>,
}

/// What a member says about itself and its leader
/// (`/v3/maintenance/status`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    /// The member's own raft ID.
    pub(crate) id: u64,
    /// The raft ID of the leader it follows, 0 when it knows none.
    pub(crate) leader: u64,
    /// The raft term it is in.
    pub(crate) term: u64,
}

impl Member {
    pub(crate) fn new(index: usize, ports: [u16; 3], tls: bool, dir: PathBuf) -> Member {
        let [client_port, peer_port, metrics_port] = ports;
        Member {
            index,
            client_port,
            peer_port,
            metrics_port,
            tls,
            dir,
            state: Mutex::new(State::default()),
        }
    }

    /// `mN`, the member's `--name`.
    pub(crate) fn name(&self) -> String {
        format!("m{}", self.index)
    }

    pub(crate) fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    pub(crate) fn client_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub(crate) fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.metrics_port)
    }

    /// Start the process with `args` (everything but the binary), output
    /// appended to the log. Returns at once; see [`Member::health`].
    pub(crate) fn spawn(&self, binary: &Path, args: &[String]) -> Result<(), Error> {
        let log_path = self.dir.join(LOG);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err(format!("opening {}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(io_err(format!("opening {}", log_path.display())))?;
        let mut command = Command::new(binary);
        command
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        // etcd reads every flag from ETCD_<FLAG> too and refuses to start
        // when one is given both ways; ours are all on the command line. The
        // one it needs from the environment on some architectures stays.
        for (name, _) in std::env::vars_os() {
            let name_text = name.to_string_lossy();
            if name_text.starts_with("ETCD_") && name_text != "ETCD_UNSUPPORTED_ARCH" {
                command.env_remove(&name);
            }
        }
        let child = command
            .spawn()
            .map_err(io_err(format!("starting {}", binary.display())))?;
        let mut state = self.state();
        state.child = Some(child);
        state.paused = false;
        Ok(())
    }

    /// SIGKILL by PID (a stopped process dies too), then reap it.
    pub(crate) fn kill(&self) {
        let mut state = self.state();
        if let Some(mut child) = state.child.take() {
            // Errors mean the process is already gone, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
        state.paused = false;
    }

    /// The exit status when the process has exited on its own since it was
    /// started (it is then reaped and forgotten).
    pub(crate) fn exited(&self) -> Option<String> {
        let mut state = self.state();
        let status = match state.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => status.to_string(),
            Some(Err(e)) => format!("could not be waited for ({e})"),
            Some(Ok(None)) | None => return None,
        };
        state.child = None;
        state.paused = false;
        Some(status)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        let mut state = self.state();
        if running(&mut state) {
            state.child.as_ref().map(Child::id)
        } else {
            None
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        running(&mut self.state())
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.state().paused
    }

    /// Running and not paused: a member that can be asked things.
    pub(crate) fn is_live(&self) -> bool {
        let mut state = self.state();
        running(&mut state) && !state.paused
    }

    pub(crate) fn pause(&self) -> Result<(), Error> {
        self.signal(Signal::SIGSTOP)?;
        self.state().paused = true;
        Ok(())
    }

    pub(crate) fn resume(&self) -> Result<(), Error> {
        self.signal(Signal::SIGCONT)?;
        self.state().paused = false;
        Ok(())
    }

    fn signal(&self, signal: Signal) -> Result<(), Error> {
        let pid = self.pid().ok_or_else(|| {
            Error::Topology(format!(
                "cannot send {signal} to etcd member m{}: it is not running",
                self.index
            ))
        })?;
        let pid = i32::try_from(pid)
            .map_err(|_| Error::Topology(format!("process id {pid} does not fit a pid_t")))?;
        kill(Pid::from_raw(pid), signal)
            .map_err(|errno| io_err(format!("sending {signal} to {pid}"))(errno.into()))
    }

    /// `Ok` when `GET /health` says `"health":"true"` (which etcd says only
    /// with a leader and a working quorum), otherwise why not.
    pub(crate) fn health(&self) -> Result<(), String> {
        let reply = http::request(self.metrics_port, "GET", "/health", "", POLL_REPLY_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let healthy = serde_json::from_str::<serde_json::Value>(&reply.body)
            .ok()
            .is_some_and(|json| json["health"] == "true");
        if reply.status == 200 && healthy {
            Ok(())
        } else {
            Err(format!(
                "/health answered {}: {}",
                reply.status,
                reply.body.trim()
            ))
        }
    }

    /// POST `body` to the gateway at `path`; the reply's body when the
    /// status is 200.
    pub(crate) fn post(&self, path: &str, body: &str, timeout: Duration) -> Result<String, Error> {
        let reply = http::request(self.client_port, "POST", path, body, timeout)?;
        if reply.status == 200 {
            Ok(reply.body)
        } else {
            Err(Error::Http(format!(
                "POST {path} on etcd member m{} (127.0.0.1:{}) answered {}: {}",
                self.index,
                self.client_port,
                reply.status,
                reply.body.trim()
            )))
        }
    }

    /// Like [`Member::post`], the reply parsed as JSON.
    pub(crate) fn post_json(
        &self,
        path: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value, Error> {
        let reply = self.post(path, body, timeout)?;
        serde_json::from_str(&reply).map_err(|e| {
            Error::Http(format!(
                "POST {path} on etcd member m{}: not JSON ({e}): {}",
                self.index,
                reply.trim()
            ))
        })
    }

    /// The member's own ID and the leader it follows.
    pub(crate) fn status(&self) -> Result<Status, Error> {
        let json = self.post_json("/v3/maintenance/status", "{}", POLL_REPLY_TIMEOUT)?;
        let id = json_u64(&json["header"]["member_id"]).ok_or_else(|| {
            Error::Http(format!(
                "etcd member m{} reports no header.member_id: {json}",
                self.index
            ))
        })?;
        Ok(Status {
            id,
            // The gateway leaves zero values out.
            leader: json_u64(&json["leader"]).unwrap_or(0),
            term: json_u64(&json["raftTerm"])
                .or_else(|| json_u64(&json["header"]["raft_term"]))
                .unwrap_or(0),
        })
    }

    /// The last `lines` lines of the member's log, on one line.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join(LOG)).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
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

/// A 64-bit number from the gateway's JSON, which writes them as strings
/// (JavaScript numbers cannot hold them) but may one day not.
pub(crate) fn json_u64(value: &serde_json::Value) -> Option<u64> {
    match value {
        serde_json::Value::String(text) => text.parse().ok(),
        other => other.as_u64(),
    }
}

/// Create a directory only its owner can read: etcd warns about data
/// directories others can read. Fails when it exists already.
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}
