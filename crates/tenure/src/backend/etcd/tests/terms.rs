//! Terms against a real cluster: only their owner renews or resigns them,
//! a term nobody renews is swept, and terms begun at once share a session.

use std::time::Duration;

use futures_util::future::join_all;

use super::one_member;
use crate::backend::address::Address;
use crate::backend::etcd::layout::lease_key;
use crate::backend::etcd::EtcdStore;
use crate::machine::{AcquireReply, AcquireRequest, RenewReply};

/// Against a real cluster: a renewal or resignation that names another
/// owner's term, or an older term, changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_owner_can_neither_renew_nor_resign() {
    let (_cluster, store) = one_member().await;
    let at = Address::new("tenure", "owned");
    let request = AcquireRequest {
        id: "owner",
        attempt: "1",
        ttl_ms: 2_000,
        hold_off_ms: 2_000,
    };
    let AcquireReply::Won { token } = store.acquire(at, &request).await.expect("acquire") else {
        panic!("the first candidate wins");
    };
    let holder = || async { store.inspect(at).await.expect("inspect") };
    let before = holder().await.expect("held");
    for (id, token) in [
        ("intruder", token),
        ("owner", token - 1),
        ("owner", token + 1),
    ] {
        let renewed = store.renew(at, id, token, 2_000).await.expect("renew");
        assert!(matches!(renewed, RenewReply::NotOwner(_)), "{id} {token}");
        assert!(
            !store.resign(at, id, token).await.expect("resign"),
            "{id} {token}"
        );
        let many = store
            .renew_many("tenure", id, 2_000, &[("owned", token)])
            .await;
        assert!(
            matches!(many[..], [Ok(RenewReply::NotOwner(_))]),
            "{id} {token}: {many:?}"
        );
    }
    let after = holder().await.expect("still held");
    assert_eq!((after.id.as_str(), after.token), ("owner", before.token));
    assert_eq!(
        store.renew(at, "owner", token, 2_000).await.expect("renew"),
        RenewReply::Renewed
    );
    assert!(store.resign(at, "owner", token).await.expect("resign"));
    assert!(holder().await.is_none());
    // With the key gone by hand, only the owner's release deletes the
    // witness that holds the candidates off.
    let AcquireReply::Won { token } = store.acquire(at, &request).await.expect("acquire") else {
        panic!("free again");
    };
    let key = lease_key(at).expect("a key");
    store
        .call(|mut c| {
            let key = key.clone();
            async move { c.delete(key, None).await }
        })
        .await
        .expect("deleted");
    let other = AcquireRequest {
        id: "other",
        ..request
    };
    assert!(!store.resign(at, "intruder", token).await.expect("resign"));
    assert!(matches!(
        store.acquire(at, &other).await.expect("acquire"),
        AcquireReply::HoldOff { .. }
    ));
    assert!(!store.resign(at, "owner", token).await.expect("resign"));
    assert!(matches!(
        store.acquire(at, &other).await.expect("acquire"),
        AcquireReply::Won { .. }
    ));
}

/// A term that ended without a release (nobody renews it) must not be
/// kept alive by the instance's other terms on the same session lease:
/// once a ttl has passed without a renewal, its key is deleted; a term
/// that is renewed stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_nobody_renews_is_swept_while_its_session_lives_on() {
    let (_cluster, store) = one_member().await;
    let request = AcquireRequest {
        id: "me",
        attempt: "1",
        ttl_ms: 1_000,
        hold_off_ms: 1_000,
    };
    let (dead, live) = (
        Address::new("tenure", "dead"),
        Address::new("tenure", "live"),
    );
    let won = |reply| match reply {
        Ok(AcquireReply::Won { token }) => token,
        other => panic!("{other:?}"),
    };
    let began = tokio::time::Instant::now();
    let _dead_token = won(store.acquire(dead, &request).await);
    let live_token = won(store.acquire(live, &request).await);
    // Not before a ttl: the term may still be running.
    store.sweep().await;
    assert!(store.inspect(dead).await.expect("inspect").is_some());
    let swept_at = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let renewed = store.renew(live, "me", live_token, 1_000).await;
            assert_eq!(renewed.expect("renew"), RenewReply::Renewed);
            store.sweep().await;
            if store.inspect(dead).await.expect("inspect").is_none() {
                return tokio::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await
    .expect("the ended term's key is deleted while the session lives on");
    assert!(swept_at - began >= Duration::from_secs(1));
    let live = store.inspect(live).await.expect("inspect").expect("held");
    assert_eq!(live.token, live_token);
}

/// Many terms of one instance begun at once, before it has a session
/// lease: one lease is granted, and every term is on it (renewable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_begun_at_once_share_one_session_lease() {
    let (_cluster, store) = one_member().await;
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    let keys: Vec<Address<'_>> = names.iter().map(|n| Address::new("tenure", n)).collect();
    let request = AcquireRequest {
        id: "me",
        attempt: "1",
        ttl_ms: 2_000,
        hold_off_ms: 2_000,
    };
    let won = join_all(keys.iter().map(|k| store.acquire(*k, &request))).await;
    for (keys, reply) in keys.iter().zip(won) {
        let Ok(AcquireReply::Won { token }) = reply else {
            panic!("{reply:?}");
        };
        let renewed = store.renew(*keys, "me", token, 2_000).await.expect("renew");
        assert_eq!(renewed, RenewReply::Renewed, "{}", keys.name);
    }
    // One session lease and one witness lease.
    assert_eq!(store.sessions_lock().len(), 2);
}

