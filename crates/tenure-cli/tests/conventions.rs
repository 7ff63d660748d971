//! What people expect of a Unix command: help with examples and exit codes,
//! shell completions, a man page, logs a shipper can parse.

mod support;

use support::tenure_output;

#[test]
fn help_explains_tenure_with_examples_and_exit_codes() {
    let out = tenure_output(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{help}");
    assert!(
        help.starts_with("Leader election on Redis: run a command on exactly one host at a time"),
        "{help}"
    );
    for expected in [
        "Examples:",
        "tenure run --election",
        "Exit status:",
        "69",
        "75",
    ] {
        assert!(help.contains(expected), "help lacks {expected:?}:\n{help}");
    }
    assert!(!help.contains("observe elections, serve metrics"), "{help}");
}

#[test]
fn completions_and_the_man_page_are_printed() {
    for (shell, expected) in [
        ("bash", "complete -F _tenure"),
        ("zsh", "#compdef tenure"),
        ("fish", "complete -c tenure"),
    ] {
        let out = tenure_output(&["completions", shell]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(script.contains(expected), "{shell}:\n{script}");
        assert!(script.contains("password-file"), "{shell}:\n{script}");
    }
    let out = tenure_output(&["man"]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(page.contains(".TH tenure 1"), "{page}");
    assert!(page.contains("Leader election on Redis"), "{page}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let server = support::redis();
    let out = tenure_output(&[
        "run",
        "--log-format",
        "json",
        "--redis",
        &server.url(),
        "--election",
        "json-logs",
        "--once",
        "--",
        "true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty(), "no logs at info level");
    for line in lines {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"));
        assert!(entry["level"].is_string(), "{line}");
        assert!(entry["fields"]["message"].is_string(), "{line}");
    }
}
