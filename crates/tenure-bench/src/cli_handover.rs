//! The graceful hand-over through the CLI, measured from outside as an
//! operator sees it: SIGTERM to the leader's `tenure run` → the next
//! leader's CMD running its first instruction.
//!
//! Two real `tenure run` processes per round on the bench's private Redis
//! (or SQLite file, where the leader may also be killed: a `kill -9` of
//! its `tenure run`, after which its guardian kills CMD and lets go of the
//! term's lock). The leader runs `sleep`; the follower's CMD is `date +%s%N`, whose first
//! useful instruction prints the time (CLOCK_REALTIME, the clock this
//! process reads too). Starting `date` costs something on its own: the
//! floor, a fork/exec of the same `date` from this process, is measured in
//! the same rounds, and the figure is reported with and without it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tenure::fence::Connection;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::report::{Report, Row};
use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

const ELECTION: &str = "bench-cli-handover";

/// Raw hand-overs (CMD's start included) and the fork/exec floor.
pub struct CliHandovers {
    pub handover: Samples,
    pub floor: Samples,
}

/// The `tenure` binary next to this one (`target/release/tenure` for
/// `target/release/tenure-bench`), if it was built.
pub fn default_binary() -> Option<PathBuf> {
    let path = std::env::current_exe().ok()?.with_file_name("tenure");
    path.is_file().then_some(path)
}

/// `rounds` hand-overs on `url`, each begun by SIGTERM to the leader's
/// `tenure run`.
pub async fn measure(tenure: &Path, url: &str, rounds: usize) -> Result<CliHandovers> {
    measure_ending(tenure, url, rounds, Signal::SIGTERM).await
}

/// `rounds` hand-overs on `url`, each begun by `ending` (SIGTERM or
/// SIGKILL) sent to the leader's `tenure run`.
pub async fn measure_ending(
    tenure: &Path,
    url: &str,
    rounds: usize,
    ending: Signal,
) -> Result<CliHandovers> {
    let store = tenure::Store::open(url)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut admin = store.redis_connection();
    let mut out = CliHandovers {
        handover: Samples::default(),
        floor: Samples::default(),
    };
    for round in 0..rounds {
        let leader_id = format!("a{round}");
        let mut leader = run(tenure, url, &leader_id, &["sleep", "1000"], Stdio::null())?;
        wait_for(&store, "the leader's election", |id| id == Some(&leader_id)).await?;
        let mut follower = run(
            tenure,
            url,
            &format!("b{round}"),
            &["date", "+%s%N"],
            Stdio::piped(),
        )?;
        let stdout = follower.stdout.take().ok_or("no stdout")?;
        wait_until_following(admin.as_mut(), url, &follower).await?;
        let sent = now_ns();
        signal(&leader, ending);
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        let read = stdout.read_line(&mut line);
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .map_err(|_| "the follower's command did not start within 10 s")?
            .map_err(|e| e.to_string())?;
        let started: u128 = line
            .trim()
            .parse()
            .map_err(|_| format!("unexpected output of the follower's command: {line:?}"))?;
        out.handover
            .push(Duration::from_nanos(started.saturating_sub(sent) as u64));
        for (child, what) in [(&mut leader, "leader"), (&mut follower, "follower")] {
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
            let killed = what == "leader" && ending == Signal::SIGKILL;
            if !matches!(status, Ok(Ok(s)) if s.success() || killed) {
                signal(child, Signal::SIGKILL);
                return Err(format!(
                    "the {what}'s tenure run did not exit cleanly: {status:?}"
                ));
            }
        }
        out.floor.push(fork_exec_floor().await?);
    }
    Ok(out)
}

/// `tenure run` of this election, logs off.
fn run(tenure: &Path, url: &str, id: &str, command: &[&str], stdout: Stdio) -> Result<Child> {
    Command::new(tenure)
        .args(["run", "--election", ELECTION, "--redis", url, "--ttl", "2s"])
        .args(["--id", id, "--"])
        .args(command)
        .env("TENURE_LOG", "off")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", tenure.display()))
}

