//! The PostgreSQL section: hand-over, takeover after a crash and a 10,000
//! partition set on a private PostgreSQL server (pg-process), beside the
//! same measurement of tenure on a private redis-server started for the
//! section (the baseline column, marked `Redis:`), and PostgreSQL's own
//! floor.
//!
//! - **Floor**: one autocommit `UPDATE` of one row, a round trip on one
//!   connection: the least any operation on the store costs.
//! - **Takeover after a crash**: a network store cannot see a crash, so it
//!   is timed from the lease's expiry (as on Redis).
//! - **Through `tenure run`**: two real processes, the leader's ended by
//!   SIGTERM and by `kill -9`, timed until the follower's CMD prints.
//!
//! The targets are the (graceful p99 <= 5 ms, takeover <= 20 ms
//! after expiry, 10,000 partitions <= 3 % of a core and one statement per
//! interval per thousand; through `tenure run`, the CLI's own p99 <= 10 ms
//! for SIGTERM, and the ttl + 150 ms for `kill -9`); they are
//! reported, not asserted.

use nix::sys::signal::Signal;
use pg_process::PgServer;
use redis_process::RedisServer;

use crate::cli_handover::{self, Ending};
use crate::fixture::{handovers, takeovers};
use crate::plan::Plan;
use crate::report::{Report, Row};
use crate::scale;
use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

/// The hand-over target on PostgreSQL: p99 in ms.
const HANDOVER_P99_MS: f64 = 5.0;
/// The takeover target after expiry: p99 in ms.
const TAKEOVER_P99_MS: f64 = 20.0;
/// The CLI's hand-over target (as on Redis): p99 in ms.
const CLI_HANDOVER_P99_MS: f64 = 10.0;
/// The CLI rounds' ttl (see `cli_handover`), and the allowance
/// after it for a `kill -9`: ms.
const CLI_KILL_P99_MS: f64 = 2_000.0 + 150.0;
/// Target of the partition set's CPU, % of one core.
const SET_CPU_PERCENT: f64 = 3.0;
/// The baseline column's label in this section.
const REDIS: &str = "Redis";

/// `n` autocommit updates of one row, on one connection.
async fn floor(url: &str, n: usize) -> Result<Samples> {
    let err = |e: tokio_postgres::Error| e.to_string();
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(err)?;
    let driver = tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_floor (k int PRIMARY KEY, v bigint); \
             INSERT INTO bench_floor VALUES (1, 0) ON CONFLICT DO NOTHING",
        )
        .await
        .map_err(err)?;
    let mut samples = Samples::default();
    for _ in 0..n {
        let t = std::time::Instant::now();
        client
            .simple_query("UPDATE bench_floor SET v = v + 1 WHERE k = 1")
            .await
            .map_err(err)?;
        samples.push(t.elapsed());
    }
    drop(client);
    let _ = driver.await;
    Ok(samples)
}

/// The PostgreSQL section.
pub(crate) async fn section(plan: &Plan, report: &mut Report) -> Result<()> {
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot start Redis: {e}"))?;
    let pg = tokio::task::spawn_blocking(PgServer::start)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot start PostgreSQL: {e}"))?;
    let outcome = measure(plan, report, &pg, &redis).await;
    tokio::task::spawn_blocking(move || drop((redis, pg)))
        .await
        .map_err(|e| e.to_string())?;
    outcome
}

async fn measure(
    plan: &Plan,
    report: &mut Report,
    pg: &PgServer,
    redis: &RedisServer,
) -> Result<()> {
    let url = pg.url();
    let redis_url = redis.url();
    let label = "postgres";
    let version = pg.sql("SHOW server_version").map_err(|e| e.to_string())?;
    eprintln!(
        "tenure-bench: PostgreSQL {version} on port {}, redis-server on port {}",
        pg.port(),
        redis.port()
    );

    eprintln!("  {label}: floor ...");
    let floor = floor(&url, plan.ops).await?;
    report.push(
        Row::latency(
            &format!("{label}: floor: one autocommit UPDATE of one row"),
            &floor,
            None,
        )
        .noted(format!(
            "PostgreSQL {version}, a private server on 127.0.0.1 (fsync off: the bench \
             measures tenure, not the disk), one connection, simple query protocol."
        )),
    );

    eprintln!("  {label}: handover after resign (Redis, then PostgreSQL) ...");
    let redis_handover = handovers(&redis_url, plan.handovers).await?;
    let handover = handovers(&url, plan.handovers).await?;
    report.push(
        Row::latency_target(
            &format!("{label}: handover after graceful resign"),
            &handover,
            Some(&redis_handover),
            &format!("p99 <= {HANDOVER_P99_MS} ms (issue)"),
            handover.p99() <= HANDOVER_P99_MS,
        )
        .against(REDIS)
        .noted(format!(
            "{} rounds on each store, the same code (as the single-node row): two instances \
             (ttl 5 s), resign() on the leader's term until the follower's campaign() returns. \
             On PostgreSQL a resign is one call of tenure_resign, whose NOTIFY reaches the \
             follower's listening session at commit; the follower acquires in one call. \
             PostgreSQL p90: {:.3} ms; p50 over the floor's p50: {:.1}.",
            plan.handovers,
            handover.p90(),
            handover.p50() / floor.p50()
        )),
    );

    eprintln!("  {label}: takeover after a crash (Redis, then PostgreSQL) ...");
    let redis_takeover = takeovers(&redis_url, plan.crashes).await?;
    let takeover = takeovers(&url, plan.crashes).await?;
    report.push(
        Row::latency_target(
            &format!("{label}: takeover after a crash, from the lease's expiry"),
            &takeover,
            Some(&redis_takeover),
            &format!("p99 <= {TAKEOVER_P99_MS} ms (issue)"),
            takeover.p99() <= TAKEOVER_P99_MS,
        )
        .against(REDIS)
        .noted(format!(
            "{} rounds on each store: a leader (ttl 1 s) on a runtime of its own vanishes \
             100-400 ms after its election; timed from when its lease expired (the crash \
             plus the ttl left, read from the store) to the follower's campaign() returning. \
             The follower, told the lease's time left, tries again at its expiry.",
            plan.crashes
        )),
    );

    cli_rows(plan, report, &url).await?;
    let pids = (scale::known([pg.pid()]), scale::known([redis.pid()]));
    scale_rows(plan, report, &url, &redis_url, pids).await
}

