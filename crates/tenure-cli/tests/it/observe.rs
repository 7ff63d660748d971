//! `tenure status` and `tenure watch` as building blocks of scripts: a stray
//! key does not hide the rest, and a closed pipe ends `watch` at once.

use crate::support;
use std::io::BufRead;
use std::process::Stdio;
use std::time::Instant;

use crate::support::{eventually, tenure, tenure_output, Instance, Scratch, HANG, LONG_JOB};

#[test]
fn status_lists_every_readable_election_and_reports_stray_entries() {
    let server = support::redis();
    let url = server.url();
    let scratch = Scratch::new("status-stray");
    let _leader = Instance::start(&url, "good", "a", &[], LONG_JOB, &scratch);
    eventually("a leads", || !scratch.read("tokens-a").is_empty());
    // A key no tenure would write (a name with white space), and a lease
    // of a foreign type.
    server
        .command(&["HSET", "tenure:{bad name}:lease", "owner", "x"])
        .expect("HSET");
    server
        .command(&["SET", "tenure:{foreign}:lease", "not a hash"])
        .expect("SET");

    let out = tenure_output(&["status", "--redis", &url]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stdout}\n{stderr}");
    let row = |name: &str| {
        stdout
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{stdout}"))
            .to_string()
    };
    assert!(row("good").contains(" a "), "{stdout}");
    assert!(row("bad name").contains("(unreadable)"), "{stdout}");
    assert!(row("foreign").contains("(unreadable)"), "{stdout}");
    assert_eq!(stderr.lines().count(), 2, "{stderr}");
    assert!(stderr.contains("\"bad name\" is unreadable"), "{stderr}");
    assert!(stderr.contains("\"foreign\" is unreadable"), "{stderr}");

    let out = tenure_output(&["status", "--json", "--redis", &url]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let elections = status["elections"].as_array().expect("an array");
    assert_eq!(elections.len(), 3, "{status}");
    for election in elections {
        if election["name"] == "good" {
            assert_eq!(election["leader"]["id"], "a", "{status}");
            assert!(election.get("error").is_none(), "{status}");
        } else {
            assert!(election["leader"].is_null(), "{status}");
            assert!(election["error"].is_string(), "{status}");
        }
    }
}

#[test]
fn watch_exits_as_soon_as_its_reader_goes() {
    let server = support::redis();
    let mut watch = tenure()
        .args(["watch", "quiet", "--redis", &server.url()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tenure watch starts");
    let mut reader = std::io::BufReader::new(watch.stdout.take().expect("stdout"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("the first line");
    assert!(line.contains("no leader"), "{line}");
    // What `| head -1` does next. Nothing changes in the election from
    // here on, so only the closed pipe can end `watch`.
    drop(reader);
    let deadline = Instant::now() + HANG;
    let status = loop {
        if let Some(status) = watch.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = watch.kill();
            let _ = watch.wait();
            panic!("watch kept running after its reader went away");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
}
