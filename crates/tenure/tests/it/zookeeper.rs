//! What only ZooKeeper does: sessions that expire, znodes deleted by hand,
//! members that die, stall and come back, and a whole ensemble restarted
//! or restored from an older copy of its data. Each test runs a private
//! 3-member ensemble.

use crate::support;
use std::time::Duration;

use crate::support::topo::{after_fault, contenders, election, renewed, store, MARGIN, TTL};
use crate::support::{campaign, TermLog, HANG};
use tenure::{Election, Error, LostReason};
use tenure_test_support::proxy::Proxy;
use tokio::time::{timeout, Instant};
use zookeeper_client as zk;

/// A raw client of `ensemble`, to change znodes by hand.
async fn by_hand(ensemble: &zk_process::ZkEnsemble) -> zk::Client {
    zk::Client::connect(&ensemble.connect_string())
        .await
        .expect("a raw ZooKeeper client")
}

/// The ZooKeeper member serving the tenure leader dies, then the
/// ensemble's own leader: no two terms overlap, and hand-over afterwards
/// works with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_zookeeper_members_keeps_one_leader_at_a_time() {
    let mut ensemble = support::zk();
    let url = ensemble.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "member-kill", &log).await;
    let observer = election(&store(&url).await, "member-kill", "observer").await;
    let before = support::topo::until_led(&observer).await;
    let leader =
        tokio::task::block_in_place(|| ensemble.wait_for_leader(HANG)).expect("a ZooKeeper leader");
    ensemble.kill(leader);
    tokio::task::block_in_place(|| ensemble.wait_for_leader(HANG)).expect("a new leader");
    let term = after_fault(&url, "member-kill", &log, tasks).await;
    assert!(term.token() > before);
}

/// One tenure instance reaches the ensemble through a proxy that stops
/// forwarding (its session expires on the ensemble): it stops leading by
/// its deadline, and the other is elected only after the cut-off one's
/// session, and lease, expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_stops_before_another_is_elected() {
    let ensemble = support::zk();
    let proxy = Proxy::start(ensemble.client_port(0)).expect("a proxy");
    let cut_off = Election::builder("cut")
        .open(format!("zk://127.0.0.1:{}", proxy.port()))
        .ttl(TTL)
        .margin(MARGIN)
        .id("cut-off")
        .build()
        .await
        .expect("an election through the proxy");
    let term = campaign(&cut_off).await;
    let other = election(&store(&ensemble.url()).await, "cut", "other").await;
    let follower = tokio::spawn(async move {
        let term = other.campaign().await;
        (Instant::now(), term)
    });
    renewed(&term).await;
    proxy.blackhole();
    let reason = timeout(HANG, term.lost()).await.expect("the term ends");
    let lost_at = Instant::now();
    assert_eq!(reason, LostReason::DeadlinePassed);
    let (elected_at, next) = timeout(HANG, follower)
        .await
        .expect("the other is elected")
        .expect("no panic");
    let next = next.expect("campaign");
    assert_eq!(next.id(), "other");
    assert!(next.token() > term.token());
    assert!(lost_at < elected_at, "the cut-off leader stopped first");
    // The session lasted its timeout (the ttl) after the last request;
    // the deadline was a margin earlier.
    assert!(elected_at >= term.deadline() + MARGIN - Duration::from_millis(5));
    proxy.heal();
}

/// A lease znode deleted by hand (the obvious way to force a re-election)
/// must not let a candidate in while its holder still acts: the witness
/// holds candidates off until the holder's next renewal finds the lease
/// gone and it stops, and releases the witness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_by_hand_lets_nobody_in_before_its_holder_stopped() {
    let ensemble = support::zk();
    let url = ensemble.url();
    let raw = by_hand(&ensemble).await;
    let ttl = Duration::from_secs(3);
    let a = support::election(&url, "by-hand", "a", ttl).await;
    let term = campaign(&a).await;
    let lost = tokio::spawn({
        let term = term.clone();
        async move {
            let reason = term.lost().await;
            (Instant::now(), reason)
        }
    });
    let deadline = term.deadline();
    raw.delete("/tenure/by-hand", None)
        .await
        .expect("deleted by hand");
    let b = support::election(&url, "by-hand", "b", ttl).await;
    let next = timeout(HANG, b.campaign())
        .await
        .expect("b is elected")
        .unwrap();
    let elected_at = Instant::now();
    let (lost_at, reason) = timeout(HANG, lost).await.expect("a stops").unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at <= elected_at && !term.is_leader(),
        "b was elected {:?} before a stopped leading",
        lost_at.saturating_duration_since(elected_at)
    );
    assert!(next.token() > term.token());
    // The holder stopped at its next renewal, not at its deadline.
    assert!(lost_at < deadline);
}

