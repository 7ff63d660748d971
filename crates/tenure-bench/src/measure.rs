//! Every measurement, tenure and the naive baseline side by side, on one
//! private redis-server started for the run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use redis::aio::MultiplexedConnection;
use redis_process::RedisServer;
use tenure::Election;
use tokio::time::Instant;

use crate::cli_handover;
use crate::etcd;
use crate::fixture::{
    connect, election, first_term, floor, handover_floor, handovers, idle_requests,
    requests_during, samples_len_jitter, takeovers,
};
use crate::naive::NaiveElection;
use crate::peers;
use crate::plan::{Plan, Section};
use crate::postgres;
use crate::report::{Machine, Report, Row};
use crate::scale;
use crate::serve_handover;
use crate::slots_handover;
use crate::sqlite;
use crate::stats::Samples;
use crate::svg::{Chart, Kind, Series};
use crate::topology;
use crate::zk;

type Result<T> = std::result::Result<T, String>;

/// Run the `sections` asked for (all when none is named), in the order
/// single, sentinel, cluster, etcd, zk; each starts its own Redis and stops it after.
/// The error is for what stops the whole run; a section's own failure is
/// in [`Report::failures`].
pub async fn all(
    quick: bool,
    tenure_binary: Option<PathBuf>,
    sections: &[Section],
) -> Result<Report> {
    let started = std::time::Instant::now();
    let sections: Vec<Section> = Section::ALL
        .into_iter()
        .filter(|s| sections.is_empty() || sections.contains(s))
        .collect();
    let plan = Plan::new(quick);
    // Read the library's own renewal latencies from its metrics. Installed
    // for the whole run, so every section measures with the same recorder.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = &recorder.snapshotter();
    recorder.install().map_err(|e| e.to_string())?;
    let mut report = Report::new(Machine::describe(), quick, sections.clone());
    eprintln!(
        "tenure-bench: {} mode",
        if quick { "quick" } else { "full" }
    );
    // A section that fails is reported and the next one runs: a long run
    // keeps what it measured.
    for section in sections {
        let t = std::time::Instant::now();
        let outcome = match section {
            Section::Single => single(&plan, snapshotter, tenure_binary.clone(), &mut report).await,
            Section::Sentinel => topology::sentinel(&plan, &mut report).await,
            Section::Cluster => topology::cluster(&plan, &mut report).await,
            Section::Etcd => etcd::section(&plan, &mut report).await,
            Section::Zk => zk::section(&plan, &mut report).await,
            Section::Sqlite => sqlite::section(&plan, &mut report).await,
            Section::Postgres => postgres::section(&plan, &mut report).await,
            Section::Peers => peers::section(&plan, &mut report).await,
        };
        if let Err(err) = outcome {
            eprintln!("tenure-bench: the {} section failed: {err}", section.name());
            report.failures.push(format!("{}: {err}", section.name()));
        }
        eprintln!(
            "  ({} rows: {:.0} s)",
            section.name(),
            t.elapsed().as_secs_f64()
        );
    }
    report.seconds = started.elapsed().as_secs_f64();
    eprintln!("tenure-bench: done in {:.0} s", report.seconds);
    Ok(report)
}

/// Every row on one private redis-server, section by section.
async fn single(
    plan: &Plan,
    snapshotter: &metrics_util::debugging::Snapshotter,
    tenure_binary: Option<PathBuf>,
    report: &mut Report,
) -> Result<()> {
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = server.url();
    let conn = connect(&url).await?;
    eprintln!("tenure-bench: redis-server on port {}", server.port());
    let (evalsha, evalsha_idle) = floor_rows(report, plan, &conn).await?;
    operation_rows(
        report,
        plan,
        snapshotter,
        &url,
        &conn,
        &evalsha,
        &evalsha_idle,
    )
    .await?;
    handover_rows(report, plan, &url, &conn, &evalsha).await?;
    cli_rows(report, plan, tenure_binary, &url).await?;
    takeover_rows(report, plan, &url, &conn, &evalsha).await?;
    load_rows(report, plan, server.port(), &url, &conn).await?;
    let store: Vec<u32> = server.pid().into_iter().collect();
    scale_rows(report, plan, &url, &store).await?;
    drop(server);
    Ok(())
}

