//! The guardian: the process between `tenure run` and CMD that makes sure
//! CMD never outlives the lease, even when tenure itself cannot act.
//!
//! tenure stops CMD on time as long as it runs. The guardian covers the
//! cases where it does not: tenure stopped (SIGSTOP, a debugger, a freezer
//! acting on it alone), wedged, or killed. It runs in its own process group
//! and
//!
//! - is started **before** the term it serves, while tenure still
//!   campaigns, and waits on the channel (see [`crate::supervisor`]) for
//!   `start`: the term's first kill instant and its fencing token. So the
//!   only process start left between winning the lease and CMD running is
//!   CMD's own. Should the channel close before `start`, it exits without
//!   running anything;
//! - is a **child subreaper**, so everything CMD starts, including processes
//!   that escape CMD's process group with `setsid` or a double fork, stays
//!   below it, where it can find and kill them;
//! - starts CMD in `tenure run`'s **cgroup** when there is one: it moves
//!   into the cgroup while it waits for its term (a move takes milliseconds,
//!   which the hand-over must not wait for), forks CMD there (a child is born
//!   in its parent's cgroup), and moves back out right after, so that it is
//!   out of the reach of `cgroup.kill` before it ever uses it. Every kill
//!   below then starts with `cgroup.kill`, which takes the whole tree at
//!   once, forks in flight included;
//! - keeps the **kill instant** tenure last sent over the channel and, when
//!   it comes without an extension, SIGKILLs CMD's whole tree on its own and
//!   tells tenure so;
//! - treats the **channel closing** as tenure's death: nobody renews the
//!   lease any more, so it kills the tree at once;
//! - when CMD exits, kills whatever CMD left behind, then tells tenure that
//!   the tree is gone (so that tenure can resign without waiting for this
//!   process to exit) and exits with CMD's status.
//!
//! It ignores SIGTERM, SIGINT and SIGHUP: what to do on those is CMD's
//! decision (tenure signals CMD's processes directly), and the guardian must
//! stay until CMD's tree is gone. Only SIGKILL ends it early, and tenure
//! handles that (see [`crate::supervisor::Ended::GuardianDied`]).
//!
//! It runs a single-threaded runtime and no logging: it is on the path of
//! every hand-over.

use std::ffi::OsString;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Chain, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::signal::unix::Signal;
use tokio::time::{sleep_until, Instant};

use tenure_procs::cgroup::Cgroup;

use crate::cli::GuardianArgs;
use crate::supervisor::{
    children_left, connect, exit_code, instant_of, kill_job, reap_orphans, receive_start,
    DEADLINE_MESSAGE, EXITED_MESSAGE,
};

/// Exit status when the guardian killed CMD (as if CMD got SIGKILL).
const KILLED: i32 = 128 + 9;

/// Exit status when tenure let go of the guardian before its term began:
/// CMD never ran.
const NOT_STARTED: i32 = 0;

/// Exit status when CMD could not be started (as shells report it).
const CANNOT_EXECUTE: i32 = 126;

/// The guardian's whole life; returns its exit status.
pub fn main(args: &GuardianArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            crate::output::err_line(&format!("tenure guardian: cannot start: {err}"));
            return 1;
        }
    };
    let cgroup = args
        .cgroup
        .as_ref()
        .map(|dir| (Cgroup::at(dir), args.cgroup_required));
    runtime.block_on(guard(&args.channel, &args.command, cgroup))
}

/// The signals a guardian outlives: it ignores them while it is
/// responsible for a job.
struct Ignored {
    term: Signal,
    int: Signal,
    hup: Signal,
}

/// The guardian's end of its channel to tenure: lines from tenure, and
/// the half it writes to.
struct Channel {
    messages: Lines<BufReader<Chain<std::io::Cursor<Vec<u8>>, OwnedReadHalf>>>,
    writer: OwnedWriteHalf,
}

