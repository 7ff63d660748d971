//! The election protocol on the in-memory store under paused time: every
//! instant is exact and every run identical.

use std::time::Duration;

use tenure::{Election, Fault, LostReason, MemoryStore};
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(3000);

/// Fail instead of hanging: paused time makes a missing event spin forever.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3600), fut)
        .await
        .expect("finished within an hour of virtual time")
}

async fn member(store: &MemoryStore, id: &str) -> Election {
    Election::builder("jobs")
        .memory(store)
        .ttl(TTL)
        .margin(Duration::from_millis(300))
        .id(id)
        .build()
        .await
        .expect("valid settings")
}

#[tokio::test(start_paused = true)]
async fn leader_keeps_renewing_while_the_store_answers() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let term = a.campaign().await.unwrap();
    tokio::time::sleep(TTL * 10).await;
    assert!(term.is_leader());
    assert_eq!(store.holder("jobs").unwrap().id, "a");
}

#[tokio::test(start_paused = true)]
async fn follower_takes_over_within_jitter_of_the_lease_expiry() {
    let store = MemoryStore::new();
    let b = member(&store, "b").await;
    // A leader that crashed right after acquiring: its lease stays, nobody
    // renews or releases it.
    let token_a = store.steal("jobs", "a", TTL);
    let expires_at = Instant::now() + TTL;
    let term_b = within(b.campaign()).await.unwrap();
    let late = Instant::now() - expires_at;
    assert!(
        late <= Duration::from_millis(15),
        "took over {late:?} after expiry"
    );
    assert!(term_b.token() > token_a);
}

#[tokio::test(start_paused = true)]
async fn resign_hands_over_in_the_same_instant() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let term = a.campaign().await.unwrap();
    let follower = tokio::spawn(async move { (b.campaign().await, Instant::now()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resigned_at = Instant::now();
    term.resign().await.unwrap();
    assert!(!term.is_leader());
    assert_eq!(term.lost().await, LostReason::Resigned);
    let (next, elected_at) = follower.await.unwrap();
    assert_eq!(next.unwrap().id(), "b");
    assert!(elected_at - resigned_at <= Duration::from_millis(15));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_store_ends_the_term_exactly_at_the_deadline() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let elected_at = Instant::now();
    let term = a.campaign().await.unwrap();
    assert_eq!(
        term.deadline(),
        elected_at + TTL - Duration::from_millis(300)
    );
    store.set_fault(Fault::Stall);
    let reason = term.lost().await;
    assert_eq!(reason, LostReason::DeadlinePassed);
    // The last renewal that succeeded was sent at elected_at (the store
    // stalled before the first renewal), so the deadline never moved.
    assert_eq!(
        Instant::now(),
        elected_at + TTL - Duration::from_millis(300)
    );
    assert!(!term.is_leader());
}

#[tokio::test(start_paused = true)]
async fn is_leader_turns_false_at_the_deadline_even_if_nobody_looked_before() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let term = a.campaign().await.unwrap();
    store.set_fault(Fault::Stall);
    let deadline = term.deadline();
    tokio::time::sleep_until(deadline - Duration::from_millis(1)).await;
    assert!(term.is_leader());
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!term.is_leader());
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_are_retried_and_a_recovery_keeps_the_term() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let term = a.campaign().await.unwrap();
    store.set_fault(Fault::Fail);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(term.is_leader(), "still inside the deadline");
    store.set_fault(Fault::None);
    tokio::time::sleep(TTL * 3).await;
    assert!(term.is_leader(), "a retry succeeded before the deadline");
}

#[tokio::test(start_paused = true)]
async fn a_revoked_lease_ends_the_term_at_the_next_renewal() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let start = Instant::now();
    let term = a.campaign().await.unwrap();
    store.revoke("jobs");
    assert_eq!(term.lost().await, LostReason::Expired);
    assert_eq!(Instant::now(), start + TTL / 3);
}