/// The floor's rows: PING and EVALSHA round trips, busy and after 20 ms
/// idle. Returns the EVALSHA samples, busy and idle, that later rows
/// compare with.
async fn floor_rows(
    report: &mut Report,
    plan: &Plan,
    conn: &MultiplexedConnection,
) -> Result<(Samples, Samples)> {
    eprintln!("  floor ...");
    let (ping, evalsha, evalsha_idle) = floor(conn, plan.ops, plan.idle_ops).await?;
    report.push(Row::latency("floor: PING round trip", &ping, None));
    report.push(Row::latency("floor: EVALSHA of `return 1`", &evalsha, None));
    report.push(Row::latency(
        "floor: EVALSHA after 20 ms idle",
        &evalsha_idle,
        None,
    ));
    Ok((evalsha, evalsha_idle))
}

/// The operations' rows: the scripts' round trips, the keeper's renewals
/// and the public API's calls, each beside the naive baseline's, and their
/// ratios to the floor.
async fn operation_rows(
    report: &mut Report,
    plan: &Plan,
    snapshotter: &metrics_util::debugging::Snapshotter,
    url: &str,
    conn: &MultiplexedConnection,
    evalsha: &Samples,
    evalsha_idle: &Samples,
) -> Result<()> {
    eprintln!("  operations ...");
    let scripts = script_operations(conn, url, plan.ops).await?;
    let keeper = keeper_renewals(url, snapshotter, plan.idle_ops).await?;
    let ops = operations(url, plan.ops).await?;
    let naive_ops = naive_operations(conn, plan.ops, plan.idle_ops).await?;
    let floor_p50 = evalsha.p50();
    report.push(Row::latency(
        "acquire script round trip (naive: SET NX PX)",
        &scripts.acquire,
        Some(&naive_ops.acquire),
    ));
    report.push(Row::latency(
        "renew script round trip (naive: renew script)",
        &scripts.renew,
        Some(&naive_ops.renew),
    ));
    report.push(Row::latency(
        "renewal as the keeper makes it, every 20 ms (naive: its heartbeat)",
        &keeper,
        Some(&naive_ops.renew_idle),
    ));
    report.push(Row::ratio(
        "acquire p50 / EVALSHA floor p50",
        scripts.acquire.p50() / floor_p50,
        naive_ops.acquire.p50() / floor_p50,
        "<= 1.3",
        |v| v <= 1.3,
    ));
    report.push(Row::ratio(
        "keeper renewal p50 / idle EVALSHA floor p50",
        keeper.p50() / evalsha_idle.p50(),
        naive_ops.renew_idle.p50() / evalsha_idle.p50(),
        "<= 1.3",
        |v| v <= 1.3,
    ));
    report.push(Row::latency(
        "try_campaign: acquire + start the term (naive: SET NX PX)",
        &ops.acquire,
        Some(&naive_ops.acquire),
    ));
    report.push(Row::latency(
        "confirm: renewal through the keeper (naive: renew script)",
        &ops.renew,
        Some(&naive_ops.renew),
    ));
    report.push(Row::latency(
        "resign (naive: release script)",
        &ops.resign,
        Some(&naive_ops.resign),
    ));
    report.push(Row::latency(
        "leader lookup (naive: GET)",
        &ops.leader,
        Some(&naive_ops.leader),
    ));
    Ok(())
}

