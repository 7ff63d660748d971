//! The checker must be able to fail on a Sentinel group and on a cluster
//! too: with instances that ignore their local deadline, a run under pauses
//! of the leader is reported unsafe whatever the store's topology. And the
//! harness refuses fault kinds its topology cannot inject.

use std::path::PathBuf;
use std::process::Command;

/// Run `tenure-chaos run` with `args` into a fresh directory; the exit
/// code and the report.
fn run(name: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let out: PathBuf = std::env::temp_dir().join(format!(
        "tenure-chaos-topology-{name}-{}",
        std::process::id()
    ));
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
/// 2.5 ttls again and again for 15 s: on resuming it writes before its
/// heartbeat learns that another instance leads.
fn no_deadline_is_unsafe(topology: &str) {
    let (code, report) = run(
        topology,
        &[
            "--topology",
            topology,
            "--seed",
            "11",
            "--duration",
            "15s",
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
    assert_eq!(report["crashes"].as_array().map(Vec::len), Some(0));
    assert_eq!(report["leaked"].as_array().map(Vec::len), Some(0));
}

#[test]
fn ignoring_the_local_deadline_on_a_sentinel_group_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("sentinel");
}

#[test]
fn ignoring_the_local_deadline_on_a_cluster_is_reported_as_overlapping_leaders() {
    no_deadline_is_unsafe("cluster");
}

#[test]
fn faults_of_another_topology_are_refused_before_anything_starts() {
    for (topology, fault) in [
        ("sentinel", "restart"),
        ("sentinel", "cut"),
        ("cluster", "sentinel-failover"),
        ("single", "cluster-reshard"),
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