/// A lease deleted by hand while its holder is cut off: nobody is elected
/// until the holder's deadline has passed (its witness goes with its
/// session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_by_hand_while_its_holder_is_cut_off_waits_for_its_deadline() {
    let ensemble = support::zk();
    let proxy = Proxy::start(ensemble.client_port(0)).expect("a proxy");
    let raw = by_hand(&ensemble).await;
    let ttl = Duration::from_secs(2);
    let cut_off = Election::builder("cut-by-hand")
        .open(format!("zk://127.0.0.1:{}", proxy.port()))
        .ttl(ttl)
        .id("cut-off")
        .build()
        .await
        .expect("an election through the proxy");
    let term = campaign(&cut_off).await;
    renewed(&term).await;
    proxy.blackhole();
    raw.delete("/tenure/cut-by-hand", None)
        .await
        .expect("deleted by hand");
    let other = support::election(&ensemble.url(), "cut-by-hand", "other", ttl).await;
    let next = timeout(HANG, other.campaign())
        .await
        .expect("elected")
        .unwrap();
    let elected_at = Instant::now();
    assert!(
        elected_at >= term.deadline(),
        "elected {:?} before the cut-off holder's deadline",
        term.deadline().saturating_duration_since(elected_at)
    );
    assert!(!term.is_leader());
    assert!(next.token() > term.token());
    proxy.heal();
}

/// The whole ensemble stops and starts again (data kept): every term's
/// token is larger than the ones before, and no two terms overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_the_whole_ensemble_keeps_tokens_rising() {
    let mut ensemble = support::zk();
    let url = ensemble.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "restart", &log).await;
    let observer = election(&store(&url).await, "restart", "observer").await;
    let before = support::topo::until_led(&observer).await;
    ensemble.kill_all();
    tokio::task::block_in_place(|| ensemble.restart_all()).expect("the ensemble restarts");
    let term = after_fault(&url, "restart", &log, tasks).await;
    assert!(term.token() > before);
}

/// A restore from an older copy of the ensemble's data rolls its zxids
/// and the token counter back: a new term's token must still be above
/// every earlier one (the candidates' clocks keep it there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_an_older_copy_keeps_tokens_rising() {
    let mut ensemble = support::zk();
    let ttl = Duration::from_secs(1);
    let url = ensemble.url();
    let term_of = |id: &'static str| {
        let url = url.clone();
        async move {
            let e = support::election(&url, "restored", id, ttl).await;
            let term = campaign(&e).await;
            let token = term.token();
            term.resign().await.expect("resign");
            token
        }
    };
    let mut tokens = vec![term_of("a").await];
    let backup = tokio::task::block_in_place(|| ensemble.back_up()).expect("a backup");
    for id in ["b", "c", "d"] {
        tokens.push(term_of(id).await);
    }
    tokio::task::block_in_place(|| ensemble.restore(&backup)).expect("restored");
    let highest = *tokens.iter().max().expect("tokens");
    for id in ["e", "f"] {
        let token = term_of(id).await;
        assert!(
            token > highest,
            "{id}'s token {token} after the restore is not above the earlier {tokens:?}"
        );
        tokens.push(token);
    }
}

/// A ttl the ensemble will not grant as a session timeout is refused with
/// one line, not silently shortened (a shorter session would expire the
/// lease before the holder's deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_ensemble_cannot_keep_is_refused_clearly() {
    let ensemble = zk_process::ZkEnsemble::builder()
        .members(1)
        .tick_time(Duration::from_millis(100))
        .session_timeouts(Duration::from_millis(400), Duration::from_secs(4))
        .start()
        .expect("an ensemble");
    for ttl in [Duration::from_millis(200), Duration::from_secs(6)] {
        let err = Election::builder("bounds")
            .open(ensemble.url())
            .ttl(ttl)
            .build()
            .await
            .expect_err("refused");
        assert!(matches!(err, Error::Config(_)), "{ttl:?}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("maxSessionTimeout") && !text.contains('\n'),
            "{text}"
        );
    }
    Election::builder("bounds")
        .open(ensemble.url())
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect("a ttl within the bounds");
}

