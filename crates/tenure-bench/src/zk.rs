//! The ZooKeeper section: hand-over, takeover, idle requests and a 10,000
//! partition set on a private 3-member ZooKeeper ensemble, each beside the
//! same measurement of tenure on a private redis-server started for the
//! section (the baseline column, marked `Redis:`), and ZooKeeper's own
//! floors.
//!
//! The measurements are the single-node ones wherever they carry over
//! (hand-over, the Redis takeover, the idle windows, the scale child), run
//! on the `zk://` URL. What ZooKeeper needs of its own:
//!
//! - **Floors**, with a client of the bench's own (the library's
//!   `zookeeper-client`): a create (one Zab write) and a create seen by a
//!   persistent watch on another session, the least any watch-driven
//!   hand-over can cost.
//! - **Takeover from session expiry**: on ZooKeeper the session is the
//!   lease, and its expiry is the ensemble's decision (no earlier than the
//!   timeout after the last packet, which may be a ping the client sent on
//!   its own, on the next tick boundary), invisible to a client as a TTL.
//!   So the bench watches the lease znode on a session of its own and
//!   counts from the instant its deletion arrives, as the etcd section
//!   does with its key.
//! - **Requests**, counted where they arrive (`zk_metrics.rs`): every
//!   packet the members received, which includes the pings a ZooKeeper
//!   client sends by itself on an idle session; a window of the same
//!   length with no tenure process and no session of the bench's is
//!   measured first and subtracted, so the four-letter words that count
//!   are shown to count nothing.
//!
//! The ensemble ticks every 100 ms, as in the library's tests: sessions
//! expire on tick boundaries, and a 1 s ttl lies well within its session
//! timeouts. The targets are the (graceful p99 <= 5 ms, takeover
//! <= 20 ms after expiry, <= 1 request per renew interval for an idle
//! leader and none for an idle follower, and for 10,000 partitions one
//! session, <= 3 % of a core, <= 64 MB); they are reported, not asserted.

use std::time::Duration;

use redis_process::RedisServer;
use tokio::time::Instant;
use zk_process::ZkEnsemble;
use zookeeper_client as zk;

use crate::fixture::{
    connect, election, floor, handovers, idle_requests, redis_idle, samples_len_jitter, takeovers,
    Arrivals, Crashable,
};
use crate::plan::Plan;
use crate::report::Report;
use crate::scale;
use crate::stats::Samples;
use crate::zk_metrics::{Counts, Snapshot};

mod rows;

type Result<T> = std::result::Result<T, String>;

/// The hand-over target on ZooKeeper: p99 in ms.
const HANDOVER_P99_MS: f64 = 5.0;
/// The takeover target on ZooKeeper, after session expiry: p99 in ms.
const TAKEOVER_P99_MS: f64 = 20.0;
/// The ensemble's tick (the library's tests' own).
const TICK: Duration = Duration::from_millis(100);
/// Lease ttl of the crash rounds (as on Redis and etcd).
const CRASH_TTL: Duration = Duration::from_secs(1);
/// The baseline column's label in this section.
const REDIS: &str = "Redis";

/// A session of the bench's own (not the library's), on any member.
pub(crate) async fn client(connect_string: &str) -> Result<zk::Client> {
    let connecting = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect_string);
    tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .map_err(|_| "no ZooKeeper session within 10 s".to_string())?
        .map_err(|e| format!("cannot connect to ZooKeeper: {e}"))
}

/// A persistent watch on `path` (`Persistent`: the znode;
/// `PersistentRecursive`: it and every znode under it); returns once the
/// ensemble has set it, so every later change is seen.
pub(crate) async fn watch_znode(
    client: &zk::Client,
    path: &str,
    mode: zk::AddWatchMode,
) -> Result<Arrivals<zk::EventType>> {
    let mut watcher = client
        .watch(path, mode)
        .await
        .map_err(|e| format!("cannot watch {path}: {e}"))?;
    Ok(Arrivals::spawn(|sender| async move {
        loop {
            let event = watcher.changed().await;
            let at = Instant::now();
            let ended =
                event.event_type == zk::EventType::Session && event.session_state.is_terminated();
            if sender.send((at, event.event_type)).is_err() || ended {
                return;
            }
        }
    }))
}

/// ZooKeeper's floors: one write, and one write seen by a watcher.
struct Floors {
    create: Samples,
    watched: Samples,
}

