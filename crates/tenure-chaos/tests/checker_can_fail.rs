//! The checker must be able to fail: with the safety mechanisms switched
//! off, a real run under pauses must be reported unsafe.

use std::path::PathBuf;
use std::process::Command;

fn run(name: &str, extra: &[&str]) -> (i32, serde_json::Value) {
    let out: PathBuf =
        std::env::temp_dir().join(format!("tenure-chaos-{name}-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_tenure-chaos"))
        .args([
            "run",
            "--seed",
            "11",
            "--duration",
            "15s",
            "--instances",
            "3",
            "--faults",
            "pause",
            "--out",
        ])
        .arg(&out)
        .args(extra)
        .status()
        .expect("tenure-chaos runs");
    let report = std::fs::read_to_string(out.join("report.json")).expect("a report is written");
    let _ = std::fs::remove_dir_all(&out);
    (
        status.code().unwrap_or(-1),
        serde_json::from_str(&report).expect("the report is JSON"),
    )
}

#[test]
fn ignoring_the_local_deadline_is_reported_as_overlapping_leaders() {
    let (code, report) = run("no-deadline", &["--unsafe-no-deadline"]);
    assert_eq!(code, 1, "the run is judged unsafe: {report}");
    assert!(report["overlaps"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["safe"], false);
}

#[test]
fn ignoring_fencing_lets_stale_writes_in_and_the_checker_sees_them() {
    let (code, report) = run(
        "no-fencing",
        &["--unsafe-no-deadline", "--unsafe-no-fencing"],
    );
    assert_eq!(code, 1, "the run is judged unsafe: {report}");
    assert!(
        report["stale_writes_accepted"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert_eq!(
        report["writes_rejected"], 0,
        "nothing is rejected without fencing"
    );
}
