//! Calendar schedules (`Runner::cron`) on the in-memory store in paused
//! time: slots on the clock, failovers mid-run, missed slots, overruns,
//! failed runs and daylight saving time. The wall clock is tokio's
//! (`Schedule::on_tokio_clock`), so every instant is exact.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tenure::{Election, Fault, MemoryStore, Schedule};
use tokio::sync::mpsc;

const TTL: Duration = Duration::from_secs(3);

/// 2026-12-03T02:00:00Z.
fn two_am() -> SystemTime {
    at(1_796_263_200)
}

fn at(unix_seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(unix_seconds)
}

/// Fail instead of hanging: paused time makes a missing event spin forever.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(3 * 24 * 3600), fut)
        .await
        .expect("finished within three days of virtual time")
}

async fn member(store: &MemoryStore, id: &str) -> Election {
    Election::builder("report")
        .memory(store)
        .ttl(TTL)
        .id(id)
        .build()
        .await
        .expect("valid settings")
}

/// One slot's run as the work saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    by: &'static str,
    slot: SystemTime,
    started: SystemTime,
}

/// The runs of every runner of a test, in order.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

impl Runs {
    fn all(&self) -> Vec<Run> {
        self.0.lock().expect("not poisoned").clone()
    }

    fn slots(&self) -> Vec<SystemTime> {
        self.all().iter().map(|run| run.slot).collect()
    }
}

/// A runner of `election` on `schedule` whose runs take `lasts` and fail
/// when `fails` says so for the slot; each start is logged in `runs` and
/// sent on the returned channel. Runs until the returned task is aborted.
fn run(
    election: &Election,
    by: &'static str,
    schedule: &Schedule,
    lasts: Duration,
    fails: fn(SystemTime) -> bool,
    runs: &Runs,
) -> (tokio::task::JoinHandle<()>, mpsc::UnboundedReceiver<Run>) {
    let (started, starts) = mpsc::unbounded_channel();
    let (runs, clock) = (runs.clone(), schedule.clone());
    let runner = election
        .runner()
        .cron(schedule.clone(), move |_term, slot| {
            let run = Run {
                by,
                slot,
                started: clock.now(),
            };
            runs.0.lock().expect("not poisoned").push(run);
            let _ = started.send(run);
            async move {
                tokio::time::sleep(lasts).await;
                if fails(slot) {
                    Err("the run failed")
                } else {
                    Ok(())
                }
            }
        });
    let task = tokio::spawn(async move {
        runner
            .run_until(std::future::pending())
            .await
            .expect("the runner runs");
    });
    (task, starts)
}

fn never(_: SystemTime) -> bool {
    false
}

async fn next(starts: &mut mpsc::UnboundedReceiver<Run>) -> Run {
    within(starts.recv()).await.expect("the runner runs")
}

