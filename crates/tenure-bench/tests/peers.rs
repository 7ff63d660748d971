//! The peers section's smoke test: every peer driver (the bench's
//! `peer-child` for tenure, rslock and etcd-client's election, the Python
//! drivers under `peers/`, kazoo's among them) holds, hands over, is taken
//! over after `kill -9`, is counted acting late after SIGSTOP and sends its
//! idle requests, one round each on a private redis-server, etcd cluster
//! and ZooKeeper ensemble. It runs the bench binary, which the built-in
//! candidates are a subcommand of; the peers themselves run in the bench,
//! not here.

use std::process::Command;

#[test]
fn every_peer_driver_hands_over_and_is_caught_acting_late() {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure-bench"))
        .arg("peer-smoke")
        .output()
        .expect("tenure-bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "peer-smoke failed: {stderr}");
    for peer in [
        "Tenure on Redis",
        "RedisPy on Redis",
        "PythonRedisLock on Redis",
        "Pottery on Redis",
        "Rslock on Redis",
        "TenureEtcd on etcd",
        "EtcdElection on etcd",
        "TenureZk on ZooKeeper",
        "Kazoo on ZooKeeper",
    ] {
        assert!(
            stderr.contains(&format!("peer-smoke: {peer} ok")),
            "{peer}: {stderr}"
        );
    }
}