async fn guard(channel: &str, command: &[OsString], cgroup: Option<(Cgroup, bool)>) -> i32 {
    use tokio::signal::unix::{signal, SignalKind};
    // Handlers before anything else, so none of these signals can end the
    // guardian while it is responsible for a job.
    let (Ok(term), Ok(int), Ok(hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        crate::output::err_line("tenure guardian: cannot install signal handlers");
        return 1;
    };
    let mut ignored = Ignored { term, int, hup };
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        crate::output::err_line(&format!(
            "tenure guardian: cannot become a child subreaper: {err}"
        ));
        return 1;
    }
    let entered = match enter_cgroup(cgroup) {
        Ok(entered) => entered,
        Err(code) => return code,
    };
    // tenure may be gone already; then there is nobody to run CMD for.
    // (Started by hand, the guardian has nobody to run CMD for either: say
    // so rather than exit 0 having run nothing.)
    let channel = match connect(channel) {
        Ok(channel) => channel,
        Err(err) => {
            crate::output::err_line(&format!(
                "tenure: __guardian is internal to `tenure run` and cannot reach its \
                 channel {channel:?} ({err}); nothing was run"
            ));
            return crate::exit::USAGE;
        }
    };
    let (reader, writer) = channel.into_split();
    // Standby until tenure wins a term, or lets go of this guardian. The
    // term's OS lock (SQLite) may come with `start`: it is kept open until
    // CMD's tree is gone, so that no follower on this host takes over while
    // CMD may still run, and closed then (see `watch`).
    let received = {
        let receiving = receive_start(&reader);
        tokio::pin!(receiving);
        loop {
            tokio::select! {
                received = &mut receiving => break received,
                _ = ignored.term.recv() => {}
                _ = ignored.int.recv() => {}
                _ = ignored.hup.recv() => {}
            }
        }
    };
    let Ok((read, lock)) = received else {
        return NOT_STARTED;
    };
    let Some(end) = read.iter().position(|byte| *byte == b'\n') else {
        return NOT_STARTED;
    };
    let Some(start) = parse_start(&String::from_utf8_lossy(&read[..end])) else {
        return NOT_STARTED;
    };
    let rest = std::io::Cursor::new(read[end + 1..].to_vec());
    let mut channel = Channel {
        messages: BufReader::new(rest.chain(reader)).lines(),
        writer,
    };
    let kill_at = instant_of(start.kill_at);
    if Instant::now() >= kill_at {
        let _ = channel
            .writer
            .write_all(format!("{DEADLINE_MESSAGE}\n").as_bytes())
            .await;
        return KILLED;
    }
    let (child, cgroup) = match start_cmd(command, &start, entered).await {
        Ok(started) => started,
        Err(code) => return code,
    };
    let guarded = Guarded {
        child,
        cgroup: cgroup.as_ref(),
        lock,
    };
    watch(guarded, kill_at, &mut channel, &mut ignored).await
}

/// Into the cgroup now, while the term has not begun: a move between
/// cgroups takes milliseconds (the kernel synchronises with every CPU),
/// and CMD, born in it, must not wait for one. The guardian leaves again
/// once CMD has started (see the module docs). The cgroup entered, if any;
/// the exit status if it is required and could not be entered.
fn enter_cgroup(cgroup: Option<(Cgroup, bool)>) -> Result<Option<Cgroup>, i32> {
    let mut entered = None;
    if let Some((group, required)) = cgroup {
        match group.enter() {
            Ok(()) => entered = Some(group),
            Err(err) if required => {
                crate::output::err_line(&format!(
                    "tenure: cannot put the command in cgroup {}: {err}",
                    group.dir().display()
                ));
                return Err(CANNOT_EXECUTE);
            }
            // `--cgroup auto`: the subreaper still holds the tree.
            Err(_) => {}
        }
    }
    Ok(entered)
}

/// Start CMD with its term's token and election, then leave the cgroup
/// `entered` (CMD stays in it). CMD and its cgroup; the exit status if
/// either step failed.
async fn start_cmd(
    command: &[OsString],
    start: &Start,
    entered: Option<Cgroup>,
) -> Result<(Child, Option<Cgroup>), i32> {
    let Some((program, args)) = command.split_first() else {
        return Err(2);
    };
    let mut cmd = Command::new(program);
    cmd.args(args).env("TENURE_TOKEN", start.token.to_string());
    if let Some(election) = &start.election {
        cmd.env("TENURE_ELECTION", election);
    }
    if let Some(slot) = &start.slot {
        cmd.env("TENURE_SLOT", slot);
    }
    let spawned = cmd.spawn();
    if let Some(group) = &entered {
        if let Err(err) = group.leave() {
            // Still inside, a kill of the cgroup would take this process
            // too: give up on this term rather than guard it from inside.
            crate::output::err_line(&format!(
                "tenure guardian: cannot leave cgroup {}: {err}",
                group.dir().display()
            ));
            if let Ok(mut child) = spawned {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            return Err(CANNOT_EXECUTE);
        }
    }
    let cgroup = entered;
    let child = match spawned {
        Ok(child) => child,
        Err(err) => {
            crate::output::err_line(&format!("tenure: cannot start {program:?}: {err}"));
            return Err(if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                CANNOT_EXECUTE
            });
        }
    };
    Ok((child, cgroup))
}

/// What a guardian guards: CMD, its cgroup, and the term's OS lock
/// (SQLite), closed as soon as CMD's tree is gone: a follower on this host
/// waiting for the lock then starts its CMD without waiting for this
/// process to exit.
struct Guarded<'a> {
    child: Child,
    cgroup: Option<&'a Cgroup>,
    lock: Option<std::os::fd::OwnedFd>,
}