/// The hand-over after a graceful resign: its row and its chart, beside
/// the naive baseline and the floor (`evalsha`).
async fn handover_rows(
    report: &mut Report,
    plan: &Plan,
    url: &str,
    conn: &MultiplexedConnection,
    evalsha: &Samples,
) -> Result<()> {
    eprintln!("  handover after resign ...");
    let handover = handovers(url, plan.handovers).await?;
    let naive_handover = naive_handovers(conn, plan.naive_handovers).await?;
    report.push(Row::latency_target(
        "handover after graceful resign",
        &handover,
        Some(&naive_handover),
        "p99 <= 10 ms",
        handover.p99() <= 10.0,
    ));
    let floor = handover_floor(url, plan.handovers).await?;
    report.push(Row::latency(
        "floor: after 30 ms idle, EVALSHA that publishes → a subscriber's EVALSHA answered",
        &floor,
        None,
    ));
    // Issue 30 asks for 4 times the busy EVALSHA floor; the hand-over's own
    // floor (release, announcement, acquisition by clients just woken)
    // says how much of it is tenure's.
    report.push(Row::plain(
        "handover p50 / EVALSHA floor p50",
        handover.p50() / evalsha.p50(),
        None,
        "<= 4 (issue 30)",
        handover.p50() / evalsha.p50() <= 4.0,
    ));
    report.push(
        Row::plain(
            "handover p50 / the hand-over floor's p50",
            handover.p50() / floor.p50(),
            None,
            "",
            true,
        )
        .targeted(false),
    );
    let machine = report.machine.short(plan.quick);
    report.charts.push(Chart {
        file: "handover",
        title: "Hand-over after a graceful resign".into(),
        subtitle: machine,
        x_label: "resign() called → the follower's campaign() returns".into(),
        series: vec![
            Series {
                label: "tenure: the release is announced (ttl 5 s)".into(),
                kind: Kind::Tenure,
                samples: handover.clone(),
            },
            Series {
                label: "naive: followers poll every ttl/3 (ttl 3 s)".into(),
                kind: Kind::Naive,
                samples: naive_handover.clone(),
            },
            Series {
                label: "floor: one EVALSHA round trip".into(),
                kind: Kind::Floor,
                samples: evalsha.clone(),
            },
        ],
    });
    Ok(())
}

/// A semaphore's permit handed over through the CLI: five `tenure run
/// --slots 3`, one holder ended by SIGTERM, then by SIGKILL.
async fn slots_rows(report: &mut Report, plan: &Plan, binary: &Path, url: &str) -> Result<()> {
    let ttl_ms = slots_handover::TTL.as_millis() as f64;
    let endings = [
        (
            "SIGTERM",
            Signal::SIGTERM,
            plan.cli_handovers,
            20.0,
            "released and announced",
        ),
        (
            "SIGKILL",
            Signal::SIGKILL,
            plan.crashes,
            ttl_ms + 150.0,
            "taken when its lease expires",
        ),
    ];
    for (name, signal, rounds, target_ms, how) in endings {
        eprintln!("  a permit handed over after {name} of a `tenure run --slots 3` ...");
        let samples = slots_handover::measure(binary, url, rounds, signal).await?;
        report.push(
            Row::latency_target(
                &format!(
                    "slots: {name} of a holder's `tenure run --slots 3` → a waiter's CMD (`date`) prints"
                ),
                &samples,
                None,
                &format!("p99 <= {target_ms} ms"),
                samples.p99() <= target_ms,
            )
            .noted(format!(
                "{rounds} rounds of five real `tenure run --slots 3` (ttl 2 s), three holding a \
                 permit and two waiting; the permit is {how}."
            )),
        );
    }
    Ok(())
}

/// The hand-over through the CLI, `tenure run` and `tenure serve`, with
/// their floors; left out without a `tenure` binary.
async fn cli_rows(
    report: &mut Report,
    plan: &Plan,
    tenure_binary: Option<PathBuf>,
    url: &str,
) -> Result<()> {
    match tenure_binary.or_else(cli_handover::default_binary) {
        Some(binary) => {
            eprintln!("  handover through the CLI ({}) ...", binary.display());
            let cli = cli_handover::measure(&binary, url, plan.cli_handovers).await?;
            report.push(Row::latency(
                "floor: fork/exec of `date +%s%N` until it prints",
                &cli.floor,
                None,
            ));
            report.push(Row::percentiles(
                "CLI: SIGTERM of the leader's `tenure run` → the next leader's CMD (`date`) prints",
                &cli.handover,
                "p50 <= 5, p99 <= 10 ms",
                Some(cli.handover.p50() <= 5.0 && cli.handover.p99() <= 10.0),
            ));
            let floor = Duration::from_secs_f64(cli.floor.p50() / 1000.0);
            report.push(Row::percentiles(
                "CLI: the same, less the fork/exec floor p50",
                &cli.handover.less(floor),
                "",
                None,
            ));
            eprintln!("  handover through `tenure serve` ...");
            let serve = serve_handover::measure(&binary, url, plan.cli_handovers).await?;
            report.push(Row::latency(
                "floor: one HTTP request and answer to `tenure serve` on a new connection",
                &serve.floor,
                None,
            ));
            report.push(Row::percentiles(
                "serve: SIGTERM of the leader's `tenure serve` → the follower's event stream says is_leader (reconnection included)",
                &serve.handover,
                "p99 <= 10 ms",
                Some(serve.handover.p99() <= 10.0),
            ));
            slots_rows(report, plan, &binary, url).await?;
        }
        None => eprintln!(
            "  handover through the CLI: left out, no `tenure` binary next to this one \
             (cargo build --release -p tenure-cli, or --tenure PATH)"
        ),
    }
    Ok(())
}

