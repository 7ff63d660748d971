//! Process supervision: running CMD so that it can always be stopped whole,
//! and never outlives this instance's lease deadline.
//!
//! `tenure run` never starts CMD directly. It starts a small **guardian**
//! (this same binary, hidden subcommand `__guardian`, see [`crate::guardian`])
//! in a process group of its own, and the guardian starts CMD. Together they
//! hold three lines of defence, each covering what the previous one cannot:
//!
//! 1. **tenure stops CMD on time.** It sends SIGTERM to every process of the
//!    job, waits the kill grace, then SIGKILLs them ([`Job::stop`]); the
//!    caller picks a grace that ends before the lease deadline.
//! 2. **The guardian enforces the deadline on its own.** tenure hands it each
//!    new kill instant over a private channel ([`Job::extend`]). If no
//!    extension arrives in time, or the channel closes because tenure died,
//!    the guardian SIGKILLs CMD's whole tree. A stopped, wedged or killed
//!    tenure therefore cannot keep CMD running past the lease.
//! 3. **tenure outlives a dead guardian.** If the guardian dies, tenure kills
//!    what is left of the job itself before it resigns; a dead guardian is
//!    never taken for CMD's exit.
//!
//! **What "the job" is.** Both tenure and the guardian are child subreapers
//! (`PR_SET_CHILD_SUBREAPER`): a process that leaves CMD's process group
//! (`setsid`) or its parent (a double fork) is re-parented to the guardian,
//! or to tenure if the guardian is gone, instead of to PID 1. So the job is
//! exactly the processes below the guardian, found through `/proc` parent
//! links ([`tenure_procs`]), and killing "every descendant, again until none
//! is left running" misses nothing that started below CMD. What this cannot
//! cover: a process re-parented to PID 1 because tenure *and* the guardian
//! died at the same instant (both SIGKILLed, the OOM killer taking both).
//!
//! **The cgroup.** Where a writable cgroup v2 is available, CMD also runs in
//! a cgroup of its own ([`JobCgroup`], see [`tenure_procs::cgroup`]), and
//! every kill starts with `cgroup.kill`: one write that SIGKILLs the whole
//! tree, forks in flight included, without the race between reading `/proc`
//! and signalling a PID. A job has ended only once the cgroup is empty. The
//! cgroup also holds on to the processes of a tenure killed together with its
//! guardian: the service manager (systemd kills the unit's whole cgroup) or
//! the next `tenure run` on this host kills them.
//!
//! **The guardian starts before its term.** While tenure campaigns it keeps
//! a [`Standby`]: a guardian already started and connected, waiting for the
//! term. Winning the lease then costs one message ([`Standby::start`]) and
//! CMD's own start, not a start of this binary too.
//!
//! **The channel** is an abstract Unix socket, private to one guardian:
//! tenure listens, the guardian connects, and tenure accepts only a peer
//! whose PID is the guardian's. Each message is one line. tenure sends
//! `start NS TOKEN ELECTION` once, when the term begins (the first kill
//! instant, the fencing token CMD gets as `TENURE_TOKEN`, and the term's
//! election, which CMD gets as `TENURE_ELECTION`: with `--slots`, the
//! permit's), then `kill-at NS` for
//! every later kill instant. NS is an instant of `CLOCK_MONOTONIC` in
//! nanoseconds, the clock tokio's `Instant` and the kernel's timers both
//! use, the same for every process on the host. The guardian writes back
//! one line: `deadline` if it killed CMD because no extension came, or
//! `exited CODE` once CMD exited and nothing it started runs any more.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::Pid;
use tenure::Leadership;
use tenure_procs::cgroup::Cgroup;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long the guardian gets to start and connect before the job is
/// given up (it never takes this long unless the host is starved).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the kill loops look at `/proc` again.
const KILL_POLL: Duration = Duration::from_millis(1);

/// The message a guardian sends when it killed CMD at the deadline.
pub const DEADLINE_MESSAGE: &str = "deadline";

/// The message a guardian sends, with CMD's status, when CMD exited and
/// nothing of its tree runs any more.
pub const EXITED_MESSAGE: &str = "exited";

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// CMD exited (by itself or from our stop) with this status: the exit
    /// code, or 128 + the signal that ended it, as shells report it.
    Exited(i32),
    /// The guardian killed CMD's tree because no extension of the deadline
    /// arrived in time.
    Deadline,
    /// The guardian itself was killed by this signal; tenure killed what was
    /// left of the job. CMD's own status is unknown.
    GuardianDied(i32),
}

