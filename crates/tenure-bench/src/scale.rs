//! Many elections in one process: CPU share, peak RSS and Redis round
//! trips per renew interval, and the CPU share of the store's server
//! processes over the same window (a client that is cheap because its
//! server is saturated is not cheap). Each measurement runs in a child
//! process of its own, so that its peak RSS is its own. On etcd and ZooKeeper the
//! child also counts the requests the members received during its window
//! (etcd's metrics, ZooKeeper's four-letter words), and on ZooKeeper the
//! sessions it holds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::etcd_metrics::{self, ByMethod};
use crate::naive::NaiveElection;
use crate::report::Row;
use crate::zk_metrics::{self, Counts};

/// Lease ttl of the scale runs; renewals every ttl/3.
const TTL: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScaleFigures {
    pub elections: usize,
    pub held: usize,
    pub cpu_percent: f64,
    /// The store's server processes (with their children: PostgreSQL's
    /// backends), summed, over the same window; `None` without a server
    /// (SQLite) or when no process was named.
    #[serde(default)]
    pub store_cpu_percent: Option<f64>,
    pub peak_rss_mb: f64,
    pub round_trips_per_interval: f64,
    /// Partition sets only ([`tenure::PartitionObserver::cycles`]): renewal
    /// cycles per renew interval (one, unless renewals were retried).
    pub cycles_per_interval: Option<f64>,
    /// Partition sets only: round trips per renewal cycle (on a Redis
    /// Cluster, one per primary holding some of the set's leases).
    pub round_trips_per_cycle: Option<f64>,
    /// etcd only: gRPC requests the members received per renew interval
    /// (`grpc_server_msg_received_total`, summed over members), by method.
    #[serde(default)]
    pub server_requests_per_interval: Option<BTreeMap<String, f64>>,
    /// ZooKeeper only: packets the members received per renew interval
    /// (and the sessions connected at the window's end).
    #[serde(default)]
    pub zk_per_interval: Option<Counts>,
}

/// The row of the store's CPU over a set's window (`figure` names it),
/// beside the same set's on Redis when `redis` is given (a figure, not a
/// target: the targets are the client's, and the 100,000 row's on one
/// redis-server).
pub fn store_cpu_row(figure: &str, set: &ScaleFigures, redis: Option<&ScaleFigures>) -> Row {
    let row = Row::plain(
        figure,
        set.store_cpu_percent.unwrap_or(f64::NAN),
        redis.map(|r| r.store_cpu_percent.unwrap_or(f64::NAN)),
        "",
        true,
    )
    .targeted(false);
    match redis {
        Some(_) => row.against("Redis"),
        None => row,
    }
}

/// The process ids of `pids` that are known (a server not started has none).
pub fn known(pids: impl IntoIterator<Item = Option<u32>>) -> Vec<u32> {
    pids.into_iter().flatten().collect()
}

/// Run `tenure-bench scale-child` and read its figures; `store` names the
/// store's server processes (none for SQLite), whose CPU is measured too.
pub async fn run_child(
    url: &str,
    design: &str,
    elections: usize,
    seconds: u64,
    store: &[u32],
) -> Result<ScaleFigures, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(["scale-child", "--redis", url, "--design", design])
        .args([
            "--elections",
            &elections.to_string(),
            "--seconds",
            &seconds.to_string(),
        ]);
    if !store.is_empty() {
        let pids: Vec<String> = store.iter().map(u32::to_string).collect();
        command.args(["--store-pids", &pids.join(",")]);
    }
    let output = command
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!(
            "scale run ({design}, {elections}) failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    serde_json::from_slice(&output.stdout).map_err(|e| format!("scale run output: {e}"))
}

/// The child's side: hold `elections` elections, then measure a steady
/// window of `seconds`.
pub async fn child(
    url: &str,
    design: &str,
    elections: usize,
    seconds: u64,
    store: Vec<u32>,
) -> Result<ScaleFigures, String> {
    let names: Vec<String> = (0..elections)
        .map(|i| format!("scale-{design}-{i}"))
        .collect();
    let held = Arc::new(AtomicU64::new(0));
    let round_trips = Arc::new(AtomicU64::new(0));
    let stop = tokio_stop();
    match design {
        "tenure" => tenure_child(url, names, elections, seconds, held, stop, store).await,
        "naive" => naive_child(url, names, elections, seconds, held, round_trips, store).await,
        other => Err(format!("unknown design {other:?}")),
    }
}