/// The takeover after a crash: its row and its chart, beside the naive
/// baseline and the floor (`evalsha`).
async fn takeover_rows(
    report: &mut Report,
    plan: &Plan,
    url: &str,
    conn: &MultiplexedConnection,
    evalsha: &Samples,
) -> Result<()> {
    eprintln!("  takeover after a crash ...");
    let takeover = takeovers(url, plan.crashes).await?;
    let naive_takeover = naive_takeovers(conn, plan.crashes).await?;
    report.push(Row::latency_target(
        "takeover after a crash, from lease expiry",
        &takeover,
        Some(&naive_takeover),
        "p99 <= 20 ms",
        takeover.p99() <= 20.0,
    ));
    let machine = report.machine.short(plan.quick);
    report.charts.push(Chart {
        file: "takeover",
        title: "Takeover after the leader crashed".into(),
        subtitle: machine,
        x_label: "the crashed leader's lease expires → a follower is elected".into(),
        series: vec![
            Series {
                label: "tenure: followers sleep until the expiry (ttl 1 s)".into(),
                kind: Kind::Tenure,
                samples: takeover.clone(),
            },
            Series {
                label: "naive: followers poll every ttl/3 (ttl 1 s)".into(),
                kind: Kind::Naive,
                samples: naive_takeover.clone(),
            },
            Series {
                label: "floor: one EVALSHA round trip".into(),
                kind: Kind::Floor,
                samples: evalsha.clone(),
            },
        ],
    });
    Ok(())
}

/// The Redis requests of an idle leader and an idle follower, per ttl and
/// per second, counted with MONITOR on `port`.
async fn load_rows(
    report: &mut Report,
    plan: &Plan,
    port: u16,
    url: &str,
    conn: &MultiplexedConnection,
) -> Result<()> {
    eprintln!("  Redis load of idle elections ...");
    let load = load(port, url, conn, plan.load_ttl, plan.load_terms).await?;
    report.push(Row::plain(
        "idle leader: Redis requests per lease ttl",
        load.leader,
        Some(load.naive_leader),
        "<= 3",
        load.leader <= 3.0,
    ));
    report.push(Row::plain(
        "idle follower: Redis requests per lease ttl",
        load.follower,
        Some(load.naive_follower),
        "<= 1",
        load.follower <= 1.0,
    ));
    let ttl_s = plan.load_ttl.as_secs();
    report.push(
        Row::plain(
            &format!("idle leader: requests per second (ttl {ttl_s} s)"),
            load.leader_per_s,
            Some(load.naive_leader_per_s),
            "",
            true,
        )
        .targeted(false),
    );
    report.push(
        Row::plain(
            &format!("idle follower: requests per second (ttl {ttl_s} s)"),
            load.follower_per_s,
            Some(load.naive_follower_per_s),
            "",
            true,
        )
        .targeted(false),
    );
    Ok(())
}

