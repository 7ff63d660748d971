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
        r"\d+(?: or more)? slots? \({instant}(?: to {instant})?\) passed with no leader"
    ))
    .expect("a pattern");
    let overran = regex::Regex::new(&format!(
        r"the run overran later slots, which are skipped .*first={instant} last={instant}"
    ))
    .expect("a pattern");
    let mut slots = BTreeSet::new();
    for found in missed
        .captures_iter(logs)
        .chain(overran.captures_iter(logs))
    {
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

/// The test above counts a slot as reported only if `reported` finds it:
/// both kinds of skip, as the instances log them.
#[test]
fn both_kinds_of_skipped_slot_are_read_from_the_logs() {
    let logs = "\
2026-12-04T00:56:31.998941Z  WARN 2 slots (2026-12-04T00:56:29+00:00 to 2026-12-04T00:56:30+00:00) passed with no leader to claim them and will not run: the latest was past the starting deadline, or a later one runs late election=report deadline=60s
2026-12-04T00:56:32.014149Z  WARN the run overran later slots, which are skipped election=report slot=2026-12-04T00:56:31Z skipped=1 first=2026-12-04T00:56:32Z last=2026-12-04T00:56:32Z
";
    let at = |s: &str| humantime::parse_rfc3339(s).expect("an instant");
    let expected: BTreeSet<SystemTime> = [
        "2026-12-04T00:56:29Z",
        "2026-12-04T00:56:30Z",
        "2026-12-04T00:56:32Z",
    ]
    .into_iter()
    .map(at)
    .collect();
    assert_eq!(reported(logs), expected);
}
