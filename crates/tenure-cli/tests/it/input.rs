//! Input from the command line and from `TENURE_*` variables: every mistake
//! gets one line that names what the user actually wrote.

use crate::support;
use std::process::Stdio;

use crate::support::{one_line, tenure, tenure_output, RedisServer};

fn run_once_with(server: &RedisServer, variables: &[(&str, &str)]) -> std::process::Output {
    let mut command = tenure();
    command
        .args([
            "run",
            "--redis",
            &server.url(),
            "--election",
            "env",
            "--",
            "true",
        ])
        .stdin(Stdio::null());
    for (name, value) in variables {
        command.env(name, value);
    }
    command.output().expect("tenure runs")
}

#[test]
fn an_invalid_variable_is_reported_by_its_name_not_its_flag() {
    let server = support::redis();
    for (name, value) in [
        ("TENURE_TTL", "bogus"),
        ("TENURE_ONCE", "maybe"),
        ("TENURE_LOG", "bogus[[["),
    ] {
        let out = run_once_with(&server, &[(name, value)]);
        let stderr = one_line(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}={value}: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains(value),
            "{name}={value}: {stderr}"
        );
        let flag = name.trim_start_matches("TENURE_").to_ascii_lowercase();
        assert!(!stderr.contains(&format!("--{flag}")), "{stderr}");
    }
    // The same value on the command line is reported under the flag.
    let out = tenure_output(&["run", "--election", "x", "--ttl", "bogus", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--ttl"), "{stderr}");
}

#[test]
fn boolean_variables_accept_1_0_true_false_yes_no() {
    let evicting = RedisServer::builder()
        .arg("--maxmemory")
        .arg("100mb")
        .arg("--maxmemory-policy")
        .arg("allkeys-lru")
        .start()
        .unwrap_or_else(|err| panic!("cannot start redis-server: {err}"));
    for (value, code) in [
        ("1", 0),
        ("true", 0),
        ("yes", 0),
        ("0", 69),
        ("false", 69),
        ("no", 69),
    ] {
        let out = run_once_with(
            &evicting,
            &[("TENURE_ONCE", value), ("TENURE_ALLOW_EVICTION", value)],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "={value}: {stderr}");
    }
}

#[test]
fn a_negative_duration_is_refused_as_negative() {
    for flag in ["--ttl", "--renew-every", "--kill-grace"] {
        let out = tenure_output(&["run", "--election", "x", flag, "-1s", "--", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.contains("must not be negative"), "{flag}: {stderr}");
        assert!(!stderr.contains("-- -1"), "{flag}: {stderr}");
    }
}

#[test]
fn a_log_filter_that_does_not_parse_is_an_error() {
    let out = tenure_output(&[
        "--log",
        "bogus[[[",
        "status",
        "--redis",
        "redis://127.0.0.1:1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a log filter"), "{stderr}");
}

#[test]
fn the_demo_ttl_is_bounded() {
    for ttl in ["1ms", "10h"] {
        let out = tenure_output(&["demo", "--ttl", ttl]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{ttl}: {stderr}");
        assert!(stderr.contains("between 100ms and 1m"), "{ttl}: {stderr}");
        assert!(out.stdout.is_empty(), "{ttl}: the demo started");
    }
}

#[test]
fn command_arguments_need_not_be_utf8() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let server = support::redis();
    let scratch = support::Scratch::new("non-utf8");
    let file = scratch.path("argument");
    let argument = OsString::from_vec(b"caf\xe9-\xff\xfe".to_vec());
    let out = tenure()
        .args([
            "run",
            "--redis",
            &server.url(),
            "--election",
            "bytes",
            "--once",
        ])
        .args(["--", "sh", "-c", r#"printf '%s' "$1" > "$2""#, "sh"])
        .arg(&argument)
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .expect("tenure runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let received = std::fs::read(&file).expect("CMD wrote its argument");
    assert_eq!(received, argument.into_vec(), "CMD got other bytes");
}
