//! Scheduling semantics on the in-memory store under paused time:
//! `Runner::every` runs a tick at most once per period across failovers,
//! by the last-run marker kept in the store. Every instant is exact.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Election, MemoryStore};
use tokio::sync::mpsc;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);
const PERIOD: Duration = Duration::from_secs(60);

/// Fail instead of hanging: paused time makes a missing event spin forever.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(24 * 3600), fut)
        .await
        .expect("finished within a day of virtual time")
}

async fn member(store: &MemoryStore, id: &str) -> Election {
    Election::builder("jobs")
        .memory(store)
        .ttl(TTL)
        .id(id)
        .build()
        .await
        .expect("valid settings")
}

/// One tick as the work saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tick {
    by: String,
    started: Instant,
    ended: Instant,
}

/// A runner of `election` whose ticks take `lasts` and succeed unless
/// `fails` says so for the tick's number (1-based, per instance); each
/// completed tick is logged and sent on the returned channel. Runs until
/// the returned task is aborted.
fn run(
    election: &Election,
    lasts: Duration,
    fails: fn(u32) -> bool,
) -> (tokio::task::JoinHandle<()>, mpsc::UnboundedReceiver<Tick>) {
    let (done, ticks) = mpsc::unbounded_channel();
    let by = election.id().to_string();
    let count = Arc::new(Mutex::new(0u32));
    let runner = election.runner().every(PERIOD, move |_term| {
        let (done, by, count) = (done.clone(), by.clone(), count.clone());
        async move {
            let started = Instant::now();
            tokio::time::sleep(lasts).await;
            let number = {
                let mut count = count.lock().unwrap();
                *count += 1;
                *count
            };
            let _ = done.send(Tick {
                by,
                started,
                ended: Instant::now(),
            });
            if fails(number) {
                Err(format!("tick {number} failed"))
            } else {
                Ok(())
            }
        }
    });
    let task = tokio::spawn(async move {
        runner
            .run_until(std::future::pending())
            .await
            .expect("the runner needs no person");
    });
    (task, ticks)
}

fn never(_: u32) -> bool {
    false
}

async fn next(ticks: &mut mpsc::UnboundedReceiver<Tick>) -> Tick {
    within(ticks.recv()).await.expect("the runner ticks on")
}

