//! Redis Clusters of real processes: start-up, redirections, failovers,
//! crashes and slot migration.

use std::time::{Duration, Instant};

use redis_process::{slot_of, RedisCluster, SLOTS};

/// The first line of an error reply, e.g. `MOVED 123 127.0.0.1:4567`.
fn error_of(result: Result<String, redis_process::Error>) -> String {
    match result {
        Err(redis_process::Error::Reply(e)) => e,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn a_cluster_starts_and_serves_keys_where_they_belong() {
    let started = Instant::now();
    let cluster = RedisCluster::start().unwrap();
    eprintln!("cluster started in {:?}", started.elapsed());

    assert_eq!(cluster.nodes().len(), 6);
    let primaries = cluster.primary_ports().unwrap();
    assert_eq!(primaries.len(), 3);
    assert_eq!(
        cluster.url(),
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            primaries[0], primaries[1], primaries[2]
        )
    );
    for node in cluster.nodes() {
        let bus = node.bus_port().unwrap();
        assert_ne!(bus, node.port());
        assert_ne!(bus, node.port() + 10000);
    }
    assert_eq!(cluster.primary_of_slot(0).unwrap(), primaries[0]);
    assert_eq!(cluster.primary_of_slot(SLOTS - 1).unwrap(), primaries[2]);
    for primary in &primaries {
        let replica = cluster.replica_of(*primary).unwrap();
        assert!(!primaries.contains(&replica));
    }

    let slot = slot_of("tenure-key");
    let owner = cluster.primary_of_slot(slot).unwrap();
    cluster.command(owner, &["SET", "tenure-key", "v"]).unwrap();
    assert_eq!(cluster.command(owner, &["GET", "tenure-key"]).unwrap(), "v");
    let other = *primaries.iter().find(|p| **p != owner).unwrap();
    assert_eq!(
        error_of(cluster.command(other, &["GET", "tenure-key"])),
        format!("MOVED {slot} 127.0.0.1:{owner}")
    );
}

#[test]
fn failover_moves_a_shard_to_its_replica() {
    let cluster = RedisCluster::start().unwrap();
    let slot = slot_of("k");
    let old = cluster.primary_of_slot(slot).unwrap();
    cluster.command(old, &["SET", "k", "v"]).unwrap();
    let replica = cluster.replica_of(old).unwrap();

    let started = Instant::now();
    let new = cluster.failover(old).unwrap();
    eprintln!("cluster failover took {:?}", started.elapsed());
    assert_eq!(new, replica);
    assert_eq!(cluster.primary_of_slot(slot).unwrap(), new);
    assert_eq!(cluster.replica_of(new).unwrap(), old);
    assert_eq!(cluster.command(new, &["GET", "k"]).unwrap(), "v");
    assert!(error_of(cluster.command(old, &["SET", "k", "w"])).starts_with("MOVED"));

    // And back again.
    assert_eq!(cluster.failover(new).unwrap(), old);
}

#[test]
fn a_killed_primary_is_replaced_and_rejoins_as_a_replica() {
    let cluster = RedisCluster::start().unwrap();
    let slot = slot_of("k");
    let old = cluster.primary_of_slot(slot).unwrap();
    cluster.command(old, &["SET", "k", "v"]).unwrap();
    // Make sure the write reached the replica before the crash.
    cluster
        .wait_for_replication(old, Duration::from_secs(30))
        .unwrap();
    let replica = cluster.replica_of(old).unwrap();
    // A replica redirects key commands (each command() is a new connection,
    // never READONLY), but counts the keys it holds.
    assert_eq!(cluster.command(replica, &["DBSIZE"]).unwrap(), "1");
    assert_eq!(
        error_of(cluster.command(replica, &["GET", "k"])),
        format!("MOVED {slot} 127.0.0.1:{old}")
    );

    let started = Instant::now();
    cluster.kill(old).unwrap();
    let new = cluster.wait_for_failover(old).unwrap();
    eprintln!(
        "cluster failover after kill -9 took {:?}",
        started.elapsed()
    );
    assert_eq!(new, replica);
    assert_eq!(cluster.primary_of_slot(slot).unwrap(), new);
    assert_eq!(cluster.command(new, &["GET", "k"]).unwrap(), "v");

    let started = Instant::now();
    cluster.resume(old).unwrap();
    eprintln!("killed primary rejoined after {:?}", started.elapsed());
    assert_eq!(cluster.replica_of(new).unwrap(), old);
    assert_eq!(cluster.node_id(old).unwrap().len(), 40);
}

#[test]
fn a_slot_migrates_with_its_keys_in_steps_and_at_once() {
    let cluster = RedisCluster::builder().password("pw").start().unwrap();
    assert!(cluster.url().starts_with("redis+cluster://:pw@127.0.0.1:"));

    let keys = ["{m}.a", "{m}.b", "{m}.c"];
    let slot = slot_of("{m}.a");
    let from = cluster.primary_of_slot(slot).unwrap();
    for key in keys {
        cluster.command(from, &["SET", key, key]).unwrap();
    }
    let to = *cluster
        .primary_ports()
        .unwrap()
        .iter()
        .find(|p| **p != from)
        .unwrap();

    // Held mid-migration: keys still on the source are served there, keys
    // already moved (or new) are redirected with ASK.
    cluster.begin_migration(slot, to).unwrap();
    assert_eq!(cluster.command(from, &["GET", "{m}.a"]).unwrap(), "{m}.a");
    assert_eq!(
        error_of(cluster.command(from, &["GET", "{m}.new"])),
        format!("ASK {slot} 127.0.0.1:{to}")
    );
    let started = Instant::now();
    assert_eq!(cluster.migrate_keys(slot).unwrap(), keys.len());
    assert!(error_of(cluster.command(from, &["GET", "{m}.a"])).starts_with("ASK"));
    cluster.finish_migration(slot).unwrap();
    eprintln!("migration steps took {:?}", started.elapsed());

    assert_eq!(cluster.primary_of_slot(slot).unwrap(), to);
    for key in keys {
        assert_eq!(cluster.command(to, &["GET", key]).unwrap(), key);
        assert_eq!(
            error_of(cluster.command(from, &["GET", key])),
            format!("MOVED {slot} 127.0.0.1:{to}")
        );
    }

    // And back in one call.
    cluster.migrate_slot(slot, from).unwrap();
    assert_eq!(cluster.primary_of_slot(slot).unwrap(), from);
    assert_eq!(cluster.command(from, &["GET", "{m}.b"]).unwrap(), "{m}.b");
    assert!(error_of(cluster.command(to, &["GET", "{m}.b"])).starts_with("MOVED"));
}
