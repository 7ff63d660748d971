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

/// Five instances, three slots: three commands run, each under its own
/// permit, while two instances wait; a SIGTERM hands a permit to a waiter,
/// and a kill -9 frees one only once the killed holder's command is gone.
#[test]
fn five_instances_with_three_slots_run_three_commands() {
    let server = redis();
    let scratch = Scratch::new("slots");
    let extra = ["--slots", "3", "--ttl", "2s"];
    let mut instances: Vec<Instance> = IDS
        .iter()
        .map(|id| Instance::start(&server.url(), "exports", id, &extra, SLOT_JOB, &scratch))
        .collect();
    eventually("three commands run", || running(&scratch).len() == 3);
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