/// Wait until `election`'s store has a run recorded (the record follows
/// the tick's completion in the same instant of virtual time).
async fn until_recorded(election: &Election) {
    within(async {
        while election.since_last_run().await.expect("readable").is_none() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_does_not_rerun_a_tick_completed_within_the_period() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let (a_task, mut a_ticks) = run(&a, Duration::from_secs(1), never);
    let first = next(&mut a_ticks).await;
    until_recorded(&a).await;
    // b waits as a follower; a dies right after the record, its term
    // dropped without a resignation (its keeper's background release then
    // hands over at once: the hardest case for the marker).
    let (b_task, mut b_ticks) = run(&b, Duration::from_secs(1), never);
    tokio::task::yield_now().await;
    a_task.abort();
    let taken_over = within(async {
        loop {
            if store.holder("jobs").is_some_and(|h| h.id == "b") {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        taken_over < first.ended + PERIOD / 2,
        "b leads long before the period is over"
    );
    let rerun = next(&mut b_ticks).await;
    assert_eq!(
        rerun.started,
        first.ended + PERIOD,
        "b ran the tick exactly one period after a completed it, not before"
    );
    b_task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_runs_at_once_when_the_last_tick_is_a_period_old() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let (a_task, mut a_ticks) = run(&a, Duration::ZERO, never);
    let first = next(&mut a_ticks).await;
    until_recorded(&a).await;
    a_task.abort();
    tokio::time::sleep(PERIOD * 2).await;
    let b = member(&store, "b").await;
    let elected = Instant::now();
    let (b_task, mut b_ticks) = run(&b, Duration::ZERO, never);
    let tick = next(&mut b_ticks).await;
    assert!(tick.started > first.ended + PERIOD);
    assert_eq!(tick.started, elected, "nothing to wait for");
    b_task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failed_tick_is_not_recorded_and_is_retried_after_the_shorter_of_period_and_ttl() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let (a_task, mut ticks) = run(&a, Duration::from_secs(1), |n| n == 1);
    let failed = next(&mut ticks).await;
    assert_eq!(a.since_last_run().await.unwrap(), None, "not recorded");
    let retried = next(&mut ticks).await;
    assert_eq!(retried.started, failed.ended + TTL.min(PERIOD));
    let after_success = next(&mut ticks).await;
    assert_eq!(after_success.started, retried.ended + PERIOD);
    a_task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_tick_that_failed_is_run_by_the_next_leader_at_once() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let (a_task, mut a_ticks) = run(&a, Duration::from_secs(1), |_| true);
    next(&mut a_ticks).await;
    let (b_task, mut b_ticks) = run(&b, Duration::ZERO, never);
    tokio::task::yield_now().await;
    a_task.abort();
    let aborted = Instant::now();
    let tick = next(&mut b_ticks).await;
    assert!(
        tick.started - aborted < Duration::from_secs(1),
        "b ran the failed tick again at once, not a period later"
    );
    until_recorded(&b).await;
    b_task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_slow_tick_is_not_overlapped_and_the_next_starts_a_period_after_it_ended() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let slow = PERIOD * 2 + Duration::from_secs(5);
    let (a_task, mut ticks) = run(&a, slow, never);
    let first = next(&mut ticks).await;
    assert_eq!(first.ended - first.started, slow);
    let second = next(&mut ticks).await;
    assert_eq!(second.started, first.ended + PERIOD);
    assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    a_task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_stale_term_cannot_record_a_run() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let stale = a.campaign().await.unwrap();
    // The lease passes to another term while a's handle lives on.
    store.steal("jobs", "someone-else", TTL);
    assert!(!stale.record_run(PERIOD).await.unwrap());
    assert_eq!(a.since_last_run().await.unwrap(), None);
    within(stale.lost()).await;
    let current = within(b.campaign()).await.unwrap();
    assert!(current.record_run(PERIOD).await.unwrap());
    // The old handle of a's ended term still cannot record.
    assert!(!stale.record_run(PERIOD).await.unwrap());
    current.resign().await.unwrap();
    assert!(!current.record_run(PERIOD).await.unwrap(), "resigned");
    assert_eq!(a.since_last_run().await.unwrap(), Some(Duration::ZERO));
    tokio::time::sleep(PERIOD).await;
    assert_eq!(
        a.since_last_run().await.unwrap(),
        None,
        "kept for the period asked, no longer"
    );
}

#[tokio::test(start_paused = true)]
async fn the_wait_for_the_period_ends_when_leadership_is_lost() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let first = a.campaign().await.unwrap();
    assert!(first.record_run(PERIOD).await.unwrap());
    first.resign().await.unwrap();
    let revoked = Arc::new(Mutex::new(Vec::new()));
    let ticks = Arc::new(Mutex::new(0));
    let task = tokio::spawn({
        let (revoked, ticks) = (revoked.clone(), ticks.clone());
        a.runner()
            .on_revoked(move |reason| {
                revoked
                    .lock()
                    .unwrap()
                    .push((Instant::now(), reason.clone()))
            })
            .every(PERIOD, move |_term| {
                *ticks.lock().unwrap() += 1;
                async {}
            })
            .run_until(tokio::time::sleep(PERIOD / 2))
    });
    // The runner leads and waits out the period; the lease goes.
    within(async {
        while store.holder("jobs").is_none() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.steal("jobs", "someone-else", TTL);
    let lost_at = Instant::now();
    within(task).await.unwrap().unwrap();
    assert_eq!(*ticks.lock().unwrap(), 0, "no tick within the period");
    let revoked = revoked.lock().unwrap();
    assert_eq!(revoked[0].1.label(), "taken");
    assert!(
        revoked[0].0 - lost_at <= TTL,
        "the wait ended with the term, at its next renewal"
    );
}

#[tokio::test(start_paused = true)]
async fn campaign_timeout_gives_up_and_leaves_no_lease_behind() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let term = a.campaign().await.unwrap();
    let asked = Instant::now();
    assert!(b.campaign_timeout(TTL * 2).await.unwrap().is_none());
    assert_eq!(Instant::now() - asked, TTL * 2, "gave up at the timeout");
    assert_eq!(store.holder("jobs").map(|h| h.id), Some("a".to_string()));
    term.resign().await.unwrap();
    let won = b.campaign_timeout(TTL).await.unwrap().expect("free now");
    assert!(won.is_leader());
    won.resign().await.unwrap();
    // A store that answers after the timeout: the acquire wins in the
    // store, but too late; the lease it won is released, not left to
    // block the election for a ttl.
    store.set_fault(tenure::Fault::Slow(Duration::from_millis(200)));
    assert!(b
        .campaign_timeout(Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());
    store.set_fault(tenure::Fault::None);
    assert!(store.holder("jobs").is_none(), "released");
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_gives_a_running_tick_the_grace_then_drops_it_and_releases() {
    let store = MemoryStore::new();
    let election = member(&store, "a").await;
    let started = Arc::new(Mutex::new(None));
    let runner = election
        .runner()
        .shutdown_grace(Duration::from_secs(2))
        .every(PERIOD, {
            let started = started.clone();
            move |_term| {
                let started = started.clone();
                async move {
                    *started.lock().unwrap() = Some(Instant::now());
                    // Far longer than the grace.
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
            }
        });
    let asked = Instant::now() + Duration::from_secs(1);
    within(runner.run_until(tokio::time::sleep_until(asked)))
        .await
        .expect("runs");
    assert!(started.lock().unwrap().is_some(), "the tick started");
    assert_eq!(
        Instant::now(),
        asked + Duration::from_secs(2),
        "the runner returns when the grace runs out, not when the tick ends"
    );
    assert!(
        election.leader().await.expect("reads").is_none(),
        "released"
    );
    assert_eq!(
        election.since_last_run().await.expect("reads"),
        None,
        "a dropped tick is not a run"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tick_that_finishes_within_the_shutdown_grace_is_recorded() {
    let store = MemoryStore::new();
    let election = member(&store, "a").await;
    let runner = election
        .runner()
        .shutdown_grace(Duration::from_secs(5))
        .every(PERIOD, |_term| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
        });
    let asked = Instant::now() + Duration::from_secs(1);
    within(runner.run_until(tokio::time::sleep_until(asked)))
        .await
        .expect("runs");
    assert!(Instant::now() < asked + Duration::from_secs(5));
    let other = member(&store, "b").await;
    assert!(
        other.since_last_run().await.expect("reads").is_some(),
        "the tick that finished during the grace was recorded"
    );
}

#[tokio::test(start_paused = true)]
async fn a_campaign_that_gives_up_leaves_the_running_term_of_its_election_alone() {
    let store = MemoryStore::new();
    let election = member(&store, "a").await;
    let term = within(election.campaign()).await.expect("elected");
    // A second campaign of the same election, while the first term runs:
    // it finds the lease held (by a term it did not begin) and gives up.
    let second = within(election.campaign_timeout(Duration::from_millis(500)))
        .await
        .expect("no error");
    assert!(second.is_none());
    tokio::time::sleep(TTL * 2).await;
    assert!(term.is_leader(), "the running term kept its lease");
    let leader = election.leader().await.expect("reads").expect("a leader");
    assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
}
