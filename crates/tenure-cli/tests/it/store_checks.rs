//! What `tenure run` says about a Redis that cannot keep leases safely.

use crate::support;
use crate::support::{tenure_output, RedisServer};

fn evicting_redis() -> RedisServer {
    RedisServer::builder()
        .arg("--maxmemory")
        .arg("100mb")
        .arg("--maxmemory-policy")
        .arg("allkeys-lru")
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"))
}

#[test]
fn a_redis_that_may_evict_leases_is_refused_with_exit_69_unless_allowed() {
    let server = evicting_redis();
    let url = server.url();
    let run_once = |extra: &[&str]| {
        let mut args = vec!["run", "--redis", &url, "--election", "evict", "--once"];
        args.extend(extra);
        args.extend(["--", "true"]);
        tenure_output(&args)
    };
    let refused = run_once(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("noeviction") && stderr.contains("allkeys-lru"),
        "{stderr}"
    );
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "one line of error: {stderr}"
    );

    let allowed = run_once(&["--allow-eviction"]);
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert_eq!(allowed.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_ttl_or_id_out_of_bounds_is_a_usage_error() {
    for (flag, value, expected) in [
        ("--ttl", "99999999h", "ttl must be between"),
        ("--ttl", "1ms", "ttl must be between"),
        ("--renew-every", "1ns", "renew interval must be at least"),
        ("--id", "two\nlines", "control characters"),
    ] {
        let out = tenure_output(&[
            "run",
            "--redis",
            "redis://127.0.0.1:1",
            "--election",
            "bounds",
            flag,
            value,
            "--",
            "true",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value:?}: {stderr}");
        assert!(stderr.contains(expected), "{flag} {value:?}: {stderr}");
    }
}

#[test]
fn once_against_a_read_only_replica_exits_69_and_names_the_primary() {
    let primary = support::redis();
    let replica = RedisServer::builder()
        .arg("--replicaof")
        .arg("127.0.0.1")
        .arg(primary.port().to_string())
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    let out = tenure_output(&[
        "run",
        "--redis",
        &replica.url(),
        "--election",
        "replica",
        "--once",
        "--",
        "true",
    ]);
    let stderr = support::one_line(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("is a read-only replica; point tenure at the primary"),
        "{stderr}"
    );
}
