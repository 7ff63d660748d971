//! The ZooKeeper section's rows: what each figure means, in its note, kept
//! apart from the measuring so that either reads on a screen.

use std::time::Duration;

use super::{Floors, Idle, Takeovers, HANDOVER_P99_MS, REDIS, TAKEOVER_P99_MS};
use crate::plan::Plan;
use crate::report::{Report, Row};
use crate::scale::{self, ScaleFigures};
use crate::stats::Samples;
use crate::zk_metrics::Counts;

type Result<T> = std::result::Result<T, String>;

/// Target of the partition set's CPU, % of one core.
const SET_CPU_PERCENT: f64 = 3.0;
/// Target of the partition set's peak RSS, MB.
const SET_RSS_MB: f64 = 64.0;

/// The floors: Redis' EVALSHA, ZooKeeper's create and create seen by a
/// watcher.
pub(super) fn floors(
    report: &mut Report,
    label: &str,
    version: &str,
    evalsha: &Samples,
    zk: &Floors,
) {
    report.push(Row::latency(
        &format!("{label}: floor: Redis EVALSHA of `return 1`"),
        evalsha,
        None,
    ));
    report.push(
        Row::latency(
            &format!("{label}: floor: ZooKeeper create of an ephemeral znode (one Zab write)"),
            &zk.create,
            None,
        )
        .noted(format!(
            "{version}; 3 members on this machine, tick 100 ms; the bench's own sessions (zookeeper-client, the library's client)."
        )),
    );
    report.push(
        Row::latency(
            &format!("{label}: floor: ZooKeeper create until a watcher sees it"),
            &zk.watched,
            None,
        )
        .noted(
            "From sending the create to the NodeCreated event arriving on a persistent watch of \
             the znode held by a second session of the bench's own: the least a hand-over \
             announced by a watch can cost on ZooKeeper.",
        ),
    );
}

/// The hand-over after a graceful resign, ZooKeeper's beside Redis'.
pub(super) fn handovers(
    report: &mut Report,
    plan: &Plan,
    label: &str,
    zk: &Samples,
    redis: &Samples,
) {
    report.push(
        Row::latency_target(
            &format!("{label}: handover after graceful resign"),
            zk,
            Some(redis),
            &format!("p99 <= {HANDOVER_P99_MS} ms (issue)"),
            zk.p99() <= HANDOVER_P99_MS,
        )
        .against(REDIS)
        .noted(format!(
            "{} rounds on each store, the same code (as the single-node row): two instances \
             (ttl 5 s), resign() on the leader's term until the follower's campaign() returns. \
             On ZooKeeper a resign is a multi deleting the lease and its witness; the \
             follower's one-shot watch on the lease fires, and it acquires with a multiRead \
             (lease, witnesses, counter) and a multi (lease, witness, counter). ZooKeeper p90: \
             {:.3} ms.",
            plan.handovers,
            zk.p90()
        )),
    );
}

/// Each store's hand-over p50 over its floor's.
pub(super) fn handover_ratio(
    report: &mut Report,
    label: &str,
    zk: &Samples,
    zk_floor: &Floors,
    redis: &Samples,
    evalsha: &Samples,
) {
    report.push(
        Row::ratio(
            &format!(
                "{label}: handover p50 / its floor p50 (ZooKeeper: a create seen by a watcher; \
                 Redis: EVALSHA)"
            ),
            zk.p50() / zk_floor.watched.p50(),
            redis.p50() / evalsha.p50(),
            "",
            |_| true,
        )
        .targeted(false)
        .against(REDIS),
    );
}

/// The takeover after a crash: from the session's expiry as the ensemble
/// carried it out, and when that was.
pub(super) fn takeovers(
    report: &mut Report,
    plan: &Plan,
    label: &str,
    zk: &Takeovers,
    redis: &Samples,
) {
    report.push(
        Row::latency_target(
            &format!("{label}: takeover after a crash, from session expiry as the store saw it"),
            &zk.from_deletion,
            Some(redis),
            &format!("p99 <= {TAKEOVER_P99_MS} ms (issue)"),
            zk.from_deletion.p99() <= TAKEOVER_P99_MS,
        )
        .against(REDIS)
        .noted(format!(
            "{} crashes on each store, ttl 1 s, a follower waiting in campaign(). ZooKeeper: \
             from the instant the lease znode's NodeDeleted (the crashed holder's session \
             expired, its ephemerals deleted) arrives on a persistent watch the bench holds on \
             a session of its own, opened before the leader, to the follower's campaign() \
             returning (woken by its own watch on the lease). Redis: from the crash plus the \
             PTTL read right after it (the single-node row's measurement).",
            plan.crashes
        )),
    );
    report.push(
        Row::percentiles(
            &format!("{label}: crashed leader's session: crash + ttl → its lease deleted"),
            &zk.deletion_lag,
            "",
            None,
        )
        .noted(
            "The lease's NodeDeleted on the bench's watch minus (the crash + 1 s), 0 when \
             earlier. The ensemble expires a session no earlier than its timeout after the \
             last packet it received, which may be a ping the client sent by itself before \
             the crash (the library's sessions ping after 3/8 of their connection timeout of \
             quiet: every 125 ms at ttl 1 s), and on the next boundary of its 100 ms tick, \
             then commits the session's close through Zab: expect 0-100 ms and a little more \
             on a loaded machine.",
        ),
    );
}

