//! Clusters of real etcd processes: start-up, reads and writes through the
//! gateway, a killed and a paused leader, a whole-cluster restart,
//! compaction.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use etcd_process::{Error, EtcdCluster, Proxy};

const DEADLINE: Duration = Duration::from_secs(20);

/// Failovers in about half a second.
fn fast_cluster() -> EtcdCluster {
    let started = Instant::now();
    let cluster = EtcdCluster::builder()
        .election_timeout(Duration::from_millis(500))
        .start()
        .unwrap();
    eprintln!("3-member cluster serving after {:?}", started.elapsed());
    cluster
}

fn put(cluster: &EtcdCluster, member: usize, key: &str, value: &str) {
    let body = format!(
        r#"{{"key":"{}","value":"{}"}}"#,
        BASE64.encode(key),
        BASE64.encode(value)
    );
    cluster.post(member, "/v3/kv/put", &body).unwrap();
}

/// A linearizable read through `member`: it sees every write committed
/// before it, wherever that was made.
fn get(cluster: &EtcdCluster, member: usize, key: &str) -> Option<String> {
    let body = format!(r#"{{"key":"{}"}}"#, BASE64.encode(key));
    let reply = cluster.post(member, "/v3/kv/range", &body).unwrap();
    let json: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let value = json["kvs"][0]["value"].as_str()?;
    Some(String::from_utf8(BASE64.decode(value).unwrap()).unwrap())
}

#[test]
fn a_cluster_survives_losing_its_leader_and_a_full_restart() {
    let mut cluster = fast_cluster();
    assert_eq!(cluster.members(), 3);
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    for (member, endpoint) in endpoints.iter().enumerate() {
        let port = cluster.client_port(member);
        assert_eq!(endpoint, &format!("127.0.0.1:{port}"));
        assert!(![2379, 2380].contains(&port));
        assert!(cluster.pid(member).is_some());
        assert!(cluster.dir(member).join("member").is_dir());
    }
    assert_eq!(cluster.url(), format!("etcd://{}", endpoints.join(",")));

    put(&cluster, 0, "k", "v");
    for member in 0..3 {
        assert_eq!(get(&cluster, member, "k").as_deref(), Some("v"));
    }

    let old = cluster.leader().unwrap();
    assert_eq!(cluster.wait_for_leader(DEADLINE).unwrap(), old);
    cluster.kill(old);
    assert_eq!(cluster.pid(old), None);
    // Until the others notice, they name the dead leader: an error, never
    // the dead member.
    if let Ok(leader) = cluster.leader() {
        assert_ne!(leader, old);
    }
    let started = Instant::now();
    let new = cluster.wait_for_leader(DEADLINE).unwrap();
    eprintln!("new leader after {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(cluster.leader().unwrap(), new);
    assert_eq!(get(&cluster, new, "k").as_deref(), Some("v"));
    put(&cluster, new, "k2", &format!("while m{old} was down"));

    let started = Instant::now();
    cluster.restart(old).unwrap();
    eprintln!("killed leader serving again after {:?}", started.elapsed());
    assert!(cluster.pid(old).is_some());
    assert_eq!(
        get(&cluster, old, "k2"),
        Some(format!("while m{old} was down"))
    );

    cluster.kill_all();
    assert!((0..3).all(|m| cluster.pid(m).is_none()));
    let started = Instant::now();
    cluster.restart_all().unwrap();
    eprintln!("whole cluster serving again after {:?}", started.elapsed());
    cluster.wait_for_leader(DEADLINE).unwrap();
    for member in 0..3 {
        assert_eq!(get(&cluster, member, "k").as_deref(), Some("v"));
    }

    put(&cluster, 1, "k", "v2");
    let revision = cluster.compact_now().unwrap();
    assert!(revision >= 4, "revision {revision}");
    // History before the compaction is gone; the present is not.
    let old_read = format!(
        r#"{{"key":"{}","revision":"{}"}}"#,
        BASE64.encode("k"),
        revision - 1
    );
    let error = cluster.post(0, "/v3/kv/range", &old_read).unwrap_err();
    assert!(
        error.to_string().contains("compacted"),
        "unexpected error: {error}"
    );
    assert_eq!(get(&cluster, 2, "k").as_deref(), Some("v2"));
    // Compacting again without a write in between is not an error.
    assert_eq!(cluster.compact_now().unwrap(), revision);
}

#[test]
fn a_paused_leader_is_replaced_and_follows_after_resuming() {
    let cluster = fast_cluster();
    let old = cluster.leader().unwrap();
    let pid = cluster.pid(old);

    cluster.pause(old).unwrap();
    assert!(cluster.is_paused(old));
    let started = Instant::now();
    let new = cluster.wait_for_leader(DEADLINE).unwrap();
    eprintln!("paused leader replaced after {:?}", started.elapsed());
    assert_ne!(new, old);
    put(&cluster, new, "k", "written while paused");

    cluster.resume(old).unwrap();
    assert!(!cluster.is_paused(old));
    assert_eq!(cluster.pid(old), pid);
    assert_eq!(cluster.wait_for_leader(DEADLINE).unwrap(), new);
    assert_eq!(
        get(&cluster, old, "k").as_deref(),
        Some("written while paused")
    );
}

#[test]
fn a_single_member_serves_through_a_proxy_and_builders_are_checked() {
    let mut cluster = EtcdCluster::builder().members(1).start().unwrap();
    assert_eq!(cluster.leader().unwrap(), 0);
    put(&cluster, 0, "k", "v");
    cluster.restart(0).unwrap();
    assert_eq!(get(&cluster, 0, "k").as_deref(), Some("v"));

    let proxy = Proxy::start(cluster.client_port(0)).unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(r#""health":"true""#), "{reply}");

    for builder in [
        EtcdCluster::builder().members(0),
        EtcdCluster::builder().members(8),
        EtcdCluster::builder().election_timeout(Duration::from_millis(5)),
    ] {
        assert!(matches!(builder.start(), Err(Error::Config(_))));
    }

    let dir = cluster.dir(0).to_path_buf();
    drop(cluster);
    assert!(!dir.exists());
}
