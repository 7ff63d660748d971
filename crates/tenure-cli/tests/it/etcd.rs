//! `tenure run`, `status` and `demo` end to end on a private 3-member etcd
//! cluster: `--store etcd://…`.

use crate::consensus;
use crate::support::tenure_output;

fn cluster() -> etcd_process::EtcdCluster {
    etcd_process::EtcdCluster::builder()
        .election_timeout(std::time::Duration::from_millis(500))
        .start()
        .expect("an etcd cluster")
}

#[test]
fn run_hands_over_on_sigterm_and_after_a_kill_and_status_follows() {
    let cluster = cluster();
    consensus::run_hands_over_on_sigterm_and_after_a_kill_and_status_follows(
        &cluster.url(),
        "etcd-run",
    );
}

#[test]
fn at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one() {
    let cluster = cluster();
    consensus::at_most_every_skips_a_job_that_succeeded_within_the_period_and_retries_a_failed_one(
        &cluster.url(),
    );
}

#[test]
fn the_demo_runs_on_etcd() {
    let cluster = cluster();
    let out = tenure_output(&["demo", "--store", &cluster.url()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("leader election on etcd"), "{stdout}");
    assert!(stdout.contains("refuses a late write"), "{stdout}");
}

#[test]
fn what_etcd_cannot_do_is_refused_in_one_line() {
    let cluster = cluster();
    let url = cluster.url();
    let out = tenure_output(&[
        "run",
        "--store",
        &url,
        "--election",
        "refused",
        "--ttl",
        "1500ms",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("whole number of seconds"), "{stderr}");
    // A client certificate goes with etcds:// only.
    for store in [url.as_str(), "redis://127.0.0.1:1"] {
        let out = tenure_output(&[
            "status",
            "--store",
            store,
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("client certificate"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

#[test]
fn five_instances_with_three_slots_run_three_commands() {
    let cluster = cluster();
    crate::slots::five_instances_with_three_slots_run_three_commands_on(
        &cluster.url(),
        "etcd-slots",
    );
}
