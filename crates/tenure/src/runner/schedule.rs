//! Calendar schedules: which slots a cron expression names in a time
//! zone, and what a new leader does about slots that passed with no run
//! ([`Schedule::catch_up`]). Pure (apart from reading the wall clock), so
//! that [`super::Runner::cron`], the CLI's `--cron` and users' own loops
//! make the same decisions; the loop that claims and runs slots is in
//! `cron.rs`.
//!
//! **Daylight saving time** follows `croner`'s rules, which Kubernetes
//! CronJobs and Vixie cron users expect: a fixed time that does not exist
//! (02:30 on the night clocks spring forward) runs at the first instant
//! after the gap; a fixed time that happens twice (the night they fall
//! back) runs once, at the first, lists and ranges of fixed times too
//! (`0 1,13 * * *`: Vixie cron's rule, a minute and an hour field that do
//! not start with `*`); a schedule of intervals or wildcards
//! (`*/15 * * * *`) runs on the wall clock's every match, in both folds.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::{Error, Result};

#[cfg(doc)]
use super::Runner;

/// The slot's instant in ms since the Unix epoch, as the store keeps it
/// (`None` before 1970 or past `u64` ms).
pub(crate) fn slot_ms(slot: SystemTime) -> Option<u64> {
    let since = slot.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}

/// The instant a slot kept in the store names.
/// The instant a slot kept in the store names (`None` if this platform's
/// clock cannot hold it: foreign data).
pub(crate) fn slot_time(ms: u64) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// How many matches one repeated hour can hold (every second of it): the
/// most a search steps over in the second fold of a fall-back night.
const MAX_FOLD_MATCHES: usize = 3600;

/// Whether `expression` names fixed times of day, as Vixie cron decides
/// which jobs its daylight-saving rules keep from running twice: neither
/// the minute nor the hour field starts with `*` (`@daily` and the other
/// nicknames but `@hourly` name fixed times).
fn fixed_times(expression: &str) -> bool {
    let fields: Vec<&str> = expression.split_whitespace().collect();
    let (minute, hour) = match fields.as_slice() {
        [nickname] => return !nickname.eq_ignore_ascii_case("@hourly"),
        [minute, hour, _, _, _] => (minute, hour),
        [_seconds, minute, hour, _, _, _] => (minute, hour),
        _ => return false,
    };
    !minute.starts_with('*') && !hour.starts_with('*')
}

/// How far a [`Schedule`] counts missed or overrun slots; past it, a count
/// is reported as "at least".
const MAX_COUNTED: u64 = 100_000;

/// The longest a leader sleeps before reading the wall clock again, so
/// that a clock that was set (a step, not a slew) is noticed.
pub(super) const MAX_NAP: Duration = Duration::from_secs(30);

/// The default [`Schedule::starting_deadline`].
pub const DEFAULT_STARTING_DEADLINE: Duration = Duration::from_secs(60);

/// A calendar schedule for [`Runner::cron`] and `tenure run --cron`: a
/// cron expression, read in a time zone (UTC unless told), and how late a
/// missed slot may still run.
///
/// Expressions have five fields (minute, hour, day of month, month, day
/// of week), or six with seconds first, plus the nicknames `@hourly`,
/// `@daily`, `@weekly`, `@monthly`, `@yearly`; `L`, `W` and `#` as in
/// Quartz. A day of month and a day of week both given match either (as
/// Vixie cron).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// let schedule = tenure::Schedule::cron("0 2 * * *")?     // 02:00 every day
///     .time_zone("Europe/Berlin")?
///     .starting_deadline(Duration::from_secs(15 * 60));
/// // 2026-12-03 00:00 UTC is 01:00 in Berlin: the next 02:00 there is 01:00 UTC.
/// let midnight = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_256_000);
/// let next = schedule.next_after(midnight).expect("a next slot");
/// assert_eq!(next, midnight + Duration::from_secs(3600));
/// # Ok::<(), tenure::Error>(())
/// ```
#[derive(Clone)]
pub struct Schedule {
    expression: String,
    cron: croner::Cron,
    zone: jiff::tz::TimeZone,
    zone_name: String,
    starting_deadline: Duration,
    clock: WallClock,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("expression", &self.expression)
            .field("time_zone", &self.zone_name)
            .field("starting_deadline", &self.starting_deadline)
            .finish_non_exhaustive()
    }
}

