//! Process supervision: running CMD so that it can always be stopped whole.
//!
//! `tenure run` never starts CMD directly. It starts a small **guardian**
//! (this same binary, hidden subcommand `__guardian`) as the leader of a new
//! process group, and the guardian starts CMD inside that group. This gives
//! three guarantees that a bare child process does not:
//!
//! - **The whole job stops.** Signals go to the process group, so a shell
//!   wrapper and the program it started (or anything else CMD spawned without
//!   leaving the group) stop together; killing only `/bin/sh` while its child
//!   keeps running cannot happen.
//! - **Nothing outlives tenure.** The guardian asks the kernel for a signal
//!   when its parent dies (Linux `PR_SET_PDEATHSIG`); if `tenure` is killed,
//!   even with SIGKILL to its own process group, the guardian SIGKILLs the
//!   job's group. Otherwise CMD would keep running after the lease lapsed,
//!   beside the next leader's CMD.
//! - **Nothing is left behind.** When CMD exits on its own, the guardian kills
//!   whatever CMD left running in the group before it reports CMD's status.
//!
//! The stop sequence ([`Job::stop`]) is SIGTERM to the group, a grace period,
//! then SIGKILL to the group. The caller chooses the grace so that the job
//! is gone before the lease deadline.

use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A running CMD inside its guardian's process group.
pub struct Job {
    guardian: Child,
    group: Pid,
    status: Option<ExitStatus>,
}

impl Job {
    /// Start `command` under a guardian in a new process group, with `env`
    /// added to the environment; stdio is inherited.
    pub fn start(command: &[String], env: &[(&str, String)]) -> std::io::Result<Job> {
        let exe = std::env::current_exe()?;
        let mut guardian = Command::new(exe);
        guardian
            .arg("__guardian")
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--")
            .args(command)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0)
            .kill_on_drop(false);
        let guardian = guardian.spawn()?;
        let pid = guardian
            .id()
            .ok_or_else(|| std::io::Error::other("guardian exited before it could be tracked"))?;
        let group = Pid::from_raw(i32::try_from(pid).map_err(std::io::Error::other)?);
        Ok(Job {
            guardian,
            group,
            status: None,
        })
    }

    /// The process group id (the guardian's PID).
    pub fn group(&self) -> i32 {
        self.group.as_raw()
    }

    /// Wait until the job exits by itself.
    ///
    /// # Cancel safety
    /// Cancel safe: the exit status is kept once seen.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = self.guardian.wait().await?;
        self.status = Some(status);
        Ok(status)
    }

    /// Stop the job: SIGTERM to the group, up to `grace` to exit, then
    /// SIGKILL to the group. Returns the guardian's exit status (CMD's status,
    /// or the signal that ended it).
    pub async fn stop(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        if grace.is_zero() {
            tracing::warn!(
                group = self.group.as_raw(),
                "no time left before the lease deadline; killing the command"
            );
        } else {
            self.signal(Signal::SIGTERM);
            if let Ok(status) = tokio::time::timeout(grace, self.wait()).await {
                return status;
            }
            tracing::warn!(
                group = self.group.as_raw(),
                ?grace,
                "command did not stop within its grace; killing it"
            );
        }
        self.signal(Signal::SIGKILL);
        self.wait().await
    }

    fn signal(&self, signal: Signal) {
        // The guardian is reaped only by wait(), so until then its PID (the
        // group id) cannot be reused; ESRCH means the group is already gone.
        if let Err(err) = killpg(self.group, signal) {
            if err != nix::errno::Errno::ESRCH {
                tracing::warn!(group = self.group.as_raw(), %signal, error = %err, "cannot signal the command's process group");
            }
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.signal(Signal::SIGKILL);
        }
    }
}

/// Exit code for an exit status: the code, or 128 + signal number, as shells do.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1)
}

/// The guardian's whole life: watch for the parent's death, run CMD in this
/// process group, clean the group up, and exit with CMD's status.
pub fn guardian_main(parent: i32, command: &[String]) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tenure guardian: cannot start: {err}");
            return 1;
        }
    };
    runtime.block_on(guard(parent, command))
}

async fn guard(parent: i32, command: &[String]) -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    // Handlers first, so none of these signals can kill the guardian before
    // it has arranged for the job to die with it.
    let (Ok(mut parent_died), Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::user_defined1()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("tenure guardian: cannot install signal handlers");
        return 1;
    };
    if let Err(err) = nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1) {
        eprintln!("tenure guardian: cannot watch the parent process: {err}");
        return 1;
    }
    // The parent may have died before the request above took effect.
    if nix::unistd::getppid().as_raw() != parent {
        return 1;
    }
    let Some((program, args)) = command.split_first() else {
        return 2;
    };
    let mut child = match Command::new(program).args(args).spawn() {
        Ok(child) => child,
        Err(err) => {
            eprintln!("tenure: cannot start {program:?}: {err}");
            return if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    loop {
        tokio::select! {
            status = child.wait() => {
                kill_rest_of_group();
                return match status {
                    Ok(status) => exit_code(status),
                    Err(_) => 1,
                };
            }
            _ = parent_died.recv() => {
                // tenure is gone: nobody renews the lease any more.
                kill_rest_of_group();
                let _ = child.kill().await;
                return 137;
            }
            // The whole group got the signal; CMD decides what to do with it.
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

/// SIGKILL every other process of this process group (Linux: read /proc).
fn kill_rest_of_group() {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state ppid pgrp ...
        let Some(after_name) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let pgrp = after_name
            .split_whitespace()
            .nth(2)
            .and_then(|s| s.parse::<i32>().ok());
        if pgrp == Some(me) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}
