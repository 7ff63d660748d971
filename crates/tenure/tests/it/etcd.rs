//! What only etcd does: its members fail, stall and come back, compaction
//! drops old revisions, and a client can be cut off from the quorum while
//! the others are not. Each test runs a private 3-member cluster.

use crate::support;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::topo::{after_fault, contenders, election, renewed, store, MARGIN, TTL};
use crate::support::{campaign, CrashableInstance, TermLog, HANG};
use tenure::{Election, Error, LostReason};
use tokio::time::{timeout, Instant};

/// The cluster's leader member dies while a tenure leader holds its term:
/// the term either survives (renewals reach the new etcd leader in time)
/// or ends by its deadline, no two terms overlap, and a hand-over on the
/// new etcd leader works with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_etcd_leader_keeps_one_leader_at_a_time() {
    let mut cluster = support::etcd();
    let url = cluster.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "leader-kill", &log).await;
    let observer = election(&store(&url).await, "leader-kill", "observer").await;
    support::topo::until_led(&observer).await;
    let etcd_leader =
        tokio::task::block_in_place(|| cluster.wait_for_leader(HANG)).expect("an etcd leader");
    cluster.kill(etcd_leader);
    let new_leader =
        tokio::task::block_in_place(|| cluster.wait_for_leader(HANG)).expect("a new etcd leader");
    assert_ne!(new_leader, etcd_leader);
    after_fault(&url, "leader-kill", &log, tasks).await;
}

/// One tenure instance reaches etcd through a proxy that stops forwarding:
/// it stops leading by its deadline, and the other instance is elected
/// only after the cut-off one's lease expired in etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_the_quorum_stops_before_another_is_elected() {
    let cluster = support::etcd();
    let proxy = etcd_process::Proxy::start(cluster.client_port(0)).expect("a proxy");
    let cut_url = format!("etcd://127.0.0.1:{}", proxy.port());
    let cut_off = Election::builder("cut")
        .redis(&cut_url)
        .ttl(TTL)
        .margin(MARGIN)
        .id("cut-off")
        .build()
        .await
        .expect("an election through the proxy");
    let term = campaign(&cut_off).await;
    let other = election(&store(&cluster.url()).await, "cut", "other").await;
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
    assert!(
        lost_at < elected_at,
        "the cut-off leader stopped before the next one began"
    );
    // The lease lasted a whole ttl after the cut-off leader's last
    // renewal; its deadline was a margin earlier.
    assert!(elected_at >= term.deadline() + MARGIN - Duration::from_millis(5));
    proxy.heal();
}

/// The whole cluster stops and starts again (data kept): leases survive
/// the restart, every term's token is larger than the ones before, and no
/// two terms overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_the_whole_cluster_keeps_tokens_rising() {
    let mut cluster = support::etcd();
    let url = cluster.url();
    let log = TermLog::default();
    let tasks = contenders(&url, "restart", &log).await;
    let observer = election(&store(&url).await, "restart", "observer").await;
    let before = support::topo::until_led(&observer).await;
    cluster.kill_all();
    tokio::task::block_in_place(|| cluster.restart_all()).expect("the cluster restarts");
    let term = after_fault(&url, "restart", &log, tasks).await;
    assert!(term.token() > before);
}

/// Compaction drops the revision history, not the leases: the watch that
/// wakes followers keeps working, and tokens keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_leaves_hand_over_fast_and_tokens_rising() {
    let cluster = support::etcd();
    let url = cluster.url();
    let ttl = Duration::from_secs(10);
    let build = |id: &'static str| {
        let url = url.clone();
        async move {
            Election::builder("compacted")
                .redis(&url)
                .ttl(ttl)
                .id(id)
                .build()
                .await
                .expect("an election")
        }
    };
    let a = build("a").await;
    let b = build("b").await;
    let first = campaign(&a).await;
    let follower = tokio::spawn({
        let b = b.clone();
        async move { b.campaign().await }
    });
    support::topo::until_led(&b).await;
    let compacted = tokio::task::block_in_place(|| cluster.compact_now()).expect("compaction");
    assert!(compacted > 0);
    let resigned_at = Instant::now();
    first.resign().await.expect("resign");
    let second = timeout(ttl / 2, follower)
        .await
        .expect("the hand-over came long before the ttl")
        .expect("no panic")
        .expect("campaign");
    assert!(resigned_at.elapsed() < ttl / 2);
    assert!(second.token() > first.token());
    assert!(second.token() > u64::try_from(compacted).expect("positive"));
}

