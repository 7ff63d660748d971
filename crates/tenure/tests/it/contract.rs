//! The API contract, run against both backends: each test below is one
//! promise of the public API, written once against a store URL and run on
//! a private redis-server and on a private 3-member etcd cluster. A user
//! who switches the URL gets the same behaviour.

use crate::support;
use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{campaign, election, CrashableInstance, HANG};
use futures_util::StreamExt;
use tenure::{Error, LostReason, PartitionSet};
use tokio::time::{timeout, Instant};

/// Long enough for every backend: etcd leases count whole seconds.
const TTL: Duration = Duration::from_secs(2);

/// A private store of one kind, stopped when dropped.
enum Fixture {
    Redis(support::RedisServer),
    Etcd(etcd_process::EtcdCluster),
}

impl Fixture {
    fn redis() -> Fixture {
        Fixture::Redis(support::redis())
    }

    fn etcd() -> Fixture {
        Fixture::Etcd(support::etcd())
    }

    fn url(&self) -> String {
        match self {
            Fixture::Redis(server) => server.url(),
            Fixture::Etcd(cluster) => cluster.url(),
        }
    }
}

macro_rules! contract {
    ($($promise:ident),* $(,)?) => {
        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $promise() {
                    let store = super::Fixture::redis();
                    super::$promise(&store.url()).await;
                }
            )*
        }
        mod on_etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $promise() {
                    let store = super::Fixture::etcd();
                    super::$promise(&store.url()).await;
                }
            )*
        }
    };
}

contract!(
    exactly_one_of_many_candidates_wins,
    renewals_keep_the_term_past_several_ttls,
    a_crashed_leader_is_replaced_after_its_lease_expires,
    a_resignation_hands_over_without_waiting_for_the_ttl,
    a_stale_handle_cannot_renew_or_resign_a_later_term,
    leader_and_watch_report_each_term,
    partition_sets_share_the_partitions_and_take_over_a_crash,
    a_tick_completed_before_a_crash_is_not_rerun_within_the_period,
    only_the_term_holding_the_lease_records_a_run,
);

