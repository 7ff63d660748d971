//! tenure's secrets stay with tenure: CMD never sees the store's URL.

mod support;

use std::process::Stdio;

use support::{tenure, RedisServer, Scratch};

#[test]
fn the_command_sees_its_term_but_not_tenures_configuration() {
    let password = "Sekrit123";
    let server = RedisServer::builder()
        .password(password)
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    let scratch = Scratch::new("secrets");
    let env_file = scratch.path("env");
    let out = tenure()
        .args(["run", "--once", "--election", "secrets", "--", "sh", "-c"])
        .arg(format!("env > {}", env_file.display()))
        .env(
            "TENURE_REDIS_URL",
            format!("redis://:{password}@127.0.0.1:{}", server.port()),
        )
        .env("TENURE_PREFIX", "tenure")
        .env("APP_SETTING", "kept")
        .stdin(Stdio::null())
        .output()
        .expect("tenure runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let env = std::fs::read_to_string(&env_file).expect("CMD wrote its environment");
    for (name, seen) in [
        ("stdout", &*stdout),
        ("stderr", &*stderr),
        ("CMD's environment", &*env),
    ] {
        assert!(
            !seen.contains(password),
            "the password is in {name}: {seen}"
        );
    }
    for passed in [
        "TENURE_ELECTION=secrets",
        "TENURE_ID=",
        "TENURE_TOKEN=",
        "APP_SETTING=kept",
    ] {
        assert!(env.contains(passed), "CMD lacks {passed}: {env}");
    }
    for kept in [
        "TENURE_REDIS_URL",
        "TENURE_PREFIX",
        "TENURE_TTL",
        "TENURE_LOG",
    ] {
        assert!(!env.contains(kept), "CMD sees {kept}: {env}");
    }
}
