//! The etcd section: hand-over, takeover, idle requests and a 10,000
//! partition set on a private 3-member etcd cluster, each beside the same
//! measurement of tenure on a private redis-server started for the section
//! (the baseline column, marked `Redis:`), and etcd's own floors.
//!
//! The measurements are the single-node ones wherever they carry over
//! (hand-over, the Redis takeover, the idle windows, the scale child), run
//! on the etcd URL. What etcd needs of its own:
//!
//! - **Floors**: a linearizable read, a write (a `Txn` put-if-absent, one
//!   Raft round) and a write seen by a watcher on another connection, the
//!   least any watch-driven hand-over can cost.
//! - **Takeover from lease expiry**: etcd's expiry is not observable from a
//!   client as Redis' PTTL is (`LeaseTimeToLive` answers whole seconds), so
//!   the bench watches the election's key on a connection of its own and
//!   counts from the instant the key's delete arrives: the lease's expiry
//!   as etcd carried it out. etcd's leader revokes expired leases on a
//!   500 ms tick; how late that is after the lease's nominal end is a row
//!   of its own.
//! - **Requests**: the library counts the requests of a partition set but
//!   not of one election, so requests are counted where they arrive: each
//!   member's `grpc_server_msg_received_total` (every unary call, and every
//!   message on a stream: each keep-alive, each watch created), read from
//!   `/metrics` on its client port before and after a window and summed
//!   over the members. Reading `/metrics` is plain HTTP, no gRPC, so it
//!   counts nothing itself.
//!
//! The targets printed beside the etcd figures are the (graceful
//! p99 <= 5 ms, takeover <= 20 ms after lease expiry, one keep-alive per
//! renew interval for 10,000 partitions); they are reported, not asserted.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, EventType, Txn, TxnOp};
use etcd_process::EtcdCluster;
use redis_process::RedisServer;
use tokio::time::Instant;

use crate::etcd_metrics::{scrape, ByMethod};
use crate::fixture::{
    connect, election, floor, handovers, idle_requests, redis_idle, samples_len_jitter, takeovers,
    Arrivals, Crashable,
};
use crate::plan::Plan;
use crate::report::{Report, Row};
use crate::scale::{self, ScaleFigures};
use crate::stats::Samples;

type Result<T> = std::result::Result<T, String>;

/// The hand-over target on etcd: p99 in ms.
const HANDOVER_P99_MS: f64 = 5.0;
/// The takeover target on etcd, after lease expiry: p99 in ms.
const TAKEOVER_P99_MS: f64 = 20.0;
/// The etcd members' election timeout: quick failovers, and leases from
/// 1 s (etcd's shortest lease is 1.5 election timeouts, in whole seconds).
const ELECTION_TIMEOUT: Duration = Duration::from_millis(500);
/// Lease ttl of the crash rounds (as on Redis).
const CRASH_TTL: Duration = Duration::from_secs(1);
/// The baseline column's label in this section.
const REDIS: &str = "Redis";

/// A client of the bench's own (not the library's), on every member.
pub(crate) async fn client(members: &[String]) -> Result<Client> {
    let endpoints: Vec<String> = members.iter().map(|m| format!("http://{m}")).collect();
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_require_leader(true);
    Client::connect(endpoints, Some(options))
        .await
        .map_err(|e| format!("cannot connect to etcd: {e}"))
}

/// Watch `key`; returns once etcd says the watch is created, so every
/// later change of the key is seen.
pub(crate) async fn watch_key(client: &Client, key: &str) -> Result<Arrivals<EventType>> {
    let mut stream = client
        .clone()
        .watch(key, None)
        .await
        .map_err(|e| format!("cannot watch {key}: {e}"))?;
    match stream.message().await {
        Ok(Some(answer)) if answer.created() => {}
        other => return Err(format!("the watch on {key} was not created: {other:?}")),
    }
    Ok(Arrivals::spawn(|sender| async move {
        while let Ok(Some(answer)) = stream.message().await {
            let at = Instant::now();
            for event in answer.events() {
                if sender.send((at, event.event_type())).is_err() {
                    return;
                }
            }
        }
    }))
}