/// Data tenure did not write in an election's znode is reported, and left
/// as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_in_an_election_znode_is_reported_and_left_alone() {
    let ensemble = support::zk();
    let raw = by_hand(&ensemble).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    raw.create("/tenure", b"", &open).await.expect("prefix");
    raw.create("/tenure/{theirs}", b"not ours", &open)
        .await
        .expect("foreign");
    let err = Election::builder("theirs")
        .open(ensemble.url())
        .ttl(TTL)
        .build()
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
    let (data, _) = raw.get_data("/tenure/{theirs}").await.expect("still there");
    assert_eq!(data, b"not ours");
}

/// Bad URLs and unreachable ensembles are one clear line, and the
/// password is never in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_ensembles_are_one_clear_line() {
    let port = tenure_test_support::ports::free_port(&[]).expect("a free port");
    let unreachable = format!("zk://app:hunter2@127.0.0.1:{port}");
    for (url, transient) in [
        ("zk://127.0.0.1".to_string(), false),
        ("zks://127.0.0.1:1".to_string(), false),
        (unreachable, true),
    ] {
        let err = Election::builder("x")
            .open(url.as_str())
            .ttl(TTL)
            .call_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert_eq!(err.is_transient(), transient, "{url}: {text}");
        assert!(!text.contains('\n') && !text.contains("hunter2"), "{text}");
    }
}

/// A digest user's password is checked when the store is opened, and the
/// znodes tenure creates are that user's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_are_checked_and_guard_the_znodes() {
    let ensemble = support::zk();
    let hosts = ensemble.connect_string();
    let url = format!("zk://app:s3cret@{hosts}");
    let e = Election::builder("guarded")
        .open(url.as_str())
        .ttl(TTL)
        .build()
        .await
        .expect("an election as the digest user");
    let term = campaign(&e).await;
    let stranger = by_hand(&ensemble).await;
    let err = stranger
        .delete("/tenure/{guarded}", None)
        .await
        .expect_err("a stranger may not delete");
    assert!(
        matches!(err, zk::Error::NoAuth | zk::Error::NotEmpty),
        "{err}"
    );
    let err = stranger
        .get_data("/tenure/guarded")
        .await
        .expect_err("a stranger may not read the lease");
    assert_eq!(err, zk::Error::NoAuth);
    let wrong = format!("zk://app:wrong@{hosts}");
    let other = Election::builder("guarded")
        .open(wrong.as_str())
        .ttl(TTL)
        .build()
        .await;
    if let Ok(other) = other {
        // ZooKeeper accepts any digest identity; the ACL refuses it.
        let err = other.try_campaign().await.expect_err("refused by the ACL");
        assert!(matches!(err, Error::Auth { .. }), "{err}");
    }
    assert!(term.is_leader());
}

/// The failing mode of the cut-off test above, so that it is known to
/// catch the bug: without the witness, a candidate is elected while the
/// holder whose lease was deleted by hand still leads. (The holder must be
/// cut off: one that hears the deletion on its own watch stops within a
/// round trip, usually before any candidate is elected.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_witness_a_lease_deleted_by_hand_gives_two_leaders() {
    let ensemble = support::zk();
    let proxy = Proxy::start(ensemble.client_port(0)).expect("a proxy");
    let raw = by_hand(&ensemble).await;
    let ttl = Duration::from_secs(3);
    let a = Election::builder("unwitnessed")
        .open(format!("zk://127.0.0.1:{}", proxy.port()))
        .ttl(ttl)
        .id("a")
        .build()
        .await
        .expect("an election through the proxy");
    let term = campaign(&a).await;
    renewed(&term).await;
    proxy.blackhole();
    raw.delete("/tenure/unwitnessed", None)
        .await
        .expect("deleted by hand");
    let b = Election::builder("unwitnessed")
        .open(ensemble.url())
        .ttl(ttl)
        .id("b")
        .unsafe_zk_ignore_witness(true)
        .build()
        .await
        .expect("an election");
    let next = timeout(HANG, b.campaign()).await.expect("elected").unwrap();
    assert!(
        term.is_leader() && next.is_leader(),
        "two leaders at once: the bug the witness prevents"
    );
    proxy.heal();
}