/// The request of the instance these tests campaign as (ttl 2 s).
const ME: AcquireRequest<'static> = AcquireRequest {
    id: "me",
    attempt: "1",
    ttl_ms: 2_000,
    hold_off_ms: 2_000,
};

/// A term of [`ME`] on the election `live`, whose renewals keep the
/// instance's session leases alive: its token.
async fn live_term(store: &EtcdStore) -> u64 {
    match store.acquire(Address::new("tenure", "live"), &ME).await {
        Ok(AcquireReply::Won { token }) => token,
        other => panic!("the first candidate wins: {other:?}"),
    }
}

/// Renew the live term `token` (keeping the session alive) and sweep,
/// until `done` answers; at most 30 s, else fail with `what`.
async fn with_session_alive<T>(
    store: &EtcdStore,
    token: u64,
    what: &str,
    mut done: impl AsyncFnMut() -> Option<T>,
) -> T {
    let live = Address::new("tenure", "live");
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let renewed = store.renew(live, ME.id, token, ME.ttl_ms).await;
            assert_eq!(renewed.expect("renew"), RenewReply::Renewed);
            store.sweep().await;
            if let Some(answer) = done().await {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"))
}

/// Start an acquire of `at` for `request` whose answer stalls (until the
/// gate returned is notified), and poll it until it waits at the gate with
/// its write landed: the election's key names `request`'s id. Returns the
/// acquire (pending, to drop or to finish), the gate, and the term it
/// wrote.
///
/// Its key shows as soon as etcd applies the write, while the acquire may
/// still wait for its keep-alives' answers, short of the gate: dropped
/// then, it would leave the gate armed for the test's next acquire, which
/// would wait at it for ever.
async fn acquire_until_written<'a>(
    store: &'a EtcdStore,
    at: Address<'a>,
    request: &'a AcquireRequest<'a>,
) -> (
    std::pin::Pin<Box<dyn std::future::Future<Output = crate::Result<AcquireReply>> + Send + 'a>>,
    std::sync::Arc<tokio::sync::Notify>,
    crate::term::Holder,
) {
    let gate = store.stall_next_answer();
    let mut acquiring = Box::pin(store.acquire(at, request));
    loop {
        tokio::select! {
            answer = &mut acquiring => panic!("the stalled acquire answered: {answer:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let at_the_gate = store
            .stall_next_answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none();
        if !at_the_gate {
            continue;
        }
        if let Some(holder) = store.inspect(at).await.expect("inspect") {
            assert_eq!(holder.id, request.id);
            return (acquiring, gate, holder);
        }
    }
}

/// An acquire whose write landed but whose answer its caller never read
/// (a campaign dropped, a call timed out): its key hangs on the session
/// lease that the instance's other terms keep alive, held by a term
/// nobody knows of. The sweep must delete it a ttl after the acquire
/// began, so that another candidate is elected; not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_was_never_read_is_swept_while_its_session_lives_on() {
    let (_cluster, store) = one_member().await;
    let ghost = Address::new("tenure", "ghost");
    let live_token = live_term(&store).await;
    let began = tokio::time::Instant::now();
    let (dropped, _gate, _) = acquire_until_written(&store, ghost, &ME).await;
    drop(dropped);
    let other = AcquireRequest { id: "other", ..ME };
    let elected_at = with_session_alive(
        &store,
        live_token,
        "another candidate is elected while the session lives on",
        async || match store.acquire(ghost, &other).await.expect("acquire") {
            AcquireReply::Won { .. } => Some(tokio::time::Instant::now()),
            AcquireReply::Held(h) => {
                assert_eq!(h.id, "me");
                None
            }
            AcquireReply::HoldOff { .. } => panic!("nothing was deleted by hand"),
        },
    )
    .await;
    assert!(elected_at - began >= Duration::from_secs(2));
    let live = store
        .inspect(Address::new("tenure", "live"))
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(live.token, live_token);
}

/// A retry of the same attempt adopts the term an earlier try wrote when
/// that try's answer was lost; adopted, the term is renewed like any
/// other, and the sweep of unanswered acquires must leave it alone (it
/// would delete a live term's key and witness: two leaders).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_adopted_from_an_unanswered_acquire_is_not_swept() {
    let (_cluster, store) = one_member().await;
    let at = Address::new("tenure", "adopted");
    let (dropped, _gate, written) = acquire_until_written(&store, at, &ME).await;
    drop(dropped);
    let AcquireReply::Won { token } = store.acquire(at, &ME).await.expect("acquire") else {
        panic!("the retry adopts the term its first try wrote");
    };
    assert_eq!(token, written.token);
    // Three ttls of renewals and sweeps: the term stays.
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until {
        let renewed = store.renew(at, "me", token, 2_000).await.expect("renew");
        assert_eq!(renewed, RenewReply::Renewed);
        store.sweep().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let held = store.inspect(at).await.expect("inspect").expect("held");
    assert_eq!((held.id.as_str(), held.token), ("me", token));
}

/// An acquire whose answer comes back after the sweep has deleted what it
/// wrote must not win the term it wrote (its key and witness are gone: a
/// candidate could be elected at once); it may win a new one, whose key
/// is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_read_after_the_sweep_deleted_its_key_does_not_win_that_term() {
    let (_cluster, store) = one_member().await;
    let late = Address::new("tenure", "late");
    let live_token = live_term(&store).await;
    let (acquiring, gate, written) = acquire_until_written(&store, late, &ME).await;
    // Keep the session alive until the sweep deletes the unanswered term.
    with_session_alive(
        &store,
        live_token,
        "the sweep deletes the unanswered term",
        async || {
            store
                .inspect(late)
                .await
                .expect("inspect")
                .is_none()
                .then_some(())
        },
    )
    .await;
    gate.notify_one();
    let AcquireReply::Won { token } = acquiring.await.expect("acquire") else {
        panic!("the election is free: the acquire wins a term");
    };
    assert_ne!(token, written.token, "the deleted term was won");
    let held = store
        .inspect(late)
        .await
        .expect("inspect")
        .expect("its key is there");
    assert_eq!((held.id.as_str(), held.token), ("me", token));
}

