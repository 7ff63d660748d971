//! `tenure run`, `status` and `demo` end to end on a private 3-member
//! ZooKeeper ensemble: `--store zk://…`.

use nix::sys::signal::Signal;

use crate::support::{eventually, status, tenure_output, tokens, Instance, Scratch, LONG_JOB};

fn ensemble() -> zk_process::ZkEnsemble {
    zk_process::ZkEnsemble::builder()
        .tick_time(std::time::Duration::from_millis(100))
        .start()
        .expect("a ZooKeeper ensemble")
}

#[test]
fn run_hands_over_on_sigterm_and_after_a_kill_and_status_follows() {
    let ensemble = ensemble();
    let url = ensemble.url();
    let scratch = Scratch::new("zk-run");
    let ttl = ["--ttl", "2s"];
    let mut a = Instance::start(&url, "nightly", "a", &ttl, LONG_JOB, &scratch);
    eventually("a leads", || !tokens(&scratch, "a").is_empty());
    let mut b = Instance::start(&url, "nightly", "b", &ttl, LONG_JOB, &scratch);
    eventually("status shows a", || {
        status(&url) == [("nightly".to_string(), Some("a".to_string()))]
    });
    // A graceful stop hands over to b at once.
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "{}", a.log());
    eventually("b leads", || !tokens(&scratch, "b").is_empty());
    assert!(tokens(&scratch, "b")[0] > tokens(&scratch, "a")[0]);
    eventually("status shows b", || {
        status(&url) == [("nightly".to_string(), Some("b".to_string()))]
    });
    // b's tenure is killed: its command goes with it, and c leads once b's
    // session expired.
    let c = Instance::start(&url, "nightly", "c", &ttl, LONG_JOB, &scratch);
    b.kill_group();
    b.wait();
    eventually("c leads", || !tokens(&scratch, "c").is_empty());
    assert!(tokens(&scratch, "c")[0] > tokens(&scratch, "b")[0]);
    drop(c);
}

#[test]
fn at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one() {
    let ensemble = ensemble();
    let url = ensemble.url();
    let run = |cmd: &str| {
        let out = tenure_output(&[
            "run",
            "--store",
            &url,
            "--election",
            "cron",
            "--ttl",
            "2s",
            "--once",
            "--at-most-every",
            "1h",
            "--",
            "sh",
            "-c",
            cmd,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stderr)
    };
    let (code, stderr) = run("exit 3");
    assert_eq!(code, Some(3), "a failure is not recorded: {stderr}");
    let (code, stderr) = run("exit 0");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("skipping"), "{stderr}");
    let (code, stderr) = run("exit 5");
    assert_eq!(code, Some(0), "skipped after the success: {stderr}");
    assert!(stderr.contains("skipping"), "{stderr}");
    // The marker is no election.
    assert_eq!(status(&url), Vec::<(String, Option<String>)>::new());
}

#[test]
fn the_demo_runs_on_zookeeper_and_leaves_nothing_behind() {
    let ensemble = ensemble();
    let url = ensemble.url();
    let out = tenure_output(&["demo", "--store", &url]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("leader election on ZooKeeper"), "{stdout}");
    assert!(stdout.contains("refuses a late write"), "{stdout}");
    let left = ensemble.cli(0, &["ls", "/tenure"]).expect("ls /tenure");
    assert!(!left.contains("demo-"), "the demo left {left}");
}

#[test]
fn a_ttl_the_ensemble_cannot_keep_is_refused_in_one_line() {
    let ensemble = ensemble();
    let out = tenure_output(&[
        "run",
        "--store",
        &ensemble.url(),
        "--election",
        "refused",
        "--ttl",
        "2m",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("maxSessionTimeout"), "{stderr}");
}