#[tokio::test(start_paused = true)]
async fn a_stolen_lease_names_the_new_owner() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let term = a.campaign().await.unwrap();
    let token = store.steal("jobs", "intruder", TTL);
    assert_eq!(
        term.lost().await,
        LostReason::Taken {
            by: "intruder".into(),
            token
        }
    );
    assert!(token > term.token());
}

#[tokio::test(start_paused = true)]
async fn tokens_keep_rising_after_the_store_loses_everything() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let first = a.campaign().await.unwrap();
    store.wipe();
    assert_eq!(first.lost().await, LostReason::Expired);
    let second = a.campaign().await.unwrap();
    assert!(second.token() > first.token());
}

#[tokio::test(start_paused = true)]
async fn confirm_fails_once_the_term_is_over() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let term = a.campaign().await.unwrap();
    assert!(term.confirm().await.is_ok());
    store.steal("jobs", "b", TTL);
    let err = term.confirm().await.unwrap_err();
    assert!(
        matches!(err, tenure::Error::NotLeader(LostReason::Taken { .. })),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_campaign_adopts_the_term_its_timed_out_attempt_won() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    // The acquire wins on the server, but its reply is lost.
    store.set_fault(tenure::Fault::LoseReplies);
    let campaign = tokio::spawn(async move { a.campaign().await });
    while store.holder("jobs").is_none() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let token = store.holder("jobs").map(|h| h.token);
    store.set_fault(tenure::Fault::None);
    let again = within(campaign).await.unwrap().unwrap();
    assert_eq!(
        Some(again.token()),
        token,
        "the same attempt's term, no new token"
    );
    assert_eq!(store.calls("jobs").resign, 0);
}

#[tokio::test(start_paused = true)]
async fn a_lease_under_our_id_from_elsewhere_is_not_adopted() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    // A lease under "a" that this Election did not write: another process
    // with the same id, or a lease restored by a rollback.
    let theirs = store.steal("jobs", "a", TTL);
    let started = Instant::now();
    let mine = within(a.campaign()).await.unwrap();
    assert!(mine.token() > theirs);
    assert!(
        Instant::now() >= started + TTL,
        "waited for that lease to lapse"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_a_term_and_campaigning_at_once_never_revives_it() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    for _ in 0..5 {
        let first = a.campaign().await.unwrap();
        let old = first.token();
        drop(first);
        let second = within(a.campaign()).await.unwrap();
        assert!(second.token() > old);
        assert!(b.try_campaign().await.unwrap().is_none());
        assert_eq!(store.holder("jobs").map(|h| h.token), Some(second.token()));
        second.resign().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_rollback_no_lease_is_granted_before_the_max_ttl() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = tenure::Election::builder("jobs")
        .memory(&store)
        .ttl(TTL)
        .max_ttl(TTL * 4)
        .id("b")
        .build()
        .await
        .unwrap();
    let old = a.campaign().await.unwrap();
    let snapshot = store.snapshot();
    old.resign().await.unwrap();
    let current = b.campaign().await.unwrap();
    store.restore(&snapshot);
    let restored = Instant::now();
    // a's old lease is back but belongs to an earlier attempt; and b, told
    // that ttls up to 4 × TTL are in use, waits that long.
    let next = within(b.campaign()).await.unwrap();
    assert!(Instant::now() >= restored + TTL * 4);
    assert!(!current.is_leader());
    assert!(next.token() > current.token());
}

#[tokio::test(start_paused = true)]
async fn the_runner_campaigns_again_after_losing() {
    use std::sync::{Arc, Mutex};
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let log = |events: &Arc<Mutex<Vec<String>>>| {
        let events = events.clone();
        move |s: String| events.lock().unwrap().push(s)
    };
    let (elected, revoked, follower) = (log(&events), log(&events), log(&events));
    let runner = a
        .runner()
        .on_elected(move |t| elected(format!("elected {}", t.token())))
        .on_revoked(move |r| revoked(format!("revoked {}", r.label())))
        .on_follower(move |l| follower(format!("following {}", l.id)))
        .run_until(tokio::time::sleep(TTL * 10));
    let chaos = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        store.steal("jobs", "b", TTL);
    };
    let (result, ()) = tokio::join!(runner, chaos);
    result.unwrap();
    let events = events.lock().unwrap().clone();
    let shape: Vec<&str> = events
        .iter()
        .map(|e| e.split(' ').next().unwrap())
        .collect();
    assert_eq!(
        shape,
        ["elected", "revoked", "following", "elected", "revoked"],
        "{events:?}"
    );
    assert_eq!(events[1], "revoked taken");
    assert_eq!(events[4], "revoked shutdown");
    assert!(store.holder("jobs").is_none(), "released on shutdown");
}

