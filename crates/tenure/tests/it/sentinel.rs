//! Elections on a Sentinel-managed Redis: real sentinels, a real primary
//! and replica, real failovers.
//!
//! The promise under test is the same as on one server: never two
//! instances within their deadlines, tokens that rise with every term,
//! and a leader again once the failover is over and one ttl of start-up
//! hold-off has passed on the promoted replica.

use std::time::Duration;

use redis_process::{Node, SentinelGroup};
use tenure::{Election, Store};
use tenure_test_support::overlap::{self, Among};
use tokio::time::timeout;

use crate::support::topo::{self, after_fault, contenders, election, handover, store, until_led};
use crate::support::topo::{MARGIN, TTL};
use crate::support::{campaign, init_logs, TermLog, TermRecord, HANG};

fn group() -> SentinelGroup {
    init_logs();
    SentinelGroup::start().unwrap_or_else(|err| panic!("cannot start a Sentinel group: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_winner_among_many_and_a_graceful_handover() {
    let group = group();
    let url = group.url();
    let store = store(&url).await;
    let (sender, mut winners) = tokio::sync::mpsc::unbounded_channel();
    let mut elections = Vec::new();
    for i in 0..4 {
        let e = election(&store, "jobs", &format!("c{i}")).await;
        elections.push(e.clone());
        let sender = sender.clone();
        tokio::spawn(async move {
            let term = campaign(&e).await;
            let _ = sender.send(term);
        });
    }
    let first = timeout(HANG, winners.recv())
        .await
        .expect("a winner")
        .expect("open");
    let bystander = election(&store, "jobs", "bystander").await;
    assert!(bystander.try_campaign().await.expect("asks").is_none());
    let leader = bystander.leader().await.expect("asks").expect("a leader");
    assert_eq!(
        (leader.id.as_str(), leader.token),
        (first.id(), first.token())
    );
    first.resign().await.expect("resigns");
    let second = timeout(HANG, winners.recv())
        .await
        .expect("a second winner")
        .expect("open");
    assert_ne!(second.id(), first.id());
    assert!(second.token() > first.token());
    assert!(!first.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_while_leading_is_safe() {
    let group = group();
    let url = group.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "failover", &log).await;
    let observer = election(&store(&url).await, "failover", "observer").await;
    until_led(&observer).await;
    let old = group.primary_port().expect("a primary");
    let new = tokio::task::spawn_blocking(move || group.failover().map(|port| (port, group)))
        .await
        .expect("joins")
        .expect("SENTINEL FAILOVER");
    assert_ne!(new.0, old);
    after_fault(&url, "failover", &log, tasks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_primary_while_leading_is_safe() {
    let group = group();
    let url = group.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "crash", &log).await;
    let observer = election(&store(&url).await, "crash", "observer").await;
    until_led(&observer).await;
    let group = tokio::task::spawn_blocking(move || {
        let old = group.kill_primary().expect("kill -9 of the primary");
        let new = group
            .wait_for_new_primary(old, HANG)
            .expect("a replica is promoted");
        assert_ne!(new, old);
        group
    })
    .await
    .expect("joins");
    after_fault(&url, "crash", &log, tasks).await;
    drop(group);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_that_comes_back_is_never_used_for_acquiring() {
    let group = group();
    let url = group.url();
    // This store knows the old primary, and keeps knowing it through the
    // crash: it must find the new one by itself.
    let known = store(&url).await;
    let first = election(&known, "stale", "first").await;
    let before = campaign(&first).await.token();
    let (group, old, new) = tokio::task::spawn_blocking(move || {
        // The old primary keeps its data (the lease of `first`) on disk.
        let old = group
            .kill_primary_keep_snapshot()
            .expect("kill with a snapshot");
        let new = group.wait_for_new_primary(old, HANG).expect("a promotion");
        // Every sentinel has heard from the new primary: none fails over
        // again to the old one once it is back.
        assert_eq!(group.wait_until_ready(HANG).expect("settled"), new);
        group
            .node(old)
            .expect("the old node")
            .resume()
            .expect("restarts");
        (group, old, new)
    })
    .await
    .expect("joins");
    // Back, the old node believes it is a primary until the sentinels
    // reconfigure it; a new election through the same store goes to the new.
    let later = election(&known, "fresh", "later").await;
    let term = campaign(&later).await;
    assert!(term.token() > before, "{} after {before}", term.token());
    let owner = group
        .node(new)
        .expect("the new primary")
        .command(&["HGET", "tenure:{fresh}:lease", "owner"])
        .expect("HGET");
    assert_eq!(
        owner, "later",
        "the lease is on the primary the sentinels name"
    );
    drop((group, old));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_holds_off_like_a_failover() {
    let group = group();
    let url = group.url();
    let e = election(&store(&url).await, "failback", "a").await;
    campaign(&e).await.resign().await.expect("resigns");
    // Away to the replica and back, with no acquisition on the replica:
    // the first primary is the same process (same run_id), but its data
    // came back through the replica, which may have lost writes.
    let group = tokio::task::spawn_blocking(move || {
        let first = group.primary_port().expect("a primary");
        group.failover().expect("away");
        group.wait_until_ready(HANG).expect("ready again");
        let back = group.failover().expect("back");
        assert_eq!(back, first, "failed back to the first primary");
        group
    })
    .await
    .expect("joins");
    topo::holds_off_after_the_failover(&url, "failback").await;
    drop(group);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_errors_for_a_wrong_service_and_unreachable_sentinels() {
    let group = group();
    let sentinel = group.sentinel_ports()[0];
    let wrong = format!("redis+sentinel://127.0.0.1:{sentinel}/no-such-service");
    let err = Store::redis(&wrong)
        .connect()
        .await
        .expect_err("unknown service");
    let text = err.to_string();
    assert!(text.contains("no-such-service"), "{text}");
    assert!(
        !err.is_transient(),
        "a person must fix the service name: {text}"
    );
    let free = redis_process::free_port().expect("a port");
    let nobody = format!("redis+sentinel://127.0.0.1:{free}/tenure-test");
    let err = timeout(HANG, Store::redis(&nobody).connect())
        .await
        .expect("no hang")
        .expect_err("unreachable");
    assert!(err.is_transient(), "{err}");
    assert!(!err.to_string().contains('\n'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_wakes_the_follower_through_the_primary() {
    let group = group();
    let primary = group.primary().expect("primary");
    topo::a_resign_wakes_the_follower(&group.url(), primary).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_for_the_data_nodes_and_the_sentinels() {
    init_logs();
    let group = SentinelGroup::builder()
        .password("data-secret")
        .sentinel_password("sentinel-secret")
        .start()
        .expect("a Sentinel group with passwords");
    let url = group.url();
    let e = election(&store(&url).await, "secure", "a").await;
    let term = campaign(&e).await;
    term.resign().await.expect("resigns");

    let wrong_sentinel = url.replace("sentinel-secret", "wrong");
    let err = Store::redis(&wrong_sentinel)
        .connect()
        .await
        .expect_err("bad sentinel password");
    let text = err.to_string();
    assert!(matches!(err, tenure::Error::Auth { .. }), "{text}");
    assert!(
        !text.contains("wrong") && !text.contains("data-secret"),
        "{text}"
    );

    let wrong_data = url.replace("data-secret", "wrong");
    let err = Store::redis(&wrong_data)
        .connect()
        .await
        .expect_err("bad data password");
    let text = err.to_string();
    assert!(matches!(err, tenure::Error::Auth { .. }), "{text}");
    assert!(
        !text.contains("wrong") && !text.contains("sentinel-secret"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_promoted_replica_holds_off_before_its_first_lease() {
    let group = group();
    let url = group.url();
    let e = election(&store(&url).await, "holdoff", "a").await;
    // Elected and released before the failover: no lease left anywhere.
    campaign(&e).await.resign().await.expect("resigns");
    let group = tokio::task::spawn_blocking(move || {
        group.failover().expect("SENTINEL FAILOVER");
        group
    })
    .await
    .expect("joins");
    // The new primary never served this data: an old leader it does not
    // know of may still lead, so no lease is granted for one ttl.
    topo::holds_off_after_the_failover(&url, "holdoff").await;
    drop(group);
}

/// A leader that keeps its term through a failover renews on the promoted
/// replica, which starts that node's start-up hold-off then: a hand-over a
/// ttl later is not held off again. (Before, the hold-off began only with
/// the first candidate's acquire there, so the first hand-over after every
/// failover waited an extra ttl.) A ttl of 4 s: at 1 s, a planned
/// failover on the loaded CI machine once outlasted the leader's deadline,
/// which is liveness, not what this test is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_renews_through_a_failover_starts_the_hold_off() {
    const TTL: Duration = Duration::from_secs(4);
    let group = group();
    let url = group.url();
    let a = topo::election_with_ttl(&store(&url).await, "through", "a", TTL).await;
    let b = topo::election_with_ttl(&store(&url).await, "through", "b", TTL).await;
    let term = campaign(&a).await;
    let old = group.primary_port().expect("a primary");
    let group = tokio::task::spawn_blocking(move || {
        let new = group.failover().expect("SENTINEL FAILOVER");
        assert_ne!(new, old);
        // The old primary demoted, the leader's next renewal can only
        // reach the new one.
        group.wait_until_ready(HANG).expect("the group settles");
        group
    })
    .await
    .expect("joins");
    timeout(HANG, async {
        while term.confirm().await.is_err() {
            assert!(term.is_leader(), "the term survives a planned failover");
            tokio::time::sleep(TTL / 10).await;
        }
    })
    .await
    .expect("a renewal reaches the new primary");
    // The hold-off (one ttl) has run out since that renewal.
    tokio::time::sleep(TTL + TTL / 2).await;
    assert!(term.confirm().await.is_ok(), "still the leader");
    term.resign().await.expect("resigns");
    assert!(
        b.try_campaign().await.expect("asks").is_some(),
        "a released lease on a node the leader has renewed on for a ttl is granted at once"
    );
    drop(group);
}

/// Wait until at least `count` clients of `sentinel` are subscribed to
/// something (tenure's stores listen for `+switch-master`).
async fn until_subscribed(sentinel: &Node, count: usize) {
    timeout(HANG, async {
        loop {
            let clients = sentinel.command(&["CLIENT", "LIST"]).expect("CLIENT LIST");
            let subscribed = clients
                .lines()
                .filter(|line| {
                    line.split(' ')
                        .any(|f| f.starts_with("sub=") && f != "sub=0")
                })
                .count();
            if subscribed >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("subscribed to the sentinel");
}

/// The longest time two of `terms` led at once.
fn longest_overlap(terms: &[TermRecord]) -> Duration {
    overlap::overlaps(terms, Among::Everyone)
        .iter()
        .map(|both| both.to.saturating_duration_since(both.from))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// A planned failover (`SENTINEL FAILOVER`) while the sentinel a leader
/// listens to is hung (SIGSTOP): nothing is partitioned, yet the leader
/// must learn of the new primary from the other sentinels. Otherwise a
/// candidate that follows a healthy sentinel is elected on the new primary
/// while the leader keeps renewing on the old one, which stays writable
/// until the sentinels demote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_while_a_sentinel_hangs_gives_one_leader() {
    init_logs();
    // Sentinel demotes a primary that came back (here: that was failed
    // over while running) after four publish periods: 8 s here, well
    // past the promoted replica's hold-off of one ttl.
    let group = SentinelGroup::builder()
        .publish_period(Duration::from_secs(2))
        .start()
        .expect("a Sentinel group");
    let ports = group.sentinel_ports();
    let url = group.url();
    let reordered = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/{}",
        ports[1],
        ports[2],
        ports[0],
        group.service_name()
    );
    let log = TermLog::default();
    let leader = log.contend(election(&store(&url).await, "hung", "a").await, TTL, MARGIN);
    let first = log.until_term_after(0).await;
    let follower = election(&store(&reordered).await, "hung", "b").await;
    let follower = log.contend(follower, TTL, MARGIN);
    // Each store listens on the first sentinel of its URL at least.
    until_subscribed(&group.sentinels()[0], 1).await;
    until_subscribed(&group.sentinels()[1], 1).await;
    let hung = group.sentinels()[0].port();
    group
        .node(hung)
        .expect("sentinel")
        .pause()
        .expect("SIGSTOP");
    let group = tokio::task::spawn_blocking(move || {
        let old = group.primary_port().expect("a primary");
        let new = group.failover().expect("SENTINEL FAILOVER");
        assert_ne!(new, old);
        // The old primary is a replica again: a leader still renewing
        // there now fails.
        group
            .wait_until_ready(HANG)
            .expect("the old primary demoted");
        group
    })
    .await
    .expect("joins");
    handover(&log).await;
    for task in [leader, follower] {
        task.abort();
        let _ = task.await;
    }
    group
        .node(hung)
        .expect("sentinel")
        .unpause()
        .expect("SIGCONT");
    let terms = log.finish();
    eprintln!(
        "first token {first}; terms {:?}; longest overlap {:?}",
        terms.iter().map(|t| (&t.id, t.token)).collect::<Vec<_>>(),
        longest_overlap(&terms)
    );
    TermLog::assert_safe(&terms);
}

/// Two Sentinel groups that monitor the same service name (each its own
/// primary) are two stores: a URL that lists sentinels of both is refused
/// with one line naming a sentinel of each, not half the instances sent to
/// each primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_of_two_groups_are_refused() {
    let (a, b) = (group(), group());
    let (a_ports, b_ports) = (a.sentinel_ports(), b.sentinel_ports());
    // B's sentinel first: today's "first primary to answer" is either.
    let mixed = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}/{}",
        b_ports[0],
        a_ports[0],
        a_ports[1],
        a.service_name()
    );
    let err = timeout(HANG, Store::redis(&mixed).connect())
        .await
        .expect("no hang")
        .expect_err("two Sentinel groups");
    let text = err.to_string();
    assert!(text.contains("different Sentinel groups"), "{text}");
    assert!(!text.contains("  "), "one line, single-spaced: {text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", b_ports[0])),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    assert!(!err.is_transient(), "a person must fix the URL: {text}");
}

/// A sentinel's port given as a plain `redis://` URL: one line that says
/// it is a sentinel and which URL to use (it used to fail later with
/// "unknown command 'EVALSHA'").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_given_as_a_single_server_is_a_clear_error() {
    let group = group();
    let url = format!("redis://127.0.0.1:{}", group.sentinel_ports()[0]);
    let result = timeout(HANG, async {
        let e = Election::builder("wrong").redis(&url).build().await?;
        e.try_campaign().await
    })
    .await
    .expect("no hang");
    let err = result.expect_err("a sentinel is no data node");
    let text = err.to_string();
    assert!(text.contains("is a Redis Sentinel"), "{text}");
    assert!(text.contains("redis+sentinel://"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    assert!(!err.is_transient(), "{text}");
}