/// Many elections in one process, at each scale of the plan: CPU, peak RSS
/// and round trips per renew interval, and the CPU of redis-server (`store`)
/// meanwhile, against the targets.
async fn scale_rows(report: &mut Report, plan: &Plan, url: &str, store: &[u32]) -> Result<()> {
    for &n in &plan.scales {
        eprintln!("  {n} elections in one process ...");
        let tenure = scale::run_child(url, "tenure", n, plan.scale_seconds, store).await?;
        let naive = if plan.naive_scales.contains(&n) {
            Some(scale::run_child(url, "naive", n, plan.scale_seconds, store).await?)
        } else {
            None
        };
        // The targets (issue "one keeper"): 10,000 elections at <= 2 % of a
        // core and <= 32 MB, 100,000 at <= 10 % and <= 160 MB, and (issue
        // 30) redis-server below half a core at 100,000; other scales are
        // reported. One round trip per renew interval up to 10,000; a
        // longer pipeline goes in slices of 10,000 renewals, one round trip
        // each, so that the client never holds all of it at once (that was
        // about 60 MB of the 100,000's peak RSS).
        let (cpu, rss) = match n {
            10_000 => (Some(("<= 2 %", 2.0)), Some(("<= 32 MB", 32.0))),
            100_000 => (Some(("<= 10 %", 10.0)), Some(("<= 160 MB", 160.0))),
            _ => (None, None),
        };
        let (store_target, store_limit) = match n {
            100_000 => ("< 50 %", 50.0),
            _ => ("", f64::MAX),
        };
        let targeted = cpu.is_some();
        type Figure = fn(&scale::ScaleFigures) -> f64;
        let (cpu_target, cpu_limit) = cpu.unwrap_or(("", f64::MAX));
        let (rss_target, rss_limit) = rss.unwrap_or(("", f64::MAX));
        // Renewals that fail are retried within the interval, so a little
        // above the count is the odd retry.
        let slices = n.div_ceil(10_000).max(1);
        let trips_target = match slices {
            1 => "<= 1".to_string(),
            _ => format!("<= {slices} (1 per 10,000)"),
        };
        let figures: [(&str, Figure, &str, f64); 4] = [
            (
                "CPU, % of one core",
                |s| s.cpu_percent,
                cpu_target,
                cpu_limit,
            ),
            (
                "redis-server's CPU meanwhile, % of one core",
                |s| s.store_cpu_percent.unwrap_or(f64::NAN),
                store_target,
                store_limit,
            ),
            ("peak RSS, MB", |s| s.peak_rss_mb, rss_target, rss_limit),
            (
                "Redis round trips per renew interval",
                |s| s.round_trips_per_interval,
                &trips_target,
                slices as f64 * 1.05,
            ),
        ];
        for (label, figure, target, limit) in figures {
            report.push(
                Row::plain(
                    &format!("{n} elections: {label}"),
                    figure(&tenure),
                    naive.as_ref().map(figure),
                    target,
                    figure(&tenure) <= limit,
                )
                .targeted(targeted),
            );
        }
    }
    Ok(())
}

#[derive(Default)]
struct Ops {
    acquire: Samples,
    renew: Samples,
    /// Naive only: renewals after 20 ms idle, as its heartbeat makes them.
    renew_idle: Samples,
    resign: Samples,
    leader: Samples,
}

/// The library's own scripts, sent over the same kind of connection as
/// the floor: the protocol's round trip without any client machinery.
#[derive(Default)]
struct ScriptOps {
    acquire: Samples,
    renew: Samples,
}

/// End to end through the public API: `try_campaign` (acquire and start the
/// term's keeper), `resign`, `confirm` (a renewal requested through the
/// keeper) and `leader`.
async fn operations(url: &str, n: usize) -> Result<Ops> {
    let e = election(url, "bench-ops", "bench", Duration::from_secs(5)).await?;
    first_term(&e)
        .await?
        .resign()
        .await
        .map_err(|e| e.to_string())?;
    let mut ops = Ops::default();
    for _ in 0..n {
        let t = Instant::now();
        let term = e
            .try_campaign()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("acquire lost to nobody")?;
        ops.acquire.push(t.elapsed());
        let t = Instant::now();
        term.resign().await.map_err(|e| e.to_string())?;
        ops.resign.push(t.elapsed());
    }
    let term = e.campaign().await.map_err(|e| e.to_string())?;
    for _ in 0..n {
        let t = Instant::now();
        term.confirm().await.map_err(|e| e.to_string())?;
        ops.renew.push(t.elapsed());
        let t = Instant::now();
        e.leader().await.map_err(|e| e.to_string())?;
        ops.leader.push(t.elapsed());
    }
    term.resign().await.map_err(|e| e.to_string())?;
    Ok(ops)
}

