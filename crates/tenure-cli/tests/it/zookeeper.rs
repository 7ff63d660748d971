//! `tenure run`, `status` and `demo` end to end on a private 3-member
//! ZooKeeper ensemble: `--store zk://…`.

use crate::consensus;
use crate::support::tenure_output;

fn ensemble() -> zk_process::ZkEnsemble {
    zk_process::ZkEnsemble::builder()
        .tick_time(std::time::Duration::from_millis(100))
        .start()
        .expect("a ZooKeeper ensemble")
}

#[test]
fn run_hands_over_on_sigterm_and_after_a_kill_and_status_follows() {
    let ensemble = ensemble();
    consensus::run_hands_over_on_sigterm_and_after_a_kill_and_status_follows(
        &ensemble.url(),
        "zk-run",
    );
}

#[test]
fn at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one() {
    let ensemble = ensemble();
    consensus::at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one(
        &ensemble.url(),
    );
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

#[test]
fn five_instances_with_three_slots_run_three_commands() {
    let ensemble = ensemble();
    crate::slots::five_instances_with_three_slots_run_three_commands_on(
        &ensemble.url(),
        "zk-slots",
    );
}
