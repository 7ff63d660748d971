//! The API contract, run against every store: each test below is one
//! promise of the public API, written once against a [`Target`] and run on
//! a private redis-server, on a private 3-member etcd cluster and on a
//! [`tenure::MemoryStore`]. A user who switches the URL gets the same
//! behaviour, and the in-memory double that the simulation and the unit
//! tests rely on keeps the promises the real stores keep.
//!
//! On memory, an instance crashes as it does on the others: it lives on a
//! runtime of its own ([`CrashableInstance`], [`Crashable`]) that vanishes
//! with every task on it, and its lease expires by the clock (real time
//! here, as on the servers: a crashable runtime cannot share a paused
//! clock).

use crate::support;
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::support::{campaign, Crashable, CrashableInstance, Target, HANG};
use futures_util::StreamExt;
use tenure::{Error, LostReason};
use tokio::time::{timeout, Instant};

/// Long enough for every backend: etcd leases count whole seconds.
const TTL: Duration = Duration::from_secs(2);

/// A private store of one kind, stopped when dropped.
enum Fixture {
    Redis(support::RedisServer),
    Etcd(etcd_process::EtcdCluster),
    #[cfg(feature = "zookeeper")]
    Zk(zk_process::ZkEnsemble),
    Sqlite(support::SqliteFile),
    #[cfg(feature = "postgres")]
    Postgres(pg_process::PgServer),
    /// The server behind PgBouncer in transaction mode (the pooler is
    /// dropped first).
    #[cfg(feature = "postgres")]
    Pooled {
        pooler: pg_process::Pooler,
        _server: pg_process::PgServer,
    },
    Memory(tenure::MemoryStore),
}

impl Fixture {
    fn redis() -> Fixture {
        Fixture::Redis(support::redis())
    }

    fn etcd() -> Fixture {
        Fixture::Etcd(support::etcd())
    }

    #[cfg(feature = "zookeeper")]
    fn zk() -> Fixture {
        Fixture::Zk(support::zk())
    }

    #[cfg(feature = "sqlite")]
    fn sqlite() -> Fixture {
        Fixture::Sqlite(support::sqlite())
    }

    #[cfg(feature = "postgres")]
    fn postgres() -> Fixture {
        Fixture::Postgres(support::postgres())
    }

    #[cfg(feature = "postgres")]
    fn pooled() -> Fixture {
        let server = support::postgres();
        match server.start_pooler() {
            Ok(pooler) => Fixture::Pooled {
                pooler,
                _server: server,
            },
            Err(err) => panic!("cannot start PgBouncer for the tests: {err}"),
        }
    }

    fn memory() -> Fixture {
        support::init_logs();
        Fixture::Memory(tenure::MemoryStore::new())
    }

    fn target(&self) -> Target {
        match self {
            Fixture::Redis(server) => Target::Url(server.url()),
            Fixture::Etcd(cluster) => Target::Url(cluster.url()),
            #[cfg(feature = "zookeeper")]
            Fixture::Zk(ensemble) => Target::Url(ensemble.url()),
            Fixture::Sqlite(file) => Target::Url(file.url()),
            #[cfg(feature = "postgres")]
            Fixture::Postgres(server) => Target::Url(server.url()),
            #[cfg(feature = "postgres")]
            Fixture::Pooled { pooler, .. } => Target::Url(pooler.url()),
            Fixture::Memory(store) => Target::Memory(store.clone()),
        }
    }
}

