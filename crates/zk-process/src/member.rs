//! One ZooKeeper server (a JVM) of a [`crate::ZkEnsemble`].
//!
//! A member keeps its ports and its directory for the life of the
//! ensemble, whatever happens to its process: that is what lets a killed
//! member come back as the same quorum peer (same server id, same
//! transaction log) rather than as a stranger, the way a real one does
//! after a crash. The process handle sits behind a mutex so that pausing
//! and asking a member work through a shared reference, from any thread.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{io_err, Error};

/// The log file in a member's directory: the JVM's stdout and stderr, where
/// log4j writes too.
const LOG: &str = "zookeeper.log";

/// How long one four-letter word may take while polling. A member answers
/// within milliseconds; the rest is margin for a loaded machine. A paused
/// member accepts the connection (the kernel does) but never answers.
pub(crate) const POLL_REPLY_TIMEOUT: Duration = Duration::from_secs(3);

/// What ZooKeeper answers most four-letter words with while it has no
/// quorum (or has not finished starting).
const NOT_SERVING: &str = "This ZooKeeper instance is not currently serving requests";

#[derive(Debug, Default)]
struct State {
    child: Option<Child>,
    paused: bool,
}

/// A member's process, ports and directory.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) index: usize,
    pub(crate) client_port: u16,
    /// Followers connect to the leader here.
    pub(crate) quorum_port: u16,
    /// Leader election's port.
    pub(crate) election_port: u16,
    /// Holds `zoo.cfg`, [`LOG`] and the data directory, `data/`.
    pub(crate) dir: PathBuf,
    state: Mutex<State>,
}

impl Member {
    pub(crate) fn new(index: usize, ports: [u16; 3], dir: PathBuf) -> Member {
        let [client_port, quorum_port, election_port] = ports;
        Member {
            index,
            client_port,
            quorum_port,
            election_port,
            dir,
            state: Mutex::new(State::default()),
        }
    }

    /// The member's `myid`: its index plus one (ZooKeeper's ids start at 1
    /// by convention).
    pub(crate) fn server_id(&self) -> usize {
        self.index + 1
    }

    /// `dataDir`: `myid` and `version-2/` (snapshots, transaction logs and
    /// the epoch files).
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Start the process with `args` (everything but the binary), output
    /// appended to the log. Returns at once; see [`Member::mode`].
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
        let child = Command::new(binary)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
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
                "cannot send {signal} to ZooKeeper member m{}: it is not running",
                self.index
            ))
        })?;
        let pid = i32::try_from(pid)
            .map_err(|_| Error::Topology(format!("process id {pid} does not fit a pid_t")))?;
        kill(Pid::from_raw(pid), signal)
            .map_err(|errno| io_err(format!("sending {signal} to {pid}"))(errno.into()))
    }

    /// Send the four-letter word `word` to the client port and read the
    /// answer: ZooKeeper closes the connection once it has written it.
    pub(crate) fn four_letter(&self, word: &str, timeout: Duration) -> Result<String, Error> {
        let context = || {
            format!(
                "asking ZooKeeper member m{} (127.0.0.1:{}) `{word}`",
                self.index, self.client_port
            )
        };
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port));
        let mut stream =
            TcpStream::connect_timeout(&address, timeout).map_err(io_err(context()))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.write_all(word.as_bytes()))
            .map_err(io_err(context()))?;
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).map_err(io_err(context()))?;
        String::from_utf8(reply)
            .map_err(|e| Error::Reply(format!("{}: the answer is not UTF-8 ({e})", context())))
    }

    /// The `Mode:` of the member's `srvr` answer (`leader`, `follower`,
    /// `standalone`, `observer`), which it gives only while it serves;
    /// otherwise why there is none.
    pub(crate) fn mode(&self) -> Result<String, String> {
        let reply = self
            .four_letter("srvr", POLL_REPLY_TIMEOUT)
            .map_err(|e| e.to_string())?;
        if let Some(mode) = reply.lines().find_map(|line| line.strip_prefix("Mode: ")) {
            return Ok(mode.trim().to_owned());
        }
        let reply = reply.trim();
        if reply.starts_with(NOT_SERVING) {
            Err("not serving".to_owned())
        } else if reply.is_empty() {
            Err("no answer to srvr (still starting?)".to_owned())
        } else {
            Err(format!("srvr answered without a Mode: {reply}"))
        }
    }

    /// The last `lines` lines of the member's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join(LOG)).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Like [`Member::log_tail`], without Java's stack frames (`\tat ...`,
    /// `\t... 2 more`): what a start-up failure is reported with, where the
    /// exception's message and its cause matter more than where they came
    /// from.
    pub(crate) fn log_summary(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join(LOG)).unwrap_or_default();
        let tail: Vec<&str> = log
            .lines()
            .rev()
            .filter(|line| {
                let line = line.trim_start();
                !(line.starts_with("at ") || line.starts_with("... "))
            })
            .take(lines)
            .collect();
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