#[tokio::test(start_paused = true)]
async fn slots_run_on_the_calendar_once_each() {
    let store = MemoryStore::new();
    let schedule = Schedule::cron("*/10 * * * * *")
        .expect("an expression")
        .on_tokio_clock(two_am() - Duration::from_secs(5));
    let runs = Runs::default();
    let election = member(&store, "a").await;
    let (task, mut starts) = run(
        &election,
        "a",
        &schedule,
        Duration::from_secs(1),
        never,
        &runs,
    );
    for _ in 0..3 {
        next(&mut starts).await;
    }
    task.abort();
    let expected: Vec<_> = (0..3)
        .map(|i| two_am() + Duration::from_secs(10 * i))
        .collect();
    assert_eq!(runs.slots(), expected);
    for run in runs.all() {
        assert_eq!(run.started, run.slot, "on the clock: {run:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_cut_off_mid_run_is_not_repeated_and_the_next_slot_runs_on_time() {
    let store = MemoryStore::new();
    let (view_a, view_b) = (store.view(), store.view());
    let schedule = Schedule::cron("* * * * *")
        .expect("an expression")
        .on_tokio_clock(two_am() - Duration::from_secs(5));
    let runs = Runs::default();
    let a = member(&view_a, "a").await;
    let (a_task, mut a_starts) = run(&a, "a", &schedule, Duration::from_secs(20), never, &runs);
    let first = next(&mut a_starts).await;
    assert_eq!(first.slot, two_am());
    let b = member(&view_b, "b").await;
    let (b_task, mut b_starts) = run(&b, "b", &schedule, Duration::from_secs(1), never, &runs);
    // a is cut off from the store five seconds into its run: it loses
    // its term at its deadline, and b takes over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    view_a.set_fault(Fault::Stall);
    let second = next(&mut b_starts).await;
    let third = next(&mut b_starts).await;
    a_task.abort();
    b_task.abort();
    assert_eq!(second.slot, two_am() + Duration::from_secs(60));
    assert_eq!(second.started, second.slot, "b runs 02:01 on time");
    assert_eq!(third.slot, two_am() + Duration::from_secs(120));
    assert_eq!(runs.slots(), [first.slot, second.slot, third.slot]);
}

/// A leader of a per-minute schedule with the starting deadline
/// `deadline` runs 02:00; the store is then down from 02:00:25 to
/// 02:03:05, so 02:01, 02:02 and 02:03 pass with no leader. The two runs
/// after the outage.
async fn after_an_outage(deadline: Duration) -> (Runs, Run, Run) {
    let store = MemoryStore::new();
    let schedule = Schedule::cron("* * * * *")
        .expect("an expression")
        .starting_deadline(deadline)
        .on_tokio_clock(two_am() - Duration::from_secs(5));
    let runs = Runs::default();
    let a = member(&store, "a").await;
    let (task, mut starts) = run(&a, "a", &schedule, Duration::from_secs(1), never, &runs);
    assert_eq!(next(&mut starts).await.slot, two_am());
    tokio::time::sleep(Duration::from_secs(25)).await;
    store.set_fault(Fault::Fail);
    tokio::time::sleep(Duration::from_secs(160)).await;
    store.set_fault(Fault::None);
    let first = next(&mut starts).await;
    let second = next(&mut starts).await;
    task.abort();
    (runs, first, second)
}

#[tokio::test(start_paused = true)]
async fn after_an_outage_the_latest_missed_slot_runs_late_within_the_deadline() {
    let (runs, late, on_time) = after_an_outage(Duration::from_secs(30)).await;
    let three = two_am() + Duration::from_secs(180);
    assert_eq!(late.slot, three, "{:?}", runs.all());
    assert!(
        late.started > three && late.started <= three + Duration::from_secs(30),
        "{late:?}"
    );
    assert_eq!(on_time.slot, three + Duration::from_secs(60));
    assert_eq!(on_time.started, on_time.slot);
    assert_eq!(runs.slots(), [two_am(), late.slot, on_time.slot]);
}

#[tokio::test(start_paused = true)]
async fn after_an_outage_slots_past_the_deadline_are_skipped() {
    let (runs, after, _) = after_an_outage(Duration::from_secs(2)).await;
    // The store came back over 2 s after 02:03: it is skipped with 02:01
    // and 02:02, and 02:04 runs on time.
    assert_eq!(after.slot, two_am() + Duration::from_secs(240));
    assert_eq!(after.started, after.slot);
    assert_eq!(runs.slots()[..2], [two_am(), after.slot]);
}

#[tokio::test(start_paused = true)]
async fn a_run_that_overruns_skips_the_slots_it_covers() {
    let store = MemoryStore::new();
    let schedule = Schedule::cron("*/10 * * * * *")
        .expect("an expression")
        .on_tokio_clock(two_am() - Duration::from_secs(5));
    let runs = Runs::default();
    let a = member(&store, "a").await;
    let (task, mut starts) = run(&a, "a", &schedule, Duration::from_secs(25), never, &runs);
    for _ in 0..3 {
        next(&mut starts).await;
    }
    task.abort();
    // 02:00:00 runs until 02:00:25: 02:00:10 and 02:00:20 are skipped,
    // never run beside it or late.
    let expected: Vec<_> = [0, 30, 60]
        .iter()
        .map(|s| two_am() + Duration::from_secs(*s))
        .collect();
    assert_eq!(runs.slots(), expected);
    for run in runs.all() {
        assert_eq!(run.started, run.slot, "{run:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_is_not_repeated_and_the_next_slot_runs() {
    let store = MemoryStore::new();
    let schedule = Schedule::cron("* * * * *")
        .expect("an expression")
        .on_tokio_clock(two_am() - Duration::from_secs(5));
    let runs = Runs::default();
    let a = member(&store, "a").await;
    let (task, mut starts) = run(
        &a,
        "a",
        &schedule,
        Duration::from_secs(1),
        |slot| slot == two_am(),
        &runs,
    );
    next(&mut starts).await;
    next(&mut starts).await;
    task.abort();
    assert_eq!(runs.slots(), [two_am(), two_am() + Duration::from_secs(60)]);
}

#[tokio::test(start_paused = true)]
async fn a_handover_mid_schedule_neither_repeats_nor_skips() {
    let store = MemoryStore::new();
    let schedule = Schedule::cron("*/10 * * * * *")
        .expect("an expression")
        .on_tokio_clock(two_am() - Duration::from_secs(5));
    let runs = Runs::default();
    let a = member(&store, "a").await;
    let b = member(&store, "b").await;
    let (a_task, mut a_starts) = run(&a, "a", &schedule, Duration::from_secs(1), never, &runs);
    next(&mut a_starts).await;
    let (b_task, mut b_starts) = run(&b, "b", &schedule, Duration::from_secs(1), never, &runs);
    // a shuts down (resigning) between slots; b takes the next ones.
    tokio::time::sleep(Duration::from_secs(3)).await;
    a_task.abort();
    let taken = next(&mut b_starts).await;
    next(&mut b_starts).await;
    b_task.abort();
    assert_eq!(taken.slot, two_am() + Duration::from_secs(10));
    assert_eq!(taken.started, taken.slot);
    let expected: Vec<_> = [0, 10, 20]
        .iter()
        .map(|s| two_am() + Duration::from_secs(*s))
        .collect();
    assert_eq!(runs.slots(), expected);
}

/// 02:30 in Berlin does not exist on 2026-03-29 (clocks go from 02:00 to
/// 03:00): that day's slot runs once, at 03:00 CEST (01:00 UTC).
#[tokio::test(start_paused = true)]
async fn a_fixed_time_in_the_spring_gap_runs_once_just_after_it() {
    let store = MemoryStore::new();
    let schedule = Schedule::cron("30 2 * * *")
        .expect("an expression")
        .time_zone("Europe/Berlin")
        .expect("a zone")
        .on_tokio_clock(at(1_774_699_200)); // 2026-03-28T12:00Z
    let runs = Runs::default();
    let a = member(&store, "a").await;
    let (task, mut starts) = run(&a, "a", &schedule, Duration::from_secs(1), never, &runs);
    next(&mut starts).await;
    next(&mut starts).await;
    task.abort();
    // 2026-03-29T01:00Z (03:00 CEST), then 2026-03-30T00:30Z (02:30 CEST).
    assert_eq!(runs.slots(), [at(1_774_746_000), at(1_774_830_600)]);
}

/// 02:30 in Berlin happens twice on 2026-10-25 (clocks go from 03:00 back
/// to 02:00): a fixed-time slot runs once, at the first; a schedule of
/// intervals runs at every 02:30 the wall clock shows.
#[tokio::test(start_paused = true)]
async fn a_fixed_time_in_the_autumn_fold_runs_once_and_an_interval_in_both() {
    let fixed = Schedule::cron("30 2 * * *")
        .expect("an expression")
        .time_zone("Europe/Berlin")
        .expect("a zone");
    let noon = at(1_792_843_200); // 2026-10-24T12:00Z
    let first = fixed.next_after(noon).expect("a slot");
    assert_eq!(first, at(1_792_888_200), "02:30 CEST, 00:30Z");
    assert_eq!(
        fixed.next_after(first),
        Some(at(1_792_978_200)),
        "then 02:30 CET the next day"
    );
    let halves = Schedule::cron("*/30 * * * *")
        .expect("an expression")
        .time_zone("Europe/Berlin")
        .expect("a zone");
    let two_cest = at(1_792_886_400); // 2026-10-25T00:00Z, 02:00 CEST
    let slots = halves
        .slots_between(two_cest, two_cest + Duration::from_secs(3 * 1800))
        .expect("slots");
    assert_eq!(
        slots.count, 3,
        "02:30 CEST, 02:00 CET, 02:30 CET: {slots:?}"
    );

    // The runner, across the fold: the fixed-time slot once.
    let store = MemoryStore::new();
    let runs = Runs::default();
    let a = member(&store, "a").await;
    let (task, mut starts) = run(
        &a,
        "a",
        &fixed.clone().on_tokio_clock(noon),
        Duration::from_secs(1),
        never,
        &runs,
    );
    next(&mut starts).await;
    next(&mut starts).await;
    task.abort();
    assert_eq!(runs.slots(), [at(1_792_888_200), at(1_792_978_200)]);
}

/// Lists and ranges of fixed times are fixed times too (Vixie cron's
/// rule): on the night clocks fall back, each runs once, at the first.
/// `croner` alone counts them as intervals and names the second fold
/// again: `0 1,13 * * *` in New York ran its 01:00 report twice.
#[test]
fn a_list_of_fixed_times_in_the_autumn_fold_runs_each_once() {
    let zoned = |expression: &str, zone: &str| {
        Schedule::cron(expression)
            .expect("an expression")
            .time_zone(zone)
            .expect("a zone")
    };
    let reports = zoned("0 1,13 * * *", "America/New_York");
    let one_edt = at(1_793_509_200); // 2026-11-01T05:00Z, 01:00 EDT
    assert_eq!(
        reports.next_after(one_edt),
        Some(at(1_793_556_000)),
        "13:00 EST (18:00Z), not 01:00 EST again"
    );
    let halves = zoned("0,30 2 * * *", "Europe/Berlin");
    let two_cest = at(1_792_886_400); // 2026-10-25T00:00Z, 02:00 CEST
    assert_eq!(halves.next_after(two_cest), Some(at(1_792_888_200)));
    assert_eq!(
        halves.next_after(at(1_792_888_200)),
        Some(at(1_792_976_400)),
        "02:00 CET on the 26th, not 02:00 CET on the 25th"
    );
    let slots = halves
        .slots_between(two_cest - Duration::from_secs(1), at(1_792_976_400 - 1))
        .expect("slots");
    assert_eq!(
        (slots.count, slots.last),
        (2, at(1_792_888_200)),
        "02:00 and 02:30 CEST only: {slots:?}"
    );
    // Wildcard hours stay intervals: every 02:00 and 02:30 the wall clock shows.
    let every = zoned("0,30 * * * *", "Europe/Berlin");
    assert_eq!(every.next_after(at(1_792_888_200)), Some(at(1_792_890_000)));
}

#[test]
fn bad_expressions_and_zones_are_one_line_configuration_errors() {
    for (expression, zone) in [
        ("61 * * * *", "UTC"),
        ("* * *", "UTC"),
        ("", "UTC"),
        ("0 2 * * *", "Mars/Olympus"),
        ("0 0 30 2 *", "UTC"),
        ("0 2 * * *", ""),
    ] {
        let built = Schedule::cron(expression).and_then(|s| s.time_zone(zone));
        match built {
            Err(tenure::Error::Config(message)) => {
                assert!(!message.contains('\n'), "{message}");
                assert!(
                    message.contains(expression) || message.contains(zone),
                    "names what is wrong: {message}"
                );
            }
            other => panic!("{expression:?} in {zone:?}: {other:?}"),
        }
    }
}

/// An instance that reads the expression in another time zone (another
/// `--tz` in a rolling change, or older time zone data on its host)
/// claimed a day's 02:00 at another instant: the 02:00 of that day here is
/// taken as claimed too, and does not run a second time.
#[test]
fn a_claim_made_in_another_time_zone_takes_the_same_days_slot() {
    let midnight = at(1_796_256_000); // 2026-12-03T00:00Z
    let there = Schedule::cron("0 2 * * *")
        .expect("an expression")
        .time_zone("Etc/GMT-2")
        .expect("a zone"); // UTC+2: 02:00 is 00:00Z
    let here = Schedule::cron("0 2 * * *")
        .expect("an expression")
        .time_zone("Etc/GMT-1")
        .expect("a zone"); // UTC+1: 02:00 is 01:00Z
    assert_eq!(
        there.next_after(midnight - Duration::from_secs(1)),
        Some(midnight)
    );
    let plan = here.catch_up(Some(midnight), midnight + Duration::from_secs(1800));
    assert_eq!(plan.run_late, None);
    assert_eq!(plan.missed, None);
    let day = Duration::from_secs(24 * 3600);
    let hour = Duration::from_secs(3600);
    assert_eq!(
        here.next_after(plan.after),
        Some(midnight + day + hour),
        "today's 02:00 (01:00Z) was claimed at 00:00Z"
    );
    // A claim of this schedule's own slot is taken as it is.
    let own = here.catch_up(Some(midnight + hour), midnight + hour + hour);
    assert_eq!(here.next_after(own.after), Some(midnight + day + hour));
}