macro_rules! contract {
    ($($promise:ident),* $(,)?) => {
        contract!(@on on_redis, redis, $($promise),*);
        contract!(@on on_etcd, etcd, $($promise),*);
        contract!(@on on_memory, memory, $($promise),*);
        #[cfg(feature = "sqlite")]
        contract!(@on on_sqlite, sqlite, $($promise),*);
        #[cfg(feature = "zookeeper")]
        contract!(@on on_zk, zk, $($promise),*);
        #[cfg(feature = "postgres")]
        contract!(@on on_postgres, postgres, $($promise),*);
    };
    (@on $module:ident, $store:ident, $($promise:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $promise() {
                    let store = super::Fixture::$store();
                    super::$promise(&store.target()).await;
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
    a_semaphore_never_has_more_holders_than_permits,
    a_slot_is_claimed_once_and_in_order,
    a_cron_slot_runs_at_most_once_across_a_crash,
);

// Through PgBouncer in transaction mode, every promise but a hand-over
// faster than the ttl: a `LISTEN` hears nothing through such a pooler, so
// a follower wakes at the lease's expiry (the book's PostgreSQL page;
// `postgres::through_a_pooler_a_resignation_hands_over_by_the_expiry`).
#[cfg(feature = "postgres")]
contract!(
    @on on_postgres_pooled,
    pooled,
    exactly_one_of_many_candidates_wins,
    renewals_keep_the_term_past_several_ttls,
    a_crashed_leader_is_replaced_after_its_lease_expires,
    a_stale_handle_cannot_renew_or_resign_a_later_term,
    leader_and_watch_report_each_term,
    partition_sets_share_the_partitions_and_take_over_a_crash,
    a_tick_completed_before_a_crash_is_not_rerun_within_the_period,
    only_the_term_holding_the_lease_records_a_run,
    a_semaphore_never_has_more_holders_than_permits,
    a_slot_is_claimed_once_and_in_order,
    a_cron_slot_runs_at_most_once_across_a_crash
);

/// Five instances, three permits: three hold one, renewing, while two
/// wait; a resigned permit goes to one waiter, with a larger token. (On
/// ZooKeeper this found a sweep that cleared another instance's term of
/// the same token: see `backend::zk::tests`.)
async fn a_semaphore_never_has_more_holders_than_permits(target: &Target) {
    let mut semaphores = Vec::new();
    for i in 0..5 {
        semaphores.push(target.semaphore("permits", &format!("s{i}"), TTL, 3).await);
    }
    let (won, mut winners) = tokio::sync::mpsc::unbounded_channel();
    let tasks: Vec<_> = semaphores
        .iter()
        .cloned()
        .map(|semaphore| {
            let won = won.clone();
            tokio::spawn(async move {
                let term = semaphore.acquire().await.expect("acquire");
                let _ = won.send(term.clone());
                term.lost().await
            })
        })
        .collect();
    let mut terms = Vec::new();
    for _ in 0..3 {
        let term = timeout(HANG, winners.recv()).await.expect("a permit");
        terms.push(term.expect("the channel is open"));
    }
    let ids = |terms: &[tenure::Leadership]| -> BTreeSet<String> {
        terms.iter().map(|t| t.id().to_string()).collect()
    };
    let permits = |terms: &[tenure::Leadership]| -> BTreeSet<String> {
        terms.iter().map(|t| t.election().to_string()).collect()
    };
    assert_eq!(ids(&terms).len(), 3, "three instances");
    assert_eq!(permits(&terms).len(), 3, "one permit each");
    // Past a ttl of renewals (each holder renews every ttl/3, all at
    // once) the three still hold, and nobody else won.
    for term in &terms {
        support::topo::renewed(term).await;
        support::topo::renewed(term).await;
    }
    support::topo::renewed(&terms[0]).await;
    assert!(winners.try_recv().is_err(), "a fourth holder");
    let holders = semaphores[0].holders().await.expect("holders");
    let listed: BTreeSet<String> = holders.iter().flatten().map(|h| h.id.clone()).collect();
    assert_eq!(listed, ids(&terms), "{holders:?}");

    let released = terms.remove(0);
    released.resign().await.expect("resigned");
    let next = timeout(HANG, winners.recv())
        .await
        .expect("a waiter takes the permit")
        .expect("the channel is open");
    assert_eq!(next.election(), released.election());
    assert!(next.token() > released.token());
    assert!(!ids(&terms).contains(next.id()), "a waiter, not a holder");
    terms.push(next);
    assert_eq!(permits(&terms).len(), 3);
    assert!(winners.try_recv().is_err(), "one waiter took it");
    for task in tasks {
        task.abort();
    }
}

async fn exactly_one_of_many_candidates_wins(target: &Target) {
    let mut candidates = Vec::new();
    for i in 0..10 {
        candidates.push(target.election("race", &format!("c{i}"), TTL).await);
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

async fn renewals_keep_the_term_past_several_ttls(target: &Target) {
    let a = target.election("renew", "a", TTL).await;
    let b = target.election("renew", "b", TTL).await;
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

async fn a_crashed_leader_is_replaced_after_its_lease_expires(target: &Target) {
    let (mut crashed, old_token) = CrashableInstance::lead(target, "crash", "victim", TTL);
    let survivor = target.election("crash", "survivor", TTL).await;
    let follower = tokio::spawn({
        let survivor = survivor.clone();
        async move { survivor.campaign().await }
    });
    // The survivor follows the victim before it crashes.
    support::topo::until_led(&survivor).await;
    // Elsewhere the term's handle is kept to read its frozen deadline; on
    // SQLite that handle holds the term's lock, so the instance goes whole.
    let kept = if target.is_sqlite() {
        crashed.crash();
        None
    } else {
        crashed.crash_in_place();
        Some(crashed)
    };
    let crashed_at = Instant::now();
    let term = timeout(HANG, follower)
        .await
        .expect("a takeover")
        .expect("no panic")
        .expect("campaign");
    let elected_at = Instant::now();
    let waited = elected_at - crashed_at;
    assert!(term.token() > old_token);
    let Some(crashed) = kept else {
        // On one host a crash is seen: the victim's lock went with it.
        assert!(waited < TTL - TTL / 3, "waited for the expiry: {waited:?}");
        return;
    };
    // Nobody deleted the victim's lease: it lapsed after the victim's
    // (now frozen) deadline, however late its last renewal was.
    let deadline = crashed.deadline();
    assert!(
        elected_at >= deadline,
        "took over {:?} before the victim's deadline",
        deadline - elected_at
    );
}

async fn a_resignation_hands_over_without_waiting_for_the_ttl(target: &Target) {
    let ttl = Duration::from_secs(10);
    let a = target.election("handover", "a", ttl).await;
    let b = target.election("handover", "b", ttl).await;
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

async fn a_stale_handle_cannot_renew_or_resign_a_later_term(target: &Target) {
    let a = target.election("stale", "a", TTL).await;
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
    let b = target.election("stale", "b", TTL).await;
    assert!(b.try_campaign().await.expect("try").is_none());
    assert_eq!(
        a.leader().await.expect("leader()").map(|l| l.token),
        Some(second.token())
    );
    second.resign().await.expect("resign");
    assert_eq!(second.lost_reason(), Some(LostReason::Resigned));
}

async fn leader_and_watch_report_each_term(target: &Target) {
    let a = target.election("watched", "a", TTL).await;
    let b = target.election("watched", "b", TTL).await;
    let observer = target.election("watched", "observer", TTL).await;
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
    match target {
        Target::Url(_) => assert!(seen.held_since.is_some()),
        // The one documented difference (`LeaderInfo::held_since`): the
        // servers date a term by their clock; the in-memory store runs on
        // tokio's, which tests pause, and dates none.
        Target::Memory(_) => assert_eq!(seen.held_since, None),
    }
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

async fn partition_sets_share_the_partitions_and_take_over_a_crash(target: &Target) {
    let partitions: Vec<String> = (0..8).map(|p| format!("part-{p}")).collect();
    let start = |id: &'static str| {
        let builder = target.partition_set("group", partitions.clone());
        let runtime = Crashable::start();
        let (tx, rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let set = builder
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
    let (mut a_runtime, a) = start("a");
    let (mut b_runtime, b) = start("b");
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
    a_runtime.crash();
    let crashed_at = Instant::now();
    timeout(HANG, async {
        while b.owned_count() != 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("b takes over: {:?}", b.owned()));
    // Not before a's leases expired: at least half a ttl after the crash
    // (a's last renewal may have run late on a busy machine; a set that
    // took over early would do it within milliseconds).
    assert!(
        crashed_at.elapsed() >= TTL / 2,
        "{:?}",
        crashed_at.elapsed()
    );
    // And at their expiry, not at some far one: a store that writes a
    // set's leases further ahead than their ttl must still end them with
    // the member.
    assert!(
        crashed_at.elapsed() < TTL * 5,
        "b took over only {:?} after the crash",
        crashed_at.elapsed()
    );
    assert_eq!(b.members(), ["b"]);
    b_runtime.crash();
}

async fn a_tick_completed_before_a_crash_is_not_rerun_within_the_period(target: &Target) {
    // Whole seconds: etcd counts a run's age in seconds.
    let period = Duration::from_secs(5);
    // The victim completes a tick (recording it as Runner::every does) and
    // crashes: no release, its lease lapses.
    let sent = Instant::now();
    let (crashed, _) = CrashableInstance::lead_after_a_run(target, "tick", "victim", TTL, period);
    let survivor = target.election("tick", "survivor", TTL).await;
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

async fn only_the_term_holding_the_lease_records_a_run(target: &Target) {
    let keep = Duration::from_secs(60);
    let a = target.election("records", "a", TTL).await;
    let b = target.election("records", "b", TTL).await;
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
    let store = target.store().await;
    assert_eq!(
        store.elections("tenure").await.expect("listed"),
        Vec::<String>::new()
    );
}

/// Scheduled slots are claimed in the store: each once, in order, and
/// only by the term holding the lease, across terms.
async fn a_slot_is_claimed_once_and_in_order(target: &Target) {
    let keep = Duration::from_secs(60);
    let at = |seconds: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200 + seconds);
    let a = target.election("slots", "a", TTL).await;
    let b = target.election("slots", "b", TTL).await;
    assert_eq!(a.last_slot().await.expect("readable"), None);
    let first = campaign(&a).await;
    assert!(first.claim_slot(at(60), keep).await.expect("answered"));
    assert!(
        !first.claim_slot(at(60), keep).await.expect("answered"),
        "a slot is claimed once"
    );
    assert!(
        !first.claim_slot(at(0), keep).await.expect("answered"),
        "an earlier slot is refused"
    );
    // A plain record of a run keeps the slot.
    assert!(first.record_run(keep).await.expect("answered"));
    assert_eq!(b.last_slot().await.expect("readable"), Some(at(60)));
    let stale = first.clone();
    first.resign().await.expect("resign");
    let second = campaign(&b).await;
    assert!(
        !second.claim_slot(at(60), keep).await.expect("answered"),
        "the next term cannot claim it again"
    );
    assert!(
        !stale.claim_slot(at(120), keep).await.expect("answered"),
        "a stale term claims nothing"
    );
    assert!(second.claim_slot(at(120), keep).await.expect("answered"));
    let a_millisecond_later = at(120) + Duration::from_millis(1);
    assert!(second
        .claim_slot(a_millisecond_later, keep)
        .await
        .expect("answered"));
    assert_eq!(
        a.last_slot().await.expect("readable"),
        Some(a_millisecond_later)
    );
    assert!(a.since_last_run().await.expect("readable").is_some());
}

/// A leader runs a slot, then crashes in the middle of the next slot's
/// run, and the next leader takes over before the following slot: it
/// never runs that slot again (had the crashed leader recorded its runs
/// only once they completed, as `Runner::every` does, the store would name
/// the first slot, and the second, within the starting deadline, would
/// run again late), and goes on with later ones.
async fn a_cron_slot_runs_at_most_once_across_a_crash(target: &Target) {
    type Runs = std::sync::Arc<std::sync::Mutex<Vec<(SystemTime, &'static str)>>>;
    let runs: Runs = Default::default();
    // A slot every four seconds: the survivor takes over within about a
    // ttl (2 s) of the crash, before the next slot.
    let schedule = || {
        tenure::Schedule::cron("*/4 * * * * *")
            .expect("an expression")
            .starting_deadline(Duration::from_secs(30))
    };
    let runner = |election: tenure::Election,
                  by: &'static str,
                  started: tokio::sync::mpsc::UnboundedSender<()>| {
        let runs = runs.clone();
        election.runner().cron(schedule(), move |_term, slot| {
            let mut runs = runs.lock().expect("not poisoned");
            runs.push((slot, by));
            let _ = started.send(());
            // The victim's second run lasts past its crash.
            let second = by == "victim" && runs.len() == 2;
            tokio::time::sleep(Duration::from_secs(if second { 10 } else { 1 }))
        })
    };
    let mut victim = support::Crashable::start();
    let (victim_started, mut victim_runs) = tokio::sync::mpsc::unbounded_channel();
    let victim_election = victim.block_on(target.election("cron", "victim", TTL));
    let victim_runner = runner(victim_election.clone(), "victim", victim_started);
    victim.spawn(victim_runner.run_until(std::future::pending()));
    let survivor = target.election("cron", "survivor", TTL).await;
    support::topo::until_led(&survivor).await;
    let (survivor_started, mut survivor_runs) = tokio::sync::mpsc::unbounded_channel();
    let running = tokio::spawn(
        runner(survivor.clone(), "survivor", survivor_started).run_until(std::future::pending()),
    );
    // The victim crashes as soon as its second run has started.
    next_tick(&mut victim_runs).await;
    next_tick(&mut victim_runs).await;
    victim.crash();
    drop(victim_election);
    next_tick(&mut survivor_runs).await;
    next_tick(&mut survivor_runs).await;
    running.abort();
    let runs = runs.lock().expect("not poisoned").clone();
    assert_eq!((runs[0].1, runs[1].1), ("victim", "victim"), "{runs:?}");
    assert!(
        runs[2..]
            .iter()
            .all(|(slot, by)| *by == "survivor" && *slot > runs[1].0),
        "the survivor ran the slot the victim had claimed: {runs:?}"
    );
    let slots: BTreeSet<SystemTime> = runs.iter().map(|(slot, _)| *slot).collect();
    assert_eq!(slots.len(), runs.len(), "a slot ran twice: {runs:?}");
}

async fn next_tick<T>(ticks: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    timeout(HANG, ticks.recv())
        .await
        .expect("the runner ticks")
        .expect("the runner runs")
}
