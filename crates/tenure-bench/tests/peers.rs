//! The peers section's smoke test: every peer driver (tenure's
//! `peer-child` and the Python drivers under `peers/`) holds, hands over,
//! is taken over after `kill -9` and is counted acting late after SIGSTOP,
//! one round each on a private redis-server. It runs the bench binary,
//! which tenure's candidate is a subcommand of; the peers themselves run
//! in the bench, not here.

use std::process::Command;

#[test]
fn every_peer_driver_hands_over_and_is_caught_acting_late() {
    let out = Command::new(env!("CARGO_BIN_EXE_tenure-bench"))
        .arg("peer-smoke")
        .output()
        .expect("tenure-bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "peer-smoke failed: {stderr}");
    for peer in ["Tenure", "RedisPy", "PythonRedisLock", "Pottery"] {
        assert!(
            stderr.contains(&format!("peer-smoke: {peer} ok")),
            "{peer}: {stderr}"
        );
    }
}
