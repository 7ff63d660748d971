//! The hand-over, takeover and scale rows on the topologies a store URL can
//! name besides one server: a Sentinel group (`redis+sentinel://`) and a
//! Redis Cluster (`redis+cluster://`), each a set of private processes
//! started for its section and stopped after it.
//!
//! The measurements are the single-node ones, run on the topology's URL, so
//! the rows compare line by line. The naive baseline is not repeated: it
//! polls every ttl/3 whatever the topology, so its figures would be the
//! single-node ones. What the topologies add: on Sentinel, nothing on the
//! data path (clients ask the sentinels for the primary, then talk to it
//! directly); on a cluster, announcements on sharded pub/sub (`SPUBLISH`
//! on the shard of the election's slot) and, for a partition set, renewals
//! split by slot and sent as one pipeline per primary.

use redis_process::{slot_of, RedisCluster, SentinelGroup};

use crate::fixture::{connect, floor, handovers, takeovers, HANDOVER_ELECTION};
use crate::plan::Plan;
use crate::report::{Report, Row};
use crate::scale;
use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

/// Hand-over target, as on one server: p99 in ms.
const HANDOVER_P99_MS: f64 = 10.0;
/// Takeover target after lease expiry, as on one server: p99 in ms.
const TAKEOVER_P99_MS: f64 = 20.0;

/// Sentinel: 1 primary, 1 replica, 3 sentinels.
pub(crate) async fn sentinel(plan: &Plan, report: &mut Report) -> Result<()> {
    let (group, primary) = tokio::task::spawn_blocking(|| {
        let group = SentinelGroup::start()?;
        let primary = group.primary_port()?;
        Ok::<_, redis_process::Error>((group, primary))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("cannot start a Sentinel group: {e}"))?;
    let url = group.url();
    eprintln!("tenure-bench: Sentinel group {url}, primary on port {primary}");
    let label = "sentinel";

    eprintln!("  {label}: floor on the primary ...");
    floor_row(report, label, "on the primary", primary, plan.ops).await?;
    eprintln!("  {label}: handover after resign ...");
    let handover = handovers(&url, plan.handovers).await?;
    handover_row(report, label, &handover);
    eprintln!("  {label}: takeover after a crash ...");
    let takeover = takeovers(&url, plan.crashes).await?;
    takeover_row(report, label, &takeover);

    stop(group).await
}

/// Cluster: 3 primaries, 3 replicas.
pub(crate) async fn cluster(plan: &Plan, report: &mut Report) -> Result<()> {
    // The node serving the hand-over election's keys (`PREFIX:{NAME}:...`).
    let slot = slot_of(format!("{{{HANDOVER_ELECTION}}}"));
    let (cluster, node, primaries) = tokio::task::spawn_blocking(move || {
        let cluster = RedisCluster::start()?;
        let node = cluster.primary_of_slot(slot)?;
        let primaries = cluster.primary_ports()?.len();
        Ok::<_, redis_process::Error>((cluster, node, primaries))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("cannot start a Redis Cluster: {e}"))?;
    let url = cluster.url();
    eprintln!("tenure-bench: Redis Cluster {url}, {primaries} primaries");
    let label = "cluster";

    eprintln!("  {label}: floor on the hand-over election's primary ...");
    floor_row(
        report,
        label,
        "on the hand-over election's primary",
        node,
        plan.ops,
    )
    .await?;
    eprintln!("  {label}: handover after resign ...");
    let handover = handovers(&url, plan.handovers).await?;
    handover_row(report, label, &handover);
    eprintln!("  {label}: takeover after a crash ...");
    let takeover = takeovers(&url, plan.crashes).await?;
    takeover_row(report, label, &takeover);

    let n = plan.cluster_partitions;
    eprintln!("  {label}: a set of {n} partitions in one process ...");
    let pids = scale::known(cluster.nodes().iter().map(|node| node.pid()));
    let set = scale::run_child(&url, "tenure", n, plan.scale_seconds, &pids).await?;
    scale_rows(report, label, &set, primaries);

    stop(cluster).await
}

/// PING and EVALSHA round trips on one node of the topology, straight to
/// its port: what a command costs there without any routing.
async fn floor_row(report: &mut Report, label: &str, on: &str, port: u16, n: usize) -> Result<()> {
    let conn = connect(&format!("redis://127.0.0.1:{port}")).await?;
    let (_, evalsha, _) = floor(&conn, n, 0).await?;
    report.push(Row::latency(
        &format!("{label}: floor: EVALSHA of `return 1` {on}"),
        &evalsha,
        None,
    ));
    Ok(())
}

fn handover_row(report: &mut Report, label: &str, samples: &Samples) {
    report.push(Row::percentiles(
        &format!("{label}: handover after graceful resign"),
        samples,
        &format!("p99 <= {HANDOVER_P99_MS} ms"),
        Some(samples.p99() <= HANDOVER_P99_MS),
    ));
}

fn takeover_row(report: &mut Report, label: &str, samples: &Samples) {
    report.push(Row::percentiles(
        &format!("{label}: takeover after a crash, from lease expiry"),
        samples,
        &format!("p99 <= {TAKEOVER_P99_MS} ms"),
        Some(samples.p99() <= TAKEOVER_P99_MS),
    ));
}

/// The partition set's figures. CPU and RSS are held to the single-node
/// targets for 10,000 elections; round trips to one per primary.
fn scale_rows(report: &mut Report, label: &str, set: &scale::ScaleFigures, primaries: usize) {
    let n = set.elections;
    report.push(Row::plain(
        &format!("{label}: {n} partitions: CPU, % of one core"),
        set.cpu_percent,
        None,
        "<= 2 % (as 1 node)",
        set.cpu_percent <= 2.0,
    ));
    report.push(scale::store_cpu_row(
        &format!("{label}: {n} partitions: the nodes' CPU meanwhile (all six), % of one core"),
        set,
        None,
    ));
    report.push(Row::plain(
        &format!("{label}: {n} partitions: peak RSS, MB"),
        set.peak_rss_mb,
        None,
        "<= 32 MB (as 1 node)",
        set.peak_rss_mb <= 32.0,
    ));
    let per_cycle = set
        .round_trips_per_cycle
        .unwrap_or(set.round_trips_per_interval);
    report.push(Row::plain(
        &format!("{label}: {n} partitions: Redis round trips per renew interval (counted per renewal cycle)"),
        per_cycle,
        None,
        &format!("<= {primaries} (one per primary)"),
        per_cycle <= primaries as f64,
    ));
    report.push(
        Row::plain(
            &format!("{label}: {n} partitions: renewal cycles per renew interval"),
            set.cycles_per_interval.unwrap_or(f64::NAN),
            None,
            "",
            true,
        )
        .targeted(false),
    );
}

/// Stop every process of a topology (its `Drop` kills them by PID and
/// removes their directories) off the async threads.
async fn stop<T: Send + 'static>(topology: T) -> Result<()> {
    tokio::task::spawn_blocking(move || drop(topology))
        .await
        .map_err(|e| e.to_string())
}