/// etcd's floors: what one read, one write and one write seen by a watcher
/// cost, with nothing of tenure's in the way.
struct Floors {
    range: Samples,
    txn: Samples,
    watched: Samples,
}

async fn floors(members: &[String], n: usize) -> Result<Floors> {
    let writer = client(members).await?;
    let watcher = client(members).await?;
    let key = "bench-floor";
    let mut watched = watch_key(&watcher, key).await?;
    let mut floors = Floors {
        range: Samples::default(),
        txn: Samples::default(),
        watched: Samples::default(),
    };
    let limit = Duration::from_secs(5);
    for i in 0..n {
        let t = Instant::now();
        writer
            .clone()
            .get(key, None)
            .await
            .map_err(|e| e.to_string())?;
        floors.range.push(t.elapsed());
        // Created if absent, as an acquire creates an election's key.
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, format!("floor {i}"), None)])
            .or_else([TxnOp::get(key, None)]);
        let t = Instant::now();
        let done = writer.clone().txn(txn).await.map_err(|e| e.to_string())?;
        floors.txn.push(t.elapsed());
        if !done.succeeded() {
            return Err(format!("{key} was not absent"));
        }
        let seen = watched.next(EventType::Put, limit).await?;
        floors.watched.push(seen - t);
        writer
            .clone()
            .delete(key, None)
            .await
            .map_err(|e| e.to_string())?;
        watched.next(EventType::Delete, limit).await?;
    }
    Ok(floors)
}

/// The etcd takeover rounds' samples.
struct Takeovers {
    /// Follower elected − the key's delete arrived on the bench's watch.
    from_deletion: Samples,
    /// The key's delete arrived − the lease's nominal end.
    deletion_lag: Samples,
    /// Follower elected − the lease's nominal end.
    from_expiry: Samples,
    /// gRPC requests the members received from the crash to the takeover,
    /// summed over the rounds.
    requests: ByMethod,
}

/// A leader (ttl 1 s) crashes 100–200 ms after its election, before its
/// first keep-alive (due ttl/3 after its acquire was sent), so its lease
/// ends at most one ttl after its election: the lease was granted during
/// the campaign that won. A watch of the bench's own, opened before the
/// leader, timestamps the key's delete. Each round starts 0–500 ms late,
/// at random: a round starting right after the previous revocation would
/// be in step with etcd's revocation tick (its leases all ended just after
/// a tick: 486 ms of lag every time, in a run without this).
async fn takeovers_etcd(url: &str, members: &[String], rounds: usize) -> Result<Takeovers> {
    let observer = client(members).await?;
    let mut samples = Takeovers {
        from_deletion: Samples::default(),
        deletion_lag: Samples::default(),
        from_expiry: Samples::default(),
        requests: ByMethod::default(),
    };
    for round in 0..rounds {
        let name = format!("bench-crash-{round}");
        // The library's layout: election NAME under prefix `tenure` is
        // the key `tenure/NAME`.
        let mut watched = watch_key(&observer, &format!("tenure/{name}")).await?;
        // Start at a random point of etcd's 500 ms revocation tick: a round
        // begins right after the previous one's revocation, so without this
        // every lease would end just after a tick and wait out the next.
        tokio::time::sleep(Duration::from_millis(samples_len_jitter(round + 11) % 500)).await;
        let crashing = Crashable::lead(url, &name, CRASH_TTL).await?;
        let lease_end = crashing.elected + CRASH_TTL;
        let follower = election(url, &name, "follower", CRASH_TTL).await?;
        let waiting = tokio::spawn(async move {
            let term = follower.campaign().await;
            (Instant::now(), term)
        });
        let crash_at =
            crashing.elected + Duration::from_millis(100 + samples_len_jitter(round) % 100);
        tokio::time::sleep_until(crash_at).await;
        crashing.crash();
        // Nothing but the follower sends requests from now on (the bench's
        // watch is open already; reading metrics is no gRPC request).
        let before = scrape(members).await?;
        let deleted = watched.next(EventType::Delete, CRASH_TTL * 5).await?;
        let (elected, term) = tokio::time::timeout(CRASH_TTL * 5, waiting)
            .await
            .map_err(|_| "the follower was not elected within 5 ttl".to_string())?
            .map_err(|e| e.to_string())?;
        let term = term.map_err(|e| e.to_string())?;
        let requests = scrape(members).await?.minus(&before);
        for (method, n) in requests.0 {
            *samples.requests.0.entry(method).or_default() += n;
        }
        samples
            .from_deletion
            .push(elected.saturating_duration_since(deleted));
        samples
            .deletion_lag
            .push(deleted.saturating_duration_since(lease_end));
        samples
            .from_expiry
            .push(elected.saturating_duration_since(lease_end));
        term.resign().await.map_err(|e| e.to_string())?;
    }
    Ok(samples)
}