/// The cgroup CMD runs in.
#[derive(Debug, Clone)]
pub struct JobCgroup {
    pub cgroup: Cgroup,
    /// The guardian refuses to start CMD outside it (`--cgroup require`).
    pub required: bool,
}

/// A guardian started and connected ahead of its term, CMD not started.
/// Dropping it lets the guardian go: it exits without running CMD.
pub struct Standby {
    guardian: Child,
    pid: Pid,
    channel: UnixStream,
    cgroup: Option<Cgroup>,
}

impl Standby {
    /// Start a guardian for `command` in a new process group, with `env`
    /// added to the environment (stdio is inherited), and wait until it is
    /// connected.
    ///
    /// tenure must have no other children while a standby or a [`Job`]
    /// exists: a job's clean-up kills and reaps every child of tenure.
    pub async fn spawn(
        command: &[OsString],
        env: &[(&str, String)],
        cgroup: Option<&JobCgroup>,
    ) -> std::io::Result<Standby> {
        let (listener, name) = listen()?;
        let exe = std::env::current_exe()?;
        let mut guardian = Command::new(exe);
        guardian.arg("__guardian").arg("--channel").arg(&name);
        if let Some(JobCgroup { cgroup, required }) = cgroup {
            guardian.arg("--cgroup").arg(cgroup.dir());
            if *required {
                guardian.arg("--cgroup-required");
            }
        }
        guardian
            .arg("--")
            .args(command)
            .env_clear()
            .envs(command_environment(std::env::vars_os()))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0)
            .kill_on_drop(false);
        let mut guardian = guardian.spawn()?;
        let pid = guardian
            .id()
            .ok_or_else(|| std::io::Error::other("guardian exited before it could be tracked"))?;
        let pid = Pid::from_raw(i32::try_from(pid).map_err(std::io::Error::other)?);
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, async {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let (stream, _) = accepted?;
                        // Anyone on the host can connect to an abstract
                        // socket; only the guardian may steer this job.
                        if stream.peer_cred()?.pid() == Some(pid.as_raw()) {
                            return Ok(stream);
                        }
                    }
                    status = guardian.wait() => {
                        return Err(std::io::Error::other(format!(
                            "the guardian exited before it connected ({})",
                            status?
                        )));
                    }
                }
            }
        })
        .await;
        let connected = connected.unwrap_or_else(|_| {
            Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "the guardian did not connect within 10 s",
            ))
        });
        match connected {
            Ok(channel) => Ok(Standby {
                guardian,
                pid,
                channel,
                cgroup: cgroup.map(|c| c.cgroup.clone()),
            }),
            Err(err) => {
                // It has not started CMD: it alone is to be killed.
                let _ = guardian.start_kill();
                let _ = guardian.wait().await;
                Err(err)
            }
        }
    }

    /// The waiting guardian's process id.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// Begin `term`: the guardian starts CMD with `TENURE_TOKEN` and
    /// `TENURE_ELECTION` of the term (with `--slots`, the permit's
    /// election), and `TENURE_SLOT` with `--cron`, and kills it at
    /// `kill_at` unless [`Job::extend`] moves that later.
    /// An error means the guardian is gone (it never got a whole `start`,
    /// so CMD did not run); start another one.
    ///
    /// # Cancel safety
    /// Not cancel safe: a guardian may have been told to start, and only
    /// the returned [`Job`] can stop it.
    pub async fn start(
        mut self,
        term: &Leadership,
        kill_at: Instant,
        slot: Option<std::time::SystemTime>,
    ) -> std::io::Result<Job> {
        let kill_at = monotonic_ns(kill_at)?;
        // Election names hold no white space (the library refuses them).
        let mut line = format!("start {kill_at} {} {}", term.token(), term.election());
        if let Some(slot) = slot {
            line.push_str(&format!(" {}", humantime::format_rfc3339_seconds(slot)));
        }
        line.push('\n');
        let lock = term.lock_fd();
        // A fresh socket's buffer takes the line at once, unless the
        // guardian is gone.
        if let Err(err) = send_start(&mut self.channel, line.as_bytes(), lock).await {
            let _ = self.guardian.start_kill();
            return Err(err);
        }
        Ok(Job {
            guardian: self.guardian,
            pid: self.pid,
            channel: Some(self.channel),
            sent_kill_at: kill_at,
            heard: Vec::new(),
            status: None,
            killed: false,
            ended: None,
            cgroup: self.cgroup,
        })
    }
}

