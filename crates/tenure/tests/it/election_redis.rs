//! The election protocol against real redis-server processes.

use crate::support;
use std::time::Duration;

use crate::support::{campaign, election, lua, raw, redis, CrashableInstance, HANG};
use futures_util::StreamExt;
use redis::AsyncCommands;
use tenure::{Election, LostReason};
use tokio::time::{timeout, Instant};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_many_concurrent_candidates_wins() {
    let server = redis();
    let mut candidates = Vec::new();
    for i in 0..12 {
        candidates.push(election(&server.url(), "race", &format!("c{i}"), 2 * SECOND).await);
    }
    let attempts = candidates.iter().map(|e| {
        let e = e.clone();
        // A fresh Redis grants the first lease one ttl after it is asked;
        // then everybody races, and the winner keeps the lease.
        tokio::spawn(async move { timeout(5 * SECOND, e.campaign()).await })
    });
    let results = futures_util::future::join_all(attempts).await;
    let winners: Vec<_> = results
        .into_iter()
        .filter_map(|r| match r.expect("campaign task does not panic") {
            Ok(Ok(term)) => Some(term),
            Ok(Err(err)) => panic!("campaign failed: {err}"),
            Err(_) => None, // still following when the window closed
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one candidate leads");
    let leader = candidates[0]
        .leader()
        .await
        .unwrap()
        .expect("someone leads");
    assert_eq!(leader.id, winners[0].id());
    assert_eq!(leader.token, winners[0].token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_lease_past_several_ttls() {
    let server = redis();
    // Not shorter: at 600 ms a keeper starved for a third of a second on
    // a loaded machine would lose its term, which is not what this tests.
    let ttl = Duration::from_secs(2);
    let a = election(&server.url(), "renew", "a", ttl).await;
    let b = election(&server.url(), "renew", "b", ttl).await;
    let term = campaign(&a).await;
    let challenger = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(ttl * 3).await;
    assert!(term.is_leader(), "still leader after 3 ttls");
    assert!(term.lost_reason().is_none());
    assert!(!challenger.is_finished(), "the follower never won");
    let leader = a.leader().await.unwrap().unwrap();
    assert_eq!((leader.id.as_str(), leader.token), ("a", term.token()));
    challenger.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced_right_after_its_lease_expires() {
    let server = redis();
    let ttl = Duration::from_millis(1500);
    let (crashed, old_token) = CrashableInstance::lead(&server.url(), "crash", "victim", ttl);
    let survivor = election(&server.url(), "crash", "survivor", ttl).await;
    let follower = tokio::spawn({
        let survivor = survivor.clone();
        async move { survivor.campaign().await }
    });
    tokio::time::sleep(ttl / 2).await;
    crashed.crash();
    let crashed_at = Instant::now();
    let term = timeout(HANG, follower).await.unwrap().unwrap().unwrap();
    let waited = crashed_at.elapsed();
    assert!(term.token() > old_token);
    // The lease had up to a full ttl left when the renewals stopped, so the
    // takeover cannot come sooner than the time left after the last renewal
    // (at least ttl - renew interval); that it comes at all, without anyone
    // deleting the key, is the property.
    assert!(
        waited >= ttl - ttl / 3 - ttl / 2,
        "took over before expiry: {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_hands_over_without_waiting_for_the_ttl() {
    let server = redis();
    let ttl = Duration::from_secs(4);
    let a = election(&server.url(), "handover", "a", ttl).await;
    let b = election(&server.url(), "handover", "b", ttl).await;
    let term = campaign(&a).await;
    let follower = tokio::spawn(async move { b.campaign().await });
    // Let b find the holder and start waiting on it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resigned_at = Instant::now();
    term.resign().await.unwrap();
    let next = timeout(ttl / 2, follower)
        .await
        .expect("handover came long before the 20 s ttl")
        .unwrap()
        .unwrap();
    assert_eq!(next.id(), "b");
    assert!(resigned_at.elapsed() < ttl / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_every_handle_releases_the_lease() {
    let server = redis();
    let ttl = Duration::from_secs(4);
    let a = election(&server.url(), "dropped", "a", ttl).await;
    let b = election(&server.url(), "dropped", "b", ttl).await;
    let term = campaign(&a).await;
    let follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(term);
    let next = timeout(ttl / 2, follower)
        .await
        .expect("released on drop")
        .unwrap()
        .unwrap();
    assert_eq!(next.id(), "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_and_resign_by_a_non_owner_change_nothing() {
    let server = redis();
    let a = election(&server.url(), "owned", "a", 2 * SECOND).await;
    let term = campaign(&a).await;
    let mut conn = raw(&server.url()).await;
    let before: Vec<String> = conn.hgetall("tenure:{owned}:lease").await.unwrap();
    let ttl_before: i64 = conn.pttl("tenure:{owned}:lease").await.unwrap();

    let renew = lua("renew.lua");
    let resign = lua("resign.lua");
    for (owner, token) in [("intruder", term.token()), ("a", term.token() - 1)] {
        let renewed: redis::Value = renew
            .key("tenure:{owned}:lease")
            .key("tenure:{owned}:witness")
            .key("tenure:epoch")
            .arg(owner)
            .arg(token)
            .arg(999_999)
            .arg(86_400_000)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert!(
            matches!(renewed, redis::Value::Array(ref items) if items[0] == redis::Value::Int(0))
        );
        let released: i64 = resign
            .key("tenure:{owned}:lease")
            .key("tenure:{owned}:witness")
            .arg(owner)
            .arg(token)
            .arg("tenure:{owned}:events")
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(released, 0);
    }
    let after: Vec<String> = conn.hgetall("tenure:{owned}:lease").await.unwrap();
    let ttl_after: i64 = conn.pttl("tenure:{owned}:lease").await.unwrap();
    assert_eq!(before, after);
    assert!(
        ttl_after <= ttl_before,
        "no renewal: {ttl_before} -> {ttl_after}"
    );
    assert!(term.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_leader_stops_at_its_deadline_before_anyone_else_can_acquire() {
    let server = redis();
    let ttl = Duration::from_millis(1000);
    let a = election(&server.url(), "paused", "a", ttl).await;
    let b = election(&server.url(), "paused", "b", ttl).await;
    let term = campaign(&a).await;
    let follower = tokio::spawn(async move {
        let term = b.campaign().await;
        (Instant::now(), term)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Freeze every client (both elections) for three ttls; key expiry is
    // frozen too, so the lease cannot lapse while paused.
    server.command(&["CLIENT", "PAUSE", "3000", "ALL"]).unwrap();
    let deadline = term.deadline();
    let reason = timeout(HANG, term.lost()).await.unwrap();
    let lost_at = Instant::now();
    assert!(!term.is_leader());
    assert_eq!(reason, LostReason::DeadlinePassed);
    assert!(
        lost_at <= term.deadline().max(deadline) + Duration::from_millis(200),
        "stopped acting no later than the deadline (+ scheduling slack)"
    );
    let (b_elected_at, b_term) = timeout(HANG, follower).await.unwrap().unwrap();
    let b_term = b_term.unwrap();
    assert!(
        lost_at < b_elected_at,
        "the old leader stopped before the new one started"
    );
    assert!(b_term.token() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_across_a_restart_that_lost_all_data() {
    let mut server = redis();
    let ttl = Duration::from_millis(900);
    let a = election(&server.url(), "restart", "a", ttl).await;
    let first = campaign(&a).await;
    let first_token = first.token();
    server.restart().unwrap();
    let mut conn = raw(&server.url()).await;
    let counter: Option<u64> = conn.get("tenure:{restart}:token").await.unwrap();
    assert_eq!(counter, None, "the restart really lost the data");

    let reason = timeout(HANG, first.lost()).await.unwrap();
    assert!(
        matches!(reason, LostReason::Expired | LostReason::DeadlinePassed),
        "{reason:?}"
    );
    // The same election object reconnects and wins a new, higher term.
    let second = campaign(&a).await;
    assert!(
        second.token() > first_token,
        "{} > {first_token}",
        second.token()
    );
    let b = election(&server.url(), "restart", "b", ttl).await;
    let second_token = second.token();
    second.resign().await.unwrap();
    let third = campaign(&b).await;
    assert!(third.token() > second_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_notifications_resume_and_handover_stays_fast() {
    let mut server = redis();
    let ttl = Duration::from_secs(4);
    let a = election(&server.url(), "resub", "a", ttl).await;
    let b = election(&server.url(), "resub", "b", ttl).await;
    server.restart().unwrap();
    // Give both the connection manager and the subscriber time to come back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let term = campaign(&a).await;
    let follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    term.resign().await.unwrap();
    let next = timeout(ttl / 2, follower)
        .await
        .expect("release was announced")
        .unwrap()
        .unwrap();
    assert_eq!(next.id(), "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stolen_lease_ends_the_term_with_the_new_owner_named() {
    let server = redis();
    let a = election(&server.url(), "stolen", "a", Duration::from_millis(900)).await;
    let term = campaign(&a).await;
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("HSET")
        .arg("tenure:{stolen}:lease")
        .arg(&["owner", "thief", "token", "99999999999999", "since", "1"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let reason = timeout(HANG, term.lost()).await.unwrap();
    assert_eq!(
        reason,
        LostReason::Taken {
            by: "thief".into(),
            token: 99_999_999_999_999
        }
    );
    assert!(term.confirm().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_renews_and_reports_the_time_left() {
    let server = redis();
    let ttl = Duration::from_secs(1);
    let a = election(&server.url(), "confirm", "a", ttl).await;
    let term = campaign(&a).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = term.deadline();
    let left = term.confirm().await.unwrap();
    assert!(term.deadline() > before, "confirm moved the deadline");
    assert!(left <= ttl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_each_change_of_leader() {
    let server = redis();
    let ttl = Duration::from_secs(3);
    let a = election(&server.url(), "watched", "a", ttl).await;
    let b = election(&server.url(), "watched", "b", ttl).await;
    let observer = election(&server.url(), "watched", "observer", ttl).await;
    let mut changes = Box::pin(observer.watch());
    async fn next(
        changes: &mut (impl futures_util::Stream<Item = tenure::Result<Option<tenure::LeaderInfo>>>
                  + Unpin),
    ) -> tenure::Result<Option<tenure::LeaderInfo>> {
        timeout(HANG, changes.next())
            .await
            .expect("a change is reported")
            .expect("stream goes on")
    }
    assert_eq!(next(&mut changes).await.unwrap(), None);
    let term_a = campaign(&a).await;
    let seen = next(&mut changes).await.unwrap().unwrap();
    assert_eq!((seen.id.as_str(), seen.token), ("a", term_a.token()));
    let b_task = tokio::spawn(async move { b.campaign().await });
    term_a.resign().await.unwrap();
    // Either the empty interval or b directly, then b.
    let mut seen = next(&mut changes).await.unwrap();
    if seen.is_none() {
        seen = next(&mut changes).await.unwrap();
    }
    let seen = seen.unwrap();
    assert_eq!(seen.id, "b");
    assert!(seen.token > term_a.token());
    assert!(seen.held_since.is_some());
    b_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_with_an_older_token_are_rejected() {
    let server = redis();
    let ttl = Duration::from_secs(1);
    let a = election(&server.url(), "fenced", "a", ttl).await;
    let b = election(&server.url(), "fenced", "b", ttl).await;
    let old = campaign(&a).await;
    let old_token = old.token();
    old.resign().await.unwrap();
    let new = campaign(&b).await;
    let mut conn = raw(&server.url()).await;
    let key = tenure::FencedKey::new("app:{fenced}:report");
    assert!(key
        .set(&mut conn, new.token(), "from b")
        .await
        .unwrap()
        .is_accepted());
    let stale = key.set(&mut conn, old_token, "from a").await.unwrap();
    assert_eq!(
        stale,
        tenure::FencedWrite::Rejected {
            highest: new.token()
        }
    );
    let (token, value) = key.get(&mut conn).await.unwrap().unwrap();
    assert_eq!(
        (token, value.as_slice()),
        (new.token(), b"from b".as_slice())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_works_while_leader_and_resigns_after_the_work_stopped_on_shutdown() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let server = redis();
    let ttl = Duration::from_secs(4);
    let a = election(&server.url(), "runner", "a", ttl).await;
    let b = election(&server.url(), "runner", "b", ttl).await;
    let ticks = Arc::new(AtomicU32::new(0));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let ticks = ticks.clone();
        a.runner()
            .every(Duration::from_millis(50), move |term| {
                let ticks = ticks.clone();
                async move {
                    assert!(term.is_leader());
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            })
            .run_until(async {
                let _ = stop_rx.await;
            })
    });
    while ticks.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop_tx.send(()).unwrap();
    timeout(HANG, run).await.unwrap().unwrap().unwrap();
    let ticks_at_stop = ticks.load(Ordering::SeqCst);
    let next = timeout(ttl / 2, follower)
        .await
        .expect("handed over on shutdown")
        .unwrap()
        .unwrap();
    assert_eq!(next.id(), "b");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        ticks_at_stop,
        "no work after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_with_different_names_are_independent() {
    let server = redis();
    let ttl = Duration::from_secs(1);
    let x = election(&server.url(), "x", "same-host", ttl).await;
    let y = election(&server.url(), "y", "same-host", ttl).await;
    let tx = campaign(&x).await;
    let ty = campaign(&y).await;
    assert!(tx.is_leader() && ty.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_prefix_moves_every_key() {
    let server = redis();
    let e = Election::builder("jobs")
        .redis(server.url())
        .ttl(SECOND)
        .prefix("myapp")
        .id("a")
        .build()
        .await
        .unwrap();
    let _term = campaign(&e).await;
    let mut conn = raw(&server.url()).await;
    let mut keys: Vec<String> = conn.keys("*").await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "myapp:epoch",
            "myapp:{jobs}:epoch",
            "myapp:{jobs}:lease",
            "myapp:{jobs}:token",
            "myapp:{jobs}:witness"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_timed_out_but_ran_is_adopted_not_repeated() {
    let server = redis();
    let a = Election::builder("paused-acquire")
        .redis(server.url())
        .ttl(Duration::from_secs(1))
        .call_timeout(Duration::from_millis(100))
        .id("a")
        .build()
        .await
        .unwrap();
    // Past the start-up hold-off, so the next acquire can win.
    campaign(&a).await.resign().await.unwrap();
    // Writes wait while paused: the first acquire times out on the client,
    // then runs on the server once the pause ends.
    server
        .command(&["CLIENT", "PAUSE", "600", "WRITE"])
        .unwrap();
    let term = campaign(&a).await;
    let mut conn = raw(&server.url()).await;
    let issued: u64 = conn.get("tenure:{paused-acquire}:token").await.unwrap();
    assert_eq!(
        term.token(),
        issued,
        "the retry adopted the term its lost attempt won"
    );
    assert!(term.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_loses_the_lease_nobody_is_elected_before_the_old_leaders_deadline() {
    let mut server = redis();
    let ttl = Duration::from_millis(1500);
    let a = election(&server.url(), "amnesia", "a", ttl).await;
    let b = election(&server.url(), "amnesia", "b", ttl).await;
    let old = campaign(&a).await;
    server.restart().unwrap();
    // The restarted server has no lease: b asks at once, while a still
    // believes until its deadline (it has not renewed since the restart).
    let deadline = old.deadline();
    let new = campaign(&b).await;
    assert!(
        Instant::now() >= deadline,
        "b was elected before a's deadline passed"
    );
    assert!(!old.is_leader());
    assert!(new.token() > old.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_sharing_a_store_share_two_connections_and_still_hand_over_at_once() {
    let server = redis();
    let url = server.url();
    let clients = |server: &support::RedisServer| -> usize {
        let list = server.command(&["CLIENT", "LIST"]).expect("CLIENT LIST");
        list.lines().filter(|line| line.contains("addr=")).count()
    };
    let before = clients(&server);
    let store = tenure::Store::redis(&url)
        .connect()
        .await
        .expect("connects");
    let mut elections = Vec::new();
    for i in 0..20 {
        let e = tenure::Election::builder(format!("shared-{i}"))
            .store(&store)
            .ttl(SECOND)
            .id(format!("a-{i}"))
            .build()
            .await
            .expect("builds");
        elections.push(e);
    }
    // One connection for lease operations, one for every subscription.
    assert_eq!(clients(&server) - before, 2);

    // Announcements still reach each election over the shared connection:
    // a resignation hands over without waiting for the (long) ttl.
    let long = 30 * SECOND;
    let build = |id: &'static str| {
        tenure::Election::builder("shared-handover")
            .store(&store)
            .ttl(long)
            .id(id)
            .build()
    };
    // As if this Redis had served the prefix for a minute, so that the new
    // election's first leader need not wait out a 30 s hold-off.
    // The epoch names the process and its replication history.
    let field = |section: &str, name: &str| {
        let info = server.command(&["INFO", section]).expect("INFO");
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .expect(name)
            .trim()
            .to_string()
    };
    let run_id = format!(
        "{}:{}",
        field("server", "run_id:"),
        field("replication", "master_replid:")
    );
    let time = server.command(&["TIME"]).expect("TIME");
    let now_ms: u64 = time
        .lines()
        .next()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .expect("TIME")
        * 1000;
    let since = (now_ms - 60_000).to_string();
    server
        .command(&["HSET", "tenure:epoch", "run_id", &run_id, "since", &since])
        .expect("HSET");
    let (leader, other) = (build("a").await.unwrap(), build("b").await.unwrap());
    let term = campaign(&leader).await;
    let calls = script_calls(&server);
    let follower = tokio::spawn(async move { campaign(&other).await });
    // With a 30 s ttl the leader does not renew for 10 s: the next script
    // call is the follower's attempt, after which it waits.
    while script_calls(&server) == calls {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    term.resign().await.expect("resigns");
    let next = timeout(long / 2, follower)
        .await
        .expect("taken over long before the ttl")
        .unwrap();
    assert_eq!(next.id(), "b");
    drop(elections);
}

/// Script calls the server has run so far.
fn script_calls(server: &support::RedisServer) -> u64 {
    let info = server.command(&["INFO", "commandstats"]).expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The store itself refuses a run recorded by a term that no longer holds
/// the lease, even while that term's keeper has not noticed yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_a_run_recorded_by_a_term_whose_lease_was_taken() {
    let server = redis();
    // The stale term's keeper renews (and notices) a second or more later;
    // a fresh Redis grants the first lease one ttl after it is asked.
    let ttl = Duration::from_secs(4);
    let a = election(&server.url(), "taken", "a", ttl).await;
    let b = election(&server.url(), "taken", "b", ttl).await;
    let stale = campaign(&a).await;
    // The lease and its witness both deleted by hand: the one operation
    // that lets another candidate in while the holder still acts.
    server
        .command(&["DEL", "tenure:{taken}:lease", "tenure:{taken}:witness"])
        .unwrap();
    let current = campaign(&b).await;
    assert!(stale.is_leader(), "the stale term has not noticed yet");
    assert!(!stale.record_run(ttl).await.unwrap(), "refused by Redis");
    assert_eq!(a.since_last_run().await.unwrap(), None);
    assert!(current.record_run(ttl).await.unwrap());
    // The marker keeps the layout of a FencedKey, with an expiry.
    let token = server
        .command(&["HGET", "tenure:{taken}:last-run", "token"])
        .unwrap();
    assert_eq!(token, current.token().to_string());
    let pttl: u64 = server
        .command(&["PTTL", "tenure:{taken}:last-run"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(pttl > 0 && pttl <= 4_000, "{pttl}");
}