/// The wall clock slots are read on.
#[derive(Clone, Debug)]
enum WallClock {
    /// The host's.
    System,
    /// `start` at tokio's instant `at`, moving with tokio's clock (paused
    /// time in tests).
    Tokio {
        start: SystemTime,
        at: tokio::time::Instant,
    },
}

impl Schedule {
    /// The schedule a cron expression names, in UTC, with the
    /// [`DEFAULT_STARTING_DEADLINE`] of a minute. An expression that is
    /// not one is a configuration error naming it.
    ///
    /// ```
    /// let every_ten_seconds = tenure::Schedule::cron("*/10 * * * * *")?;
    /// assert_eq!(every_ten_seconds.expression(), "*/10 * * * * *");
    /// assert!(tenure::Schedule::cron("61 * * * *").is_err());
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn cron(expression: &str) -> Result<Schedule> {
        let cron = croner::Cron::from_str(expression).map_err(|err| {
            Error::Config(format!("{expression:?} is not a cron expression: {err}"))
        })?;
        if cron
            .find_next_occurrence(
                &jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC),
                false,
            )
            .is_err()
        {
            return Err(Error::Config(format!(
                "{expression:?} is a cron expression no date matches"
            )));
        }
        Ok(Schedule {
            expression: expression.to_string(),
            cron,
            zone: jiff::tz::TimeZone::UTC,
            zone_name: "UTC".into(),
            starting_deadline: DEFAULT_STARTING_DEADLINE,
            clock: WallClock::System,
        })
    }

    /// Read the expression in the IANA time zone `name` (`Europe/Berlin`,
    /// `America/New_York`; `UTC` is the default), from the host's time
    /// zone database, else from the copy compiled into tenure.
    ///
    /// ```
    /// let schedule = tenure::Schedule::cron("0 9 * * MON-FRI")?.time_zone("America/New_York")?;
    /// assert_eq!(schedule.time_zone_name(), "America/New_York");
    /// assert!(tenure::Schedule::cron("0 9 * * *")?.time_zone("Mars/Olympus").is_err());
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn time_zone(mut self, name: &str) -> Result<Schedule> {
        self.zone = jiff::tz::TimeZone::get(name)
            .map_err(|_| Error::Config(format!("{name:?} is not a known IANA time zone")))?;
        self.zone_name = name.to_string();
        Ok(self)
    }

    /// How late a missed slot may still run: a slot that passed with no
    /// run (no leader at the time, a failover) is run late by the next
    /// leader if it is the latest that passed and at most this late; else
    /// it is skipped (Kubernetes' `startingDeadlineSeconds`). A minute
    /// unless told.
    ///
    /// ```
    /// use std::time::Duration;
    /// let schedule = tenure::Schedule::cron("@daily")?.starting_deadline(Duration::from_secs(3600));
    /// assert_eq!(schedule.deadline(), Duration::from_secs(3600));
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn starting_deadline(mut self, deadline: Duration) -> Schedule {
        self.starting_deadline = deadline;
        self
    }

    /// Read the wall clock as `start` now, moving with tokio's clock from
    /// here on: for tests in paused time (`tokio::time::pause`), where the
    /// host's clock would not move.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::{Duration, SystemTime};
    /// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// let schedule = tenure::Schedule::cron("* * * * *")?.on_tokio_clock(start);
    /// tokio::time::sleep(Duration::from_secs(90)).await;
    /// assert_eq!(schedule.now(), start + Duration::from_secs(90));
    /// # Ok(()) }
    /// ```
    pub fn on_tokio_clock(mut self, start: SystemTime) -> Schedule {
        self.clock = WallClock::Tokio {
            start,
            at: tokio::time::Instant::now(),
        };
        self
    }

    /// The expression, as given.
    ///
    /// ```
    /// assert_eq!(tenure::Schedule::cron("@hourly")?.expression(), "@hourly");
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone's name.
    ///
    /// ```
    /// assert_eq!(tenure::Schedule::cron("@hourly")?.time_zone_name(), "UTC");
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn time_zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The starting deadline ([`Schedule::starting_deadline`]).
    ///
    /// ```
    /// let schedule = tenure::Schedule::cron("@hourly")?;
    /// assert_eq!(schedule.deadline(), tenure::DEFAULT_STARTING_DEADLINE);
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn deadline(&self) -> Duration {
        self.starting_deadline
    }

    /// The wall clock's time now: the host's, or tokio's
    /// ([`Schedule::on_tokio_clock`]).
    ///
    /// ```
    /// let schedule = tenure::Schedule::cron("@hourly")?;
    /// assert!(schedule.now() > std::time::SystemTime::UNIX_EPOCH);
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn now(&self) -> SystemTime {
        match &self.clock {
            WallClock::System => SystemTime::now(),
            WallClock::Tokio { start, at } => *start + at.elapsed(),
        }
    }

    /// The first slot strictly after `time`, or `None` if there is none
    /// (an expression no date matches, or past the year 9999).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// let hourly = tenure::Schedule::cron("0 * * * *")?;
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// assert_eq!(hourly.next_after(two_am), Some(two_am + Duration::from_secs(3600)));
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn next_after(&self, time: SystemTime) -> Option<SystemTime> {
        let mut at = self.zoned(time)?;
        for _ in 0..=MAX_FOLD_MATCHES {
            let next = self.cron.find_next_occurrence(&at, false).ok()?;
            if !self.repeats_a_fixed_time(&next) {
                return Some(SystemTime::from(next.timestamp()));
            }
            at = next;
        }
        None
    }

    /// The last slot at or before `time`, if any.
    fn last_at_or_before(&self, time: SystemTime) -> Option<SystemTime> {
        let mut last = self
            .cron
            .find_previous_occurrence(&self.zoned(time)?, true)
            .ok()?;
        for _ in 0..MAX_FOLD_MATCHES {
            if !self.repeats_a_fixed_time(&last) {
                break;
            }
            last = self.cron.find_previous_occurrence(&last, false).ok()?;
        }
        Some(SystemTime::from(last.timestamp()))
    }

    /// `at` is the second time the wall clock shows its time (the night
    /// clocks fall back) and the expression names fixed times, as Vixie
    /// cron counts them: neither its minute nor its hour field starts
    /// with `*`, lists and ranges included (`0 1,13 * * *`). Such a slot
    /// ran already, at the first: it is no slot. `croner` skips the second
    /// fold only when each field holds a single value.
    fn repeats_a_fixed_time(&self, at: &jiff::Zoned) -> bool {
        if !fixed_times(&self.expression) {
            return false;
        }
        let first = self.zone.to_ambiguous_zoned(at.datetime()).earlier();
        first.is_ok_and(|first| first.timestamp() < at.timestamp())
    }

    pub(super) fn zoned(&self, time: SystemTime) -> Option<jiff::Zoned> {
        let timestamp = jiff::Timestamp::try_from(time).ok()?;
        Some(timestamp.to_zoned(self.zone.clone()))
    }

    /// The slots after `from` up to and including `to`.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// let minutely = tenure::Schedule::cron("* * * * *")?;
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// let slots = minutely.slots_between(two_am, two_am + Duration::from_secs(150));
    /// assert_eq!(slots.map(|s| s.count), Some(2)); // 02:01 and 02:02
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn slots_between(&self, from: SystemTime, to: SystemTime) -> Option<Slots> {
        let first = self.next_after(from).filter(|first| *first <= to)?;
        let last = self.last_at_or_before(to).unwrap_or(first).max(first);
        let mut count = 1;
        let mut at = first;
        while at < last && count < MAX_COUNTED {
            match self.next_after(at) {
                Some(next) if next <= last => {
                    count += 1;
                    at = next;
                }
                _ => break,
            }
        }
        Some(Slots {
            count,
            at_least: at < last,
            first,
            last,
        })
    }

    /// What a leader does about the slots that passed since `last`, the
    /// last slot claimed (`None`: none ever was, and nothing passed), at
    /// `now`: which of them it runs late, which it skips, and where it
    /// waits from.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// let minutely = tenure::Schedule::cron("* * * * *")?.starting_deadline(Duration::from_secs(30));
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// // The leader that claimed 02:00 crashed; the next leads at 02:03:10.
    /// let plan = minutely.catch_up(Some(two_am), two_am + Duration::from_secs(190));
    /// assert_eq!(plan.run_late, Some(two_am + Duration::from_secs(180))); // 02:03, 10 s late
    /// assert_eq!(plan.missed.map(|m| m.count), Some(2)); // 02:01 and 02:02
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn catch_up(&self, last: Option<SystemTime>, now: SystemTime) -> CatchUp {
        let Some(last) = last else {
            return CatchUp {
                missed: None,
                run_late: None,
                after: now,
            };
        };
        let last = self.as_own_slot(last);
        let Some(passed) = self.slots_between(last, now) else {
            return CatchUp {
                missed: None,
                run_late: None,
                after: last.max(now),
            };
        };
        let late = now.duration_since(passed.last).unwrap_or_default();
        let run_late = (late <= self.starting_deadline).then_some(passed.last);
        let missed = match run_late {
            None => Some(passed),
            Some(_) if passed.count == 1 => None,
            Some(latest) => self
                .last_at_or_before(latest - Duration::from_secs(1))
                .map(|last| Slots {
                    count: passed.count - 1,
                    last,
                    ..passed
                }),
        };
        CatchUp {
            missed,
            run_late,
            after: now,
        }
    }

    /// The slot of this schedule a claim of `claimed` stands for: itself,
    /// if it is one of this schedule's slots; else the nearest of them, if
    /// that comes after it. A claim that is not a slot of this schedule was
    /// made by an instance reading the expression differently (another
    /// expression or time zone, or older time zone data on that host): the
    /// same calendar slot may then fall at another instant here, and must
    /// not run a second time.
    fn as_own_slot(&self, claimed: SystemTime) -> SystemTime {
        let next = self.next_after(claimed);
        let own = claimed
            .checked_sub(Duration::from_secs(1))
            .and_then(|before| self.next_after(before));
        if own == Some(claimed) {
            return claimed;
        }
        let Some(next) = next else { return claimed };
        let after = next.duration_since(claimed).unwrap_or_default();
        let before = self
            .last_at_or_before(claimed)
            .and_then(|prev| claimed.duration_since(prev).ok())
            .unwrap_or(Duration::MAX);
        if after < before {
            next
        } else {
            claimed
        }
    }

    /// How long a claim of `slot` ([`crate::Leadership::claim_slot`]) is
    /// kept in the store: a hundred years, the longest any record is kept,
    /// so that a leader after any outage still knows the last slot claimed
    /// (which slots it missed, and which it must not run again). One small
    /// record per election.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// let hourly = tenure::Schedule::cron("0 * * * *")?;
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// assert_eq!(hourly.keep_for(two_am), Duration::from_secs(100 * 365 * 24 * 3600));
    /// # Ok::<(), tenure::Error>(())
    /// ```
    pub fn keep_for(&self, slot: SystemTime) -> Duration {
        let _ = slot;
        Duration::from_millis(crate::backend::MAX_KEEP_MS)
    }
}

/// Slots of a [`Schedule`] in a span of time: how many, the first and the
/// last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// How many (at most 100,000 are counted).
    pub count: u64,
    /// Whether there were more than were counted.
    pub at_least: bool,
    /// The first.
    pub first: SystemTime,
    /// The last.
    pub last: SystemTime,
}

/// A leader's plan for the slots that passed since the last one claimed
/// ([`Schedule::catch_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    /// Slots that passed unclaimed and are skipped, if any.
    pub missed: Option<Slots>,
    /// The slot to run now, late: the latest that passed, if it is at
    /// most the starting deadline late.
    pub run_late: Option<SystemTime>,
    /// Slots up to this instant are done with: after `run_late`, the next
    /// slot is the first after it.
    pub after: SystemTime,
}