/// Idle requests per ttl, leader alone and the follower's share, with the
/// methods on etcd.
struct Idle {
    leader: f64,
    follower: f64,
    leader_methods: Option<ByMethod>,
    follower_methods: Option<ByMethod>,
}

/// The etcd section.
pub(crate) async fn section(plan: &Plan, report: &mut Report) -> Result<()> {
    let (cluster, server) = tokio::task::spawn_blocking(|| {
        let cluster = EtcdCluster::builder()
            .election_timeout(ELECTION_TIMEOUT)
            .start()
            .map_err(|e| format!("cannot start an etcd cluster: {e}"))?;
        let server = RedisServer::start().map_err(|e| format!("cannot start Redis: {e}"))?;
        Ok::<_, String>((cluster, server))
    })
    .await
    .map_err(|e| e.to_string())??;
    let outcome = measure(plan, report, &cluster, &server).await;
    tokio::task::spawn_blocking(move || drop((cluster, server)))
        .await
        .map_err(|e| e.to_string())?;
    outcome
}

async fn measure(
    plan: &Plan,
    report: &mut Report,
    cluster: &EtcdCluster,
    server: &RedisServer,
) -> Result<()> {
    let (etcd_url, redis_url) = (cluster.url(), server.url());
    let members = cluster.endpoints();
    eprintln!(
        "tenure-bench: etcd cluster {etcd_url} ({} members, election timeout {ELECTION_TIMEOUT:?}), \
         redis-server on port {}",
        cluster.members(),
        server.port()
    );
    let label = "etcd";

    let (evalsha, etcd_floor) = floor_rows(plan, report, label, &redis_url, &members).await?;
    handover_rows(
        plan,
        report,
        label,
        &redis_url,
        &etcd_url,
        &evalsha,
        &etcd_floor,
    )
    .await?;
    takeover_rows(plan, report, label, &redis_url, &etcd_url, &members).await?;
    idle_rows(plan, report, label, server, &redis_url, &etcd_url, &members).await?;

    let n = plan.cluster_partitions;
    eprintln!("  {label}: a set of {n} partitions in one process (Redis, then etcd) ...");
    let redis_pids = scale::known([server.pid()]);
    let etcd_pids = scale::known((0..cluster.members()).map(|m| cluster.pid(m)));
    let redis_set =
        scale::run_child(&redis_url, "tenure", n, plan.scale_seconds, &redis_pids).await?;
    let etcd_set = scale::run_child(&etcd_url, "tenure", n, plan.scale_seconds, &etcd_pids).await?;
    scale_rows(report, label, &etcd_set, &redis_set, plan.scale_seconds)
}

