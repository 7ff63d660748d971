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

#[test]
fn no_failure_shows_the_password_of_a_url() {
    let password = "Sekrit123";
    let server = RedisServer::builder()
        .password("another-one")
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    let wrong = format!("redis://default:{password}@127.0.0.1:{}", server.port());
    let urls = [
        format!("redis://u:{password}@127.0.0.1:99999"),
        format!("redis://u:{password}@[::1:7301"),
        format!("redis://u:{password}@127.0.0.1:1"),
        format!("redis://u:{password}@no-such-host.invalid:6379"),
        format!("redis+unix:///nonexistent/redis.sock?pass={password}"),
        format!("rediss://u:{password}@127.0.0.1:{}", server.port()),
        wrong,
    ];
    for url in &urls {
        let runs: [Vec<&str>; 4] = [
            vec![
                "run",
                "--redis",
                url,
                "--election",
                "e",
                "--once",
                "--",
                "true",
            ],
            vec!["status", "--redis", url],
            vec!["watch", "e", "--redis", url],
            vec!["demo", "--redis", url],
        ];
        for args in runs {
            let out = tenure()
                .args(&args)
                .env("TENURE_LOG", "debug")
                .stdin(Stdio::null())
                .output()
                .expect("tenure runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_ne!(out.status.code(), Some(0), "{args:?} succeeded");
            assert!(
                !stdout.contains(password) && !stderr.contains(password),
                "{args:?} showed the password:\n{stdout}\n{stderr}"
            );
        }
    }
}