/// A running CMD under its guardian.
pub struct Job {
    guardian: Child,
    pid: Pid,
    /// `None` once it read as closed.
    channel: Option<UnixStream>,
    /// The last kill instant the guardian was sent (CLOCK_MONOTONIC ns).
    sent_kill_at: u64,
    /// What the guardian wrote back so far.
    heard: Vec<u8>,
    /// The guardian's exit status, once reaped.
    status: Option<ExitStatus>,
    /// Set when tenure itself SIGKILLed the job: the guardian's death by
    /// SIGKILL is then ours, not a failure.
    killed: bool,
    ended: Option<Ended>,
    cgroup: Option<Cgroup>,
}

/// The variables of tenure's own configuration that CMD may see: its term.
/// Everything else named `TENURE_*` (the store URL with its password, the
/// CA file, timings) stays with tenure.
const PASSED_TO_COMMAND: [&str; 3] = ["TENURE_ELECTION", "TENURE_ID", "TENURE_TOKEN"];

/// tenure's environment without its own configuration variables.
fn command_environment(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    vars.filter(|(key, _)| {
        let key = key.to_string_lossy();
        !key.starts_with("TENURE_") || PASSED_TO_COMMAND.contains(&key.as_ref())
    })
}

impl Job {
    /// The guardian's PID, which is also the process group CMD starts in.
    pub fn group(&self) -> i32 {
        self.pid.as_raw()
    }

    /// Tell the guardian that CMD may run until `kill_at` (no-op if that is
    /// what it was last told). An error means the guardian is not listening
    /// (gone, or not reading for a long time): the job must be stopped.
    pub fn extend(&mut self, kill_at: Instant) -> std::io::Result<()> {
        let kill_at = monotonic_ns(kill_at)?;
        if kill_at == self.sent_kill_at || self.status.is_some() {
            return Ok(());
        }
        let Some(channel) = &self.channel else {
            return Err(std::io::Error::new(
                ErrorKind::NotConnected,
                "no channel to the guardian",
            ));
        };
        let line = format!("kill-at {kill_at}\n");
        // A whole line or nothing: the socket buffer holds thousands of
        // these, so it is only full if the guardian stopped reading.
        match channel.try_write(line.as_bytes()) {
            Ok(n) if n == line.len() => {
                self.sent_kill_at = kill_at;
                Ok(())
            }
            Ok(_) => Err(std::io::Error::new(
                ErrorKind::WouldBlock,
                "the guardian is not reading its channel",
            )),
            Err(err) => Err(err),
        }
    }

    /// Wait until the job ends by itself.
    ///
    /// # Cancel safety
    /// Cancel safe: what the guardian said and its status are kept once
    /// seen, and the clean-up after a dead guardian starts again from the
    /// top if interrupted.
    pub async fn wait(&mut self) -> Ended {
        if let Some(ended) = self.ended {
            return ended;
        }
        let status = match self.status {
            Some(status) => status,
            None => {
                let waited = tokio::select! {
                    // The guardian reports CMD's end once the whole tree is
                    // gone, a little before it has exited itself.
                    code = exited_heard(&mut self.channel, &mut self.heard) => {
                        // The guardian is left to exit; tokio reaps it once
                        // the job is dropped.
                        self.ended = Some(Ended::Exited(code));
                        return Ended::Exited(code);
                    }
                    status = self.guardian.wait() => status,
                };
                match waited {
                    Ok(status) => {
                        self.status = Some(status);
                        status
                    }
                    Err(err) => {
                        // Cannot happen for our own child; treat it as a dead
                        // guardian so that the job is killed all the same.
                        tracing::error!(error = %err, "cannot wait for the guardian");
                        self.kill_all().await;
                        return self.finish(Ended::GuardianDied(0));
                    }
                }
            }
        };
        self.hear_the_rest().await;
        let exited = exited_code(&self.heard);
        let said_deadline = String::from_utf8_lossy(&self.heard).contains(DEADLINE_MESSAGE);
        let ended = match (status.code(), status.signal(), exited) {
            (Some(_), _, _) if said_deadline => Ended::Deadline,
            // It reported the tree gone (and may have died after that).
            (_, _, Some(code)) => Ended::Exited(code),
            (Some(code), _, None) => Ended::Exited(code),
            (None, Some(signal), None) if self.killed => Ended::Exited(128 + signal),
            // Not `kill()`: its mark would make a wait() interrupted during
            // this clean-up and called again take the death for our kill,
            // and skip the rest of the clean-up.
            (None, signal, None) => {
                let signal = signal.unwrap_or(0);
                tracing::error!(
                    guardian = self.pid.as_raw(),
                    signal,
                    "the guardian of the command died; killing what is left of the command"
                );
                self.kill_all().await;
                Ended::GuardianDied(signal)
            }
        };
        self.finish(ended)
    }

