//! Helpers for the tests on Redis Sentinel and Redis Cluster: elections
//! with a short ttl, contenders recorded in a [`TermLog`], and the checks
//! after a fault (a hand-over on the new node, no overlap, rising tokens).

use std::time::Duration;

use tenure::{Election, Leadership, Store};
use tokio::time::{timeout, Instant};

use super::{campaign, TermLog, HANG};

pub const TTL: Duration = Duration::from_secs(1);
pub const MARGIN: Duration = Duration::from_millis(100);

/// A store of its own on `url`.
pub async fn store(url: &str) -> Store {
    Store::redis(url)
        .connect()
        .await
        .unwrap_or_else(|err| panic!("connecting to {url}: {err}"))
}

/// An election on `store` with [`TTL`] and [`MARGIN`].
pub async fn election(store: &Store, name: &str, id: &str) -> Election {
    election_with_ttl(store, name, id, TTL).await
}

/// An election on `store` with `ttl` and [`MARGIN`].
pub async fn election_with_ttl(store: &Store, name: &str, id: &str, ttl: Duration) -> Election {
    Election::builder(name)
        .store(store)
        .ttl(ttl)
        .margin(MARGIN)
        .id(id)
        .build()
        .await
        .unwrap_or_else(|err| panic!("building {name} for {id}: {err}"))
}

/// Wait until somebody leads (as the store says); the token.
pub async fn until_led(observer: &Election) -> u64 {
    timeout(HANG, async {
        loop {
            if let Ok(Some(leader)) = observer.leader().await {
                return leader.token;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a leader within the bound")
}

/// Wait until `term` renews (its deadline moves on).
pub async fn renewed(term: &Leadership) {
    let before = term.deadline();
    timeout(HANG, async {
        while term.deadline() <= before {
            assert!(term.is_leader(), "lost: {:?}", term.lost_reason());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a renewal");
}

/// The leading contender resigns (if one leads); wait for the next term.
pub async fn handover(log: &TermLog) -> u64 {
    let before = log.terms().iter().map(|t| t.token).max().unwrap_or(0);
    let resigned = log.resign_current().await.unwrap_or(before);
    log.until_term_after(resigned.max(before)).await
}

/// Three contenders on `url` that campaign again and again, a store each
/// (one instance's failover handling must not help another's).
pub async fn contenders(url: &str, name: &str, log: &TermLog) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for id in ["a", "b", "c"] {
        let store = store(url).await;
        tasks.push(log.contend(election(&store, name, id).await, TTL, MARGIN));
    }
    tasks
}

/// After a fault: a leader again, a hand-over (a term that began on the
/// new node), no two terms overlapping, and a new term's token above every
/// earlier one; the new term.
pub async fn after_fault(
    url: &str,
    name: &str,
    log: &TermLog,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> Leadership {
    let observer = election(&store(url).await, name, "observer").await;
    until_led(&observer).await;
    handover(log).await;
    for task in tasks {
        task.abort();
        let _ = task.await;
    }
    let terms = log.finish();
    TermLog::assert_safe(&terms);
    assert!(terms.len() >= 2, "a term before and one after: {terms:?}");
    let highest = terms.iter().map(|t| t.token).max().unwrap_or(0);
    let term = campaign(&observer).await;
    assert!(term.token() > highest, "{} after {highest}", term.token());
    term
}

/// A resignation on `url` wakes a waiting follower through the release
/// announcement. `node` is the node of the election `handover`'s slot
/// (where its scripts run).
pub async fn a_resign_wakes_the_follower(url: &str, node: &redis_process::Node) {
    let ttl = Duration::from_secs(4);
    let build = |id: &'static str| async move {
        Election::builder("handover")
            .store(&store(url).await)
            .ttl(ttl)
            .id(id)
            .build()
            .await
            .expect("builds")
    };
    let (a, b) = (build("a").await, build("b").await);
    let term = campaign(&a).await;
    // Only an acquisition that finds the lease held calls PTTL: once the
    // count moves, b has found it held and waits.
    let before = super::pttl_calls(node);
    let follower = tokio::spawn(async move { campaign(&b).await });
    timeout(HANG, async {
        while super::pttl_calls(node) == before {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("b tries");
    assert!(!follower.is_finished(), "b cannot win while a leads");
    let resigned = Instant::now();
    term.resign().await.expect("resigns");
    let next = timeout(HANG, follower)
        .await
        .expect("b wins")
        .expect("joins");
    // Without the announcement b would look again only when the lease
    // would have expired: a whole ttl after a's last renewal.
    assert!(
        Instant::now() < resigned + ttl / 2,
        "the follower was not woken by the release announcement"
    );
    assert!(next.token() > 0);
}

/// An election released before a failover (or failback) of its node: on
/// the promoted node nobody leads, yet no lease is granted at once.
pub async fn holds_off_after_the_failover(url: &str, name: &str) {
    let fresh = election(&store(url).await, name, "b").await;
    assert!(
        fresh.leader().await.expect("asks").is_none(),
        "nobody leads"
    );
    assert!(
        fresh.try_campaign().await.expect("asks").is_none(),
        "granted at once on a promoted node"
    );
    let term = campaign(&fresh).await;
    assert!(term.is_leader());
}
