//! `tenure run --cron`: three instances on a per-second schedule, across a
//! leader killed with SIGKILL and another stopped with SIGSTOP, on a real
//! redis-server: every slot runs once, or is reported as missed with its
//! reason, and none runs twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use crate::support::*;

/// CMD appends its slot and instance.
const CRON_JOB: &str = r#"echo "$TENURE_SLOT $ME $TENURE_TOKEN" >> "$DIR/runs""#;

const IDS: [&str; 3] = ["a", "b", "c"];

/// Each run: (slot, instance), in the order they started.
fn runs(scratch: &Scratch) -> Vec<(SystemTime, String)> {
    scratch
        .read("runs")
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let slot = humantime::parse_rfc3339(words.next()?).ok()?;
            Some((slot, words.next()?.to_string()))
        })
        .collect()
}

/// The instance that ran the latest slot.
fn last_runner(scratch: &Scratch) -> Option<String> {
    runs(scratch).last().map(|(_, by)| by.clone())
}

/// The slots the logs report as skipped: missed (no leader claimed them)
/// or overrun, each with its reason in the line.
fn reported(logs: &str) -> BTreeSet<SystemTime> {
    let instant = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\+00:00|Z)";
    let missed = regex::Regex::new(&format!(
        r"\d+ slots? \({instant}(?: to {instant})?\) passed with no leader"
    ))
    .expect("a pattern");
    let mut slots = BTreeSet::new();
    for found in missed.captures_iter(logs) {
        let at = |i: usize| {
            found
                .get(i)
                .and_then(|m| humantime::parse_rfc3339(&format!("{}Z", m.as_str())).ok())
        };
        let Some(first) = at(1) else { continue };
        let last = at(2).unwrap_or(first);
        let mut slot = first;
        while slot <= last {
            slots.insert(slot);
            slot += Duration::from_secs(1);
        }
    }
    slots
}

#[test]
fn three_instances_run_each_slot_once_across_a_kill_and_a_stop() {
    let server = redis();
    let scratch = Scratch::new("cron");
    let extra = ["--cron", "* * * * * *", "--ttl", "2s"];
    let instances: Vec<Instance> = IDS
        .iter()
        .map(|id| Instance::start(&server.url(), "report", id, &extra, CRON_JOB, &scratch))
        .collect();
    let index = |id: &str| IDS.iter().position(|i| *i == id).expect("ours");
    eventually("three slots run", || runs(&scratch).len() >= 3);
    // kill -9 the leader: another instance takes the schedule over.
    let killed = last_runner(&scratch).expect("a leader");
    instances[index(&killed)].kill_group();
    eventually("another instance runs a slot", || {
        last_runner(&scratch).is_some_and(|by| by != killed)
    });
    // SIGSTOP the new leader: the third takes over once its lease lapses.
    let stopped = last_runner(&scratch).expect("a leader");
    instances[index(&stopped)].signal(Signal::SIGSTOP);
    eventually("the third instance runs a slot", || {
        last_runner(&scratch).is_some_and(|by| by != killed && by != stopped)
    });
    // Resumed past its deadline, the stopped one runs no slot twice.
    instances[index(&stopped)].signal(Signal::SIGCONT);
    let count = runs(&scratch).len();
    eventually("three more slots run", || runs(&scratch).len() >= count + 3);
    for instance in &instances {
        instance.signal(Signal::SIGTERM);
    }
    let mut instances = instances;
    let logs: String = instances
        .iter_mut()
        .map(|instance| {
            instance.wait();
            instance.log()
        })
        .collect();

    let runs = runs(&scratch);
    let mut by_slot: BTreeMap<SystemTime, Vec<String>> = BTreeMap::new();
    for (slot, by) in &runs {
        by_slot.entry(*slot).or_default().push(by.clone());
    }
    let twice: Vec<_> = by_slot.iter().filter(|(_, by)| by.len() > 1).collect();
    assert!(twice.is_empty(), "slots run twice: {twice:?}");
    let ids: BTreeSet<&str> = runs.iter().map(|(_, by)| by.as_str()).collect();
    assert_eq!(ids.len(), 3, "every instance led: {runs:?}");
    // Every slot from the first run to the last ran, or was reported as
    // skipped with its reason.
    let skipped = reported(&logs);
    let (first, last) = (runs[0].0, runs[runs.len() - 1].0);
    let mut slot = first;
    while slot <= last {
        assert!(
            by_slot.contains_key(&slot) || skipped.contains(&slot),
            "slot {} neither ran nor was reported: runs {runs:?}, reported {skipped:?}\n{logs}",
            humantime::format_rfc3339_seconds(slot)
        );
        slot += Duration::from_secs(1);
    }
    assert!(!skipped.is_empty(), "the failovers skipped some slots");
}