    fn finish(&mut self, ended: Ended) -> Ended {
        reap_orphans();
        self.ended = Some(ended);
        ended
    }

    /// Make sure nothing of the job runs any more: the guardian reports the
    /// tree gone, and this checks its cgroup (if any) too, killing what is
    /// in it. Call before the lease is released.
    pub async fn ensure_gone(&mut self) {
        if let Some(cgroup) = &self.cgroup {
            if cgroup.populated() {
                tracing::error!(
                    cgroup = %cgroup.dir().display(),
                    "processes of the command outlived its guardian's clean-up; killing them"
                );
                kill_job(std::process::id() as i32, Some(cgroup)).await;
            }
        }
    }

    /// Read what the guardian still had to say. Called once it has exited,
    /// so the channel holds all it will ever say and then reads as closed.
    ///
    /// (Not `try_read`: tokio answers that from readiness the reactor may not
    /// have seen yet, and a missed message would make a kill at the deadline
    /// look like CMD exiting by itself.)
    async fn hear_the_rest(&mut self) {
        use tokio::io::AsyncReadExt;
        if let Some(channel) = self.channel.as_mut() {
            let mut buf = [0u8; 64];
            loop {
                match tokio::time::timeout(CONNECT_TIMEOUT, channel.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => self.heard.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            self.channel = None;
        }
    }

    /// Stop the job: SIGTERM to every process of it, up to `grace` to exit,
    /// then SIGKILL to every process of it until none is left running.
    pub async fn stop(&mut self, grace: Duration) -> Ended {
        if let Some(ended) = self.ended {
            return ended;
        }
        if grace.is_zero() {
            tracing::warn!(
                group = self.pid.as_raw(),
                "no time left before the lease deadline; killing the command"
            );
        } else {
            // CMD's process group at once (the guardian ignores SIGTERM),
            // and whatever left that group as soon as a look at /proc finds
            // it. That look takes a while on a busy host: neither CMD's
            // shutdown nor the end of the stop waits for it.
            let _ = killpg(self.pid, Signal::SIGTERM);
            let group = self.pid.as_raw();
            let ended = Arc::new(Mutex::new(false));
            let cgroup = self.cgroup.clone();
            tokio::task::spawn_blocking({
                let ended = ended.clone();
                move || {
                    let found = tenure_procs::descendants(&tenure_procs::all(), group);
                    // The cgroup's list is exact and cheap; /proc finds what
                    // is outside it (no cgroup, or CMD moved something out).
                    // Its list leaves out CMD's own group, which has had its
                    // SIGTERM already (a second one makes some programs
                    // skip their graceful shutdown).
                    let in_cgroup: Vec<i32> = cgroup
                        .map(|c| c.pids())
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|pid| !found.iter().any(|p| p.pid == *pid))
                        .filter(|pid| tenure_procs::read(*pid).is_some_and(|p| p.pgrp != group))
                        .collect();
                    // Once the job has ended, these PIDs are not ours to
                    // signal any more (they may be reused): the lock makes
                    // "ended" and a round of signals exclude each other.
                    let ended = ended.lock().unwrap_or_else(PoisonError::into_inner);
                    if !*ended {
                        let outside_group = found
                            .iter()
                            .filter(|p| !p.zombie && p.pgrp != group)
                            .map(|p| p.pid);
                        for pid in outside_group.chain(in_cgroup) {
                            signal(pid, Signal::SIGTERM);
                        }
                    }
                }
            });
            let waited = tokio::time::timeout(grace, self.wait()).await;
            *ended.lock().unwrap_or_else(PoisonError::into_inner) = true;
            if let Ok(ended) = waited {
                return ended;
            }
            tracing::warn!(
                group = self.pid.as_raw(),
                ?grace,
                "command did not stop within its grace; killing it"
            );
        }
        self.kill().await;
        self.wait().await
    }

    /// Our kill of the job: what [`Job::kill_all`] does, marked as ours so
    /// that the guardian's death by SIGKILL is not taken for a failure.
    async fn kill(&mut self) {
        self.killed = true;
        self.kill_all().await;
    }

    /// SIGKILL the guardian and everything below this process until nothing
    /// runs, and reap the guardian.
    async fn kill_all(&mut self) {
        kill_job(std::process::id() as i32, self.cgroup.as_ref()).await;
        if self.status.is_none() {
            if let Ok(status) = self.guardian.wait().await {
                self.status = Some(status);
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Only on paths that did not stop the job (an error, a panic).
        // Dropping the channel tells the guardian to kill the job; in case
        // it cannot, one pass of SIGKILL from here too.
        if self.ended.is_none() {
            if let Some(cgroup) = &self.cgroup {
                let _ = cgroup.kill();
            }
            for p in tenure_procs::descendants(&tenure_procs::all(), std::process::id() as i32) {
                signal(p.pid, Signal::SIGKILL);
            }
        }
    }
}

/// Read the channel until the guardian reports CMD's exit (`exited CODE`);
/// never returns if the channel closes first.
///
/// Cancel safe: bytes are added to `heard` only once read.
async fn exited_heard(channel: &mut Option<UnixStream>, heard: &mut Vec<u8>) -> i32 {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(code) = exited_code(heard) {
            return code;
        }
        let Some(stream) = channel.as_mut() else {
            return std::future::pending().await;
        };
        let mut buf = [0u8; 64];
        match stream.read(&mut buf).await {
            Ok(n) if n > 0 => heard.extend_from_slice(&buf[..n]),
            _ => *channel = None,
        }
    }
}

/// CMD's status from a complete `exited CODE` line, if the guardian sent one.
fn exited_code(heard: &[u8]) -> Option<i32> {
    String::from_utf8_lossy(heard)
        .split_inclusive('\n')
        .filter(|line| line.ends_with('\n'))
        .find_map(|line| {
            line.strip_prefix(EXITED_MESSAGE)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
}

/// Send `start` on `channel`, with the term's OS lock (SQLite) attached:
/// the guardian keeps it open until CMD's tree is gone, so that a
/// follower on the same host cannot take over while CMD may still run,
/// even when tenure itself was killed.
async fn send_start(
    channel: &mut UnixStream,
    line: &[u8],
    lock: Option<std::os::fd::OwnedFd>,
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    use tokio::io::AsyncWriteExt;
    let Some(lock) = lock else {
        return channel.write_all(line).await;
    };
    let sent = loop {
        channel.writable().await?;
        let sent = channel.try_io(tokio::io::Interest::WRITABLE, || {
            use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
            let fds = [lock.as_fd()];
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(std::io::Error::other("no room for the lock"));
            }
            let iov = [std::io::IoSlice::new(line)];
            rustix::net::sendmsg(&*channel, &iov, &mut control, SendFlags::NOSIGNAL)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(sent) => break sent,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(err) => return Err(err),
        }
    };
    // The lock went with the first byte; the rest of the line follows.
    channel.write_all(&line[sent.min(line.len())..]).await
}

/// Receive the `start` line on `channel` (the guardian's side), with the
/// OS lock that may come with it. Returns the bytes read (the line, and
/// whatever followed it in the same read) and the lock; no bytes: the
/// channel closed.
pub async fn receive_start(
    channel: &tokio::net::unix::OwnedReadHalf,
) -> std::io::Result<(Vec<u8>, Option<std::os::fd::OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let stream: &UnixStream = channel.as_ref();
    let mut read = Vec::new();
    let mut lock = None;
    while !read.contains(&b'\n') {
        stream.readable().await?;
        let mut buf = [0u8; 256];
        let received = stream.try_io(tokio::io::Interest::READABLE, || {
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let message =
                rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
                    .map_err(std::io::Error::from)?;
            let mut fds = Vec::new();
            for part in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = part {
                    fds.extend(received);
                }
            }
            Ok((message.bytes, fds))
        });
        let (bytes, fds) = match received {
            Ok(received) => received,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(err) => return Err(err),
        };
        if let Some(fd) = fds.into_iter().next() {
            lock = Some(fd);
        }
        if bytes == 0 {
            return Ok((read, lock));
        }
        read.extend_from_slice(&buf[..bytes.min(buf.len())]);
    }
    Ok((read, lock))
}

/// Bind a fresh abstract socket name for one job's channel.
fn listen() -> std::io::Result<(UnixListener, String)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static JOBS: AtomicU64 = AtomicU64::new(0);
    let mut last_err = None;
    // A name in use (a leftover, or someone guessing) is simply skipped.
    for _ in 0..8 {
        let name = format!(
            "tenure-run-{}-{}-{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed),
            monotonic_now().as_nanos()
        );
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        match std::os::unix::net::UnixListener::bind_addr(&addr) {
            Ok(listener) => {
                listener.set_nonblocking(true)?;
                return Ok((UnixListener::from_std(listener)?, name));
            }
            Err(err) => last_err = Some(err),
        }
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("cannot bind a channel")))
}

/// Connect to the channel a `tenure run` listens on (the guardian's side).
pub fn connect(name: &str) -> std::io::Result<UnixStream> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

/// Time on CLOCK_MONOTONIC.
pub fn monotonic_now() -> Duration {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(now) => Duration::new(now.tv_sec() as u64, now.tv_nsec() as u32),
        // CLOCK_MONOTONIC cannot fail on Linux; if it did, report the
        // earliest instant, which makes every kill instant look due.
        Err(_) => Duration::MAX,
    }
}