#[tokio::test(start_paused = true)]
async fn lead_work_is_told_to_stop_on_shutdown_before_the_lease_is_released() {
    use std::sync::{Arc, Mutex};
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let seen = Arc::new(Mutex::new(None));
    let runner = a.runner().lead({
        let seen = seen.clone();
        let store = store.clone();
        move |term| {
            let seen = seen.clone();
            let store = store.clone();
            async move {
                let reason = term.lost().await;
                // Winding down: the lease is still ours while we clean up.
                tokio::time::sleep(Duration::from_millis(200)).await;
                *seen.lock().unwrap() = Some((reason, store.holder("jobs").map(|h| h.id)));
            }
        }
    });
    runner
        .run_until(tokio::time::sleep(Duration::from_millis(100)))
        .await
        .unwrap();
    let (reason, holder_while_winding_down) = seen.lock().unwrap().clone().unwrap();
    assert_eq!(reason, LostReason::Shutdown);
    assert_eq!(holder_while_winding_down.as_deref(), Some("a"));
    assert!(store.holder("jobs").is_none());
}

#[tokio::test(start_paused = true)]
async fn after_the_store_loses_everything_no_lease_is_granted_for_one_ttl() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let old = a.campaign().await.unwrap();
    store.wipe();
    let wiped_at = Instant::now();
    let new = within(b.campaign()).await.unwrap();
    let waited = Instant::now() - wiped_at;
    assert!(
        waited >= TTL && waited <= TTL + Duration::from_millis(15),
        "granted one ttl later (plus jitter): {waited:?}"
    );
    assert!(Instant::now() >= old.deadline());
    assert!(new.token() > old.token());
}

#[tokio::test(start_paused = true)]
async fn an_idle_follower_asks_once_and_then_listens_to_the_leaders_renewals() {
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let term = a.campaign().await.unwrap();
    let follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(TTL * 10).await;
    let calls = store.calls("jobs");
    // a's first acquire, then b's attempts: renewal announcements push b's
    // next attempt back, but, since anyone allowed to publish could forge
    // them, never more than one ttl past the expiry b last read: b asks
    // about once every two ttls.
    assert!(calls.acquire <= 2 + 6, "{calls:?}");
    assert!(
        calls.renew >= 29,
        "the leader renews every ttl/3: {calls:?}"
    );
    term.resign().await.unwrap();
    let next = within(follower).await.unwrap().unwrap();
    assert_eq!(next.id(), "b");
}

#[tokio::test(start_paused = true)]
async fn watch_reports_a_term_that_began_between_two_reads_at_once() {
    use futures_util::StreamExt;
    let store = MemoryStore::new();
    let a = member(&store, "a").await;
    let mut changes = Box::pin(a.watch());
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
    // The term begins while nobody is polling the stream.
    let started = Instant::now();
    let term = a.campaign().await.unwrap();
    let seen = within(changes.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(seen.token, term.token());
    assert_eq!(Instant::now(), started, "reported at once, not after a ttl");
}
