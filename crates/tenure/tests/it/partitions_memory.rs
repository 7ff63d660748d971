//! Partition sets on the in-memory store, under tokio's paused clock: every
//! hand-over happens at an exact, repeatable instant.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Leadership, MemoryStore, PartitionObserver, PartitionSet};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(3);
const GROUP: &str = "orders";

fn partitions(n: usize) -> Vec<String> {
    (0..n).map(|p| format!("orders-{p}")).collect()
}

/// (member, partition, token, instant) entries.
type Entries = Arc<Mutex<Vec<(String, String, u64, Instant)>>>;

/// What every member's work reports: when a term's work begins, and when
/// it returns.
#[derive(Default, Clone)]
struct Journal {
    started: Entries,
    returned: Entries,
}

struct Member {
    observer: PartitionObserver,
    stop: Option<oneshot::Sender<()>>,
    run: JoinHandle<tenure::Result<()>>,
}

impl Member {
    /// Join the group; each term's work runs until `lost()` fires, then
    /// takes `linger` more before it returns.
    async fn join(
        store: &MemoryStore,
        id: &str,
        n: usize,
        journal: &Journal,
        linger: Duration,
        terms: Option<mpsc::UnboundedSender<Leadership>>,
    ) -> Member {
        let set = PartitionSet::builder(GROUP, partitions(n))
            .memory(store)
            .ttl(TTL)
            .id(id)
            .build()
            .await
            .expect("builds");
        let observer = set.observer();
        let (stop, stopped) = oneshot::channel::<()>();
        let journal = journal.clone();
        let member = id.to_string();
        let run = tokio::spawn(set.run(
            move |partition, term| {
                let journal = journal.clone();
                let member = member.clone();
                let terms = terms.clone();
                async move {
                    let token = term.token();
                    journal.started.lock().unwrap().push((
                        member.clone(),
                        partition.clone(),
                        token,
                        Instant::now(),
                    ));
                    if let Some(terms) = &terms {
                        let _ = terms.send(term.clone());
                    }
                    term.lost().await;
                    sleep(linger).await;
                    journal.returned.lock().unwrap().push((
                        member,
                        partition,
                        token,
                        Instant::now(),
                    ));
                }
            },
            async move {
                let _ = stopped.await;
            },
        ));
        Member {
            observer,
            stop: Some(stop),
            run,
        }
    }

    /// Leave the group: stop the work, release everything.
    async fn leave(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.run.await.expect("no panic").expect("runs");
    }

    /// Vanish without releasing anything, as a crashed process.
    fn crash(self) {
        self.run.abort();
    }
}

/// Owners of every partition, as the store says.
fn owners(store: &MemoryStore, n: usize) -> BTreeMap<String, Option<String>> {
    partitions(n)
        .into_iter()
        .map(|p| {
            let owner = store.holder(&p).map(|h| h.id);
            (p, owner)
        })
        .collect()
}

/// The token of every partition's lease, as the store says.
fn tokens(store: &MemoryStore, n: usize) -> Vec<Option<u64>> {
    partitions(n)
        .iter()
        .map(|p| store.holder(p).map(|h| h.token))
        .collect()
}

/// Advance paused time in small steps until `done`, failing after `limit`.
async fn until(limit: Duration, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < give_up,
            "condition not met within {limit:?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn members_share_partitions_fairly_and_take_over_from_one_that_leaves_or_crashes() {
    let store = MemoryStore::new();
    let journal = Journal::default();
    let n = 6;
    let a = Member::join(&store, "a", n, &journal, Duration::ZERO, None).await;
    let b = Member::join(&store, "b", n, &journal, Duration::ZERO, None).await;
    let c = Member::join(&store, "c", n, &journal, Duration::ZERO, None).await;
    until(TTL * 5, || {
        [&a, &b, &c].iter().all(|m| m.observer.owned().len() == 2)
            && owners(&store, n).values().all(Option::is_some)
    })
    .await;

    // c leaves: its partitions move at once, within the fair share of 3.
    let left = Instant::now();
    c.leave().await;
    until(TTL * 5, || {
        a.observer.owned().len() == 3 && b.observer.owned().len() == 3
    })
    .await;
    assert!(
        Instant::now() - left < TTL,
        "a graceful leave waits for no lease"
    );

    // b crashes: a takes everything once b's heartbeat and leases lapse.
    let crashed = Instant::now();
    b.crash();
    until(TTL * 5, || a.observer.owned().len() == n).await;
    assert!(
        Instant::now() - crashed >= TTL,
        "taken before b's leases lapsed"
    );
    assert!(owners(&store, n)
        .values()
        .all(|o| o.as_deref() == Some("a")));
    a.leave().await;
}

