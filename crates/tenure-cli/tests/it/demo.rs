//! `tenure demo --redis` on a Redis shared with real elections.

use crate::support;
use crate::support::{tenure_output, RedisServer};

fn keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server
        .command(&["KEYS", "*"])
        .expect("KEYS")
        .lines()
        .map(str::to_string)
        .filter(|key| !key.is_empty())
        .collect();
    keys.sort();
    keys
}

#[test]
fn the_demo_on_a_shared_redis_deletes_its_keys_and_no_others() {
    let server = support::redis();
    let url = server.url();
    // Another election lives here.
    let out = tenure_output(&[
        "run",
        "--redis",
        &url,
        "--election",
        "other",
        "--once",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let before = keys(&server);
    assert!(
        before.iter().any(|key| key.contains("{other}")),
        "{before:?}"
    );

    let out = tenure_output(&["demo", "--redis", &url, "--ttl", "300ms"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("is refused"), "{stdout}");
    let after = keys(&server);
    assert_eq!(after, before, "the demo left keys behind or took others'");
}