/// The acquire and renew scripts' round trips on a plain connection.
async fn script_operations(conn: &MultiplexedConnection, url: &str, n: usize) -> Result<ScriptOps> {
    // Past the start-up grace period first, through the library.
    let e = election(url, "bench-scripts", "bench", Duration::from_secs(5)).await?;
    first_term(&e)
        .await?
        .resign()
        .await
        .map_err(|e| e.to_string())?;
    let keys = [
        "tenure:{bench-scripts}:lease",
        "tenure:{bench-scripts}:token",
        "tenure:{bench-scripts}:epoch",
        "tenure:epoch",
        "tenure:{bench-scripts}:witness",
    ];
    macro_rules! script {
        ($file:literal) => {
            redis::Script::new(concat!(
                include_str!("../../tenure/src/backend/redis/scripts/prelude.lua"),
                include_str!(concat!("../../tenure/src/backend/redis/scripts/", $file))
            ))
        };
    }
    let acquire = redis::Script::new(concat!(
        include_str!("../../tenure/src/backend/redis/scripts/prelude.lua"),
        include_str!("../../tenure/src/backend/redis/scripts/acquire_one.lua"),
        include_str!("../../tenure/src/backend/redis/scripts/acquire.lua")
    ));
    let renew = script!("renew.lua");
    let resign = script!("resign.lua");
    let mut conn = conn.clone();
    let mut ops = ScriptOps::default();
    for attempt in 0..n {
        let t = Instant::now();
        let reply: Vec<redis::Value> = acquire
            .key(keys[0])
            .key(keys[1])
            .key(keys[2])
            .key(keys[3])
            .key(keys[4])
            .arg("bench")
            .arg(5000)
            .arg("tenure:{bench-scripts}:events")
            .arg(format!("bench.{attempt}"))
            .arg(5000)
            .arg(86_400_000)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        ops.acquire.push(t.elapsed());
        let token = match reply.get(1) {
            Some(redis::Value::Int(token)) => *token,
            _ => return Err("unexpected acquire reply".into()),
        };
        let t = Instant::now();
        let _: redis::Value = renew
            .key(keys[0])
            .key(keys[4])
            .key(keys[3])
            .arg("bench")
            .arg(token)
            .arg(5000)
            .arg(86_400_000)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        ops.renew.push(t.elapsed());
        let _: i64 = resign
            .key(keys[0])
            .key(keys[4])
            .arg("bench")
            .arg(token)
            .arg("tenure:{bench-scripts}:events")
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(ops)
}

/// Renewals as the keeper of a term makes them, read from the library's
/// own `leader_election_renew_duration_seconds` histogram.
async fn keeper_renewals(
    url: &str,
    snapshotter: &metrics_util::debugging::Snapshotter,
    n: usize,
) -> Result<Samples> {
    // The shortest ttl allowed and a renewal every 20 ms, so that renewals
    // come often; nothing else runs meanwhile.
    let ttl = Duration::from_millis(100);
    let e = Election::builder("bench-keeper")
        .redis(url)
        .ttl(ttl)
        .renew_every(Duration::from_millis(20))
        .margin(Duration::from_millis(10))
        .id("keeper")
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let term = first_term(&e).await?;
    snapshotter.snapshot();
    tokio::time::sleep(e.renew_every() * n as u32).await;
    let mut samples = Samples::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let is_ours = key.key().name() == "leader_election_renew_duration_seconds"
            && key
                .key()
                .labels()
                .any(|l| l.key() == "name" && l.value() == "bench-keeper");
        if let (true, metrics_util::debugging::DebugValue::Histogram(values)) = (is_ours, value) {
            for v in values {
                samples.push(Duration::from_secs_f64(v.into_inner()));
            }
        }
    }
    term.resign().await.map_err(|e| e.to_string())?;
    Ok(samples)
}

async fn naive_operations(conn: &MultiplexedConnection, n: usize, idle_n: usize) -> Result<Ops> {
    let e = NaiveElection::new(conn.clone(), "ops", "bench", Duration::from_secs(5));
    let mut ops = Ops::default();
    for _ in 0..n {
        let t = Instant::now();
        e.acquire().await.map_err(|e| e.to_string())?;
        ops.acquire.push(t.elapsed());
        let t = Instant::now();
        e.release().await.map_err(|e| e.to_string())?;
        ops.resign.push(t.elapsed());
    }
    e.acquire().await.map_err(|e| e.to_string())?;
    for _ in 0..n {
        let t = Instant::now();
        e.renew().await.map_err(|e| e.to_string())?;
        ops.renew.push(t.elapsed());
        let t = Instant::now();
        e.leader().await.map_err(|e| e.to_string())?;
        ops.leader.push(t.elapsed());
    }
    for _ in 0..idle_n {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        e.renew().await.map_err(|e| e.to_string())?;
        ops.renew_idle.push(t.elapsed());
    }
    e.release().await.map_err(|e| e.to_string())?;
    Ok(ops)
}