/// Poll the lease until `holds` says yes about its owner's id.
async fn wait_for(
    store: &tenure::Store,
    what: &str,
    holds: impl Fn(Option<&String>) -> bool,
) -> Result<()> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let leader = store
            .leader_of(tenure::DEFAULT_PREFIX, ELECTION)
            .await
            .map_err(|e| e.to_string())?;
        if holds(leader.as_ref().map(|l| &l.id)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > until {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Until the follower has subscribed to the election's announcements (both
/// instances listen; on SQLite, until it has a lock watcher) and has had
/// time to look at the lease and go idle.
async fn wait_until_following(
    admin: Option<&mut Connection>,
    url: &str,
    follower: &Child,
) -> Result<()> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    if let Some(port) = postgres_port(url) {
        // The leader's and the follower's listening sessions.
        while postgres_listeners(port).await? < 2 {
            if tokio::time::Instant::now() > until || follower.id().is_none() {
                return Err("the follower never listened".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        return Ok(());
    }
    let Some(admin) = admin else {
        let pid = follower.id().ok_or("the follower is gone")?;
        while !has_thread(pid, WATCHER_THREAD) {
            if tokio::time::Instant::now() > until {
                return Err("the follower never watched the lock".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        return Ok(());
    };
    let channel = format!("{}:{{{ELECTION}}}:events", tenure::DEFAULT_PREFIX);
    loop {
        let reply: (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(admin)
            .await
            .map_err(|e| e.to_string())?;
        if reply.1 >= 2 {
            break;
        }
        if tokio::time::Instant::now() > until || follower.id().is_none() {
            return Err("the follower never subscribed".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

/// The port of a `postgres://…@127.0.0.1:PORT/…` URL (the bench's own
/// server's).
fn postgres_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("postgres://")?;
    let host = rest.split('/').next()?.rsplit('@').next()?;
    host.rsplit(':').next()?.parse().ok()
}

/// How many sessions listen for tenure's announcements on the server at
/// `port` (each process's listener names itself `tenure listen`).
async fn postgres_listeners(port: u16) -> Result<u64> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        tokio_postgres::NoTls,
    )
    .await
    .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tenure listen'",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    drop(client);
    let _ = driver.await;
    let count: i64 = row.try_get(0).map_err(|e| e.to_string())?;
    Ok(u64::try_from(count).unwrap_or(0))
}

/// The name (as `/proc` shows it, 15 bytes at most) of the thread a SQLite
/// follower waits for its election's lock in.
const WATCHER_THREAD: &str = "tenure-sqlite-w";

/// Whether process `pid` has a thread named `name`.
fn has_thread(pid: u32, name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
    })
}

/// A fork/exec of `date +%s%N` from here until the time it prints.
async fn fork_exec_floor() -> Result<Duration> {
    let sent = now_ns();
    let output = Command::new("date")
        .arg("+%s%N")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run date: {e}"))?;
    let printed: u128 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| "date +%s%N printed no nanoseconds")?;
    Ok(Duration::from_nanos(printed.saturating_sub(sent) as u64))
}

pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

pub(crate) fn signal(child: &Child, signal: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), signal);
    }
}

/// One ending of a section's `tenure run` rows: its name, the signal, the
/// p99 target (ms), and what happens between the signal and the next CMD.
pub struct Ending<'a> {
    pub name: &'a str,
    pub signal: Signal,
    pub target_ms: f64,
    pub how: &'a str,
}

/// The rows of two `tenure run` processes on `url`, one per ending: the
/// leader's `tenure run` ended by the ending's signal, timed until the
/// follower's CMD prints. Left out without a `tenure` binary.
pub async fn ending_rows(
    report: &mut Report,
    label: &str,
    url: &str,
    rounds: usize,
    endings: &[Ending<'_>],
) -> Result<()> {
    let Some(binary) = default_binary() else {
        eprintln!("  {label}: handover through the CLI: left out, no `tenure` binary");
        return Ok(());
    };
    for ending in endings {
        let name = ending.name;
        eprintln!("  {label}: `tenure run` hand-over after {name} ...");
        let cli = measure_ending(&binary, url, rounds, ending.signal).await?;
        report.push(
            Row::latency_target(
                &format!(
                    "{label}: {name} of the leader's `tenure run` → the next leader's CMD \
                     (`date`) prints"
                ),
                &cli.handover,
                None,
                &format!("p99 <= {} ms", ending.target_ms),
                cli.handover.p99() <= ending.target_ms,
            )
            .noted(format!(
                "{rounds} rounds, two real `tenure run` processes (ttl 2 s), timed from the \
                 signal until the follower's CMD prints the time{}. Floor: a fork/exec of the \
                 same `date`, p50 {:.3} ms.",
                ending.how,
                cli.floor.p50()
            )),
        );
    }
    Ok(())
}
