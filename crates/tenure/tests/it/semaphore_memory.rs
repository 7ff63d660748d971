//! Semaphores on the in-memory store, under tokio's paused clock: how many
//! hold a permit, and when a waiter gets one, at exact instants.

use std::collections::BTreeSet;
use std::time::Duration;

use tenure::{Election, Error, Fault, Leadership, MemoryStore, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

const TTL: Duration = Duration::from_secs(3);

async fn semaphore(store: &MemoryStore, id: &str, permits: usize) -> Semaphore {
    Election::builder("exports")
        .memory(store)
        .id(id)
        .ttl(TTL)
        .semaphore(permits)
        .await
        .expect("a semaphore")
}

/// The permits held now, as (permit, holder id).
fn held(store: &MemoryStore, permits: usize) -> BTreeSet<(usize, String)> {
    (0..permits)
        .filter_map(|p| {
            let holder = store.holder(&format!("exports/permit-{p}"))?;
            Some((p, holder.id))
        })
        .collect()
}

fn waiting(waiters: &[JoinHandle<tenure::Result<Leadership>>]) -> usize {
    waiters.iter().filter(|w| !w.is_finished()).count()
}

/// Five instances, three permits: three hold one, two wait for as long as
/// nobody lets go; a released permit goes to a waiter at once, and the
/// permit of a holder cut off from the store comes back only after its
/// deadline.
#[tokio::test(start_paused = true)]
async fn at_most_three_of_five_hold_a_permit() {
    let store = MemoryStore::new();
    let mut views = Vec::new();
    let mut waiters = Vec::new();
    for id in ["a", "b", "c", "d", "e"] {
        let view = store.view();
        let semaphore = semaphore(&view, id, 3).await;
        waiters.push(tokio::spawn(async move { semaphore.acquire().await }));
        views.push(view);
    }
    sleep(TTL * 10).await;
    assert_eq!(waiting(&waiters), 2, "three of five acquired");
    let holders = held(&store, 3);
    assert_eq!(holders.len(), 3, "{holders:?}");
    let ids: BTreeSet<&String> = holders.iter().map(|(_, id)| id).collect();
    assert_eq!(
        ids.len(),
        3,
        "three instances, one permit each: {holders:?}"
    );

    // A release: a waiter holds that permit right away.
    let mut terms = Vec::new();
    let mut rest = Vec::new();
    for waiter in waiters {
        if waiter.is_finished() {
            terms.push(waiter.await.expect("no panic").expect("a permit"));
        } else {
            rest.push(waiter);
        }
    }
    let released = terms.remove(0);
    released.resign().await.expect("resigned");
    sleep(Duration::from_millis(1)).await;
    assert_eq!(waiting(&rest), 1, "a waiter took the released permit");
    let holders = held(&store, 3);
    assert_eq!(holders.len(), 3, "{holders:?}");
    assert!(
        !holders.iter().any(|(_, id)| id == released.id()),
        "{holders:?}"
    );

    // The waiter that took it holds it (a dropped handle would release it).
    let mut last = None;
    for waiter in rest {
        if waiter.is_finished() {
            terms.push(waiter.await.expect("no panic").expect("a permit"));
        } else {
            last = Some(waiter);
        }
    }
    let last = last.expect("one waiter");

    // A holder cut off from the store: its permit comes back only after
    // its deadline, and then to the last waiter.
    let cut = terms.remove(0);
    let cut_view = &views[["a", "b", "c", "d", "e"]
        .iter()
        .position(|id| *id == cut.id())
        .expect("one of ours")];
    cut_view.set_fault(Fault::Stall);
    let taken = last.await.expect("no panic").expect("a permit");
    assert!(
        Instant::now() >= cut.deadline(),
        "not before the cut-off holder's deadline"
    );
    assert!(!cut.is_leader(), "the cut-off holder no longer holds it");
    assert_eq!(taken.election(), cut.election(), "the same permit");
    assert!(taken.token() > cut.token(), "with a larger token");
}

/// With every permit free, one `acquire` holds exactly one of them: the
/// campaigns for the others, abandoned, leave no lease behind. Replies
/// that come late, all at the same instant, make every campaign win its
/// permit before the first is kept.
#[tokio::test(start_paused = true)]
async fn acquire_keeps_one_permit_and_leaves_the_others_free() {
    let store = MemoryStore::new();
    let view = store.view();
    view.set_fault(Fault::Slow(Duration::from_millis(10)));
    let a = semaphore(&view, "a", 3).await;
    let term = a.acquire().await.expect("a permit");
    view.set_fault(Fault::None);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        held(&store, 3),
        BTreeSet::from([(permit_of(&term), "a".to_string())])
    );
    // The other two are free for another instance now, not after a ttl.
    let b = semaphore(&store, "b", 3).await;
    let second = b.try_acquire().await.expect("answers").expect("free");
    let third = b.try_acquire().await.expect("answers").expect("free");
    assert!(
        b.try_acquire().await.expect("answers").is_none(),
        "all held"
    );
    let permits: BTreeSet<usize> = [&term, &second, &third]
        .iter()
        .map(|t| permit_of(t))
        .collect();
    assert_eq!(permits.len(), 3);
}