/// The floors' rows: Redis' EVALSHA, etcd's read, write and write seen by
/// a watcher. Returns the EVALSHA samples and etcd's floors, that the
/// hand-over's ratio compares with.
async fn floor_rows(
    plan: &Plan,
    report: &mut Report,
    label: &str,
    redis_url: &str,
    members: &[String],
) -> Result<(Samples, Floors)> {
    eprintln!("  {label}: floors ...");
    let conn = connect(redis_url).await?;
    let (_, evalsha, _) = floor(&conn, plan.ops, 0).await?;
    let etcd_floor = floors(members, plan.etcd_ops).await?;
    report.push(Row::latency(
        &format!("{label}: floor: Redis EVALSHA of `return 1`"),
        &evalsha,
        None,
    ));
    report.push(Row::latency(
        &format!("{label}: floor: etcd Range of one key (linearizable read)"),
        &etcd_floor.range,
        None,
    ));
    report.push(Row::latency(
        &format!("{label}: floor: etcd Txn put-if-absent (one Raft write)"),
        &etcd_floor.txn,
        None,
    ));
    report.push(
        Row::latency(
            &format!("{label}: floor: etcd Txn put-if-absent until a watcher sees it"),
            &etcd_floor.watched,
            None,
        )
        .noted(
            "From sending the Txn to the Put event arriving on a watch of the key held by a \
             second client (its own connections): the least a hand-over announced by a watch \
             can cost on etcd.",
        ),
    );
    Ok((evalsha, etcd_floor))
}

/// The hand-over after a graceful resign, on Redis then etcd, and each
/// one's ratio to its floor.
async fn handover_rows(
    plan: &Plan,
    report: &mut Report,
    label: &str,
    redis_url: &str,
    etcd_url: &str,
    evalsha: &Samples,
    etcd_floor: &Floors,
) -> Result<()> {
    eprintln!("  {label}: handover after resign (Redis, then etcd) ...");
    let redis_handover = handovers(redis_url, plan.handovers).await?;
    let etcd_handover = handovers(etcd_url, plan.handovers).await?;
    report.push(
        Row::latency_target(
            &format!("{label}: handover after graceful resign"),
            &etcd_handover,
            Some(&redis_handover),
            &format!("p99 <= {HANDOVER_P99_MS} ms (issue)"),
            etcd_handover.p99() <= HANDOVER_P99_MS,
        )
        .against(REDIS)
        .noted(format!(
            "{} rounds on each store, the same code (as the single-node row): two instances \
             (ttl 5 s), resign() on the leader's term until the follower's campaign() returns. \
             On etcd a resign is a Range then a Txn delete; the follower hears the delete on \
             its watch and creates the key in a Txn (a LeaseKeepAlive of its session beside \
             it). etcd p90: {:.3} ms.",
            plan.handovers,
            etcd_handover.p90()
        )),
    );
    report.push(
        Row::ratio(
            &format!(
                "{label}: handover p50 / its floor p50 (etcd: a write seen by a watcher; Redis: EVALSHA)"
            ),
            etcd_handover.p50() / etcd_floor.watched.p50(),
            redis_handover.p50() / evalsha.p50(),
            "",
            |_| true,
        )
        .targeted(false)
        .against(REDIS),
    );
    Ok(())
}