/// A retry adopts only a whole term: once the witness an unanswered try
/// wrote is gone (its lease revoked by hand), the key alone is not
/// adopted. A term without its witness would let a candidate in at once
/// if the key were then deleted by hand too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_does_not_adopt_a_term_whose_witness_is_gone() {
    use crate::backend::etcd::session::witness_session;
    let (_cluster, store) = one_member().await;
    let at = Address::new("tenure", "unwitnessed");
    let (dropped, _gate, written) = acquire_until_written(&store, at, &ME).await;
    drop(dropped);
    let witness = store
        .sessions_lock()
        .get(&(witness_session("me"), 2_000))
        .copied()
        .expect("a witness session");
    store
        .call(|mut c| async move { c.lease_revoke(witness).await })
        .await
        .expect("revoked");
    // The first retry finds the witness lease gone, the second has a new
    // one: neither may adopt the term.
    for _ in 0..2 {
        match store.acquire(at, &ME).await {
            Ok(AcquireReply::Won { token }) => {
                assert_ne!(
                    token, written.token,
                    "a term without its witness was adopted"
                );
            }
            other => assert!(
                matches!(other, Ok(AcquireReply::Held(_)) | Err(_)),
                "{other:?}"
            ),
        }
    }
}

/// A resign that fails (the cluster unreachable: nothing reached it)
/// leaves its term's key on the session lease, which the instance's other
/// terms keep alive. The store must not forget the term then: the sweep
/// deletes its key a ttl after the term's last renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_resign_failed_is_swept_while_its_session_lives_on() {
    let cluster = etcd_process::EtcdCluster::builder()
        .members(1)
        .election_timeout(Duration::from_millis(500))
        .start()
        .expect("an etcd member");
    let proxy = etcd_process::Proxy::start(cluster.client_port(0)).expect("a proxy");
    let url = format!("etcd://127.0.0.1:{}", proxy.port());
    let store = EtcdStore::connect(super::target(&url), Duration::from_secs(2))
        .await
        .expect("connected");
    let request = AcquireRequest {
        id: "me",
        attempt: "1",
        ttl_ms: 5_000,
        hold_off_ms: 5_000,
    };
    let (ended, live) = (
        Address::new("tenure", "ended"),
        Address::new("tenure", "live"),
    );
    let won = |reply| match reply {
        Ok(AcquireReply::Won { token }) => token,
        other => panic!("{other:?}"),
    };
    let live_token = won(store.acquire(live, &request).await);
    let ended_token = won(store.acquire(ended, &request).await);
    proxy.cut();
    let resigned = tokio::time::timeout(
        Duration::from_secs(10),
        store.resign(ended, "me", ended_token),
    )
    .await
    .expect("a resign fails, it does not hang");
    assert!(resigned.is_err(), "{resigned:?}");
    proxy.heal();
    // Calls in flight when the proxy closed its connections fail: until
    // the first answers again, transient errors are retried.
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let renewed = store.renew(live, "me", live_token, 5_000).await;
            match renewed {
                Err(err) if err.is_transient() => {}
                renewed => {
                    assert_eq!(renewed.expect("renew"), RenewReply::Renewed);
                    store.sweep().await;
                    match store.inspect(ended).await {
                        Ok(None) => return,
                        Ok(Some(_)) => {}
                        Err(err) => assert!(err.is_transient(), "{err}"),
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await
    .expect("the key of the term whose resign failed is deleted while the session lives on");
}