#[tokio::test(start_paused = true)]
async fn a_newcomers_partitions_are_handed_over_only_after_the_old_work_returned() {
    let store = MemoryStore::new();
    let journal = Journal::default();
    let n = 2;
    // a's work takes a second to wind down after it is told to stop.
    let linger = Duration::from_secs(1);
    let a = Member::join(&store, "a", n, &journal, linger, None).await;
    until(TTL * 5, || a.observer.owned().len() == n).await;
    let b = Member::join(&store, "b", n, &journal, Duration::ZERO, None).await;
    until(TTL * 5, || {
        a.observer.owned().len() == 1 && b.observer.owned().len() == 1
    })
    .await;
    let moved = b.observer.owned()[0].clone();
    let returned = journal
        .returned
        .lock()
        .unwrap()
        .iter()
        .find(|(m, p, _, _)| m == "a" && *p == moved)
        .map(|(.., at)| *at)
        .expect("a's work on the moved partition returned");
    let started = journal
        .started
        .lock()
        .unwrap()
        .iter()
        .find(|(m, p, _, _)| m == "b" && *p == moved)
        .map(|(.., at)| *at)
        .expect("b started the moved partition");
    assert!(
        started >= returned,
        "b started {moved} before a's work on it returned"
    );
    a.leave().await;
    b.leave().await;
}

#[tokio::test(start_paused = true)]
async fn resigning_from_a_stale_handle_leaves_the_newer_term_alone() {
    let store = MemoryStore::new();
    let journal = Journal::default();
    let (terms_tx, mut terms) = mpsc::unbounded_channel();
    let a = Member::join(&store, "a", 1, &journal, Duration::ZERO, Some(terms_tx)).await;
    let first = terms.recv().await.expect("a first term");
    // The lease is lost (as after a store outage); a takes it again with a
    // new term.
    store.revoke(first.election());
    let second = terms.recv().await.expect("a second term");
    assert!(second.token() > first.token());
    assert!(!first.is_leader());
    // The old term's handle resigns: the new term must not end.
    first
        .resign()
        .await
        .expect("resign of a term that is over is a no-op");
    assert!(second.is_leader());
    assert_eq!(
        store.holder(second.election()).map(|h| h.token),
        Some(second.token())
    );
    assert!(first.confirm().await.is_err());
    assert!(second.confirm().await.is_ok());
    a.leave().await;
}

