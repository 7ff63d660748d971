//! End-to-end: `tenure run` puts CMD in a cgroup v2 of its own where one is
//! writable, and what that adds to the subreapers: processes that outlive
//! every process of ours are still found and killed.
//!
//! These tests need a writable cgroup v2 (root on a host with the unified
//! hierarchy, as on CI); elsewhere each says so on stderr and passes.

use std::path::{Path, PathBuf};

use crate::support::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tenure_procs::cgroup::Cgroup;

/// The directory `tenure run` processes started by this test get their
/// cgroups in, if there is a writable cgroup v2 here.
fn cgroup_parent() -> Option<PathBuf> {
    match Cgroup::create() {
        Ok((probe, _)) => {
            let _ = probe.remove();
            Cgroup::of_process(std::process::id() as i32).ok()
        }
        Err(reason) => {
            eprintln!("skipped: no writable cgroup v2 here ({reason})");
            None
        }
    }
}

fn cgroup_of(pid: i32) -> Option<PathBuf> {
    Cgroup::of_process(pid).ok()
}

/// The cgroup instance `run`'s CMD (`cmd`) runs in: `tenure-run-PID-RANDOM`
/// right below `parent`.
fn run_cgroup(parent: &Path, run: &Instance, cmd: i32) -> PathBuf {
    let dir = cgroup_of(cmd).expect("CMD's cgroup");
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string());
    assert_eq!(dir.parent(), Some(parent), "{}", dir.display());
    assert!(
        name.as_deref()
            .is_some_and(|n| n.starts_with(&format!("tenure-run-{}-", run.pid()))),
        "{}",
        dir.display()
    );
    dir
}

#[test]
fn the_command_and_everything_it_starts_run_in_a_cgroup_removed_at_exit() {
    let Some(parent) = cgroup_parent() else {
        return;
    };
    let server = redis();
    let scratch = Scratch::new("cgroup-in");
    let job = escaping_job();
    let mut a = Instance::start(
        &server.url(),
        "cgroup-in",
        "a",
        &["--cgroup", "require"],
        &job,
        &scratch,
    );
    let pids = wait_for_escapes(&scratch, "a");
    let _reap = Reap(pids.to_vec());
    let dir = run_cgroup(&parent, &a, pids[0]);
    for pid in pids {
        assert_eq!(cgroup_of(pid), Some(dir.clone()), "process {pid}");
    }
    let guardian = parent_of(pids[0]).expect("CMD has a parent");
    // It forks CMD from inside and moves out right after (a move takes
    // milliseconds, which CMD's start does not wait for).
    eventually("the guardian leaves the cgroup it kills", || {
        cgroup_of(guardian) == Some(parent.clone())
    });
    assert_eq!(cgroup_of(a.pid().as_raw()), Some(parent));

    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "clean shutdown; log:\n{}", a.log());
    let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        running.is_empty(),
        "{running:?} of {pids:?} outlived tenure"
    );
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

#[test]
fn processes_of_a_tenure_killed_with_its_guardian_are_killed_by_the_next_run() {
    let Some(parent) = cgroup_parent() else {
        return;
    };
    let server = redis();
    let scratch = Scratch::new("cgroup-leftover");
    let job = escaping_job();
    let ttl = ["--ttl", "1s"];
    let a = Instance::start(&server.url(), "cgroup-leftover", "a", &ttl, &job, &scratch);
    let pids = wait_for_escapes(&scratch, "a");
    let _reap = Reap(pids.to_vec());
    let dir = run_cgroup(&parent, &a, pids[0]);
    let guardian = parent_of(pids[0]).expect("CMD has a parent");
    // Both at once, as far as either can tell: tenure cannot act on the
    // guardian's death while it is stopped.
    a.signal(Signal::SIGSTOP);
    let _ = kill(Pid::from_raw(guardian), Signal::SIGKILL);
    eventually("CMD is re-parented to the stopped tenure", || {
        parent_of(pids[0]) == Some(a.pid().as_raw())
    });
    a.kill_group();
    eventually("tenure is gone", || !alive(a.pid().as_raw()));

    // Nothing of ours is left to act; the next run on this host is.
    let b = Instance::start(
        &server.url(),
        "cgroup-leftover",
        "b",
        &ttl,
        LONG_JOB,
        &scratch,
    );
    eventually("b's command starts", || child_pid(&scratch, "b").is_some());
    let running: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(
        running.is_empty(),
        "{running:?} of a's {pids:?} still ran when b's command started; b's log:\n{}",
        b.log()
    );
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

/// A cgroup made for the test that looks like a systemd unit's, removed on drop.
struct UnitCgroup(PathBuf);

impl Drop for UnitCgroup {
    fn drop(&mut self) {
        let _ = Cgroup::at(&self.0).remove();
    }
}

/// `tenure run --once --cgroup require ... -- sh -c SCRIPT` started in
/// the cgroup `unit`.
fn run_in(unit: &Path, server: &RedisServer, script: &str) -> std::process::Output {
    let tenure = env!("CARGO_BIN_EXE_tenure");
    let url = server.url();
    tenure_in_cgroup(unit, tenure, &url, script)
}

fn tenure_in_cgroup(unit: &Path, tenure: &str, url: &str, script: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$UNIT/cgroup.procs" && exec "$@""#)
        .arg("sh")
        .args([
            tenure,
            "run",
            "--redis",
            url,
            "--election",
            "unit",
            "--once",
            "--cgroup",
            "require",
            "--",
            "sh",
            "-c",
            script,
        ])
        .env("UNIT", unit)
        .env("TENURE_TTL", "1s")
        .env_remove("TENURE_REDIS_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("sh runs")
}

#[test]
fn a_systemd_units_cgroup_is_used_only_when_it_was_delegated() {
    let Some(parent) = cgroup_parent() else {
        return;
    };
    let server = redis();
    let unit = UnitCgroup(parent.join(format!("tenure-test-{}.service", std::process::id())));
    std::fs::create_dir(&unit.0).expect("a unit-like cgroup");
    let script = r#"grep '^0::' /proc/$$/cgroup"#;

    let refused = run_in(&unit.0, &server, script);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("Delegate=yes"), "{stderr}");
    assert!(refused.stdout.is_empty(), "CMD must not run");

    xattr::set(&unit.0, "trusted.delegate", b"1").expect("mark the cgroup delegated");
    let ran = run_in(&unit.0, &server, script);
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&ran.stdout);
    let name = unit.0.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        stdout.contains(&format!("{name}/tenure-run-")),
        "CMD ran in {stdout}"
    );
}

#[test]
fn a_graceful_stop_sends_sigterm_once() {
    if cgroup_parent().is_none() {
        return;
    }
    let server = redis();
    let scratch = Scratch::new("cgroup-term-once");
    // A CMD that counts the SIGTERMs it gets and keeps running, so that
    // every one sent during the kill grace arrives.
    let job = r#"trap 'echo term >> "$DIR/terms-$ME"' TERM
echo $$ > "$DIR/pid-$ME"
while :; do sleep 0.05; done"#;
    let mut a = Instance::start(
        &server.url(),
        "cgroup-term-once",
        "a",
        &["--cgroup", "require", "--kill-grace", "1s"],
        job,
        &scratch,
    );
    eventually("CMD runs", || child_pid(&scratch, "a").is_some());
    a.signal(Signal::SIGTERM);
    a.wait();
    let terms = scratch.read("terms-a").lines().count();
    assert_eq!(terms, 1, "SIGTERMs CMD got; log:\n{}", a.log());
}
