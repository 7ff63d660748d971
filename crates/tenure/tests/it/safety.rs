//! Attacks on the one promise: at most one instance believes it leads.
//!
//! Each test reproduces a way the promise was once broken in ordinary use
//! (misuse of the API, a store rollback, mixed ttls, eviction, missing ACL
//! permissions, duplicate ids, forged announcements, foreign data) against
//! a real redis-server, and asserts that it no longer is.

use std::time::Duration;

use redis::AsyncCommands;
use tenure::{Election, Error, FencedKey};
use tokio::time::{timeout, Instant};

use crate::support::{campaign, election, lua, raw, redis, CrashableInstance, RedisServer, HANG};

const SECOND: Duration = Duration::from_secs(1);

/// Wait until the election's start-up hold-off is over, so that later
/// steps of a test are not timed by it.
async fn past_hold_off(url: &str, name: &str, ttl: Duration) {
    let e = election(url, name, "warm-up", ttl).await;
    campaign(&e).await.resign().await.expect("resigns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaigning_again_after_dropping_a_term_starts_a_new_term() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "again", SECOND).await;
    let a = election(&url, "again", "a", SECOND).await;
    let b = election(&url, "again", "b", SECOND).await;
    for _ in 0..10 {
        let first = campaign(&a).await;
        let old = first.token();
        // Dropping every handle releases the lease in the background...
        drop(first);
        // ...while the same Election campaigns again at once.
        let second = campaign(&a).await;
        assert!(
            second.token() > old,
            "a new term reused token {old} of the dropped one"
        );
        // The old term's release can no longer end the new term: nobody
        // else gets the lease while it leads.
        assert!(b.try_campaign().await.expect("b asks").is_none());
        let mut conn = raw(&url).await;
        let token: u64 = conn.hget("tenure:{again}:lease", "token").await.unwrap();
        assert_eq!(token, second.token());
        assert!(second.is_leader());
        second.resign().await.expect("resigns");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_reusing_an_id_does_not_share_the_term() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "dup", SECOND).await;
    let first = election(&url, "dup", "same-id", SECOND).await;
    let second = election(&url, "dup", "same-id", SECOND).await;
    let term = campaign(&first).await;
    assert!(
        second.try_campaign().await.expect("asks").is_none(),
        "a second process with the same id adopted the term"
    );
    // Nor can it release the other process's lease.
    assert!(!second.release_if_held().await.expect("asks"));
    assert!(term.is_leader());
    assert_eq!(
        first.leader().await.unwrap().map(|l| l.token),
        Some(term.token())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_restored_from_a_snapshot_is_not_adopted_before_the_hold_off_ends() {
    let mut server = redis();
    let url = server.url();
    past_hold_off(&url, "rollback", SECOND).await;
    let a = election(&url, "rollback", "a", SECOND).await;
    let old = campaign(&a).await;
    // The snapshot holds a's lease.
    server.command(&["SAVE"]).expect("SAVE");
    let old_token = old.token();
    old.resign().await.expect("resigns");
    let b = election(&url, "rollback", "b", SECOND).await;
    let current = campaign(&b).await;
    // Redis restarts from the older snapshot: a's lease is back.
    server.restart().expect("restarts");
    let restarted = Instant::now();
    let again = timeout(HANG, a.campaign())
        .await
        .expect("no hang")
        .expect("campaigns");
    assert!(
        restarted + SECOND <= Instant::now(),
        "a restored lease was adopted without the start-up hold-off"
    );
    assert!(
        !current.is_leader(),
        "b still believed it led when a was elected"
    );
    assert!(again.token() > current.token() && again.token() > old_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_off_covers_the_longest_ttl_a_candidate_has_seen() {
    let mut server = redis();
    let url = server.url();
    let long = 6 * SECOND;
    // A leader with a 6 s ttl, and a candidate with 1 s that sees it.
    let (leader, _) = CrashableInstance::lead(&url, "mixed", "slow", long);
    let short = election(&url, "mixed", "fast", SECOND).await;
    assert!(short.try_campaign().await.expect("asks").is_none());
    // Redis restarts and loses the lease; the leader is cut off (crashes),
    // still believing it leads until up to 6 s after its last renewal.
    server.restart().expect("restarts");
    let restarted = Instant::now();
    let term = timeout(HANG, short.campaign())
        .await
        .expect("no hang")
        .expect("campaigns");
    let waited = restarted.elapsed();
    leader.crash();
    assert!(
        waited >= long - SECOND / 2,
        "elected {waited:?} after the restart, while a 6 s leader could still lead"
    );
    assert!(term.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_may_evict_leases_is_refused_unless_allowed() {
    let server = RedisServer::builder()
        .arg("--maxmemory")
        .arg("100mb")
        .arg("--maxmemory-policy")
        .arg("volatile-lru")
        .start()
        .expect("starts");
    let refused = Election::builder("evict")
        .redis(server.url())
        .build()
        .await
        .expect_err("refused");
    assert!(matches!(refused, Error::Unsafe { .. }), "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("noeviction") && text.contains("volatile-lru"),
        "{text}"
    );
    Election::builder("evict")
        .redis(server.url())
        .allow_eviction(true)
        .build()
        .await
        .expect("allowed explicitly");
}

/// The permissions of the documented least-privilege ACL (the book's
/// Operations page), one by one.
fn acl_permissions() -> Vec<&'static str> {
    tenure::MIN_ACL
        .split_whitespace()
        .filter(|p| p.starts_with('+'))
        .collect()
}

fn set_user(server: &RedisServer, name: &str, permissions: &[&str]) {
    let mut args = vec!["ACL", "SETUSER", name, "reset", "on", ">pw"];
    args.extend(
        tenure::MIN_ACL
            .split_whitespace()
            .filter(|p| !p.starts_with('+')),
    );
    args.extend(permissions);
    server.command(&args).expect("ACL SETUSER");
}

fn user_url(server: &RedisServer, name: &str) -> String {
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

/// Everything tenure does with a store, as one user.
async fn every_operation(url: &str) -> tenure::Result<()> {
    let e = Election::builder("acl")
        .redis(url)
        .ttl(SECOND)
        .id("acl-user")
        .build()
        .await?;
    let term = e.campaign().await?;
    term.confirm().await?;
    e.leader().await?;
    assert!(
        term.record_run(SECOND).await?,
        "the last-run marker is written"
    );
    assert!(e.since_last_run().await?.is_some());
    let mut conn = tenure::fence::connect(url, None, SECOND).await?;
    let marker = FencedKey::new("tenure:{acl}:last-run");
    marker.set(&mut conn, term.token(), "1").await?;
    marker.get(&mut conn).await?;
    term.resign().await?;
    let store = tenure::Store::open(url)
        .call_timeout(SECOND)
        .connect()
        .await?;
    store.elections("tenure").await?;
    store.leader_of("tenure", "acl").await?;
    tenure::PartitionSet::builder("acl-group", ["p0"])
        .redis(url)
        .ttl(SECOND)
        .build()
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_is_enough_and_every_permission_in_it_is_needed() {
    let server = redis();
    // Past the hold-off, as the admin user.
    past_hold_off(&server.url(), "acl", SECOND).await;
    let all = acl_permissions();
    set_user(&server, "elector", &all);
    every_operation(&user_url(&server, "elector"))
        .await
        .expect("the documented ACL is enough");

    for missing in &all {
        let without: Vec<&str> = all.iter().copied().filter(|p| p != missing).collect();
        set_user(&server, "limited", &without);
        // Scripts cached by an earlier user would hide a missing script|load.
        server.command(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
        let err = timeout(HANG, every_operation(&user_url(&server, "limited")))
            .await
            .unwrap_or_else(|_| panic!("without {missing}: hangs"))
            .expect_err(missing);
        let text = err.to_string();
        assert!(
            matches!(err, Error::NoPermission { .. }),
            "without {missing}: not a permission error: {text}"
        );
        let command = missing.trim_start_matches('+').to_uppercase();
        let command = command.split('|').next().unwrap_or(&command);
        assert!(
            text.to_uppercase().contains(command),
            "without {missing}: the error does not name the command: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_leaves_the_election_untouched() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "half", SECOND).await;
    let acquire = lua("acquire.lua");
    for missing in [
        "+pexpire", "+publish", "+set", "+hset", "+time", "+info", "+hlen",
    ] {
        let without: Vec<&str> = acl_permissions()
            .into_iter()
            .filter(|p| p != &missing)
            .collect();
        set_user(&server, "limited", &without);
        let mut conn = raw(&user_url(&server, "limited")).await;
        let mut admin = raw(&url).await;
        let before: Vec<String> = admin.hgetall("tenure:{half}:lease").await.unwrap();
        let reply: redis::RedisResult<redis::Value> = acquire
            .key("tenure:{half}:lease")
            .key("tenure:{half}:token")
            .key("tenure:{half}:epoch")
            .key("tenure:epoch")
            .key("tenure:{half}:witness")
            .arg("limited")
            .arg(1000)
            .arg("tenure:{half}:events")
            .arg("attempt-1")
            .arg(1000)
            .arg(86_400_000)
            .invoke_async(&mut conn)
            .await;
        let err = reply.expect_err(missing);
        assert_eq!(err.code(), Some("TENURECMD"), "without {missing}: {err}");
        let after: Vec<String> = admin.hgetall("tenure:{half}:lease").await.unwrap();
        assert_eq!(before, after, "without {missing}: the lease changed");
        assert!(
            after.is_empty(),
            "without {missing}: a lease was written: {after:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_renewal_announcement_does_not_delay_takeover() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "forged", SECOND).await;
    let (leader, _) = CrashableInstance::lead(&url, "forged", "a", SECOND);
    let b = election(&url, "forged", "b", SECOND).await;
    // b finds the lease held, then waits for it.
    assert!(b.try_campaign().await.expect("asks").is_none());
    let follower = tokio::spawn(async move { campaign(&b).await });
    let mut conn = raw(&url).await;
    leader.crash();
    let crashed = Instant::now();
    for _ in 0..20 {
        let _: i64 = conn
            .publish("tenure:{forged}:events", "renewed:1:3600000")
            .await
            .unwrap();
    }
    let term = timeout(HANG, follower)
        .await
        .expect("no hang")
        .expect("follower task");
    // The lease lapses within one ttl of the crash; a forged announcement
    // may push the wait back by at most one more ttl.
    assert!(
        crashed.elapsed() < 5 * SECOND,
        "took over {:?} after the crash",
        crashed.elapsed()
    );
    assert!(term.is_leader());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_release_announcements_do_not_flood_the_store() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "flood", SECOND).await;
    let a = election(&url, "flood", "a", SECOND).await;
    let _term = campaign(&a).await;
    let b = election(&url, "flood", "b", SECOND).await;
    let _follower = tokio::spawn(async move { b.campaign().await });
    tokio::time::sleep(SECOND / 10).await;
    let calls = |server: &RedisServer| -> u64 {
        let stats = server.command(&["INFO", "commandstats"]).expect("INFO");
        stats
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let before = calls(&server);
    let mut conn = raw(&url).await;
    let started = Instant::now();
    for _ in 0..2000 {
        let _: i64 = conn
            .publish("tenure:{flood}:events", "released:1")
            .await
            .unwrap();
    }
    // Give the follower one renew interval to act on all of them.
    tokio::time::sleep(SECOND / 3).await;
    let made = calls(&server) - before;
    let window = started.elapsed();
    // Paced at one attempt per retry interval (ttl / 30) after a burst of
    // three, plus the leader's renewals (one per ttl / 3).
    let bound = 3 + 2 * (window.as_millis() as u64 / 33 + 1) + 10;
    assert!(
        made <= bound,
        "{made} script calls in {window:?} after 2000 forged releases (bound {bound})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_auxiliary_keys_are_reported_and_never_written() {
    let server = redis();
    let url = server.url();
    let mut conn = raw(&url).await;
    // A foreign hash where the epoch lives.
    let _: () = conn
        .hset_multiple("tenure:{aux}:epoch", &[("owner", "someone"), ("x", "1")])
        .await
        .unwrap();
    let e = election(&url, "aux", "a", SECOND).await;
    let err = e.try_campaign().await.expect_err("foreign epoch");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
    let epoch: Vec<(String, String)> = conn.hgetall("tenure:{aux}:epoch").await.unwrap();
    assert_eq!(epoch.len(), 2, "the foreign epoch was written: {epoch:?}");

    // A foreign hash where a fenced marker lives, even one with the
    // marker's field names among others.
    let _: () = conn
        .hset_multiple(
            "tenure:{aux}:last-run",
            &[("token", "1"), ("value", "v"), ("mine", "yes")],
        )
        .await
        .unwrap();
    let marker = FencedKey::new("tenure:{aux}:last-run");
    let err = marker
        .set(&mut conn, 99, "written")
        .await
        .expect_err("foreign marker");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
    let value: String = conn.hget("tenure:{aux}:last-run", "value").await.unwrap();
    assert_eq!(value, "v");

    // A marker whose slot is not a number.
    let _: () = conn.del("tenure:{aux}:last-run").await.unwrap();
    let _: () = conn
        .hset_multiple(
            "tenure:{aux}:last-run",
            &[("token", "1"), ("value", "5"), ("slot", "soon")],
        )
        .await
        .unwrap();
    let err = e.last_slot().await.expect_err("foreign slot");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_without_expiry_is_reported_not_polled() {
    let server = redis();
    let url = server.url();
    let mut conn = raw(&url).await;
    let _: () = conn
        .hset_multiple(
            "tenure:{stuck}:lease",
            &[("owner", "x"), ("token", "5"), ("since", "1")],
        )
        .await
        .unwrap();
    let e = election(&url, "stuck", "a", SECOND).await;
    let err = e.leader().await.expect_err("no expiry");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phantom_members_do_not_hold_partitions_unowned() {
    let server = redis();
    let url = server.url();
    let mut conn = raw(&url).await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    // A member entry that no heartbeat wrote: it "expires" in an hour.
    let _: () = conn
        .zadd("tenure:{ghosts}:members", "phantom", now_ms + 3_600_000)
        .await
        .unwrap();
    let partitions: Vec<String> = (0..3).map(|p| format!("ghost-{p}")).collect();
    let set = tenure::PartitionSet::builder("ghosts", partitions)
        .redis(&url)
        .ttl(SECOND)
        .build()
        .await
        .expect("builds");
    let observer = set.observer();
    let run = tokio::spawn(set.run(
        |_partition, term| async move {
            term.lost().await;
        },
        std::future::pending::<()>(),
    ));
    let deadline = Instant::now() + HANG;
    while observer.owned().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "owned {:?} of 3 beside a phantom member",
            observer.owned()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(observer.members().len(), 1, "{:?}", observer.members());
    run.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_election_waits_only_while_the_redis_process_is_new_to_the_prefix() {
    let mut server = redis();
    let url = server.url();
    // The process has served the prefix for longer than any ttl in use...
    past_hold_off(&url, "first", SECOND).await;
    // ...so a name it has never seen cannot have a leader from before.
    let fresh = election(&url, "never-seen", "a", SECOND).await;
    assert!(
        fresh.try_campaign().await.expect("asks").is_some(),
        "a new election on a long-running Redis waited for the hold-off"
    );
    // A new process may have lost any lease: no lease for one ttl.
    server.restart().expect("restarts");
    let other = election(&url, "also-never-seen", "a", SECOND).await;
    assert!(other.try_campaign().await.expect("asks").is_none());
}

/// The obvious way to force a re-election, deleting the lease by hand,
/// must not let a candidate in while the holder still acts: the holder's
/// next renewal finds the lease gone and stops, and only then does its
/// release of the lease's witness let the next candidate in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_by_hand_lets_nobody_in_before_its_holder_stopped() {
    let server = redis();
    let url = server.url();
    let ttl = 3 * SECOND;
    past_hold_off(&url, "deleted", ttl).await;
    let a = election(&url, "deleted", "a", ttl).await;
    let term = campaign(&a).await;
    let lost = tokio::spawn({
        let term = term.clone();
        async move {
            let reason = term.lost().await;
            (Instant::now(), reason)
        }
    });
    let mut conn = raw(&url).await;
    let deleted: i64 = conn.del("tenure:{deleted}:lease").await.unwrap();
    assert_eq!(deleted, 1);
    // A candidate that starts right after the delete.
    let b = election(&url, "deleted", "b", ttl).await;
    let next = timeout(HANG, b.campaign())
        .await
        .expect("b is elected")
        .unwrap();
    let elected_at = Instant::now();
    let (lost_at, reason) = timeout(HANG, lost).await.expect("a stops").unwrap();
    assert_eq!(reason, tenure::LostReason::Expired);
    assert!(
        lost_at <= elected_at && !term.is_leader(),
        "b was elected {:?} before a stopped leading",
        lost_at.saturating_duration_since(elected_at)
    );
    assert!(next.token() > term.token());
}

/// A lease deleted by hand while its holder is stopped (hung, cut off,
/// crashed): nobody is elected until the holder's deadline has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_by_hand_while_its_holder_hangs_waits_for_its_deadline() {
    let server = redis();
    let url = server.url();
    let ttl = 2 * SECOND;
    past_hold_off(&url, "hung", ttl).await;
    let (mut holder, token) = CrashableInstance::lead(&url, "hung", "a", ttl);
    holder.crash_in_place();
    let deadline = holder.deadline();
    let mut conn = raw(&url).await;
    let deleted: i64 = conn.del("tenure:{hung}:lease").await.unwrap();
    assert_eq!(deleted, 1);
    // A release by anyone but the holder (here with the holder's token)
    // does not end the wait.
    let released: i64 = lua("resign.lua")
        .key("tenure:{hung}:lease")
        .key("tenure:{hung}:witness")
        .arg("intruder")
        .arg(token)
        .arg("tenure:{hung}:events")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(released, 0);
    let b = election(&url, "hung", "b", ttl).await;
    let next = timeout(HANG, b.campaign())
        .await
        .expect("b is elected")
        .unwrap();
    let elected_at = Instant::now();
    assert!(
        elected_at >= deadline,
        "b was elected {:?} before the hung holder's deadline",
        deadline.saturating_duration_since(elected_at)
    );
    assert!(next.token() > token);
}

/// Foreign data where a lease's witness lives is reported and never
/// written: neither by an acquisition nor by the holder's renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_witness_is_reported_and_never_written() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "foreign-witness", SECOND).await;
    let mut conn = raw(&url).await;
    let _: () = conn
        .set("tenure:{foreign-witness}:witness", "not mine")
        .await
        .unwrap();
    let e = election(&url, "foreign-witness", "a", SECOND).await;
    let err = e.try_campaign().await.expect_err("foreign witness");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
    let value: String = conn.get("tenure:{foreign-witness}:witness").await.unwrap();
    assert_eq!(value, "not mine");

    // Written while a term holds: its renewal does not overwrite it.
    let _: () = conn.del("tenure:{foreign-witness}:witness").await.unwrap();
    let term = campaign(&e).await;
    let _: () = conn
        .set("tenure:{foreign-witness}:witness", "not mine")
        .await
        .unwrap();
    // A renewal runs (its refusal does not end the term before its
    // deadline, so confirm may still answer with the time left).
    let _ = term.confirm().await;
    let value: String = conn.get("tenure:{foreign-witness}:witness").await.unwrap();
    assert_eq!(value, "not mine");
}

/// Every key an acquisition reads, holding a type tenure never writes
/// there: the campaign reports that key and what it holds, and leaves it
/// as it was. (The scripts read each key with the command of its type and
/// ask its type only when Redis refuses that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_of_the_wrong_type_is_reported_with_its_type_and_never_written() {
    let server = redis();
    let url = server.url();
    past_hold_off(&url, "warm", SECOND).await;
    let mut conn = raw(&url).await;
    // (election, key, holds): the prefix's epoch last, as every election
    // of the prefix reads it.
    let cases = [
        ("wt-lease", "tenure:{wt-lease}:lease", "list"),
        ("wt-token", "tenure:{wt-token}:token", "hash"),
        ("wt-witness", "tenure:{wt-witness}:witness", "hash"),
        ("wt-epoch", "tenure:{wt-epoch}:epoch", "string"),
        ("wt-prefix", "tenure:epoch", "list"),
    ];
    for (name, key, holds) in cases {
        let _: () = conn.del(key).await.unwrap();
        match holds {
            "list" => {
                let _: () = conn.rpush(key, "x").await.unwrap();
            }
            "hash" => {
                let _: () = conn.hset(key, "x", "1").await.unwrap();
            }
            _ => {
                let _: () = conn.set(key, "x").await.unwrap();
            }
        }
        let e = election(&url, name, "a", SECOND).await;
        let err = e.try_campaign().await.expect_err("foreign data");
        assert!(
            matches!(err, Error::ForeignData { key: ref k, .. } if k == key),
            "{name}: {err:?}"
        );
        assert!(
            err.to_string().contains(&format!("holds a {holds}")),
            "{name}: {err}"
        );
        let kept = match holds {
            "list" => conn.lrange::<_, Vec<String>>(key, 0, -1).await.unwrap(),
            "hash" => {
                let fields: Vec<(String, String)> = conn.hgetall(key).await.unwrap();
                fields.into_iter().flat_map(|(f, v)| [f, v]).collect()
            }
            _ => vec![conn.get::<_, String>(key).await.unwrap()],
        };
        let written: &[&str] = if holds == "hash" { &["x", "1"] } else { &["x"] };
        assert_eq!(kept, written, "{name}: the key was written");
        let ttl: i64 = conn.pttl(key).await.unwrap();
        assert_eq!(ttl, -1, "{name}: an expiry was set on the key");
    }
}
