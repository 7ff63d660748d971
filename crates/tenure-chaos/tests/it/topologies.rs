//! The checker must be able to fail on a Sentinel group, on a cluster, on
//! etcd, on ZooKeeper and on SQLite too: with instances that ignore their
//! local deadline, a run under pauses of the leader is reported unsafe
//! whatever the store's topology. Short runs on etcd, on ZooKeeper and on
//! SQLite under their faults are safe. And the harness refuses fault kinds its topology cannot
//! inject, and ttls etcd or ZooKeeper cannot keep.

use std::path::PathBuf;
use std::process::Command;

/// Run `tenure-chaos run` with `args` into a fresh directory; the exit
/// code and the report.
fn run(name: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let out: PathBuf = std::env::temp_dir().join(format!(
        "tenure-chaos-topology-{name}-{}",
        std::process::id()
    ));
    let _slot = crate::RunSlot::take();
    let status = Command::new(env!("CARGO_BIN_EXE_tenure-chaos"))
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(&out)
        .status()
        .expect("tenure-chaos runs");
    let report = std::fs::read_to_string(out.join("report.json")).expect("a report is written");
    let _ = std::fs::remove_dir_all(&out);
    (
        status.code().unwrap_or(-1),
        serde_json::from_str(&report).expect("the report is JSON"),
    )
}

/// Three instances ignoring their deadline, the leader paused for 1.3 to
/// 2.5 ttls again and again for `duration`: on resuming it writes before its
/// heartbeat learns that another instance leads.
fn no_deadline_is_unsafe(topology: &str, duration: &str) {
    let (code, report) = run(
        topology,
        &[
            "--topology",
            topology,
            "--seed",
            "11",
            "--duration",
            duration,
            "--instances",
            "3",
            "--faults",
            "pause",
            "--unsafe-no-deadline",
        ],
    );
    assert_eq!(code, 1, "the run is judged unsafe: {report}");
    assert!(report["overlaps"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["safe"], false);
    assert_eq!(
        report["crashes"].as_array().map(Vec::len),
        Some(0),
        "{}",
        report["crashes"]
    );
    assert_eq!(report["leaked"].as_array().map(Vec::len), Some(0));
}

#[test]
fn ignoring_the_local_deadline_on_a_sentinel_group_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("sentinel", "15s");
}

#[test]
fn ignoring_the_local_deadline_on_a_cluster_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("cluster", "15s");
}

/// etcd's ttl is 2 s here, so 20 s for as many pauses as the others get.
#[test]
fn ignoring_the_local_deadline_on_etcd_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("etcd", "20s");
}

/// ZooKeeper's ttl is 2 s here too.
#[test]
fn ignoring_the_local_deadline_on_zookeeper_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("zk", "20s");
}

#[test]
fn ignoring_the_local_deadline_on_sqlite_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("sqlite", "15s");
}

#[test]
fn ignoring_the_local_deadline_on_postgres_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("postgres", "15s");
}

/// Every fault kind of the etcd topology but `etcd-pause-member`: raft
/// members killed (the leader half the time), every member killed and
/// started again, compaction, links cut, dropped and slowed, instances
/// killed, paused, churned, duplicated, stopped. `etcd-pause-member` is left
/// out because a paused raft leader of etcd before the fix of etcd#15247
/// (3.4.23 here) revokes, on resuming, leases that its successor kept
/// renewing; see the book ("Fault injection on etcd").
#[test]
fn a_short_run_on_etcd_under_its_faults_is_safe() {
    let (code, report) = run(
        "etcd-safe",
        &[
            "--store",
            "etcd",
            "--seed",
            "280",
            "--duration",
            "30s",
            "--faults",
            "kill,pause,cut,drop,delay,graceful,churn,mixed-ttl,dup-id,\
             etcd-kill-member,etcd-restart-all,etcd-compact",
        ],
    );
    assert_eq!(code, 0, "the run is judged safe: {report}");
    assert_eq!(report["safe"], true, "{report}");
    assert_eq!(report["overlaps"], 0, "{report}");
    assert_eq!(report["stale_writes_accepted"], 0, "{report}");
    assert_eq!(report["crashes"].as_array().map(Vec::len), Some(0));
    assert_eq!(report["leaked"].as_array().map(Vec::len), Some(0));
    assert!(report["terms"].as_u64().unwrap() > 0, "{report}");
    let faults = report["faults"].as_object().expect("faults by kind");
    assert!(
        faults.keys().any(|kind| kind.starts_with("etcd-")),
        "the seed draws faults of the etcd cluster: {report}"
    );
}