/// `at` as CLOCK_MONOTONIC nanoseconds.
pub fn monotonic_ns(at: Instant) -> std::io::Result<u64> {
    let now = Instant::now();
    let mono = monotonic_now();
    let at = if at >= now {
        mono.checked_add(at - now)
    } else {
        mono.checked_sub(now - at)
    };
    at.and_then(|at| u64::try_from(at.as_nanos()).ok())
        .ok_or_else(|| std::io::Error::other("CLOCK_MONOTONIC is unusable"))
}

/// The tokio instant of a CLOCK_MONOTONIC time in nanoseconds.
pub fn instant_of(monotonic_ns: u64) -> Instant {
    let at = Duration::from_nanos(monotonic_ns);
    let mono = monotonic_now();
    let now = Instant::now();
    if at >= mono {
        now + (at - mono)
    } else {
        now.checked_sub(mono - at).unwrap_or(now)
    }
}

/// SIGKILL the job: its cgroup (if any) at once, then every descendant of
/// `root` (`root` itself excepted) until none runs, then wait until the
/// cgroup is empty too.
pub async fn kill_job(root: i32, cgroup: Option<&Cgroup>) {
    if let Some(cgroup) = cgroup {
        let _ = cgroup.kill();
    }
    kill_descendants_of(root).await;
    if let Some(cgroup) = cgroup {
        while cgroup.populated() {
            let _ = cgroup.kill();
            tokio::time::sleep(KILL_POLL).await;
        }
    }
}