/// etcd leases count whole seconds and have a floor (1.5 election
/// timeouts): a ttl it cannot keep is refused with a clear error before
/// anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_etcd_cannot_keep_is_refused_clearly() {
    let cluster = support::etcd();
    let url = cluster.url();
    for (ttl, says) in [
        (Duration::from_millis(1500), "whole number of seconds"),
        (Duration::from_secs(1), "shorter than the smallest lease"),
    ] {
        let slow = etcd_process::EtcdCluster::builder()
            .members(1)
            .election_timeout(Duration::from_secs(2));
        let (url, _single) = if says.contains("smallest") {
            let single = tokio::task::block_in_place(|| slow.start()).expect("a slow cluster");
            (single.url(), Some(single))
        } else {
            (url.clone(), None)
        };
        let err = Election::builder("ttl")
            .redis(&url)
            .ttl(ttl)
            .build()
            .await
            .expect_err("refused");
        assert!(matches!(err, Error::Config(_)), "{err}");
        let text = err.to_string();
        assert!(text.contains(says), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}

/// Unreachable clusters, wrong credentials and bad URLs are one clear line
/// each, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_unreachable_clusters_are_one_clear_line() {
    let port = etcd_process::free_port().expect("a free port");
    let cases = [
        (format!("etcd://127.0.0.1:{port}"), "cannot reach etcd"),
        ("etcd://u:secret@127.0.0.1".to_string(), "invalid etcd URL"),
        ("etcd://u:secret@h:1/path".to_string(), "no path"),
    ];
    for (url, says) in cases {
        let err = timeout(
            HANG,
            Election::builder("bad")
                .redis(&url)
                .ttl(TTL)
                .call_timeout(Duration::from_millis(500))
                .build(),
        )
        .await
        .expect("no hang")
        .expect_err("refused");
        let text = err.to_string();
        assert!(text.contains(says), "{url}: {text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}

/// A key under the prefix that tenure did not write is reported, never
/// overwritten or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_in_an_election_key_is_reported_and_left_alone() {
    let cluster = support::etcd();
    let url = cluster.url();
    let body = r#"{"key":"dGVudXJlL2ZvcmVpZ24=","value":"bm90IG91cnM="}"#; // tenure/foreign = "not ours"
    cluster
        .post(0, "/v3/kv/put", body)
        .expect("a foreign key is written");
    let a = election(&store(&url).await, "foreign", "a").await;
    let err = timeout(HANG, a.campaign())
        .await
        .expect("no hang")
        .expect_err("refused");
    assert!(matches!(err, Error::ForeignData { .. }), "{err}");
    let range = cluster
        .post(0, "/v3/kv/range", r#"{"key":"dGVudXJlL2ZvcmVpZ24="}"#)
        .expect("read back");
    assert!(range.contains("bm90IG91cnM="), "left alone: {range}");
}

/// Transactions every member has answered so far, from its metrics.
fn transactions(cluster: &etcd_process::EtcdCluster) -> u64 {
    grpc_counter(cluster, "grpc_server_handled_total", "Txn")
}

/// A gRPC server counter of one method (`grpc_method`), summed over every
/// member, from their metrics.
fn grpc_counter(cluster: &etcd_process::EtcdCluster, counter: &str, method: &str) -> u64 {
    let (series, method) = (format!("{counter}{{"), format!("grpc_method=\"{method}\""));
    metric(cluster, &series, &method)
}

/// The lines of every member's metrics that start with `series` and
/// contain `label`, their values summed.
fn metric(cluster: &etcd_process::EtcdCluster, series: &str, label: &str) -> u64 {
    use std::io::{Read, Write};
    (0..cluster.members())
        .map(|member| {
            let port = cluster.client_port(member);
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics");
            write!(stream, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("sent");
            let mut text = String::new();
            stream.read_to_string(&mut text).expect("read");
            text.lines()
                .filter(|l| l.starts_with(series) && l.contains(label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum()
}

/// A leader's renewals keep each session lease alive on a stream kept open
/// between them: one keep-alive message per lease and renewal, no stream
/// opened. Opening a stream per renewal cost two messages per lease (the
/// client reads the first answer itself, which does not say which cluster
/// answered, so a second keep-alive is checked): 8 streams and 16 messages
/// over the 4 renewals counted here, against 0 and 8.
///
/// Hedges are off, so that a member slow to answer on a loaded machine
/// opens no stream; a window in which etcd changed leaders (a follower
/// member then ends the keep-alive streams it forwards) is counted again.
/// A renewal retried once is allowed for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_leader_keeps_its_keep_alive_streams_open() {
    let cluster = support::etcd();
    let e = Election::builder("streams")
        .open(cluster.url())
        .ttl(Duration::from_secs(3))
        .id("a")
        .unsafe_etcd_no_hedges(true)
        .build()
        .await
        .expect("an election");
    let term = campaign(&e).await;
    renewed(&term).await;
    let count = || {
        tokio::task::block_in_place(|| {
            [
                grpc_counter(&cluster, "grpc_server_started_total", "LeaseKeepAlive"),
                grpc_counter(&cluster, "grpc_server_msg_received_total", "LeaseKeepAlive"),
                metric(&cluster, "etcd_server_leader_changes_seen_total ", ""),
            ]
        })
    };
    let renewals = 4;
    let (streams, messages) = timeout(HANG, async {
        loop {
            let before = count();
            for _ in 0..renewals {
                renewed(&term).await;
            }
            let after = count();
            if after[2] == before[2] {
                break (after[0] - before[0], after[1] - before[1]);
            }
        }
    })
    .await
    .expect("4 renewals without a change of etcd's leader");
    // Two leases (the term's and its witness's); the next renewal may have
    // begun before the count was read.
    let most = 2 * (renewals + 1) + 2 * streams;
    assert!(
        streams <= 2 && messages <= most,
        "{streams} keep-alive streams opened and {messages} messages sent in {renewals} renewals"
    );
}

/// A follower waiting out a crashed leader's last second asks etcd a few
/// times, not in a loop: etcd reports the time left in whole seconds,
/// rounded down, and a follower sleeping on 0 s would ask again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_waits_out_a_crashed_leader_without_asking_in_a_loop() {
    let cluster = support::etcd();
    let url = cluster.url();
    let ttl = Duration::from_secs(2);
    let (crashed, _) = CrashableInstance::lead(&url, "spin", "victim", ttl);
    let survivor = support::election(&url, "spin", "survivor", ttl).await;
    let follower = tokio::spawn({
        let survivor = survivor.clone();
        async move { survivor.campaign().await }
    });
    support::topo::until_led(&survivor).await;
    let before = tokio::task::block_in_place(|| transactions(&cluster));
    crashed.crash();
    let term = timeout(HANG, follower)
        .await
        .expect("a takeover")
        .expect("no panic")
        .expect("campaign");
    let asked = tokio::task::block_in_place(|| transactions(&cluster)) - before;
    assert!(term.is_leader());
    // One attempt per second of the lease left, one when the watch reports
    // the delete, and the winning one; dozens before the fix.
    assert!(
        asked <= 8,
        "{asked} transactions while waiting out one lease"
    );
}

/// Base64, as etcd's JSON gateway wants keys and values.
fn b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// etcd with authentication on: a user whose role covers the prefix
/// leads; a wrong password and a role without the prefix are each one
/// clear line (never the password), before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_roles_are_checked_with_one_clear_line() {
    let cluster = support::etcd();
    let setup = [
        (
            "/v3/auth/user/add",
            r#"{"name":"root","password":"rootpw"}"#.to_string(),
        ),
        (
            "/v3/auth/user/grant",
            r#"{"user":"root","role":"root"}"#.to_string(),
        ),
        ("/v3/auth/role/add", r#"{"name":"app"}"#.to_string()),
        (
            "/v3/auth/role/grant",
            format!(
                r#"{{"name":"app","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                b64("tenure/"),
                b64("tenure0")
            ),
        ),
        (
            "/v3/auth/user/add",
            r#"{"name":"app","password":"s3cret"}"#.to_string(),
        ),
        (
            "/v3/auth/user/grant",
            r#"{"user":"app","role":"app"}"#.to_string(),
        ),
        ("/v3/auth/role/add", r#"{"name":"other"}"#.to_string()),
        (
            "/v3/auth/role/grant",
            format!(
                r#"{{"name":"other","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                b64("elsewhere/"),
                b64("elsewhere0")
            ),
        ),
        (
            "/v3/auth/user/add",
            r#"{"name":"other","password":"0ther"}"#.to_string(),
        ),
        (
            "/v3/auth/user/grant",
            r#"{"user":"other","role":"other"}"#.to_string(),
        ),
        ("/v3/auth/enable", "{}".to_string()),
    ];
    for (path, body) in &setup {
        cluster.post(0, path, body).expect(path);
    }
    let hosts = cluster.url().replacen("etcd://", "", 1);
    let app = format!("etcd://app:s3cret@{hosts}");
    let a = Election::builder("guarded")
        .redis(&app)
        .ttl(TTL)
        .id("a")
        .build()
        .await
        .expect("the app user may use tenure/");
    let term = campaign(&a).await;
    renewed(&term).await;
    term.resign().await.expect("resign");
    // A change to users or roles makes every token issued before it stale
    // ("revision of auth store is old"): the connected client authenticates
    // again instead of failing every call from then on.
    let added = std::process::Command::new("etcdctl")
        .args(["--endpoints", &hosts, "--user", "root:rootpw"])
        .args(["user", "add", "later", "--new-user-password", "l4ter"])
        .env_remove("ETCDCTL_API")
        .output()
        .expect("etcdctl runs");
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let term = campaign(&a).await;
    renewed(&term).await;
    term.resign().await.expect("resign after the auth change");
    for (url, says) in [
        (
            format!("etcd://app:wrong-pw@{hosts}"),
            "rejected the credentials",
        ),
        (
            format!("etcd://other:0ther@{hosts}"),
            "read and write on the key prefix",
        ),
    ] {
        let err = timeout(
            HANG,
            Election::builder("guarded").redis(&url).ttl(TTL).build(),
        )
        .await
        .expect("no hang")
        .expect_err("refused");
        assert!(matches!(err, Error::Auth { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(says), "{text}");
        assert!(
            !text.contains("wrong-pw") && !text.contains("0ther"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as
/// PEM files in `dir`: (the cluster's files, client cert, client key).
fn certificates(dir: &std::path::Path) -> (etcd_process::TlsFiles, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("a key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("a CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let signed = |names: Vec<String>| {
        let key = KeyPair::generate().expect("a key");
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("signed");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = signed(vec!["127.0.0.1".into(), "localhost".into()]);
    let (client_cert, client_key) = signed(vec!["tenure-client".into()]);
    let files = etcd_process::TlsFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        ca: dir.join("ca.pem"),
    };
    let write = |path: &std::path::Path, text: &str| std::fs::write(path, text).expect("written");
    write(&files.cert, &server_cert);
    write(&files.key, &server_key);
    write(&files.ca, &ca_cert.pem());
    write(&dir.join("client.pem"), &client_cert);
    write(&dir.join("client.key"), &client_key);
    (files, dir.join("client.pem"), dir.join("client.key"))
}

/// `etcds://` with a client certificate: the election works; without the
/// client certificate, or without the CA, it is one clear line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_with_a_client_certificate_leads_and_without_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("tenure-etcd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let (files, cert, key) = certificates(&dir);
    let cluster = tokio::task::block_in_place(|| {
        etcd_process::EtcdCluster::builder()
            .members(1)
            .election_timeout(Duration::from_millis(500))
            .tls(files.clone())
            .start()
    })
    .expect("a TLS cluster");
    let url = cluster.url();
    assert!(url.starts_with("etcds://"), "{url}");
    let a = Election::builder("tls")
        .open(
            tenure::Store::open(&url)
                .tls_ca_file(&files.ca)
                .tls_client_cert_file(&cert, &key),
        )
        .ttl(TTL)
        .id("a")
        .build()
        .await
        .expect("TLS with a client certificate");
    let term = campaign(&a).await;
    renewed(&term).await;
    term.resign().await.expect("resign");
    let without_cert = Election::builder("tls")
        .open(tenure::Store::open(&url).tls_ca_file(&files.ca))
        .ttl(TTL)
        .call_timeout(Duration::from_millis(500))
        .build();
    let without_ca = Election::builder("tls")
        .open(tenure::Store::open(&url).tls_client_cert_file(&cert, &key))
        .ttl(TTL)
        .call_timeout(Duration::from_millis(500))
        .build();
    for attempt in [without_cert, without_ca] {
        let err = timeout(HANG, attempt)
            .await
            .expect("no hang")
            .expect_err("refused");
        let text = err.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(matches!(err, Error::Tls { .. }), "{text}");
        assert!(text.contains("--tls-"), "names the setting: {text}");
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// etcd itself refuses a run recorded by a term that no longer holds the
/// election's key, even while that term's keeper has not noticed yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_run_recorded_by_a_term_whose_key_was_taken() {
    let cluster = support::etcd();
    let store = store(&cluster.url()).await;
    // A long ttl: the stale term's keeper renews (and notices) seconds later.
    let ttl = Duration::from_secs(30);
    let member = |id: &'static str| {
        Election::builder("taken")
            .store(&store)
            .ttl(ttl)
            .id(id)
            .build()
    };
    let (a, b) = (member("a").await.unwrap(), member("b").await.unwrap());
    let stale = campaign(&a).await;
    // The key and its witness both deleted by hand: the one operation
    // that lets another candidate in while the holder still acts.
    for key in ["tenure/taken", "tenure/{taken}/witness"] {
        let body = format!(r#"{{"key":"{}"}}"#, b64(key));
        cluster
            .post(0, "/v3/kv/deleterange", &body)
            .expect("the key is deleted");
    }
    let current = campaign(&b).await;
    assert!(stale.is_leader(), "the stale term has not noticed yet");
    assert!(!stale.record_run(ttl).await.unwrap(), "refused by etcd");
    assert_eq!(a.since_last_run().await.unwrap(), None);
    assert!(current.record_run(ttl).await.unwrap());
    assert!(a.since_last_run().await.unwrap().is_some());
    // Recorded again: the earlier marker's lease is revoked, not left to run out.
    assert!(current.record_run(ttl).await.unwrap());
    // A member lists the leases it has applied, which may trail the
    // revoke by a moment: wait for the exact count.
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let leases = cluster
            .post(0, "/v3/lease/leases", "{}")
            .expect("leases listed");
        if leases.matches("\"ID\"").count() == 5 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not only a's and b's session and witness leases and one marker lease: {leases}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Delete an election's key by hand, as `etcdctl del PREFIX/NAME` does.
fn delete_by_hand(cluster: &etcd_process::EtcdCluster, key: &str) {
    let body = format!(r#"{{"key":"{}"}}"#, b64(key));
    let answer = cluster
        .post(0, "/v3/kv/deleterange", &body)
        .expect("the key is deleted");
    assert!(answer.contains(r#""deleted":"1""#), "{answer}");
}

/// Revoke the lease an election's key hangs on, as `etcdctl lease revoke`.
fn revoke_by_hand(cluster: &etcd_process::EtcdCluster, key: &str) {
    let body = format!(r#"{{"key":"{}"}}"#, b64(key));
    let found = cluster
        .post(0, "/v3/kv/range", &body)
        .expect("the key is read");
    let lease = found
        .split(r#""lease":""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the key has a lease: {found}"))
        .to_string();
    let body = format!(r#"{{"ID":"{lease}"}}"#);
    cluster
        .post(0, "/v3/lease/revoke", &body)
        .expect("the lease is revoked");
}

/// A key deleted or a lease revoked by hand (the obvious ways to force a
/// re-election) must not let a candidate in while the holder still acts:
/// the holder's watch on its own key makes it renew at once, find the key
/// gone, stop, and only then release the witness that held the
/// candidates off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_or_revoked_by_hand_lets_nobody_in_before_its_holder_stopped() {
    let cluster = support::etcd();
    let url = cluster.url();
    let ttl = Duration::from_secs(6);
    for (round, by_hand) in [delete_by_hand, revoke_by_hand].into_iter().enumerate() {
        let name = format!("by-hand-{round}");
        let a = support::election(&url, &name, "a", ttl).await;
        let term = campaign(&a).await;
        let lost = tokio::spawn({
            let term = term.clone();
            async move {
                let reason = term.lost().await;
                (Instant::now(), reason)
            }
        });
        let deadline = term.deadline();
        tokio::task::block_in_place(|| by_hand(&cluster, &format!("tenure/{name}")));
        // A candidate that starts right after.
        let b = support::election(&url, &name, "b", ttl).await;
        let next = timeout(HANG, b.campaign())
            .await
            .expect("b is elected")
            .unwrap();
        let elected_at = Instant::now();
        let (lost_at, reason) = timeout(HANG, lost).await.expect("a stops").unwrap();
        assert_eq!(reason, LostReason::Expired, "round {round}");
        assert!(
            lost_at <= elected_at && !term.is_leader(),
            "round {round}: b was elected {:?} before a stopped leading",
            lost_at.saturating_duration_since(elected_at)
        );
        assert!(next.token() > term.token());
        // The holder stopped when its watch told it, not at its deadline.
        assert!(lost_at < deadline, "round {round}");
    }
}

/// A key deleted by hand while its holder is cut off from etcd (hung,
/// partitioned): nobody is elected until the holder's deadline has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_by_hand_while_its_holder_is_cut_off_waits_for_its_deadline() {
    let cluster = support::etcd();
    let proxy = etcd_process::Proxy::start(cluster.client_port(0)).expect("a proxy");
    let ttl = Duration::from_secs(3);
    let cut_off = Election::builder("cut-by-hand")
        .redis(format!("etcd://127.0.0.1:{}", proxy.port()))
        .ttl(ttl)
        .id("cut-off")
        .build()
        .await
        .expect("an election through the proxy");
    let term = campaign(&cut_off).await;
    renewed(&term).await;
    proxy.blackhole();
    tokio::task::block_in_place(|| delete_by_hand(&cluster, "tenure/cut-by-hand"));
    let other = support::election(&cluster.url(), "cut-by-hand", "other", ttl).await;
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

/// An endpoint list that spans two clusters (two members of one, one of
/// another) is refused with one line naming both, before anything is
/// written: the client balances over every endpoint, and each cluster
/// would grant its own term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_list_spanning_two_clusters_is_refused() {
    let (one, other) = (support::etcd(), support::etcd());
    let url = format!(
        "etcd://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        one.client_port(0),
        one.client_port(1),
        other.client_port(0)
    );
    let err = Election::builder("spanning")
        .redis(&url)
        .ttl(Duration::from_secs(2))
        .build()
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::Unsafe { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("different etcd clusters"), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", other.client_port(0))),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    // One cluster's members are fine.
    let fine = format!(
        "etcd://127.0.0.1:{},127.0.0.1:{}",
        one.client_port(0),
        one.client_port(1)
    );
    let e = support::election(&fine, "spanning", "a", Duration::from_secs(2)).await;
    campaign(&e).await;
}

/// An endpoint that later answers for another cluster (its address
/// reused, its member replaced while tenure runs) is refused as one that
/// does at connect: every answer's cluster is checked, not only the first
/// ones. Here a candidate connected to three members of one cluster; then
/// the first member's address reaches an empty second cluster while the
/// other two are out of its reach. Taking that cluster's word would grant
/// the candidate a term there, beside the holder's on the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_later_answers_for_another_cluster_is_refused() {
    let first = support::etcd();
    let other = tokio::task::block_in_place(|| {
        etcd_process::EtcdCluster::builder()
            .members(1)
            .election_timeout(Duration::from_millis(500))
            .start()
    })
    .expect("a second cluster");
    let proxies: Vec<etcd_process::Proxy> = (0..first.members())
        .map(|member| etcd_process::Proxy::start(first.client_port(member)).expect("a proxy"))
        .collect();
    let endpoints: Vec<String> = proxies
        .iter()
        .map(|proxy| format!("127.0.0.1:{}", proxy.port()))
        .collect();
    let proxied = format!("etcd://{}", endpoints.join(","));
    let ttl = Duration::from_secs(2);
    let holder = support::election(&first.url(), "moved", "holder", ttl).await;
    let term = campaign(&holder).await;
    // Every endpoint answers for the first cluster: connecting passes.
    let candidate = support::election(&proxied, "moved", "candidate", ttl).await;
    let tried = candidate.try_campaign().await.expect("the candidate asks");
    assert!(tried.is_none(), "the term is held");
    proxies[0].retarget(other.client_port(0));
    proxies[1].cut();
    proxies[2].cut();
    let err = match timeout(HANG, candidate.campaign()).await {
        Ok(Ok(second)) => panic!(
            "two leaders: {} (token {}) on the other cluster beside {} (token {})",
            second.id(),
            second.token(),
            term.id(),
            term.token()
        ),
        Ok(Err(err)) => err,
        Err(_) => panic!("the candidate neither led nor gave up within {HANG:?}"),
    };
    assert!(matches!(err, Error::Unsafe { .. }), "{err}");
    assert!(!err.is_transient());
    let text = err.to_string();
    assert!(text.contains("answered for etcd cluster"), "{text}");
    assert!(
        text.contains("list the members of one cluster only"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    // Nothing was written there, and the holder leads on.
    let body = format!(r#"{{"key":"{}","range_end":"{}"}}"#, b64("\0"), b64("\0"));
    let everything = tokio::task::block_in_place(|| other.post(0, "/v3/kv/range", &body))
        .expect("the other cluster is read");
    assert!(!everything.contains(r#""kvs""#), "{everything}");
    assert_eq!(term.lost_reason(), None);
    renewed(&term).await;
}

/// A restore from an older backup rolls etcd's revision back (etcd 3.4
/// cannot bump it): the terms after it must still get tokens above every
/// earlier one, or a fenced resource could not tell a new leader from a
/// stale one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_an_older_backup_keeps_tokens_rising() {
    let mut cluster = support::etcd();
    let ttl = Duration::from_secs(2);
    let url = cluster.url();
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
    let backup = tokio::task::block_in_place(|| cluster.back_up()).expect("a backup");
    for id in ["b", "c", "d"] {
        tokens.push(term_of(id).await);
    }
    tokio::task::block_in_place(|| cluster.restore(&backup)).expect("restored");
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

/// An etcd leader change renews every lease, the last-run marker's too:
/// the marker's age must still count from the run, or the next period's
/// run would be skipped (the issue saw two skipped in a row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_leader_change_does_not_make_the_last_run_look_younger() {
    let mut cluster = support::etcd();
    let url = cluster.url();
    let e = support::election(&url, "marker-age", "a", Duration::from_secs(2)).await;
    let term = campaign(&e).await;
    assert!(term.record_run(Duration::from_secs(60)).await.unwrap());
    let recorded = Instant::now();
    // The run ages (this is the scenario, not a wait for a condition).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let leader =
        tokio::task::block_in_place(|| cluster.wait_for_leader(HANG)).expect("an etcd leader");
    cluster.kill(leader);
    tokio::task::block_in_place(|| cluster.wait_for_leader(HANG)).expect("a new etcd leader");
    let age = timeout(HANG, async {
        loop {
            if let Ok(age) = e.since_last_run().await {
                return age;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the marker is read after the leader change")
    .expect("a marker");
    let elapsed = recorded.elapsed();
    // One second of clock slack and one of etcd's whole seconds.
    assert!(
        age + Duration::from_secs(2) >= elapsed,
        "the marker looks {age:?} old after {elapsed:?}"
    );
    assert!(
        age <= elapsed,
        "never older than it is: {age:?} > {elapsed:?}"
    );
}

/// A follower member that stops (SIGSTOP) holds every call the client
/// balanced onto it; a leader must not lose its term for that while two
/// members answer at once: calls are hedged to the others well within the
/// renewal's time. (A ttl of 4 s: at 2 s, and once at 3 s, a CI machine
/// busy with the other tests starved the renewals for a whole deadline.)
/// The etcd leader is waited for, not read: on a loaded machine the
/// cluster may be between two leaders of its own when a round begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_member_never_costs_a_term() {
    let cluster = support::etcd();
    let ttl = Duration::from_secs(4);
    let e = support::election(&cluster.url(), "paused-member", "a", ttl).await;
    let term = campaign(&e).await;
    for round in 0..4 {
        let leader = tokio::task::block_in_place(|| cluster.wait_for_leader(HANG))
            .unwrap_or_else(|err| panic!("round {round}: {err}"));
        let follower = (leader + 1 + round % 2) % 3;
        cluster.pause(follower).expect("paused");
        // Long enough for every renewal of two ttls to meet the stopped
        // member.
        tokio::time::sleep(ttl * 2 + Duration::from_secs(1)).await;
        cluster.resume(follower).expect("resumed");
        assert_eq!(term.lost_reason(), None, "round {round}: the term was lost");
        renewed(&term).await;
    }
    assert!(term.is_leader());
}

/// Authentication enabled on a running cluster while a leader without
/// credentials holds its term: the term ends by its deadline (nothing can
/// be renewed), and campaigning again fails with one clear line instead of
/// retrying for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_enabled_while_leading_ends_with_a_clear_error() {
    let cluster = support::etcd();
    let e = support::election(&cluster.url(), "auth-later", "a", TTL).await;
    let term = campaign(&e).await;
    for (path, body) in [
        (
            "/v3/auth/user/add",
            r#"{"name":"root","password":"rootpw"}"#,
        ),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        ("/v3/auth/enable", "{}"),
    ] {
        cluster.post(0, path, body).expect(path);
    }
    let reason = timeout(HANG, term.lost()).await.expect("the term ends");
    assert_eq!(reason, LostReason::DeadlinePassed);
    let err = timeout(HANG, e.campaign())
        .await
        .expect("campaign gives up")
        .expect_err("refused");
    assert!(matches!(err, Error::Auth { .. }), "{err}");
    assert!(!err.is_transient());
    let text = err.to_string();
    assert!(text.contains("requires authentication"), "{text}");
    assert!(!text.contains('\n'), "{text}");
}