/// The child's side for tenure: one partition set holding every election
/// (`names`); `stop` ends it.
async fn tenure_child(
    url: &str,
    names: Vec<String>,
    elections: usize,
    seconds: u64,
    held: Arc<AtomicU64>,
    stop: (
        tokio::sync::oneshot::Sender<()>,
        tokio::sync::oneshot::Receiver<()>,
    ),
    store: Vec<u32>,
) -> Result<ScaleFigures, String> {
    let set = tenure::PartitionSet::builder(format!("scale-{elections}"), names)
        .redis(url)
        .ttl(TTL)
        .id("scale")
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let observer = set.observer();
    let stop_rx = stop.1;
    tokio::spawn(set.run(
        |_partition, term| async move {
            term.lost().await;
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    wait_until(
        || observer.owned_count() == elections,
        TTL * 4 + Duration::from_secs(elections as u64 / 2_000),
    )
    .await
    .map_err(|err| format!("{err} ({} of {elections} held)", observer.owned_count()))?;
    let members = Members {
        etcd: etcd_metrics::metrics_endpoints(url),
        zk: zk_metrics::members_of(url),
        store,
    };
    let figures = window(seconds, &members, || {
        (observer.round_trips(), observer.cycles())
    })
    .await?;
    held.store(observer.owned_count() as u64, Ordering::Relaxed);
    let _ = stop.0.send(());
    Ok(finish(
        elections,
        held.load(Ordering::Relaxed) as usize,
        figures,
    ))
}

/// The child's side for the naive baseline: one task per election
/// (`names`), one command per election per tick.
async fn naive_child(
    url: &str,
    names: Vec<String>,
    elections: usize,
    seconds: u64,
    held: Arc<AtomicU64>,
    round_trips: Arc<AtomicU64>,
    store: Vec<u32>,
) -> Result<ScaleFigures, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    for name in &names {
        let e = NaiveElection::new(conn.clone(), name, "scale", TTL);
        let (held, round_trips) = (held.clone(), round_trips.clone());
        // One task per election, one command per election per tick.
        tokio::spawn(async move {
            round_trips.fetch_add(1, Ordering::Relaxed);
            if !matches!(e.acquire().await, Ok(true)) {
                return;
            }
            held.fetch_add(1, Ordering::Relaxed);
            loop {
                tokio::time::sleep(TTL / 3).await;
                round_trips.fetch_add(1, Ordering::Relaxed);
                if !matches!(e.renew().await, Ok(true)) {
                    return;
                }
            }
        });
    }
    let total = elections as u64;
    wait_until(|| held.load(Ordering::Relaxed) == total, TTL * 4).await?;
    let members = Members {
        store,
        ..Members::default()
    };
    let figures = window(seconds, &members, || {
        (round_trips.load(Ordering::Relaxed), 0)
    })
    .await?;
    Ok(finish(
        elections,
        held.load(Ordering::Relaxed) as usize,
        figures,
    ))
}

fn tokio_stop() -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::sync::oneshot::Receiver<()>,
) {
    tokio::sync::oneshot::channel()
}

async fn wait_until(mut done: impl FnMut() -> bool, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("not all elections were held within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The members that count what they receive, of the store the child
/// uses, and the store's server processes.
#[derive(Default)]
struct Members {
    etcd: Option<Vec<String>>,
    zk: Option<Vec<String>>,
    store: Vec<u32>,
}

/// What a steady window saw: CPU and wall seconds, round trips and renewal
/// cycles (0 when the design has no cycles to count), and the requests the
/// etcd or ZooKeeper members received, when the store is one of those.
struct Window {
    cpu: f64,
    /// The store's server processes' CPU seconds, if any were named.
    store_cpu: Option<f64>,
    wall: f64,
    trips: u64,
    cycles: u64,
    server: Option<ByMethod>,
    zk: Option<Counts>,
}

/// Measure a steady window; `counters` reads (round trips, cycles). When
/// there are cycles, the window starts half a renew interval after one
/// begins, away from the instant a cycle counts itself and its round trips
/// (and, the window being whole intervals, so does it end). The etcd
/// `members`' metrics are read at both ends (a few milliseconds each, no
/// gRPC request), or the ZooKeeper members' four-letter words.
async fn window(
    seconds: u64,
    members: &Members,
    counters: impl Fn() -> (u64, u64),
) -> Result<Window, String> {
    let (_, cycles) = counters();
    if cycles > 0 {
        let _ = wait_until(|| counters().1 != cycles, TTL).await;
        tokio::time::sleep(TTL / 6).await;
    }
    let server0 = match &members.etcd {
        Some(members) => Some(etcd_metrics::scrape(members).await?),
        None => None,
    };
    let zk0 = match &members.zk {
        Some(members) => Some(zk_metrics::Snapshot::read(members).await?),
        None => None,
    };
    let store0 = store_cpu_seconds(&members.store);
    let (cpu0, (trips0, cycles0), t0) = (cpu_seconds(), counters(), Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (trips1, cycles1) = counters();
    let (cpu1, wall) = (cpu_seconds(), t0.elapsed().as_secs_f64());
    let store1 = store_cpu_seconds(&members.store);
    let server = match (&members.etcd, server0) {
        (Some(members), Some(before)) => Some(etcd_metrics::scrape(members).await?.minus(&before)),
        _ => None,
    };
    let zk = match (&members.zk, zk0) {
        (Some(members), Some(before)) => {
            Some(zk_metrics::Snapshot::read(members).await?.since(&before))
        }
        _ => None,
    };
    Ok(Window {
        cpu: cpu1 - cpu0,
        store_cpu: (!members.store.is_empty()).then_some(store1 - store0),
        wall,
        trips: trips1 - trips0,
        cycles: cycles1 - cycles0,
        server,
        zk,
    })
}

fn finish(elections: usize, held: usize, w: Window) -> ScaleFigures {
    let intervals = w.wall / (TTL / 3).as_secs_f64();
    let counted = w.cycles > 0;
    ScaleFigures {
        elections,
        held,
        cpu_percent: w.cpu / w.wall * 100.0,
        store_cpu_percent: w.store_cpu.map(|cpu| cpu / w.wall * 100.0),
        peak_rss_mb: peak_rss_mb(),
        round_trips_per_interval: w.trips as f64 / intervals,
        cycles_per_interval: counted.then(|| w.cycles as f64 / intervals),
        round_trips_per_cycle: counted.then(|| w.trips as f64 / w.cycles as f64),
        server_requests_per_interval: w.server.map(|s| s.scaled(1.0 / intervals).0),
        zk_per_interval: w.zk.map(|c| c.scaled(1.0 / intervals)),
    }
}

/// User + system CPU time of this process (Linux /proc).
fn cpu_seconds() -> f64 {
    Stat::read("self").map_or(0.0, |stat| stat.cpu_seconds)
}

/// User + system CPU time of the process `pid` (Linux /proc; 0 when it
/// is gone).
pub(crate) fn cpu_seconds_of(pid: u32) -> f64 {
    Stat::read(&pid.to_string()).map_or(0.0, |stat| stat.cpu_seconds)
}

/// User + system CPU time of the processes `pids` and of their children
/// alive now (PostgreSQL's backends are children of its postmaster).
pub(crate) fn store_cpu_seconds(pids: &[u32]) -> f64 {
    if pids.is_empty() {
        return 0.0;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|name| {
            let pid: u32 = name.parse().ok()?;
            let stat = Stat::read(&name)?;
            (pids.contains(&pid) || pids.contains(&stat.ppid)).then_some(stat.cpu_seconds)
        })
        .sum()
}

/// What the bench reads of `/proc/PID/stat`.
struct Stat {
    ppid: u32,
    cpu_seconds: f64,
}

impl Stat {
    /// `/proc/{pid}/stat`, if the process is there.
    fn read(pid: &str) -> Option<Stat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the command name: state(0) ppid(1) ... utime(11) stime(12),
        // in clock ticks.
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
            .sum();
        Some(Stat {
            ppid: fields.get(1)?.parse().ok()?,
            // USER_HZ, which Linux fixes at 100 for /proc.
            cpu_seconds: ticks / 100.0,
        })
    }
}

/// Peak resident set size of this process in MB (VmHWM).
fn peak_rss_mb() -> f64 {
    peak_rss_mb_of("self")
}

/// Peak resident set size of the process `pid` (a number, or `self`) in
/// MB (VmHWM); NaN when it is gone.
pub(crate) fn peak_rss_mb_of(pid: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