/// Every fault kind of the ZooKeeper topology: members killed (a follower,
/// the ensemble's leader), paused, every member killed and started again,
/// a restore from an older backup, the lease deleted by hand, links cut,
/// dropped and slowed, sessions expired by pauses, instances killed,
/// churned, duplicated, stopped, mixed ttls.
#[test]
fn a_short_run_on_zookeeper_under_its_faults_is_safe() {
    let (code, report) = run(
        "zk-safe",
        &[
            "--store",
            "zk",
            "--seed",
            "280",
            "--duration",
            "40s",
            "--faults",
            "kill,pause,cut,drop,delay,graceful,churn,mixed-ttl,dup-id,delete-lease,cut-delete-lease,\
             restore-snapshot,zk-kill-member,zk-kill-leader,zk-pause-member,zk-restart-all",
        ],
    );
    safe_with_store_faults(code, &report, "zk-");
}

/// Every fault kind of the sqlite topology: another writer holding the
/// file, the file deleted under the instances, an older copy put back,
/// the lease row deleted by hand, instances killed (their OS lock goes
/// with them), paused (they keep it), churned, duplicated, stopped.
#[test]
fn a_short_run_on_sqlite_under_its_faults_is_safe() {
    let (code, report) = run(
        "sqlite-safe",
        &[
            "--store",
            "sqlite",
            "--seed",
            "280",
            "--duration",
            "40s",
            "--faults",
            "kill,pause,graceful,churn,dup-id,delete-lease,restore-snapshot,sqlite-lock,\
             sqlite-delete-file",
        ],
    );
    safe_with_store_faults(code, &report, "sqlite-");
}

/// Every fault kind of the postgres topology: the server killed and
/// started with its data, paused, its lease table locked by another
/// session, started from an older copy of its data, the lease row deleted
/// by hand, links cut, dropped and slowed, instances killed, paused,
/// churned, duplicated, stopped.
#[test]
fn a_short_run_on_postgres_under_its_faults_is_safe() {
    let (code, report) = run(
        "postgres-safe",
        &[
            "--store",
            "postgres",
            "--seed",
            "31",
            "--duration",
            "40s",
            "--faults",
            "kill,pause,cut,drop,delay,graceful,churn,mixed-ttl,dup-id,delete-lease,\
             cut-delete-lease,restore-snapshot,pg-restart,pg-pause,pg-lock",
        ],
    );
    safe_with_store_faults(code, &report, "pg-");
}

/// Failovers to a replica, left streaming or cut off by the seed, among
/// crashes and hand-overs: the promoted replica, which may lack the lease
/// of the term that leads, grants no term before that term's deadline.
#[test]
fn failovers_to_a_replica_on_postgres_are_safe() {
    let (code, report) = run(
        "postgres-failover",
        &[
            "--store",
            "postgres",
            "--seed",
            "3",
            "--duration",
            "45s",
            "--faults",
            "pg-failover,kill,graceful",
        ],
    );
    safe_with_store_faults(code, &report, "pg-failover");
    assert!(
        report["faults"]["pg-failover"].as_u64() >= Some(2),
        "failovers: {report}"
    );
}