/// `n` creates of an ephemeral znode (as an acquire creates a lease) on
/// one session, each seen by a persistent watch on another, then deleted.
async fn floors(connect_string: &str, n: usize) -> Result<Floors> {
    let writer = client(connect_string).await?;
    let watcher = client(connect_string).await?;
    let path = "/bench-floor";
    let mut watched = watch_znode(&watcher, path, zk::AddWatchMode::Persistent).await?;
    let mut floors = Floors {
        create: Samples::default(),
        watched: Samples::default(),
    };
    let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let limit = Duration::from_secs(5);
    for i in 0..n {
        let t = Instant::now();
        writer
            .create(path, format!("floor {i}").as_bytes(), &options)
            .await
            .map_err(|e| format!("create {path}: {e}"))?;
        floors.create.push(t.elapsed());
        let seen = watched.next(zk::EventType::NodeCreated, limit).await?;
        floors.watched.push(seen - t);
        writer
            .delete(path, None)
            .await
            .map_err(|e| format!("delete {path}: {e}"))?;
        watched.next(zk::EventType::NodeDeleted, limit).await?;
    }
    Ok(floors)
}

/// The ZooKeeper takeover rounds' samples.
struct Takeovers {
    /// Follower elected − the lease's deletion arrived on the bench's watch.
    from_deletion: Samples,
    /// The lease's deletion arrived − (the crash + the ttl); negative lags
    /// count as zero.
    deletion_lag: Samples,
}

/// A leader (ttl 1 s) crashes 100–200 ms after its election; its session
/// expires a ttl after the last packet it sent (a renewal or a ping), on
/// the ensemble's next tick. A watch of the bench's own, opened before the
/// leader, timestamps the lease's deletion. Each round starts at a random
/// point of a tick, so that rounds do not fall in step with it.
async fn takeovers_zk(url: &str, connect_string: &str, rounds: usize) -> Result<Takeovers> {
    let observer = client(connect_string).await?;
    let mut samples = Takeovers {
        from_deletion: Samples::default(),
        deletion_lag: Samples::default(),
    };
    let tick_ms = TICK.as_millis() as u64;
    for round in 0..rounds {
        let name = format!("bench-crash-{round}");
        // The library's layout: election NAME under prefix `tenure` is the
        // ephemeral znode `/tenure/NAME`.
        let mut watched = watch_znode(
            &observer,
            &format!("/tenure/{name}"),
            zk::AddWatchMode::Persistent,
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(
            samples_len_jitter(round + 11) % tick_ms,
        ))
        .await;
        let crashing = Crashable::lead(url, &name, CRASH_TTL).await?;
        let follower = election(url, &name, "follower", CRASH_TTL).await?;
        let waiting = tokio::spawn(async move {
            let term = follower.campaign().await;
            (Instant::now(), term)
        });
        let crash_at =
            crashing.elected + Duration::from_millis(100 + samples_len_jitter(round) % 100);
        tokio::time::sleep_until(crash_at).await;
        crashing.crash();
        let crashed = Instant::now();
        let deleted = watched
            .next(zk::EventType::NodeDeleted, CRASH_TTL * 5)
            .await?;
        let (elected, term) = tokio::time::timeout(CRASH_TTL * 5, waiting)
            .await
            .map_err(|_| "the follower was not elected within 5 ttl".to_string())?
            .map_err(|e| e.to_string())?;
        let term = term.map_err(|e| e.to_string())?;
        samples
            .from_deletion
            .push(elected.saturating_duration_since(deleted));
        samples
            .deletion_lag
            .push(deleted.saturating_duration_since(crashed + CRASH_TTL));
        term.resign().await.map_err(|e| e.to_string())?;
    }
    Ok(samples)
}

/// Idle packets per renew interval, leader alone and the follower's
/// share, and the baseline subtracted from both.
struct Idle {
    leader: Counts,
    follower: Counts,
    baseline: Counts,
}

/// Packets the members received during `window` (see `zk_metrics.rs`).
async fn counted(members: &[String], window: Duration) -> Result<Counts> {
    let before = Snapshot::read(members).await?;
    tokio::time::sleep(window).await;
    Ok(Snapshot::read(members).await?.since(&before))
}