/// The takeover after a crash, on Redis then etcd: from the lease's expiry
/// as etcd carried it out and from its nominal end, the lag between the
/// two, and the requests a takeover costs.
async fn takeover_rows(
    plan: &Plan,
    report: &mut Report,
    label: &str,
    redis_url: &str,
    etcd_url: &str,
    members: &[String],
) -> Result<()> {
    eprintln!("  {label}: takeover after a crash (Redis, then etcd) ...");
    let redis_takeover = takeovers(redis_url, plan.crashes).await?;
    let etcd_takeover = takeovers_etcd(etcd_url, members, plan.crashes).await?;
    report.push(
        Row::latency_target(
            &format!("{label}: takeover after a crash, from lease expiry as the store saw it"),
            &etcd_takeover.from_deletion,
            Some(&redis_takeover),
            &format!("p99 <= {TAKEOVER_P99_MS} ms (issue)"),
            etcd_takeover.from_deletion.p99() <= TAKEOVER_P99_MS,
        )
        .against(REDIS)
        .noted(format!(
            "{} crashes on each store, ttl 1 s, a follower waiting in campaign(). etcd: from \
             the instant the key's Delete (the lease's revocation) arrives on a watch the bench \
             holds on its own connection, opened before the leader, to the follower's \
             campaign() returning (no polling: the follower is woken by its own watch on the \
             key). Redis: from the crash plus the PTTL read right after it (the single-node \
             row's measurement).",
            plan.crashes
        )),
    );
    report.push(
        Row::percentiles(
            &format!("{label}: crashed leader's lease: nominal end → its key deleted"),
            &etcd_takeover.deletion_lag,
            "",
            None,
        )
        .noted(
            "The leader is crashed 100-200 ms after its election, before its first keep-alive \
             (due ttl/3 after its acquire), so its lease, granted in the campaign that won, ends \
             at most 1 s after its election; this row is the Delete's arrival on the bench's \
             watch minus (election + 1 s), under by at most the leader's acquire. etcd's leader \
             revokes expired leases on a 500 ms tick, then commits the revocation through Raft: \
             expect 0-500 ms (each round starts at a random point of that tick).",
        ),
    );
    takeover_cost_rows(plan, report, label, &etcd_takeover, &redis_takeover);
    Ok(())
}

/// The takeover's other rows: from the lease's nominal end (what an
/// application sees past the ttl), and the gRPC requests a takeover costs.
fn takeover_cost_rows(
    plan: &Plan,
    report: &mut Report,
    label: &str,
    etcd_takeover: &Takeovers,
    redis_takeover: &Samples,
) {
    report.push(
        Row::latency(
            &format!("{label}: takeover after a crash, from the lease's nominal end"),
            &etcd_takeover.from_expiry,
            Some(redis_takeover),
        )
        .against(REDIS)
        .noted(
            "The follower's election minus (the crashed leader's election + 1 s): what an \
             application sees past the ttl, the two rows above added. Redis needs no such row: \
             its lease ends when its PTTL says (the baseline is the same as above).",
        ),
    );
    let rounds = plan.crashes.max(1) as f64;
    let per_round = etcd_takeover.requests.scaled(1.0 / rounds);
    report.push(
        Row::plain(
            &format!("{label}: gRPC requests from a crash to the takeover, per round"),
            per_round.total(),
            None,
            "",
            true,
        )
        .targeted(false)
        .noted(format!(
            "Counted by the members (grpc_server_msg_received_total, summed) from just after \
             the crash to the follower's election: the follower's requests only (the crashed \
             leader sends none, the bench's watch is open already). Per round, by method: {}. \
             One acquire is a Txn with a LeaseKeepAlive of the follower's session beside it; \
             a LeaseGrant and a second Txn follow when that session lease has lapsed (a \
             follower's session is kept alive only by its own attempts).",
            per_round.describe()
        )),
    );
}