/// A host list that spans two ensembles is refused with one line naming
/// the odd host, before anything is granted: processes that reached
/// different ensembles would each grant a term of the same election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_list_spanning_two_ensembles_is_refused() {
    let single = || {
        zk_process::ZkEnsemble::builder()
            .members(1)
            .tick_time(Duration::from_millis(100))
            .start()
            .expect("an ensemble")
    };
    let (one, other) = (single(), single());
    let url = format!("zk://{},{}", one.connect_string(), other.connect_string());
    for _ in 0..3 {
        // The client reaches either first; both ways are refused.
        let err = Election::builder("spanning")
            .open(url.as_str())
            .ttl(TTL)
            .build()
            .await
            .expect_err("refused");
        assert!(matches!(err, Error::Unsafe { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("another ZooKeeper ensemble") && !text.contains('\n'),
            "{text}"
        );
    }
    // Each alone is fine.
    for ensemble in [&one, &other] {
        Election::builder("spanning")
            .open(ensemble.url())
            .ttl(TTL)
            .build()
            .await
            .expect("one ensemble");
    }
}

/// The sessions the ensemble's members serve now, by `cons` (the
/// connection asking, which has no session, is not among them).
fn sessions(ensemble: &zk_process::ZkEnsemble) -> std::collections::BTreeSet<String> {
    let mut sessions = std::collections::BTreeSet::new();
    for member in 0..ensemble.members() {
        let cons = ensemble.four_letter(member, "cons").expect("cons");
        for line in cons.lines() {
            let sid = line
                .split("sid=")
                .nth(1)
                .and_then(|rest| rest.split([',', ')']).next());
            if let Some(sid) = sid.filter(|sid| *sid != "0x0") {
                sessions.insert(sid.to_string());
            }
        }
    }
    sessions
}

/// A process that campaigns on one ttl keeps one session: the one its
/// terms live on, which also serves its reads. The session opened at
/// connect, for reads before any election, is closed once the election's
/// opens, not left pinging beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_on_one_ttl_keeps_one_session() {
    let ensemble = support::zk();
    let store = store(&ensemble.url()).await;
    let candidate = election(&store, "one-session", "a").await;
    let _term = campaign(&candidate).await;
    let leader = store
        .leader_of(tenure::DEFAULT_PREFIX, "one-session")
        .await
        .expect("a read");
    assert_eq!(leader.map(|holder| holder.id), Some("a".to_string()));
    let deadline = Instant::now() + HANG;
    let mut seen = sessions(&ensemble);
    while seen.len() != 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = sessions(&ensemble);
    }
    assert_eq!(seen.len(), 1, "sessions: {seen:?}");
}

/// A term whose create committed but whose answer never came back (the
/// ensemble's leader stopped while the create waited on it, the call
/// timed out, and the leader then went on) is nobody's: the instance that
/// sent it deletes it a ttl later, and another candidate is elected then,
/// not only once that instance exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_created_after_its_acquire_timed_out_is_deleted_a_ttl_later() {
    // A long tick: the followers serve reads and wait on a stopped leader
    // for five ticks before they give up on it.
    let ensemble = zk_process::ZkEnsemble::builder()
        .tick_time(Duration::from_millis(500))
        .start()
        .expect("an ensemble");
    let leader =
        tokio::task::block_in_place(|| ensemble.wait_for_leader(HANG)).expect("a ZooKeeper leader");
    let follower = (leader + 1) % ensemble.members();
    let ttl = Duration::from_secs(3);
    let a = Election::builder("orphan")
        .open(format!("zk://127.0.0.1:{}", ensemble.client_port(follower)))
        .ttl(ttl)
        .call_timeout(Duration::from_millis(300))
        .id("a")
        .build()
        .await
        .expect("an election on a follower member");
    ensemble.pause(leader).expect("the leader stops");
    let lost = a.try_campaign().await;
    ensemble.resume(leader).expect("the leader goes on");
    assert!(lost.is_err(), "the acquire timed out: {lost:?}");
    let b = support::election(&ensemble.url(), "orphan", "b", ttl).await;
    let term = timeout(HANG, b.campaign())
        .await
        .expect("b is elected")
        .expect("a term");
    assert!(term.is_leader());
    drop(a);
}

/// A URL of several hosts and a chroot nobody has used yet: its znodes are
/// made on first use, the ensemble mark among them, as with one host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_chroot_on_a_url_of_several_hosts_is_made_on_first_use() {
    let ensemble = support::zk();
    let url = format!("{}/apps/new", ensemble.url());
    let candidate = support::election(&url, "chrooted", "a", TTL).await;
    let term = campaign(&candidate).await;
    assert!(term.is_leader());
    let under = ensemble
        .cli(0, &["ls", "/apps/new"])
        .expect("ls the chroot");
    assert!(under.contains("tenure-ensemble"), "{under}");
}