/// The requests of an idle leader and follower per renew interval, on
/// Redis (`redis`: leader, follower) and ZooKeeper.
pub(super) fn idle(
    report: &mut Report,
    label: &str,
    ttl: Duration,
    terms: u32,
    zk: &Idle,
    redis: (f64, f64),
) {
    let how = format!(
        "An election of ttl {} s (renewals every ttl/3): the leader alone, then the leader \
         and a follower waiting in campaign(), each for {terms} ttls after half a ttl to \
         settle; the follower's are the difference. ZooKeeper: packets the members received \
         (mntr's zk_packets_received, summed over the 3 members), less a window of the same \
         length measured first with no tenure process and no session of the bench's open \
         ({:.2} per interval; the four-letter words that count, one packet each, are taken \
         off every window); split by each session's cons (its lcxid advances by requests \
         only, not by pings). Redis: commands seen by MONITOR.",
        ttl.as_secs(),
        zk.baseline.packets
    );
    report.push(
        Row::plain(
            &format!(
                "{label}: idle leader: requests per renew interval, all its terms (pings apart)"
            ),
            zk.leader.requests,
            Some(redis.0),
            "<= 1 (issue)",
            zk.leader.requests <= 1.05,
        )
        .against(REDIS)
        .noted(format!(
            "{how} ZooKeeper per interval: {}, on {} session(s) of the leader's store (one \
             per ttl, which serves its reads too). A client pings after 3/8 of its connection \
             timeout (a third of the ttl) of quiet, so that a dead member is left in time for \
             the next renewal: ZooKeeper's heartbeats, not requests.",
            zk.leader.describe(),
            zk.leader.sessions
        )),
    );
    report.push(
        Row::plain(
            &format!(
                "{label}: idle follower: requests per renew interval besides its watch (pings apart)"
            ),
            zk.follower.requests,
            Some(redis.1),
            "0 (issue)",
            zk.follower.requests <= 0.05,
        )
        .against(REDIS)
        .noted(format!(
            "As above; the follower's watch was set before the window. ZooKeeper per \
             interval: {}. The pings are its store's idle session's; its requests are the \
             campaign's re-read of the lease when the holder's lease would end, which on \
             ZooKeeper is a whole ttl after each read (a lease znode tells no time left), so \
             one multiRead per ttl.",
            zk.follower.describe()
        )),
    );
}

/// The partition set: sessions, CPU, peak RSS and packets, ZooKeeper's
/// beside Redis'.
pub(super) fn scale(
    report: &mut Report,
    label: &str,
    zk: &ScaleFigures,
    redis: &ScaleFigures,
    seconds: u64,
) -> Result<()> {
    let n = zk.elections;
    if zk.held != n || redis.held != n {
        return Err(format!(
            "the sets held {} (ZooKeeper) and {} (Redis) of {n} partitions",
            zk.held, redis.held
        ));
    }
    let counts: Counts = zk
        .zk_per_interval
        .ok_or("the ZooKeeper scale run counted nothing on the members")?;
    let set = format!("{label}: {n} partitions held by one member");
    report.push(
        Row::plain(
            &format!("{set}: ZooKeeper sessions"),
            counts.sessions as f64,
            None,
            "1 (issue)",
            counts.sessions == 1,
        )
        .noted(
            "Sessions connected to any member at the end of the window (cons, by session \
             id), while nothing but the set's process is connected.",
        ),
    );
    report.push(
        Row::plain(
            &format!("{set}: CPU, % of one core"),
            zk.cpu_percent,
            Some(redis.cpu_percent),
            &format!("<= {SET_CPU_PERCENT} % (issue)"),
            zk.cpu_percent <= SET_CPU_PERCENT,
        )
        .against(REDIS)
        .noted(format!(
            "One process holding every partition of one PartitionSet (ttl 3 s, a renewal cycle \
             per second), measured over {seconds} s once all are held; CPU (user + system) and \
             peak RSS are the process's own (a child of the bench). Redis: the same set on the \
             section's redis-server."
        )),
    );
    report.push(scale::store_cpu_row(
        &format!(
            "{set}: the ZooKeeper members' CPU meanwhile (Redis: redis-server's), % of one core"
        ),
        zk,
        Some(redis),
    ));
    report.push(
        Row::plain(
            &format!("{set}: peak RSS, MB"),
            zk.peak_rss_mb,
            Some(redis.peak_rss_mb),
            &format!("<= {SET_RSS_MB} MB (issue)"),
            zk.peak_rss_mb <= SET_RSS_MB,
        )
        .against(REDIS),
    );
    report.push(
        Row::plain(
            &format!("{set}: packets per renew interval, counted by the members"),
            counts.packets,
            Some(redis.round_trips_per_interval),
            "",
            true,
        )
        .targeted(false)
        .against(REDIS)
        .noted(format!(
            "zk_packets_received summed over the members, read at both ends of the window: \
             {}; the set's own count (PartitionObserver::round_trips) is {:.2}. Redis: \
             round trips the set counted.",
            counts.describe(),
            zk.round_trips_per_interval
        )),
    );
    Ok(())
}
