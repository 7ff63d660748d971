//! A semaphore's hand-over through the CLI, as an operator sees it: five
//! `tenure run --slots 3` on the bench's private Redis, three holding a
//! permit (CMD `sleep`), two waiting (CMD `date +%s%N`). One holder's
//! `tenure run` gets SIGTERM (its permit is released and announced) or
//! SIGKILL (its guardian kills CMD, and the permit comes back when its
//! lease expires); the figure runs from the signal until a waiter's CMD
//! prints the time (CLOCK_REALTIME, the clock this process reads too).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tenure::fence::Connection;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::cli_handover::{now_ns, signal};
use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

const SEMAPHORE: &str = "bench-slots";
/// The permits, and the instances (holders and waiters).
const PERMITS: usize = 3;
const INSTANCES: usize = 5;
/// Every instance's ttl.
pub const TTL: Duration = Duration::from_secs(2);

/// `rounds` hand-overs of a permit on `url`, each begun by `ending`
/// (SIGTERM or SIGKILL) sent to one holder's `tenure run`.
pub async fn measure(tenure: &Path, url: &str, rounds: usize, ending: Signal) -> Result<Samples> {
    let store = tenure::Store::open(url)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut admin = store
        .redis_connection()
        .ok_or("the slots hand-over is measured on Redis only")?;
    let permits: Vec<String> = (0..PERMITS)
        .map(|index| tenure::Semaphore::permit_election(SEMAPHORE, index))
        .collect();
    let mut out = Samples::default();
    for round in 0..rounds {
        let mut holders = Vec::new();
        for k in 0..PERMITS {
            holders.push(run(
                tenure,
                url,
                &format!("h{round}-{k}"),
                &["sleep", "1000"],
                Stdio::null(),
            )?);
        }
        wait_until_held(&store, &permits).await?;
        let before = subscribers(&mut admin, &permits).await?;
        let mut waiters = Vec::new();
        let mut outputs = Vec::new();
        for k in PERMITS..INSTANCES {
            let mut waiter = run(
                tenure,
                url,
                &format!("w{round}-{k}"),
                &["date", "+%s%N"],
                Stdio::piped(),
            )?;
            outputs.push(waiter.stdout.take().ok_or("no stdout")?);
            waiters.push(waiter);
        }
        // Both waiters follow every permit's announcements, and had time
        // to look at the leases and go idle.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = subscribers(&mut admin, &permits).await?;
            if now
                .iter()
                .zip(&before)
                .all(|(now, before)| *now >= before + 2)
            {
                break;
            }
            if tokio::time::Instant::now() > until {
                return Err("the waiters never subscribed to every permit".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let sent = now_ns();
        signal(&holders[0], ending);
        let started = first_line(outputs).await?;
        out.push(Duration::from_nanos(started.saturating_sub(sent) as u64));
        for child in holders.iter().chain(&waiters) {
            signal(child, Signal::SIGTERM);
        }
        for (index, child) in holders.iter_mut().chain(waiters.iter_mut()).enumerate() {
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
            let killed = index == 0 && ending == Signal::SIGKILL;
            if !matches!(status, Ok(Ok(s)) if s.success() || killed) {
                signal(child, Signal::SIGKILL);
                return Err(format!(
                    "a `tenure run --slots` did not exit cleanly: {status:?}"
                ));
            }
        }
        // Every permit free again before the next round (a killed
        // holder's lease may still run out).
        wait_until_free(&store, &permits).await?;
    }
    Ok(out)
}

/// `tenure run --slots 3` of the semaphore, logs off.
fn run(tenure: &Path, url: &str, id: &str, command: &[&str], stdout: Stdio) -> Result<Child> {
    let ttl = format!("{}ms", TTL.as_millis());
    Command::new(tenure)
        .args([
            "run",
            "--election",
            SEMAPHORE,
            "--slots",
            "3",
            "--redis",
            url,
        ])
        .args(["--ttl", &ttl, "--id", id, "--"])
        .args(command)
        .env("TENURE_LOG", "off")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", tenure.display()))
}

/// The time the first waiter's CMD printed, in ns since the Unix epoch.
async fn first_line(outputs: Vec<ChildStdout>) -> Result<u128> {
    let mut reads = tokio::task::JoinSet::new();
    for output in outputs {
        reads.spawn(async move {
            let mut line = String::new();
            BufReader::new(output)
                .read_line(&mut line)
                .await
                .map_err(|e| e.to_string())?;
            line.trim()
                .parse::<u128>()
                .map_err(|_| format!("unexpected output of a waiter's command: {line:?}"))
        });
    }
    let first = async {
        let mut last = Err("no waiter".to_string());
        while let Some(read) = reads.join_next().await {
            last = read.map_err(|e| e.to_string()).and_then(|read| read);
            if last.is_ok() {
                break;
            }
        }
        last
    };
    tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .map_err(|_| "no waiter's command started within 10 s")?
}

/// How many connections subscribe to each permit's announcements.
async fn subscribers(admin: &mut Connection, permits: &[String]) -> Result<Vec<u64>> {
    let mut counts = Vec::new();
    for permit in permits {
        let channel = format!("{}:{{{permit}}}:events", tenure::DEFAULT_PREFIX);
        let reply: (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(admin)
            .await
            .map_err(|e| e.to_string())?;
        counts.push(reply.1);
    }
    Ok(counts)
}

/// Until every permit has a holder.
async fn wait_until_held(store: &tenure::Store, permits: &[String]) -> Result<()> {
    wait_for(store, permits, "every permit held", true).await
}

/// Until no permit has a holder.
async fn wait_until_free(store: &tenure::Store, permits: &[String]) -> Result<()> {
    wait_for(store, permits, "every permit free", false).await
}

async fn wait_for(store: &tenure::Store, permits: &[String], what: &str, held: bool) -> Result<()> {
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut all = true;
        for permit in permits {
            let holder = store
                .leader_of(tenure::DEFAULT_PREFIX, permit)
                .await
                .map_err(|e| e.to_string())?;
            all &= holder.is_some() == held;
        }
        if all {
            return Ok(());
        }
        if tokio::time::Instant::now() > until {
            return Err(format!("timed out waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