/// The requests of an idle leader and an idle follower per lease ttl, on
/// Redis (MONITOR on `server`) then etcd (the members' metrics).
async fn idle_rows(
    plan: &Plan,
    report: &mut Report,
    label: &str,
    server: &RedisServer,
    redis_url: &str,
    etcd_url: &str,
    members: &[String],
) -> Result<()> {
    let (ttl, terms) = (plan.load_ttl, plan.load_terms);
    eprintln!(
        "  {label}: requests of idle elections, {terms} ttls of {} s per window (Redis, then etcd) ...",
        ttl.as_secs()
    );
    let window = ttl * terms;
    let (leader, follower) = redis_idle(redis_url, server.port(), ttl, window).await?;
    let redis_idle = Idle {
        leader: leader / f64::from(terms),
        follower: follower / f64::from(terms),
        leader_methods: None,
        follower_methods: None,
    };
    let etcd_idle = etcd_idle(etcd_url, members, ttl, window, terms).await?;
    let how = format!(
        "An election of ttl {} s: the leader alone, then the leader and a follower waiting in \
         campaign(), each for {terms} ttls after half a ttl to settle; the follower's are the \
         difference. etcd: gRPC messages the members received (grpc_server_msg_received_total \
         from each member's /metrics, summed; each keep-alive and each watch created is one), \
         Redis: commands seen by MONITOR (the commands scripts run are not requests).",
        ttl.as_secs()
    );
    let methods = |m: &Option<ByMethod>| m.as_ref().map_or("-".into(), ByMethod::describe);
    report.push(
        Row::plain(
            &format!("{label}: idle leader: requests per lease ttl"),
            etcd_idle.leader,
            Some(redis_idle.leader),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS)
        .noted(format!(
            "{how} etcd per ttl, by method: {}.",
            methods(&etcd_idle.leader_methods)
        )),
    );
    report.push(
        Row::plain(
            &format!("{label}: idle follower: requests per lease ttl"),
            etcd_idle.follower,
            Some(redis_idle.follower),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS)
        .noted(format!(
            "As above. etcd per ttl, by method: {}.",
            methods(&etcd_idle.follower_methods)
        )),
    );
    Ok(())
}

/// Requests of an idle tenure leader and follower per lease ttl on etcd,
/// counted by the members (`members`), with their methods.
async fn etcd_idle(
    etcd_url: &str,
    members: &[String],
    ttl: Duration,
    window: Duration,
    terms: u32,
) -> Result<Idle> {
    let count = |w: Duration| {
        let members = members.to_vec();
        async move {
            let before = scrape(&members).await?;
            tokio::time::sleep(w).await;
            Ok::<_, String>(scrape(&members).await?.minus(&before))
        }
    };
    let (leader, both) = idle_requests(etcd_url, ttl, window, count).await?;
    let per_ttl = 1.0 / f64::from(terms);
    let follower = both.minus(&leader).scaled(per_ttl);
    let leader = leader.scaled(per_ttl);
    Ok(Idle {
        leader: leader.total(),
        follower: follower.total(),
        leader_methods: Some(leader),
        follower_methods: Some(follower),
    })
}

/// The partition sets' figures, etcd's beside Redis'.
fn scale_rows(
    report: &mut Report,
    label: &str,
    etcd: &ScaleFigures,
    redis: &ScaleFigures,
    seconds: u64,
) -> Result<()> {
    let n = etcd.elections;
    let set = format!("{label}: {n} partitions held by one member on one lease");
    if etcd.held != n || redis.held != n {
        return Err(format!(
            "the sets held {} (etcd) and {} (Redis) of {n} partitions",
            etcd.held, redis.held
        ));
    }
    let server = etcd
        .server_requests_per_interval
        .clone()
        .map(ByMethod)
        .ok_or("the etcd scale run counted no requests on the members")?;
    set_cost_rows(report, &set, etcd, redis, seconds);
    report.push(scale::store_cpu_row(
        &format!("{set}: the etcd members' CPU meanwhile (Redis: redis-server's), % of one core"),
        etcd,
        Some(redis),
    ));
    set_member_rows(report, &set, &server, etcd, redis);
    Ok(())
}

/// The partition set's CPU, peak RSS and requests counted by the client,
/// etcd's beside Redis'; `set` names the set in each row.
fn set_cost_rows(
    report: &mut Report,
    set: &str,
    etcd: &ScaleFigures,
    redis: &ScaleFigures,
    seconds: u64,
) {
    report.push(
        Row::plain(
            &format!("{set}: CPU, % of one core"),
            etcd.cpu_percent,
            Some(redis.cpu_percent),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS)
        .noted(format!(
            "One process holding every partition of one PartitionSet (ttl 3 s, a renewal cycle \
             per second), measured over {seconds} s once all are held; CPU (user + system) and \
             peak RSS are the process's own (a child of the bench). Redis: the same set on the \
             section's redis-server."
        )),
    );
    report.push(
        Row::plain(
            &format!("{set}: peak RSS, MB"),
            etcd.peak_rss_mb,
            Some(redis.peak_rss_mb),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS),
    );
    report.push(
        Row::plain(
            &format!("{set}: requests per renew interval, counted by the client"),
            etcd.round_trips_per_interval,
            Some(redis.round_trips_per_interval),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS)
        .noted(
            "The set's own count (PartitionObserver::round_trips): on etcd every gRPC call of a \
             cycle, on Redis every pipeline (one round trip carrying the heartbeat and every \
             renewal; a longer one than 10,000 renewals goes in slices, one round trip each).",
        ),
    );
}

