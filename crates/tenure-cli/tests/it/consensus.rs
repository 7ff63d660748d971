//! What `tenure run` and `status` promise on every store but Redis (whose
//! own tests are in `run.rs`), run on etcd (`etcd.rs`), ZooKeeper
//! (`zookeeper.rs`) and SQLite (`sqlite.rs`): each store's module starts
//! its own servers (or makes its file) and calls these with their URL.

use nix::sys::signal::Signal;

use crate::support::{eventually, status, tenure_output, tokens, Instance, Scratch, LONG_JOB};

/// Two `tenure run` hand over at once on SIGTERM, and a third leads after
/// the second is killed (once its lease ran out); `status` follows, and
/// every term's token is larger than the one before.
pub fn run_hands_over_on_sigterm_and_after_a_kill_and_status_follows(url: &str, name: &str) {
    let scratch = Scratch::new(name);
    let ttl = ["--ttl", "2s"];
    let mut a = Instance::start(url, "nightly", "a", &ttl, LONG_JOB, &scratch);
    eventually("a leads", || !tokens(&scratch, "a").is_empty());
    let mut b = Instance::start(url, "nightly", "b", &ttl, LONG_JOB, &scratch);
    eventually("status shows a", || {
        status(url) == [("nightly".to_string(), Some("a".to_string()))]
    });
    // A graceful stop hands over to b at once.
    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait(), 0, "{}", a.log());
    eventually("b leads", || !tokens(&scratch, "b").is_empty());
    assert!(tokens(&scratch, "b")[0] > tokens(&scratch, "a")[0]);
    eventually("status shows b", || {
        status(url) == [("nightly".to_string(), Some("b".to_string()))]
    });
    // b's tenure is killed: its command goes with it, and c leads once b's
    // lease (on ZooKeeper, its session) expired.
    let c = Instance::start(url, "nightly", "c", &ttl, LONG_JOB, &scratch);
    b.kill_group();
    b.wait();
    eventually("c leads", || !tokens(&scratch, "c").is_empty());
    assert!(tokens(&scratch, "c")[0] > tokens(&scratch, "b")[0]);
    drop(c);
}

/// `--at-most-every` skips a job that succeeded within the period and
/// retries a failed one; its marker is no election.
pub fn at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one(
    url: &str,
) {
    let run = |cmd: &str| {
        let out = tenure_output(&[
            "run",
            "--store",
            url,
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
    assert_eq!(status(url), Vec::<(String, Option<String>)>::new());
}