async fn naive_handovers(conn: &MultiplexedConnection, rounds: usize) -> Result<Samples> {
    let ttl = Duration::from_secs(3);
    let a = NaiveElection::new(conn.clone(), "handover", "a", ttl);
    let b = NaiveElection::new(conn.clone(), "handover", "b", ttl);
    a.campaign().await.map_err(|e| e.to_string())?;
    let (mut leader, mut follower) = (a, b);
    let mut samples = Samples::default();
    for _ in 0..rounds {
        let waiting = tokio::spawn({
            let follower = follower.clone();
            async move {
                let outcome = follower.campaign().await;
                (Instant::now(), outcome)
            }
        });
        // Release at a random point of the follower's polling cycle.
        tokio::time::sleep(Duration::from_millis(
            30 + (samples_len_jitter(rounds) % 900),
        ))
        .await;
        let t = Instant::now();
        leader.release().await.map_err(|e| e.to_string())?;
        let (elected, outcome) = waiting.await.map_err(|e| e.to_string())?;
        outcome.map_err(|e| e.to_string())?;
        samples.push(elected - t);
        std::mem::swap(&mut leader, &mut follower);
    }
    leader.release().await.map_err(|e| e.to_string())?;
    Ok(samples)
}

async fn naive_takeovers(conn: &MultiplexedConnection, rounds: usize) -> Result<Samples> {
    let ttl = Duration::from_secs(1);
    let mut samples = Samples::default();
    let mut raw = conn.clone();
    for round in 0..rounds {
        let name = format!("crash-{round}");
        let crashing = NaiveElection::new(conn.clone(), &name, "crashing", ttl);
        crashing.acquire().await.map_err(|e| e.to_string())?;
        let keeper = tokio::spawn(async move { crashing.keep().await });
        // Followers start at a random point of the leader's renewal cycle.
        tokio::time::sleep(Duration::from_millis(samples_len_jitter(round) % 333)).await;
        let follower = NaiveElection::new(conn.clone(), &name, "follower", ttl);
        let key = follower.key().to_string();
        let waiting = tokio::spawn(async move {
            let outcome = follower.campaign().await;
            (Instant::now(), outcome)
        });
        // The crash: no more renewals. The lease expires after its PTTL.
        tokio::time::sleep(Duration::from_millis(
            100 + samples_len_jitter(round + 7) % 500,
        ))
        .await;
        keeper.abort();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .map_err(|e| e.to_string())?;
        let expiry = Instant::now() + Duration::from_millis(pttl.max(0) as u64);
        let (elected, outcome) = waiting.await.map_err(|e| e.to_string())?;
        outcome.map_err(|e| e.to_string())?;
        samples.push(elected.saturating_duration_since(expiry));
    }
    Ok(samples)
}

struct Load {
    leader: f64,
    follower: f64,
    naive_leader: f64,
    naive_follower: f64,
    leader_per_s: f64,
    follower_per_s: f64,
    naive_leader_per_s: f64,
    naive_follower_per_s: f64,
}

async fn load(
    port: u16,
    url: &str,
    conn: &MultiplexedConnection,
    ttl: Duration,
    terms: u32,
) -> Result<Load> {
    let window = ttl * terms;
    let per_term = |commands: f64| commands / f64::from(terms);
    let per_s = |commands: f64| commands / window.as_secs_f64();

    let (leader, both) = idle_requests(url, ttl, window, |w| requests_during(port, w)).await?;

    let na = NaiveElection::new(conn.clone(), "load", "a", ttl);
    na.acquire().await.map_err(|e| e.to_string())?;
    let keeper = tokio::spawn({
        let na = na.clone();
        async move { na.keep().await }
    });
    tokio::time::sleep(ttl / 2).await;
    let naive_leader = requests_during(port, window).await?;
    let nb = NaiveElection::new(conn.clone(), "load", "b", ttl);
    let poller = tokio::spawn(async move { nb.campaign().await });
    tokio::time::sleep(ttl / 2).await;
    let naive_both = requests_during(port, window).await?;
    poller.abort();
    keeper.abort();

    Ok(Load {
        leader: per_term(leader),
        follower: per_term(both - leader),
        naive_leader: per_term(naive_leader),
        naive_follower: per_term(naive_both - naive_leader),
        leader_per_s: per_s(leader),
        follower_per_s: per_s(both - leader),
        naive_leader_per_s: per_s(naive_leader),
        naive_follower_per_s: per_s(naive_both - naive_leader),
    })
}