/// SIGKILL every descendant of `root` (not `root` itself), again and again,
/// until none is left running. Killing a parent re-parents its children to
/// the nearest subreaper (`root`, or the guardian below it), so the next
/// look at `/proc` finds them; "running" means not yet a zombie, so a
/// process that returns here can no longer execute anything.
async fn kill_descendants_of(root: i32) {
    loop {
        let running: Vec<i32> = tenure_procs::descendants(&tenure_procs::all(), root)
            .into_iter()
            .filter(|p| !p.zombie)
            .map(|p| p.pid)
            .collect();
        if running.is_empty() {
            return;
        }
        for pid in running {
            signal(pid, Signal::SIGKILL);
        }
        tokio::time::sleep(KILL_POLL).await;
    }
}

/// Reap this process's exited children and tell whether any child still
/// runs. For a child subreaper "no child" means "no descendant": a living
/// descendant's parent chain ends here, through a child of ours.
///
/// Only call it when no `Child` handle of this process is still unreaped.
pub fn children_left() -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(Errno::ECHILD) => return false,
            // Unknown: assume there are some, and look.
            Err(_) => return true,
        }
    }
}

/// Reap every exited child of this process that nobody else waits for.
///
/// Only call it when no `Child` handle of this process is still unreaped:
/// it would take that child's status.
pub fn reap_orphans() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            return;
        }
    }
}

fn signal(pid: i32, signal: Signal) {
    // ESRCH: already gone. A PID from /proc can in theory be reused between
    // the read and the signal; only a cgroup closes that window.
    let _ = kill(Pid::from_raw(pid), signal);
}

/// Exit code for an exit status: the code, or 128 + signal number, as shells do.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1)
}