/// Guard the running CMD until it exits (its status is the guardian's), or
/// kill its whole job at `kill_at` (moved by each `kill-at` from tenure) or
/// as soon as tenure is gone.
async fn watch(
    guarded: Guarded<'_>,
    mut kill_at: Instant,
    channel: &mut Channel,
    ignored: &mut Ignored,
) -> i32 {
    let Guarded {
        mut child,
        cgroup,
        lock,
    } = guarded;
    let me = std::process::id() as i32;
    let deadline = sleep_until(kill_at);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            status = child.wait() => {
                // CMD is reaped; anything it left behind is a child of
                // ours now (we are its subreaper). Usually nothing is, and
                // then there is nothing to look for in /proc.
                if children_left() || cgroup.is_some_and(Cgroup::populated) {
                    kill_job(me, cgroup).await;
                    reap_orphans();
                }
                drop(lock);
                let code = match status {
                    Ok(status) => exit_code(status),
                    Err(_) => 1,
                };
                // The tree is gone: tenure may resign before this process
                // has finished exiting.
                let message = format!("{EXITED_MESSAGE} {code}\n");
                let _ = tokio::time::timeout(
                    Duration::from_millis(100),
                    channel.writer.write_all(message.as_bytes()),
                )
                .await;
                return code;
            }
            message = channel.messages.next_line() => match message {
                Ok(Some(line)) => {
                    if let Some(at) = parse_kill_at(&line) {
                        kill_at = instant_of(at);
                        deadline.as_mut().reset(kill_at);
                    }
                }
                // tenure is gone (or broke the channel): nobody renews the
                // lease any more.
                Ok(None) | Err(_) => {
                    kill_job(me, cgroup).await;
                    let _ = child.wait().await;
                    reap_orphans();
                    drop(lock);
                    return KILLED;
                }
            },
            () = &mut deadline => {
                kill_job(me, cgroup).await;
                let message = format!("{DEADLINE_MESSAGE}\n");
                let _ = tokio::time::timeout(
                    Duration::from_millis(100),
                    channel.writer.write_all(message.as_bytes()),
                )
                .await;
                let _ = child.wait().await;
                reap_orphans();
                return KILLED;
            }
            _ = ignored.term.recv() => {}
            _ = ignored.int.recv() => {}
            _ = ignored.hup.recv() => {}
        }
    }
}

/// The message that begins a term.
#[derive(Debug, PartialEq, Eq)]
struct Start {
    /// The first kill instant (CLOCK_MONOTONIC ns).
    kill_at: u64,
    /// The term's fencing token, CMD's `TENURE_TOKEN`.
    token: u64,
    /// The term's election, CMD's `TENURE_ELECTION` (absent from a `tenure`
    /// of before `--slots`: the variable it was started with stays).
    election: Option<String>,
    /// With `--cron`, the slot this run is for, CMD's `TENURE_SLOT`
    /// (RFC 3339, UTC).
    slot: Option<String>,
}

/// `start NS TOKEN [ELECTION [SLOT]]`.
fn parse_start(line: &str) -> Option<Start> {
    let mut words = line.strip_prefix("start ")?.split_whitespace();
    let kill_at = words.next()?.parse().ok()?;
    let token = words.next()?.parse().ok()?;
    let election = words.next().map(str::to_owned);
    let slot = words.next().map(str::to_owned);
    if words.next().is_some() {
        return None;
    }
    Some(Start {
        kill_at,
        token,
        election,
        slot,
    })
}

/// `kill-at NS` → NS.
fn parse_kill_at(line: &str) -> Option<u64> {
    line.strip_prefix("kill-at ")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_kill_instants_are_taken() {
        assert_eq!(parse_kill_at("kill-at 123456789"), Some(123_456_789));
        assert_eq!(parse_kill_at("kill-at -1"), None);
        assert_eq!(parse_kill_at("deadline"), None);
    }

    #[test]
    fn a_term_starts_only_with_a_kill_instant_and_a_token() {
        let start = |election: Option<&str>| Start {
            kill_at: 123_456_789,
            token: 42,
            election: election.map(str::to_owned),
            slot: None,
        };
        assert_eq!(parse_start("start 123456789 42"), Some(start(None)));
        assert_eq!(
            parse_start("start 123456789 42 exports/permit-2"),
            Some(start(Some("exports/permit-2")))
        );
        assert_eq!(parse_start("start 123456789"), None);
        assert_eq!(parse_start("start x 42"), None);
        assert_eq!(
            parse_start("start 123456789 42 a 2026-12-03T02:00:00Z"),
            Some(Start {
                slot: Some("2026-12-03T02:00:00Z".into()),
                ..start(Some("a"))
            })
        );
        assert_eq!(parse_start("start 123456789 42 a b c"), None);
        assert_eq!(parse_start("kill-at 123456789"), None);
    }
}
