//! ZooKeeper's own command-line client (`ZooKeeperMain`, what `zkCli.sh`
//! runs), one command per JVM, for the few znodes a test writes and reads.
//!
//! A JVM per command costs half a second or so; that is cheaper than a
//! client library of our own, and it is ZooKeeper's real client.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::config::cli_args;
use crate::{io_err, Error, Installation};

/// How long one command may take, JVM start included, before its process
/// is killed. The client gives up on its own after about ten seconds
/// without a connection.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// Run `command` (`["create", "/x", "data"]`, `["get", "/x"]`, ...) against
/// the server at 127.0.0.1:`port`; its output (stdout, then stderr), less
/// the client's greeting and connection events. An exit status other than
/// success is an [`Error::Reply`] with that output (`Node does not exist:
/// /x`, `Node already exists: /x`, `KeeperErrorCode = ConnectionLoss ...`).
pub(crate) fn run(
    install: &Installation,
    root: &Path,
    port: u16,
    command: &[&str],
) -> Result<String, Error> {
    let shown = command.join(" ");
    let child = Command::new(&install.java)
        .args(cli_args(install, root, port))
        .args(command)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("starting {}", install.java.display())))?;
    let pid = child.id();
    let (done, output) = mpsc::channel();
    // Waiting (and draining both pipes) on a thread of its own, so that a
    // client that hangs can be killed at the deadline.
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let output = match output.recv_timeout(CLI_TIMEOUT) {
        Ok(output) => output,
        Err(_) => {
            // Still our unreaped child, so the PID is still its own.
            if let Ok(pid) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = output.recv();
            return Err(Error::Reply(format!(
                "`{shown}` on 127.0.0.1:{port} did not finish in {CLI_TIMEOUT:?}"
            )));
        }
    };
    let output = output.map_err(io_err(format!("waiting for `{shown}`")))?;
    let text = clean(&output);
    if output.status.success() {
        Ok(text)
    } else {
        Err(Error::Reply(format!(
            "`{shown}` on 127.0.0.1:{port} exited with {}: {text}",
            output.status
        )))
    }
}

/// The command's own output: the client prints `Connecting to ...`, a
/// `WATCHER::` banner and every connection event to stdout, and the JVM may
/// announce options it picked up from the environment.
fn clean(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    stdout
        .lines()
        .chain(stderr.lines())
        .filter(|line| {
            !(line.trim().is_empty()
                || line.starts_with("Connecting to ")
                || *line == "WATCHER::"
                || line.starts_with("WatchedEvent ")
                || line.starts_with("Picked up "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