/// The partition set's requests counted by the members (`server`, per
/// renew interval, by method), its keep-alives against the target
/// and its renewal cycles; `set` names the set in each row.
fn set_member_rows(
    report: &mut Report,
    set: &str,
    server: &ByMethod,
    etcd: &ScaleFigures,
    redis: &ScaleFigures,
) {
    report.push(
        Row::plain(
            &format!("{set}: gRPC requests per renew interval, counted by the members"),
            server.total(),
            Some(redis.round_trips_per_interval),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS)
        .noted(format!(
            "grpc_server_msg_received_total summed over the members, read at both ends of the \
             window, per renew interval, by method: {}. A renewal cycle is the \
             membership heartbeat (a Txn, a LeaseKeepAlive) and one renew-many operation per \
             1,000 partitions (the library's RENEW_MANY, sized for Redis scripts), each a \
             LeaseKeepAlive of the same session lease beside Txns of compares that check each \
             partition's key is still the term's (64 keys per Txn: etcd's default \
             --max-txn-ops is 128 operations, two compares per key); the member list is a \
             Range.",
            server.describe()
        )),
    );
    let keep_alives = server.get("LeaseKeepAlive");
    report.push(Row::plain(
        &format!("{set}: LeaseKeepAlive per renew interval, counted by the members"),
        keep_alives,
        None,
        "1 per interval (issue)",
        keep_alives <= 1.05,
    ));
    report.push(
        Row::plain(
            &format!("{set}: renewal cycles per renew interval"),
            etcd.cycles_per_interval.unwrap_or(f64::NAN),
            redis.cycles_per_interval,
            "",
            true,
        )
        .targeted(false)
        .against(REDIS),
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Against a real member: each request is counted once, by its method,
    /// reading the metrics counts nothing, and the watch sees a put and a
    /// delete of its key in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn members_count_each_request_once_and_the_watch_sees_each_change() {
        let cluster = tokio::task::spawn_blocking(|| {
            EtcdCluster::builder()
                .members(1)
                .election_timeout(ELECTION_TIMEOUT)
                .start()
        })
        .await
        .expect("joined")
        .expect("an etcd member");
        let members = cluster.endpoints();
        let client = client(&members).await.expect("connected");
        let mut watched = watch_key(&client, "counted").await.expect("watch");

        let before = scrape(&members).await.expect("metrics");
        let unchanged = scrape(&members).await.expect("metrics");
        assert_eq!(unchanged.minus(&before), ByMethod::default());
        for _ in 0..3 {
            client.clone().get("counted", None).await.expect("get");
        }
        client.clone().put("counted", "v", None).await.expect("put");
        client
            .clone()
            .delete("counted", None)
            .await
            .expect("delete");
        let counted = scrape(&members).await.expect("metrics").minus(&unchanged);
        assert_eq!(
            counted.0,
            BTreeMap::from([
                ("DeleteRange".to_string(), 1.0),
                ("Put".to_string(), 1.0),
                ("Range".to_string(), 3.0),
            ])
        );

        let limit = Duration::from_secs(10);
        let put = watched.next(EventType::Put, limit).await.expect("put seen");
        let deleted = watched
            .next(EventType::Delete, limit)
            .await
            .expect("delete seen");
        assert!(put <= deleted);
        drop(watched);
        tokio::task::spawn_blocking(move || drop(cluster))
            .await
            .expect("stopped");
    }
}