/// One instance may hold several permits: a second `acquire` of a holder
/// takes another permit, never the one it holds.
#[tokio::test(start_paused = true)]
async fn a_second_acquire_takes_another_permit() {
    let store = MemoryStore::new();
    let a = semaphore(&store, "a", 2).await;
    let first = a.acquire().await.expect("a permit");
    let second = a.acquire().await.expect("another permit");
    assert_ne!(first.election(), second.election());
    assert!(first.is_leader() && second.is_leader());
    let third = tokio::spawn({
        let a = a.clone();
        async move { a.acquire().await }
    });
    sleep(TTL * 5).await;
    assert!(!third.is_finished(), "no third permit");
    drop(second);
    let third = third.await.expect("no panic").expect("the dropped permit");
    assert!(first.is_leader() && third.is_leader());
}

/// A permit's tokens grow from one holder to the next, as an election's
/// do: a resource keeps the highest token per permit.
#[tokio::test(start_paused = true)]
async fn a_permits_token_grows_with_each_holder() {
    let store = MemoryStore::new();
    let (a, b) = (
        semaphore(&store, "a", 1).await,
        semaphore(&store, "b", 1).await,
    );
    let mut last = 0;
    for round in 0..4 {
        let who = if round % 2 == 0 { &a } else { &b };
        let term = who.acquire().await.expect("a permit");
        assert_eq!(term.election(), "exports/permit-0");
        assert!(term.token() > last, "{} after {last}", term.token());
        last = term.token();
        term.resign().await.expect("resigned");
    }
}

#[tokio::test]
async fn bad_permit_counts_and_names_are_refused_in_one_line() {
    let store = MemoryStore::new();
    for permits in [0, tenure::MAX_PERMITS + 1] {
        let err = Election::builder("exports")
            .memory(&store)
            .semaphore(permits)
            .await
            .expect_err("refused");
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(err.to_string().contains(&permits.to_string()), "{err}");
    }
    // Room for the name, none for its permits' suffix.
    let long = "x".repeat(195);
    assert!(Election::builder(long.as_str())
        .memory(&store)
        .build()
        .await
        .is_ok());
    let err = Election::builder(long.as_str())
        .memory(&store)
        .semaphore(3)
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(!err.to_string().contains('\n'), "{err}");
}

fn permit_of(term: &Leadership) -> usize {
    term.election()
        .strip_prefix("exports/permit-")
        .and_then(|p| p.parse().ok())
        .expect("a permit's election")
}

/// `acquire` returns a permit its caller holds. A permit won while the
/// other permits' campaigns are wound up (store calls) can end meanwhile;
/// then `acquire` goes on campaigning rather than return a term that
/// already ended (found by the simulation: a permit handed out after a
/// later term of it had begun).
#[tokio::test(start_paused = true)]
async fn acquire_never_returns_a_permit_that_ended_while_the_others_were_released() {
    let store = MemoryStore::new();
    let view = store.view();
    let ttl = Duration::from_secs(1);
    let exports = Election::builder("exports")
        .memory(&view)
        .id("a")
        .ttl(ttl)
        .semaphore(2)
        .await
        .expect("a semaphore");
    // Replies just inside the call timeout (a third of the ttl): winding
    // up the other permit's campaign takes a call or two, while the lease
    // of the permit won is lost (evicted) the moment it is written, which
    // its first renewal finds.
    view.set_fault(Fault::Slow(ttl * 3 / 10));
    let evicted = tokio::spawn({
        let store = store.clone();
        async move {
            while store.holder("exports/permit-0").is_none() {
                sleep(Duration::from_millis(1)).await;
            }
            store.revoke("exports/permit-0");
            sleep(ttl * 3).await;
            view.set_fault(Fault::None);
        }
    });
    let permit = exports.acquire().await.expect("a permit");
    assert!(
        permit.is_leader(),
        "acquire returned {} token {}, whose term had ended",
        permit.election(),
        permit.token()
    );
    evicted.await.expect("no panic");
}
