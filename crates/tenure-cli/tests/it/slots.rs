//! `tenure run --slots N`: up to N instances run CMD at once, each under a
//! permit of its own, on a real redis-server.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::*;

/// CMD records its PID, and its permit's election and token.
const SLOT_JOB: &str = r#"echo $$ > "$DIR/pid-$ME"; echo "$TENURE_ELECTION $TENURE_TOKEN" >> "$DIR/terms-$ME"; exec sleep 1000"#;

const IDS: [&str; 5] = ["a", "b", "c", "d", "e"];

/// The instances whose command runs now.
fn running(scratch: &Scratch) -> Vec<&'static str> {
    IDS.iter()
        .copied()
        .filter(|id| child_pid(scratch, id).is_some_and(alive))
        .collect()
}

/// The (permit, token) of instance `id`'s latest term.
fn last_term(scratch: &Scratch, id: &str) -> (String, u64) {
    let terms = scratch.read(&format!("terms-{id}"));
    let line = terms.lines().last().unwrap_or_default().to_string();
    let (permit, token) = line.split_once(' ').unwrap_or_default();
    (permit.to_string(), token.trim().parse().unwrap_or(0))
}

#[test]
fn five_instances_with_three_slots_run_three_commands() {
    let server = redis();
    five_instances_with_three_slots_run_three_commands_on(&server.url(), "slots");
}

/// Five instances, three slots, on the store at `url`: three commands run,
/// each under its own permit, while two instances wait; a SIGTERM hands a
/// permit to a waiter, and a kill -9 frees one only once the killed
/// holder's command is gone. (Every store's module runs it.)
pub fn five_instances_with_three_slots_run_three_commands_on(url: &str, scratch: &str) {
    let scratch = Scratch::new(scratch);
    let extra = ["--slots", "3", "--ttl", "2s"];
    let mut instances: Vec<Instance> = IDS
        .iter()
        .map(|id| Instance::start(url, "exports", id, &extra, SLOT_JOB, &scratch))
        .collect();
    eventually_or_show(
        "three commands run",
        || running(&scratch).len() == 3,
        || {
            let logs: Vec<String> = IDS
                .iter()
                .zip(&instances)
                .map(|(id, instance)| format!("--- {id}:\n{}", instance.log()))
                .collect();
            logs.join("\n")
        },
    );
    // Past a ttl, still three: the two others wait.
    std::thread::sleep(Duration::from_secs(3));
    let holders = running(&scratch);
    assert_eq!(holders.len(), 3, "{holders:?}");
    let started: Vec<&str> = IDS
        .iter()
        .copied()
        .filter(|id| child_pid(&scratch, id).is_some())
        .collect();
    assert_eq!(started, holders, "no other command ever started");
    let permits: BTreeSet<String> = holders.iter().map(|id| last_term(&scratch, id).0).collect();
    assert_eq!(
        permits,
        BTreeSet::from(
            ["exports/permit-0", "exports/permit-1", "exports/permit-2"].map(String::from)
        ),
        "one permit each, named in TENURE_ELECTION"
    );

    // SIGTERM: a waiter takes that permit, with a larger token.
    let stopped = holders[0];
    let (permit, token) = last_term(&scratch, stopped);
    let index = IDS.iter().position(|id| *id == stopped).expect("ours");
    instances[index].signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(instances[index].wait(), 0, "{}", instances[index].log());
    let mut next = None;
    eventually("a waiter's command starts", || {
        next = IDS
            .iter()
            .copied()
            .find(|id| !holders.contains(id) && child_pid(&scratch, id).is_some());
        next.is_some()
    });
    let next = next.expect("a waiter");
    let (next_permit, next_token) = last_term(&scratch, next);
    assert_eq!(next_permit, permit, "the released permit");
    assert!(next_token > token, "{next_token} after {token}");
    assert_eq!(running(&scratch).len(), 3);

    // kill -9 of a holder's tenure: its command dies at the deadline, and
    // only then does the last waiter's start.
    let victim = holders[1];
    let victim_pid = child_pid(&scratch, victim).expect("running");
    let (victim_permit, victim_token) = last_term(&scratch, victim);
    let last = IDS
        .iter()
        .copied()
        .find(|id| !holders.contains(id) && *id != next)
        .expect("the last waiter");
    let index = IDS.iter().position(|id| *id == victim).expect("ours");
    instances[index].kill_group();
    eventually("the last waiter's command starts", || {
        child_pid(&scratch, last).is_some()
    });
    assert!(!alive(victim_pid), "never four commands at once");
    let (last_permit, last_token) = last_term(&scratch, last);
    assert_eq!(last_permit, victim_permit);
    assert!(last_token > victim_token);
    assert_eq!(running(&scratch).len(), 3);
}