#[tokio::test(start_paused = true)]
async fn a_steady_member_costs_one_round_trip_per_renew_interval() {
    let store = MemoryStore::new();
    let journal = Journal::default();
    let n = 8;
    let a = Member::join(&store, "a", n, &journal, Duration::ZERO, None).await;
    until(TTL * 5, || a.observer.owned().len() == n).await;
    let before = a.observer.round_trips();
    let heartbeats = store.calls(GROUP).heartbeat;
    sleep(TTL * 3).await;
    let trips = a.observer.round_trips() - before;
    // Renew interval ttl/3: nine cycles in three ttls, each one batch of the
    // heartbeat and all eight renewals.
    assert!((8..=10).contains(&trips), "{trips} round trips");
    assert_eq!(store.calls(GROUP).heartbeat - heartbeats, trips);
    a.leave().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_batch_is_retried_before_the_deadline_not_at_the_next_tick() {
    let store = MemoryStore::new();
    let journal = Journal::default();
    let n = 2;
    let a = Member::join(&store, "a", n, &journal, Duration::ZERO, None).await;
    until(TTL * 5, || a.observer.owned().len() == n).await;
    let before = tokens(&store, n);
    // The store fails for a little over 1.5 renew intervals: the next two
    // ticks fail, and the tick after them would come after the deadline
    // (ttl - margin = 2.7 s after the last renewal).
    sleep(Duration::from_millis(500)).await;
    store.set_fault(tenure::Fault::Fail);
    sleep(Duration::from_millis(1550)).await;
    store.set_fault(tenure::Fault::None);
    sleep(TTL).await;
    let after = tokens(&store, n);
    assert_eq!(before, after, "a term was lost and taken again");
    assert!(journal.returned.lock().unwrap().is_empty(), "a term ended");
    a.leave().await;
}

#[tokio::test(start_paused = true)]
async fn acquisitions_in_flight_never_hold_up_the_renewals_of_what_is_held() {
    // 10,000 partitions take ten round trips of acquisitions; each round
    // trip answers after 600 ms. Made one after another between renewals,
    // they would keep the first partitions unrenewed for 6 s, past their
    // deadline (ttl 3 s - margin).
    let store = MemoryStore::new();
    store.set_fault(tenure::Fault::Slow(Duration::from_millis(600)));
    let journal = Journal::default();
    let n = 10_000;
    let a = Member::join(&store, "a", n, &journal, Duration::ZERO, None).await;
    until(TTL * 10, || a.observer.owned().len() == n).await;
    sleep(TTL * 2).await;
    assert!(
        journal.returned.lock().unwrap().is_empty(),
        "terms ended while others were being acquired: {:?}",
        &journal.returned.lock().unwrap()[..3.min(journal.returned.lock().unwrap().len())]
    );
    assert_eq!(
        journal.started.lock().unwrap().len(),
        n,
        "each partition won once"
    );
    store.set_fault(tenure::Fault::None);
    a.leave().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_renewal_batch_keeps_every_term_it_renews_in_time() {
    // Each round trip answers after 800 ms (inside the 1 s call timeout):
    // every renewal succeeds, late, and no term is lost or taken again.
    let store = MemoryStore::new();
    let journal = Journal::default();
    let n = 4;
    let a = Member::join(&store, "a", n, &journal, Duration::ZERO, None).await;
    until(TTL * 5, || a.observer.owned().len() == n).await;
    let before = tokens(&store, n);
    store.set_fault(tenure::Fault::Slow(Duration::from_millis(800)));
    sleep(TTL * 3).await;
    store.set_fault(tenure::Fault::None);
    assert_eq!(tokens(&store, n), before, "a term was lost and taken again");
    assert!(journal.returned.lock().unwrap().is_empty(), "a term ended");
    a.leave().await;
}

#[tokio::test(start_paused = true)]
async fn a_set_whose_renewals_outlast_the_call_timeout_holds_steadily_instead_of_thrashing() {
    // A saturated store: 60 µs a lease, one round trip at a time. Renewing
    // 20,000 partitions takes 1.2 s, longer than the 1 s call timeout but
    // well inside the 2.7 s from a renewal's sending to its deadline. A set
    // that gives up on it at the call timeout sends it again on top of the
    // work still queued, and its terms lapse and are won again, over and
    // over (100,000 partitions on one redis-server did so).
    let store = MemoryStore::new();
    store.set_fault(tenure::Fault::Busy(Duration::from_micros(60)));
    let journal = Journal::default();
    let n = 20_000;
    let a = Member::join(&store, "a", n, &journal, Duration::ZERO, None).await;
    until(TTL * 20, || a.observer.owned().len() == n).await;
    let won = journal.started.lock().unwrap().len();
    let before = tokens(&store, n);
    sleep(TTL * 5).await;
    assert_eq!(
        journal.returned.lock().unwrap().len(),
        0,
        "terms lapsed while the set held all {n}"
    );
    assert_eq!(tokens(&store, n), before, "a term was lost and taken again");
    assert_eq!(won, n, "each partition won once while the set warmed up");
    store.set_fault(tenure::Fault::None);
    a.leave().await;
}

/// When the first term of a member that joins right after the store lost
/// its data begins: the start-up hold-off it waits.
async fn first_term_after_a_wipe(max_ttl: Option<Duration>) -> Duration {
    let store = MemoryStore::new();
    store.wipe();
    let wiped = Instant::now();
    let mut builder = PartitionSet::builder(GROUP, partitions(1))
        .memory(&store)
        .ttl(Duration::from_millis(200))
        .id("short");
    if let Some(max_ttl) = max_ttl {
        builder = builder.max_ttl(max_ttl);
    }
    let set = builder.build().await.expect("builds");
    let (began, mut first) = mpsc::unbounded_channel();
    let run = tokio::spawn(set.run(
        move |_partition, _term| {
            let _ = began.send(Instant::now());
            std::future::pending::<()>()
        },
        std::future::pending::<()>(),
    ));
    let at = tokio::time::timeout(Duration::from_secs(60), first.recv())
        .await
        .expect("a term within a minute")
        .expect("a term");
    run.abort();
    at - wiped
}

#[tokio::test(start_paused = true)]
async fn a_member_with_a_shorter_ttl_waits_out_the_max_ttl_after_the_store_lost_its_data() {
    // A member whose ttl is 200 ms, in a group where another member's is
    // 400 ms: after a wipe, that other member may still believe it leads
    // for up to 400 ms, so no partition lease may be granted before then.
    let held_off = first_term_after_a_wipe(Some(Duration::from_millis(400))).await;
    assert!(held_off >= Duration::from_millis(400), "{held_off:?}");
    // Without max_ttl, only its own ttl (what the simulation found).
    let own = first_term_after_a_wipe(None).await;
    assert!(
        own >= Duration::from_millis(200) && own < Duration::from_millis(400),
        "{own:?}"
    );
}