async fn exactly_one_of_many_candidates_wins(url: &str) {
    let mut candidates = Vec::new();
    for i in 0..10 {
        candidates.push(election(url, "race", &format!("c{i}"), TTL).await);
    }
    let attempts = candidates.iter().map(|e| {
        let e = e.clone();
        // A fresh Redis grants the first lease one ttl after it is asked;
        // then everybody races, and the winner keeps the lease.
        tokio::spawn(async move { timeout(TTL * 3, e.campaign()).await })
    });
    let winners: Vec<_> = futures_util::future::join_all(attempts)
        .await
        .into_iter()
        .filter_map(|r| match r.expect("the campaign task does not panic") {
            Ok(Ok(term)) => Some(term),
            Ok(Err(err)) => panic!("campaign failed: {err}"),
            Err(_) => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one candidate leads");
    let leader = candidates[0]
        .leader()
        .await
        .expect("leader() answers")
        .expect("someone leads");
    assert_eq!(
        (leader.id.as_str(), leader.token),
        (winners[0].id(), winners[0].token())
    );
}

async fn renewals_keep_the_term_past_several_ttls(url: &str) {
    let a = election(url, "renew", "a", TTL).await;
    let b = election(url, "renew", "b", TTL).await;
    let term = campaign(&a).await;
    let challenger = tokio::spawn(async move { b.campaign().await });
    // Three ttls of renewals, each one moving the deadline on.
    let until = Instant::now() + TTL * 3;
    let mut renewals = 0;
    while Instant::now() < until {
        support::topo::renewed(&term).await;
        renewals += 1;
    }
    assert!(renewals >= 6, "renewed every ttl/3: {renewals}");
    assert!(term.is_leader());
    assert!(!challenger.is_finished(), "the follower never won");
    let leader = a.leader().await.expect("leader()").expect("a leads");
    assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
    challenger.abort();
}

async fn a_crashed_leader_is_replaced_after_its_lease_expires(url: &str) {
    let (crashed, old_token) = CrashableInstance::lead(url, "crash", "victim", TTL);
    let survivor = election(url, "crash", "survivor", TTL).await;
    let follower = tokio::spawn({
        let survivor = survivor.clone();
        async move { survivor.campaign().await }
    });
    // The survivor follows the victim before it crashes.
    support::topo::until_led(&survivor).await;
    crashed.crash();
    let crashed_at = Instant::now();
    let term = timeout(HANG, follower)
        .await
        .expect("a takeover")
        .expect("no panic")
        .expect("campaign");
    let waited = crashed_at.elapsed();
    assert!(term.token() > old_token);
    // The victim renewed at most a renew interval before the crash: its
    // lease had at least ttl - ttl/3 left, and nobody deleted it.
    assert!(
        waited >= TTL - TTL / 3 - Duration::from_millis(50),
        "took over before the lease expired: {waited:?}"
    );
}

async fn a_resignation_hands_over_without_waiting_for_the_ttl(url: &str) {
    let ttl = Duration::from_secs(10);
    let a = election(url, "handover", "a", ttl).await;
    let b = election(url, "handover", "b", ttl).await;
    let term = campaign(&a).await;
    let follower = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    // b has seen a lead (it follows) before a resigns.
    support::topo::until_led(&b).await;
    let resigned_at = Instant::now();
    term.resign().await.expect("resign");
    let next = timeout(ttl / 2, follower)
        .await
        .expect("the hand-over came long before the ttl")
        .expect("no panic")
        .expect("campaign");
    assert_eq!(next.id(), "b");
    assert!(next.token() > term.token());
    assert!(resigned_at.elapsed() < ttl / 2);
}

async fn a_stale_handle_cannot_renew_or_resign_a_later_term(url: &str) {
    let a = election(url, "stale", "a", TTL).await;
    let first = campaign(&a).await;
    let stale = first.clone();
    first.resign().await.expect("resign");
    let second = campaign(&a).await;
    assert!(second.token() > stale.token());
    // The old handle speaks for its own, ended term only.
    assert!(matches!(stale.confirm().await, Err(Error::NotLeader(_))));
    let _ = stale.resign().await;
    assert!(second.is_leader(), "{:?}", second.lost_reason());
    let leader = a.leader().await.expect("leader()").expect("a leads");
    assert_eq!(leader.token, second.token());
    let left = second.confirm().await.expect("the current term renews");
    assert!(left <= TTL);
    // Another instance cannot resign it either: its resign is for its own
    // term, and it has none.
    let b = election(url, "stale", "b", TTL).await;
    assert!(b.try_campaign().await.expect("try").is_none());
    assert_eq!(
        a.leader().await.expect("leader()").map(|l| l.token),
        Some(second.token())
    );
    second.resign().await.expect("resign");
    assert_eq!(second.lost_reason(), Some(LostReason::Resigned));
}

async fn leader_and_watch_report_each_term(url: &str) {
    let a = election(url, "watched", "a", TTL).await;
    let b = election(url, "watched", "b", TTL).await;
    let observer = election(url, "watched", "observer", TTL).await;
    let mut changes = Box::pin(observer.watch());
    async fn next(
        changes: &mut (impl futures_util::Stream<Item = tenure::Result<Option<tenure::LeaderInfo>>>
                  + Unpin),
    ) -> Option<tenure::LeaderInfo> {
        timeout(HANG, changes.next())
            .await
            .expect("a change is reported")
            .expect("the stream goes on")
            .expect("no error")
    }
    assert_eq!(next(&mut changes).await, None);
    let term_a = campaign(&a).await;
    let seen = next(&mut changes).await.expect("a leads");
    assert_eq!((seen.id.as_str(), seen.token), ("a", term_a.token()));
    assert!(seen.held_since.is_some());
    let b_task = tokio::spawn(async move { b.campaign().await });
    term_a.resign().await.expect("resign");
    let mut seen = next(&mut changes).await;
    if seen.is_none() {
        seen = next(&mut changes).await;
    }
    let seen = seen.expect("b leads");
    assert_eq!(seen.id, "b");
    assert!(seen.token > term_a.token());
    let leader = observer.leader().await.expect("leader()").expect("b leads");
    assert_eq!(leader.token, seen.token);
    b_task.abort();
}

async fn partition_sets_share_the_partitions_and_take_over_a_crash(url: &str) {
    let partitions: Vec<String> = (0..8).map(|p| format!("part-{p}")).collect();
    let start = |id: &'static str| {
        let url = url.to_string();
        let partitions = partitions.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (tx, rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let set = PartitionSet::builder("group", partitions)
                .redis(&url)
                .ttl(TTL)
                .id(id)
                .build()
                .await
                .expect("a partition set");
            let _ = tx.send(set.observer());
            let _ = set
                .run(
                    |_, term| async move {
                        term.lost().await;
                    },
                    std::future::pending::<()>(),
                )
                .await;
        });
        let observer = rx.recv_timeout(HANG).expect("the set is built");
        (runtime, observer)
    };
    let (a_runtime, a) = start("a");
    let (b_runtime, b) = start("b");
    let owned = |a: &tenure::PartitionObserver, b: &tenure::PartitionObserver| {
        (a.owned_count(), b.owned_count())
    };
    timeout(HANG, async {
        while owned(&a, &b) != (4, 4) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("a fair share each: {:?}", owned(&a, &b)));
    let mine: BTreeSet<String> = a.owned().into_iter().collect();
    let theirs: BTreeSet<String> = b.owned().into_iter().collect();
    assert!(mine.is_disjoint(&theirs), "{mine:?} {theirs:?}");
    // a crashes: b takes every partition once a's leases expired.
    a_runtime.shutdown_background();
    let crashed_at = Instant::now();
    timeout(HANG, async {
        while b.owned_count() != 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("b takes over: {:?}", b.owned()));
    assert!(crashed_at.elapsed() >= TTL - TTL / 3 - Duration::from_millis(50));
    assert_eq!(b.members(), ["b"]);
    b_runtime.shutdown_background();
}

async fn a_tick_completed_before_a_crash_is_not_rerun_within_the_period(url: &str) {
    // Whole seconds: etcd counts a run's age in seconds.
    let period = Duration::from_secs(5);
    // The victim completes a tick (recording it as Runner::every does) and
    // crashes: no release, its lease lapses.
    let sent = Instant::now();
    let (crashed, _) = CrashableInstance::lead_after_a_run(url, "tick", "victim", TTL, period);
    let survivor = election(url, "tick", "survivor", TTL).await;
    let (ticked, mut ticks) = tokio::sync::mpsc::unbounded_channel();
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let runner = survivor.runner().every(period, move |term| {
        let (ticked, attempts) = (ticked.clone(), attempts.clone());
        async move {
            let _ = ticked.send((Instant::now(), term.token()));
            // The survivor's first tick fails, and is tried again.
            if attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                Err("the first tick fails")
            } else {
                Ok(())
            }
        }
    });
    let running = tokio::spawn(runner.run_until(std::future::pending()));
    support::topo::until_led(&survivor).await;
    crashed.crash();
    let (first, _) = next_tick(&mut ticks).await;
    // The store recorded the victim's run after `sent`; its clock and this
    // host's run at the same rate, give or take a few milliseconds.
    assert!(
        first + Duration::from_millis(20) >= sent + period,
        "the survivor ran the tick {:?} after the victim's, within the period {period:?}",
        first - sent
    );
    let (retried, _) = next_tick(&mut ticks).await;
    assert!(
        retried >= first + TTL,
        "a failed tick is retried after the ttl, here shorter than the period"
    );
    running.abort();
}

async fn only_the_term_holding_the_lease_records_a_run(url: &str) {
    let keep = Duration::from_secs(60);
    let a = election(url, "records", "a", TTL).await;
    let b = election(url, "records", "b", TTL).await;
    assert_eq!(a.since_last_run().await.expect("readable"), None);
    let first = campaign(&a).await;
    let stale = first.clone();
    first.resign().await.expect("resign");
    let current = campaign(&b).await;
    assert!(
        !stale.record_run(keep).await.expect("answered"),
        "a stale term's record is refused"
    );
    assert_eq!(b.since_last_run().await.expect("readable"), None);
    assert!(current.record_run(keep).await.expect("answered"));
    let age = a
        .since_last_run()
        .await
        .expect("readable")
        .expect("a run is remembered");
    assert!(age < Duration::from_secs(2), "{age:?}");
    // Recorded again by the same term: the age starts over.
    assert!(current.record_run(keep).await.expect("answered"));
    current.resign().await.expect("resign");
    assert!(
        !current.record_run(keep).await.expect("answered"),
        "after resigning"
    );
    // The marker is no election: nothing new is listed.
    let store = tenure::Store::open(url).connect().await.expect("store");
    assert_eq!(
        store.elections("tenure").await.expect("listed"),
        Vec::<String>::new()
    );
}

async fn next_tick<T>(ticks: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    timeout(HANG, ticks.recv())
        .await
        .expect("the runner ticks")
        .expect("the runner runs")
}
