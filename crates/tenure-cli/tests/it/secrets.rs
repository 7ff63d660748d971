//! tenure's secrets stay with tenure: CMD never sees the store's URL or
//! password, and no output shows the password, whether it came in the URL
//! or from `--password-file`.

use crate::support;
use std::process::Stdio;

use crate::support::{one_line, tenure, RedisServer, Scratch};

/// A password file holding `password` and a trailing newline.
fn password_file(scratch: &Scratch, password: &str) -> String {
    let file = scratch.path("password");
    std::fs::write(&file, format!("{password}\n")).expect("write the password file");
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("a secret's mode");
    file.to_string_lossy().into_owned()
}

/// Stdout and stderr of `out`, checked not to contain `password`.
fn assert_hidden(password: &str, what: &str, out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(password) && !stderr.contains(password),
        "{what} showed the password:\n{stdout}\n{stderr}"
    );
}

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
    let scratch = Scratch::new("secrets-failures");
    let file = password_file(&scratch, password);
    // The same failures with the password from a file.
    // (URL, exit code): the file was read and the password used, so each
    // fails at Redis (69), or as a conflict with the URL's own password (2).
    let with_file = [
        ("redis://127.0.0.1:1".to_string(), 69),
        ("redis://u@no-such-host.invalid:6379".to_string(), 69),
        ("redis+unix:///nonexistent/redis.sock".to_string(), 69),
        (format!("rediss://127.0.0.1:{}", server.port()), 69),
        (format!("redis://127.0.0.1:{}", server.port()), 69),
        (format!("redis://:other@127.0.0.1:{}", server.port()), 2),
    ];
    for (url, code) in &with_file {
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
        for mut args in runs {
            // Before any `--`, after which everything is CMD's.
            args.splice(1..1, ["--password-file", file.as_str()]);
            let out = tenure()
                .args(&args)
                .env("TENURE_LOG", "debug")
                .stdin(Stdio::null())
                .output()
                .expect("tenure runs");
            assert_eq!(out.status.code(), Some(*code), "{args:?}: {out:?}");
            assert_hidden(password, &format!("{args:?}"), &out);
        }
    }
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

#[test]
fn a_password_file_authenticates_without_the_password_showing_anywhere() {
    let password = "File-Sekrit-42";
    let scratch = Scratch::new("password-file");
    let socket = scratch.path("redis.sock");
    let server = RedisServer::builder()
        .password(password)
        .arg("--unixsocket")
        .arg(socket.to_string_lossy())
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    let file = password_file(&scratch, password);
    let env_file = scratch.path("env");
    let url = format!("redis://127.0.0.1:{}", server.port());
    let out = tenure()
        .args(["run", "--once", "--election", "secrets", "--redis", &url])
        .args(["--", "sh", "-c"])
        .arg(format!("env > {}", env_file.display()))
        .env("TENURE_PASSWORD_FILE", &file)
        .env("TENURE_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .expect("tenure runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_hidden(password, "run", &out);
    let env = std::fs::read_to_string(&env_file).expect("CMD wrote its environment");
    assert!(!env.contains(password), "CMD's environment: {env}");
    assert!(
        !env.contains("TENURE_PASSWORD_FILE"),
        "CMD's environment: {env}"
    );

    let unix = format!("redis+unix://{}", socket.display());
    for url in [&url, &unix] {
        let out = support::tenure_output(&["status", "--redis", url, "--password-file", &file]);
        assert_eq!(out.status.code(), Some(0), "{url}: {out:?}");
        assert_hidden(password, "status", &out);
    }
}

#[test]
fn a_password_file_that_cannot_be_used_is_one_clear_line() {
    let scratch = Scratch::new("password-file-errors");
    let missing = scratch.path("missing").to_string_lossy().into_owned();
    let empty = scratch.path("empty").to_string_lossy().into_owned();
    std::fs::write(&empty, "\n").expect("write");
    let good = password_file(&scratch, "pw-from-file");
    let cases = [
        (
            "redis://127.0.0.1:1",
            &missing,
            "cannot read the password file",
        ),
        ("redis://127.0.0.1:1", &empty, "is empty"),
        (
            "redis://:in-url@127.0.0.1:1",
            &good,
            "has a password already",
        ),
        (
            "redis+unix:///s.sock?pass=in-url",
            &good,
            "has a password (pass=) already",
        ),
    ];
    for (url, file, expected) in cases {
        for command in ["run", "status", "watch"] {
            let mut args = vec![command];
            match command {
                "run" => args.extend(["--election", "e"]),
                "watch" => args.push("e"),
                _ => {}
            }
            args.extend(["--redis", url, "--password-file", file]);
            if command == "run" {
                args.extend(["--", "true"]);
            }
            let out = support::tenure_output(&args);
            let stderr = one_line(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains(expected), "{args:?}: {stderr}");
            assert!(!stderr.contains("in-url"), "{args:?}: {stderr}");
            assert!(!stderr.contains("pw-from-file"), "{args:?}: {stderr}");
        }
    }
}