/// `--no-wait` with every slot held exits 75 and says so in one line;
/// `--slots` and `--at-most-every` do not go together.
#[test]
fn no_wait_with_every_slot_held_exits_75() {
    let server = redis();
    let scratch = Scratch::new("slots-no-wait");
    let extra = ["--slots", "1", "--ttl", "2s"];
    let _holder = Instance::start(&server.url(), "report", "a", &extra, SLOT_JOB, &scratch);
    eventually("a's command runs", || running(&scratch) == ["a"]);
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "report",
        "--slots",
        "1",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tenure: 1 of 1 permits are held in \"report\"; not waiting (--no-wait)"),
        "{stderr}"
    );
    let out = tenure_output(&[
        "run",
        "--redis",
        &server.url(),
        "--election",
        "report",
        "--slots",
        "2",
        "--once",
        "--at-most-every",
        "1h",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: the argument '--slots <SLOTS>' cannot be used with '--at-most-every"
        ),
        "{stderr}"
    );
}

/// `status --slots N` shows every permit of a semaphore, held or free, and
/// how many are held; `watch --slots N` follows each permit's holder,
/// through a hand-over to a waiter.
#[test]
fn status_and_watch_show_every_permit() {
    use std::io::BufRead;
    let server = redis();
    let scratch = Scratch::new("slots-observe");
    // Each watched change, parsed, as the watch prints it.
    let mut watch = tenure()
        .args(["watch", "exports", "--slots", "2", "--json", "--store"])
        .arg(server.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tenure starts");
    let out = std::io::BufReader::new(watch.stdout.take().expect("piped"));
    let (lines, changes) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let parsed: serde_json::Value = serde_json::from_str(&line).expect("JSON");
            if lines.send(parsed).is_err() {
                return;
            }
        }
    });
    // The next change of `permit` (skipping others) whose leader is `who`.
    let until = |permit: &str, who: Option<&str>| loop {
        let change = changes
            .recv_timeout(Duration::from_secs(60))
            .expect("a change within a minute");
        assert_eq!(change["semaphore"], "exports", "{change}");
        if change["election"] == permit && change["leader"].as_str() == who {
            return change;
        }
    };
    until("exports/permit-0", None);
    until("exports/permit-1", None);

    let extra = ["--slots", "2", "--ttl", "2s"];
    let mut instances: Vec<Instance> = IDS[..3]
        .iter()
        .map(|id| Instance::start(&server.url(), "exports", id, &extra, SLOT_JOB, &scratch))
        .collect();
    eventually("two commands run", || running(&scratch).len() == 2);
    let holders = running(&scratch);
    let (permit, token) = last_term(&scratch, holders[0]);
    let change = until(&permit, Some(holders[0]));
    assert_eq!(change["token"], token);

    // Three permits asked of a semaphore of two: the third is free.
    let out = tenure_output(&[
        "status",
        "exports",
        "--slots",
        "3",
        "--json",
        "--store",
        &server.url(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let shown: Vec<(&str, Option<&str>)> = status["elections"]
        .as_array()
        .expect("elections")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or(""), e["leader"]["id"].as_str()))
        .collect();
    let mut expected = Vec::new();
    for index in 0..3 {
        let name = format!("exports/permit-{index}");
        let holder = holders
            .iter()
            .copied()
            .find(|id| last_term(&scratch, id).0 == name);
        expected.push((name, holder));
    }
    let expected: Vec<(&str, Option<&str>)> =
        expected.iter().map(|(n, h)| (n.as_str(), *h)).collect();
    assert_eq!(shown, expected);
    assert_eq!(
        status["semaphores"],
        serde_json::json!([{ "name": "exports", "permits": 3, "held": 2, "unreadable": 0 }])
    );
    // A name given twice is shown once.
    let out = tenure_output(&[
        "status",
        "exports",
        "exports",
        "--slots",
        "2",
        "--json",
        "--store",
        &server.url(),
    ]);
    let twice: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        twice["elections"].as_array().map(Vec::len),
        Some(2),
        "{twice}"
    );
    assert_eq!(
        twice["semaphores"],
        serde_json::json!([{ "name": "exports", "permits": 2, "held": 2, "unreadable": 0 }])
    );
    let out = tenure_output(&[
        "status",
        "exports",
        "--slots",
        "2",
        "--store",
        &server.url(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("ELECTION "), "{text}");
    assert!(text.ends_with("\nexports: 2 of 2 permits held\n"), "{text}");

    // A hand-over: the waiter takes the released permit, and the watch says so.
    let waiter = IDS[..3]
        .iter()
        .copied()
        .find(|id| !holders.contains(id))
        .expect("a waiter");
    let index = IDS.iter().position(|id| *id == holders[0]).expect("ours");
    instances[index].signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(instances[index].wait(), 0, "{}", instances[index].log());
    let change = until(&permit, Some(waiter));
    assert!(change["token"].as_u64() > Some(token), "{change}");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    assert_eq!(watch.wait().ok().and_then(|s| s.code()), Some(0));
}