/// A run judged safe, with no overlap, stale write, falling token, crash
/// or leak, some terms, and faults of the store (kinds starting with
/// `store_kinds`) drawn by its seed.
fn safe_with_store_faults(code: i32, report: &serde_json::Value, store_kinds: &str) {
    assert_eq!(code, 0, "the run is judged safe: {report}");
    assert_eq!(report["safe"], true, "{report}");
    assert_eq!(report["overlaps"], 0, "{report}");
    assert_eq!(report["stale_writes_accepted"], 0, "{report}");
    assert_eq!(report["tokens_not_rising"], 0, "{report}");
    assert_eq!(report["crashes"].as_array().map(Vec::len), Some(0));
    assert_eq!(report["leaked"].as_array().map(Vec::len), Some(0));
    assert!(report["terms"].as_u64().unwrap() > 0, "{report}");
    let faults = report["faults"].as_object().expect("faults by kind");
    assert!(
        faults.keys().any(|kind| kind.starts_with(store_kinds)),
        "the seed draws faults of the store: {report}"
    );
}

#[test]
fn faults_of_another_topology_are_refused_before_anything_starts() {
    for (topology, fault) in [
        ("sentinel", "restart"),
        ("sentinel", "cut"),
        ("cluster", "sentinel-failover"),
        ("single", "cluster-reshard"),
        ("etcd", "restart"),
        ("etcd", "rollback"),
        ("etcd", "stall"),
        ("etcd", "forged"),
        ("single", "etcd-compact"),
        ("cluster", "etcd-kill-member"),
        ("zk", "restart"),
        ("zk", "forged"),
        ("zk", "revoke-lease"),
        ("zk", "etcd-compact"),
        ("single", "zk-kill-member"),
        ("etcd", "zk-restart-all"),
        ("single", "restore-snapshot"),
        ("sqlite", "cut"),
        ("sqlite", "restart"),
        ("sqlite", "forged"),
        ("single", "sqlite-lock"),
        ("etcd", "sqlite-delete-file"),
        ("postgres", "restart"),
        ("postgres", "forged"),
        ("postgres", "revoke-lease"),
        ("single", "pg-lock"),
        ("sqlite", "pg-restart"),
        ("single", "pg-failover"),
    ] {
        let out = std::env::temp_dir().join(format!(
            "tenure-chaos-refused-{topology}-{fault}-{}",
            std::process::id()
        ));
        let output = Command::new(env!("CARGO_BIN_EXE_tenure-chaos"))
            .args(["run", "--topology", topology, "--faults", fault, "--out"])
            .arg(&out)
            .output()
            .expect("tenure-chaos runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{topology} {fault}: {stderr}"
        );
        assert!(stderr.contains("needs --topology"), "{stderr}");
        assert!(!out.exists(), "nothing was started for {topology} {fault}");
    }
}

#[test]
fn ttls_that_etcd_or_zookeeper_cannot_keep_are_refused_before_anything_starts() {
    for (args, expected) in [
        (&["--store", "etcd", "--ttl", "1500ms"][..], "whole seconds"),
        (&["--store", "etcd", "--ttl", "500ms"][..], "whole seconds"),
        // mixed-ttl runs every second instance at half the ttl.
        (
            &["--store", "etcd", "--ttl", "1s", "--faults", "mixed-ttl"][..],
            "half of 1s",
        ),
        (
            &["--store", "etcd", "--ttl", "3s", "--faults", "mixed-ttl"][..],
            "half of 3s",
        ),
        // Ten ticks of the ensemble's 100 ms: the margin outlasts a tick.
        (
            &["--store", "zk", "--ttl", "500ms"][..],
            "does not suit ZooKeeper",
        ),
        (
            &["--store", "zk", "--ttl", "1s", "--faults", "mixed-ttl"][..],
            "half of 1s",
        ),
    ] {
        let out = std::env::temp_dir().join(format!(
            "tenure-chaos-refused-ttl-{}-{}",
            args.join("-"),
            std::process::id()
        ));
        let output = Command::new(env!("CARGO_BIN_EXE_tenure-chaos"))
            .args(["run", "--out"])
            .arg(&out)
            .args(args)
            .output()
            .expect("tenure-chaos runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!out.exists(), "nothing was started for {args:?}");
    }
}
