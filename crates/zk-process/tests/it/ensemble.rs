//! Three-member ensembles of real ZooKeeper servers: start-up, znodes
//! written and read with ZooKeeper's own client, a killed and a paused
//! leader, whole-ensemble restarts, a backup restored.

use std::time::Instant;

use zk_process::ZkEnsemble;

use crate::{eventually, mntr, DEADLINE};

fn ensemble() -> ZkEnsemble {
    let started = Instant::now();
    let zk = ZkEnsemble::start().unwrap();
    eprintln!("3-member ensemble serving after {:?}", started.elapsed());
    zk
}

/// The member's mode per `srvr`, if it serves.
fn mode(zk: &ZkEnsemble, member: usize) -> Option<String> {
    let reply = zk.four_letter(member, "srvr").ok()?;
    let mode = reply.lines().find_map(|l| l.strip_prefix("Mode: "))?;
    Some(mode.trim().to_owned())
}

#[test]
fn an_ensemble_elects_one_leader_and_survives_losing_it() {
    let mut zk = ensemble();
    assert_eq!(zk.members(), 3);
    let addresses: Vec<String> = (0..3)
        .map(|m| format!("127.0.0.1:{}", zk.client_port(m)))
        .collect();
    assert_eq!(zk.connect_string(), addresses.join(","));
    assert_eq!(zk.url(), format!("zk://{}", zk.connect_string()));
    for member in 0..3 {
        assert_ne!(zk.client_port(member), 2181);
        assert!(zk.pid(member).is_some() && zk.is_running(member));
        assert!(zk.dir(member).join("data/version-2").is_dir());
        assert!(zk.log_tail(member, 50).contains("QuorumPeer"));
    }
    let modes: Vec<String> = (0..3).map(|m| mode(&zk, m).unwrap()).collect();
    let old = zk.leader().unwrap();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(modes[old], "leader");
    assert_eq!(zk.wait_for_leader(DEADLINE).unwrap(), old);

    assert_eq!(zk.cli(old, &["create", "/x", "y"]).unwrap(), "Created /x");
    let follower = (old + 1) % 3;
    // A follower may not have applied the write yet.
    let read = eventually("a follower reads /x", || {
        zk.cli(follower, &["get", "/x"]).ok()
    });
    assert_eq!(read, "y");

    zk.kill(old);
    assert_eq!(zk.pid(old), None);
    if let Ok(leader) = zk.leader() {
        assert_ne!(leader, old);
    }
    let started = Instant::now();
    let new = zk.wait_for_leader(DEADLINE).unwrap();
    eprintln!("new leader after {:?}", started.elapsed());
    assert_ne!(new, old);
    assert_eq!(zk.cli(new, &["get", "/x"]).unwrap(), "y");
    zk.cli(new, &["create", "/during", "m-down"]).unwrap();

    let started = Instant::now();
    zk.restart(old).unwrap();
    eprintln!("killed leader serving again after {:?}", started.elapsed());
    assert_eq!(mode(&zk, old).as_deref(), Some("follower"));
    zk.wait_serving(DEADLINE).unwrap();
    // It synced with the leader before it served.
    assert_eq!(zk.cli(old, &["get", "/during"]).unwrap(), "m-down");
    let error = zk.cli(old, &["get", "/missing"]).unwrap_err();
    assert!(error.to_string().contains("Node does not exist"), "{error}");
}

#[test]
fn a_paused_leader_is_replaced_and_data_survives_restarts_and_restores() {
    let mut zk = ensemble();
    let old = zk.leader().unwrap();
    let pid = zk.pid(old);
    zk.pause(old).unwrap();
    assert!(zk.is_paused(old) && zk.is_running(old));
    let started = Instant::now();
    let new = zk.wait_for_leader(DEADLINE).unwrap();
    eprintln!("paused leader replaced after {:?}", started.elapsed());
    assert_ne!(new, old);
    zk.resume(old).unwrap();
    assert!(!zk.is_paused(old));
    assert_eq!(zk.pid(old), pid);
    zk.wait_serving(DEADLINE).unwrap();
    assert_eq!(zk.leader().unwrap(), new);
    assert_eq!(mode(&zk, old).as_deref(), Some("follower"));

    zk.cli(new, &["create", "/kept", "1"]).unwrap();
    let count = |zk: &ZkEnsemble, m| mntr(zk, m, "zk_znode_count").unwrap();
    let before = count(&zk, new);
    let backup = zk.back_up().unwrap();
    let leader = zk.leader().unwrap();
    assert_eq!(count(&zk, leader), before);
    zk.cli(leader, &["create", "/later", "2"]).unwrap();

    zk.kill_all();
    assert!((0..3).all(|m| zk.pid(m).is_none()));
    let started = Instant::now();
    zk.restart_all().unwrap();
    eprintln!("whole ensemble serving again after {:?}", started.elapsed());
    let leader = zk.leader().unwrap();
    assert_eq!(
        zk.cli(leader, &["ls", "/"]).unwrap(),
        "[kept, later, zookeeper]"
    );

    zk.restore(&backup).unwrap();
    let leader = zk.leader().unwrap();
    assert_eq!(zk.cli(leader, &["ls", "/"]).unwrap(), "[kept, zookeeper]");
    for member in 0..3 {
        eventually("every member has the restored znodes", || {
            (mntr(&zk, member, "zk_znode_count")? == before).then_some(())
        });
    }
}
