//! What people expect of a Unix command: help with examples and exit codes,
//! shell completions, a man page, logs a shipper can parse.

use crate::support;
use std::io::Read;
use std::process::Stdio;

use crate::support::{tenure, tenure_output};

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

/// Stderr of `tenure run --once … -- true` on a terminal, with `no_color`
/// as NO_COLOR (unset when `None`).
fn logs_on_a_terminal(url: &str, no_color: Option<&str>) -> String {
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut command = tenure();
    command
        .args(["run", "--redis", url, "--election", "colour", "--once"])
        .args(["--", "true"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave));
    if let Some(value) = no_color {
        command.env("NO_COLOR", value);
    }
    let mut child = command.spawn().expect("tenure starts");
    // Our copy of the terminal's end goes with `command`, so that reading
    // ends (EIO) once tenure and its children have closed theirs.
    drop(command);
    let mut master = std::fs::File::from(pty.master);
    let mut output = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = master.read(&mut chunk) {
        output.extend_from_slice(&chunk[..n]);
    }
    let status = child.wait().expect("tenure exits");
    let output = String::from_utf8_lossy(&output).into_owned();
    assert_eq!(status.code(), Some(0), "{output}");
    output
}

#[test]
fn logs_on_a_terminal_are_coloured_unless_no_color_is_set() {
    let server = support::redis();
    let url = server.url();
    let coloured = logs_on_a_terminal(&url, None);
    assert!(coloured.contains("\u{1b}["), "no colour: {coloured:?}");
    let plain = logs_on_a_terminal(&url, Some("1"));
    assert!(plain.contains("started command as leader"), "{plain:?}");
    assert!(
        !plain.contains("\u{1b}["),
        "colour despite NO_COLOR: {plain:?}"
    );
}