/// Two `tenure run` on the server: the leader's ended by SIGTERM, and by
/// `kill -9`, until the follower's CMD prints.
async fn cli_rows(plan: &Plan, report: &mut Report, url: &str) -> Result<()> {
    let endings = [
        Ending {
            name: "SIGTERM",
            signal: Signal::SIGTERM,
            target_ms: CLI_HANDOVER_P99_MS,
            how: ": the leader's tenure stops its CMD, resigns, and the NOTIFY wakes the follower",
        },
        Ending {
            name: "kill -9",
            signal: Signal::SIGKILL,
            target_ms: CLI_KILL_P99_MS,
            how: ": the leader's guardian stops its CMD at once; nobody resigns, so the \
                  follower is elected at the lease's expiry (issue: ttl + 150 ms)",
        },
    ];
    cli_handover::ending_rows(report, "postgres", url, plan.crashes, &endings).await
}

/// A set of 10,000 partitions in one process, on PostgreSQL and on Redis
/// (with the server processes of each: `pids`).
async fn scale_rows(
    plan: &Plan,
    report: &mut Report,
    url: &str,
    redis_url: &str,
    (pids, redis_pids): (Vec<u32>, Vec<u32>),
) -> Result<()> {
    let label = "postgres";
    let n = plan.cluster_partitions;
    eprintln!("  {label}: a set of {n} partitions in one process (Redis, then PostgreSQL) ...");
    let redis_set =
        scale::run_child(redis_url, "tenure", n, plan.scale_seconds, &redis_pids).await?;
    let set = scale::run_child(url, "tenure", n, plan.scale_seconds, &pids).await?;
    let held = format!("{label}: {n} partitions held by one member");
    report.push(
        Row::plain(
            &format!("{held}: CPU, % of one core"),
            set.cpu_percent,
            Some(redis_set.cpu_percent),
            &format!("<= {SET_CPU_PERCENT} % (issue)"),
            set.cpu_percent <= SET_CPU_PERCENT,
        )
        .against(REDIS)
        .noted(format!(
            "One process holding every partition of one PartitionSet (ttl 3 s, a renewal cycle \
             per second), measured over {} s once all are held; CPU (user + system) and peak \
             RSS are the process's own (a child of the bench), not the server's. Redis: the \
             same set on the section's redis-server.",
            plan.scale_seconds
        )),
    );
    report.push(scale::store_cpu_row(
        &format!(
            "{held}: the PostgreSQL server's CPU meanwhile, backends included (Redis: \
             redis-server's), % of one core"
        ),
        &set,
        Some(&redis_set),
    ));
    report.push(
        Row::plain(
            &format!("{held}: peak RSS, MB"),
            set.peak_rss_mb,
            Some(redis_set.peak_rss_mb),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS),
    );
    let per_thousand = (n as f64 / 1_000.0).ceil();
    report.push(
        Row::plain(
            &format!("{held}: round trips per renew interval"),
            set.round_trips_per_interval,
            Some(redis_set.round_trips_per_interval),
            &format!("<= {per_thousand} (issue: one statement per interval per 1,000)"),
            set.round_trips_per_interval <= per_thousand + 0.5,
        )
        .against(REDIS)
        .noted(
            "The set's own count (PartitionObserver::round_trips): on PostgreSQL, one call of \
             tenure_renew_many (an UPDATE … FROM unnest) per batch of up to 1,000 renewals, \
             pipelined on one connection.",
        ),
    );
    Ok(())
}
