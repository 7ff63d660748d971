//! A verdict needs all of its evidence: a run or a check that cannot read
//! or write any of it fails with one line (exit 2), never reports SAFE.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory for one test's evidence.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tenure-chaos-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Dir(dir)
    }

    /// `file` in the directory is a full disk.
    fn full(&self, file: &str) {
        std::os::unix::fs::symlink("/dev/full", self.0.join(file)).expect("symlink");
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chaos(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenure-chaos"))
        .args(args)
        .arg(dir)
        .output()
        .expect("tenure-chaos runs")
}

/// Exit 2 and one line on stderr that names `file`.
fn fails_naming(out: &Output, file: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(file), "{stderr}");
}

/// A log of one instance that started, and nothing else.
fn quiet_run(dir: &Dir) {
    std::fs::write(
        dir.0.join("inst-1.jsonl"),
        "{\"ev\":\"start\",\"inst\":\"inst-1\",\"t\":1}\n",
    )
    .expect("log");
}

#[test]
fn a_missing_resource_record_is_an_error_not_zero_stale_writes() {
    let dir = Dir::new("no-resource");
    quiet_run(&dir);
    fails_naming(&chaos(&["check"], &dir.0), "resource.txt");
}

#[test]
fn a_report_that_cannot_be_written_fails_the_check() {
    for file in ["report.md", "report.json", "timeline.svg"] {
        let dir = Dir::new(&format!("full-{file}"));
        quiet_run(&dir);
        std::fs::write(dir.0.join("resource.txt"), "").expect("resource");
        dir.full(file);
        fails_naming(&chaos(&["check"], &dir.0), file);
    }
}

#[test]
fn a_run_whose_evidence_cannot_be_written_is_not_judged() {
    let dir = Dir::new("full-run");
    dir.full("resource.txt");
    let out = chaos(
        &[
            "run",
            "--seed",
            "3",
            "--duration",
            "4s",
            "--ttl",
            "1s",
            "--instances",
            "2",
            "--faults",
            "pause",
            "--out",
        ],
        &dir.0,
    );
    fails_naming(&out, "resource.txt");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("SAFE"),
        "a verdict was printed"
    );
}