/// Packets of an idle tenure leader and follower per renew interval on
/// ZooKeeper, after a baseline window with nothing of tenure's running.
async fn zk_idle(
    zk_url: &str,
    members: &[String],
    ttl: Duration,
    window: Duration,
    intervals: f64,
) -> Result<Idle> {
    let baseline = counted(members, window).await?;
    let count = |w: Duration| counted(members, w);
    let (leader, both) = idle_requests(zk_url, ttl, window, count).await?;
    let per = 1.0 / intervals;
    Ok(Idle {
        follower: both.minus(&leader).scaled(per),
        leader: leader.minus(&baseline).scaled(per),
        baseline: baseline.scaled(per),
    })
}

/// The ZooKeeper section.
pub(crate) async fn section(plan: &Plan, report: &mut Report) -> Result<()> {
    let (ensemble, server) = tokio::task::spawn_blocking(|| {
        let ensemble = ZkEnsemble::builder()
            .tick_time(TICK)
            .start()
            .map_err(|e| format!("cannot start a ZooKeeper ensemble: {e}"))?;
        let server = RedisServer::start().map_err(|e| format!("cannot start Redis: {e}"))?;
        Ok::<_, String>((ensemble, server))
    })
    .await
    .map_err(|e| e.to_string())??;
    let outcome = measure(plan, report, &ensemble, &server).await;
    tokio::task::spawn_blocking(move || drop((ensemble, server)))
        .await
        .map_err(|e| e.to_string())?;
    outcome
}

async fn measure(
    plan: &Plan,
    report: &mut Report,
    ensemble: &ZkEnsemble,
    server: &RedisServer,
) -> Result<()> {
    let (zk_url, redis_url) = (ensemble.url(), server.url());
    let connect_string = ensemble.connect_string();
    let members: Vec<String> = connect_string.split(',').map(str::to_string).collect();
    eprintln!(
        "tenure-bench: ZooKeeper ensemble {zk_url} ({} members, tick {TICK:?}), \
         redis-server on port {}",
        ensemble.members(),
        server.port()
    );
    let label = "zk";
    let version = ensemble
        .four_letter(0, "srvr")
        .map_err(|e| e.to_string())?
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();

    eprintln!("  {label}: floors ...");
    let (_, evalsha, _) = floor(&connect(&redis_url).await?, plan.ops, 0).await?;
    let zk_floor = floors(&connect_string, plan.etcd_ops).await?;
    rows::floors(report, label, &version, &evalsha, &zk_floor);

    eprintln!("  {label}: handover after resign (Redis, then ZooKeeper) ...");
    let redis_handover = handovers(&redis_url, plan.handovers).await?;
    let zk_handover = handovers(&zk_url, plan.handovers).await?;
    rows::handovers(report, plan, label, &zk_handover, &redis_handover);
    rows::handover_ratio(
        report,
        label,
        &zk_handover,
        &zk_floor,
        &redis_handover,
        &evalsha,
    );

    eprintln!("  {label}: takeover after a crash (Redis, then ZooKeeper) ...");
    let redis_takeover = takeovers(&redis_url, plan.crashes).await?;
    let zk_takeover = takeovers_zk(&zk_url, &connect_string, plan.crashes).await?;
    rows::takeovers(report, plan, label, &zk_takeover, &redis_takeover);

    let (ttl, terms) = (plan.load_ttl, plan.load_terms);
    eprintln!(
        "  {label}: requests of idle elections, {terms} ttls of {} s per window \
         (Redis, then a baseline and ZooKeeper) ...",
        ttl.as_secs()
    );
    let window = ttl * terms;
    // Renewals are due every ttl/3.
    let intervals = 3.0 * f64::from(terms);
    let (leader, follower) = redis_idle(&redis_url, server.port(), ttl, window).await?;
    let redis_idle = (leader / intervals, follower / intervals);
    let zk_idle = zk_idle(&zk_url, &members, ttl, window, intervals).await?;
    rows::idle(report, label, ttl, terms, &zk_idle, redis_idle);

    let n = plan.cluster_partitions;
    eprintln!("  {label}: a set of {n} partitions in one process (Redis, then ZooKeeper) ...");
    let redis_pids = scale::known([server.pid()]);
    let zk_pids = scale::known((0..ensemble.members()).map(|m| ensemble.pid(m)));
    let redis_set =
        scale::run_child(&redis_url, "tenure", n, plan.scale_seconds, &redis_pids).await?;
    let zk_set = scale::run_child(&zk_url, "tenure", n, plan.scale_seconds, &zk_pids).await?;
    rows::scale(report, label, &zk_set, &redis_set, plan.scale_seconds)
}
