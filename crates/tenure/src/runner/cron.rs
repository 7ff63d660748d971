//! Calendar schedules ([`Runner::cron`]): which slots a cron expression
//! names in a time zone, what a new leader does about slots that passed
//! with no run, and the loop that claims and runs slots while leader.
//!
//! **Each slot runs at most once, across failovers.** Before running a
//! slot, the leader claims it in the store ([`Leadership::claim_slot`]):
//! the claim names the slot itself, not the time of the run, and the store
//! refuses any claim of a slot not later than the last one claimed. So a
//! new leader neither repeats a slot its predecessor started, nor mistakes
//! a late run of one slot for the next slot. A slot whose run was cut
//! short (the leader crashed, lost its lease or was stopped) is not run
//! again: at most once, never twice.
//!
//! **Slots fire by the leader's wall clock**, as cron's do; the store only
//! orders the claims. Hosts whose clocks disagree fire a slot early or
//! late by as much, never twice.
//!
//! **Missed slots.** A slot that passed unclaimed (no leader at the time,
//! a failover, the store unreachable) is run late by the next leader if it
//! is the latest that passed and at most the starting deadline late;
//! every other one is skipped, with a log line and the
//! `leader_election_schedule_slots_total{outcome="missed"}` metric. A run
//! that overruns later slots skips them (never two runs at once), logged
//! and counted as `overrun`.
//!
//! The planning and daylight saving time are `schedule.rs`'s.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use super::every::{run_tick, sleep_in_term};
use super::schedule::{Schedule, Slots, MAX_NAP};
use super::{TermEnd, TickFuture};
use crate::{Election, Leadership};

#[cfg(doc)]
use super::Runner;

/// A cron tick: the term, and the slot it runs.
pub(super) type CronFn = Box<dyn FnMut(Leadership, SystemTime) -> TickFuture + Send>;

/// A span of slots for the log, in the schedule's time zone.
struct Span<'a>(&'a Schedule, Slots);

impl fmt::Display for Span<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Span(schedule, slots) = self;
        let more = if slots.at_least { " or more" } else { "" };
        let show = |time| Instant(schedule, time);
        if slots.count == 1 {
            write!(f, "1 slot ({})", show(slots.first))
        } else {
            let (first, last) = (show(slots.first), show(slots.last));
            write!(f, "{}{more} slots ({first} to {last})", slots.count)
        }
    }
}

/// A slot for the log, in the schedule's time zone.
struct Instant<'a>(&'a Schedule, SystemTime);

impl fmt::Display for Instant<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.zoned(self.1) {
            Some(zoned) => write!(f, "{}", zoned.strftime("%Y-%m-%dT%H:%M:%S%:z")),
            None => write!(f, "{:?}", self.1),
        }
    }
}

/// Where a term stands in the schedule.
enum Next {
    /// Wait for this slot, then claim it.
    Claim(SystemTime),
    /// This term claimed this slot already: run it now.
    Run(SystemTime),
    /// The schedule has no more slots.
    None,
}

/// Claim and run the schedule's slots while `term` lasts (see
/// [`Runner::cron`]), until it is lost or shutdown is requested.
pub(super) async fn lead_cron(
    election: &Election,
    term: &Leadership,
    schedule: &Schedule,
    tick: &mut CronFn,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
) -> TermEnd {
    let name = election.name();
    let retry = (election.ttl() / 3).max(Duration::from_millis(10));
    // Slots up to `after` are done with; `None`: ask the store.
    let mut after: Option<SystemTime> = None;
    // A slot whose claim may have been made: a timeout, say.
    let mut unsure: Option<SystemTime> = None;
    loop {
        let next = match after {
            Some(after) => schedule.next_after(after).map_or(Next::None, Next::Claim),
            None => {
                match position(election, term, schedule, shutdown.as_mut(), unsure).await {
                    Ok(Some(next)) => {
                        // Read: the unconfirmed claim is settled either way.
                        unsure = None;
                        next
                    }
                    Ok(None) => {
                        // The store could not be read: wait, and ask again.
                        if let Err(end) = sleep_in_term(term, shutdown.as_mut(), retry).await {
                            return end;
                        }
                        continue;
                    }
                    Err(end) => return end,
                }
            }
        };
        let slot = match next {
            Next::Run(slot) => slot,
            Next::Claim(slot) => {
                if let Err(end) = sleep_until(schedule, slot, term, shutdown.as_mut()).await {
                    return end;
                }
                let claim = tokio::select! {
                    biased;
                    reason = term.lost() => return TermEnd::Lost(reason),
                    claim = term.claim_slot(slot, schedule.keep_for(slot)) => claim,
                };
                match claim {
                    Ok(true) => slot,
                    refused => {
                        match refused {
                            Ok(_) => {
                                tracing::info!(election = %name, slot = %Instant(schedule, slot), "the slot was claimed already, or this term no longer holds the lease; reading the schedule's position again")
                            }
                            Err(err) => {
                                tracing::warn!(election = %name, slot = %Instant(schedule, slot), error = %err, "cannot claim the slot; reading the schedule's position again");
                                unsure = Some(slot);
                            }
                        }
                        after = None;
                        if let Err(end) = sleep_in_term(term, shutdown.as_mut(), retry).await {
                            return end;
                        }
                        continue;
                    }
                }
            }
            Next::None => {
                tracing::warn!(election = %name, schedule = %schedule.expression(), "the schedule has no more slots");
                return tokio::select! {
                    reason = term.lost() => TermEnd::Lost(reason),
                    _ = shutdown.as_mut() => TermEnd::Shutdown,
                };
            }
        };
        match run_slot(
            election,
            term,
            schedule,
            tick,
            shutdown.as_mut(),
            grace,
            slot,
        )
        .await
        {
            Ok(end) => after = Some(end),
            Err(end) => return end,
        }
    }
}

/// Where the term stands, from the last slot the store names: `Ok(None)`
/// if it cannot be read now, `Err` if the term ends meanwhile. `unsure`
/// is a slot this term tried to claim without an answer: if the store
/// names it, the claim was made (only the term holding the lease claims),
/// and it is run.
async fn position(
    election: &Election,
    term: &Leadership,
    schedule: &Schedule,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    unsure: Option<SystemTime>,
) -> Result<Option<Next>, TermEnd> {
    let read = async {
        if let Some(tried) = unsure {
            if election.last_slot().await? == Some(tried) {
                tracing::info!(election = %election.name(), slot = %Instant(schedule, tried), "the claim that could not be confirmed was made");
                return Ok(Next::Run(tried));
            }
        }
        Ok(election
            .next_slot(schedule)
            .await?
            .map_or(Next::None, Next::Claim))
    };
    let read: crate::Result<Next> = tokio::select! {
        biased;
        reason = term.lost() => return Err(TermEnd::Lost(reason)),
        _ = shutdown.as_mut() => return Err(TermEnd::Shutdown),
        read = read => read,
    };
    match read {
        Ok(next) => Ok(Some(next)),
        Err(err) => {
            tracing::warn!(election = %election.name(), error = %err, "cannot read the last slot claimed; no slot runs until it can be read");
            Ok(None)
        }
    }
}

impl Election {
    /// The slot of `schedule` a leader of this election runs next, from
    /// the last slot claimed in the store ([`Leadership::claim_slot`]), by
    /// [`Schedule::catch_up`]: the latest slot that passed unclaimed, if it
    /// is within the starting deadline (to run late), else the first slot
    /// after now; `None` when the schedule has no more. Slots that passed
    /// unclaimed and are skipped are logged in one line and counted
    /// (`leader_election_schedule_slots_total{outcome="missed"}`).
    ///
    /// [`Runner::cron`] and `tenure run --cron` ask this once per term,
    /// then claim the slot when it falls due; a loop of one's own does
    /// the same.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::{Duration, SystemTime};
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("report").memory(&store).build().await?;
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// let daily = tenure::Schedule::cron("0 2 * * *")?.on_tokio_clock(two_am - Duration::from_secs(60));
    /// assert_eq!(election.next_slot(&daily).await?, Some(two_am));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn next_slot(&self, schedule: &Schedule) -> crate::Result<Option<SystemTime>> {
        let name = self.name();
        let last = self.last_slot().await?;
        match last {
            None => {
                tracing::info!(election = %name, schedule = %schedule.expression(), time_zone = %schedule.time_zone_name(), "no slot of this schedule was ever claimed; it starts with the next")
            }
            Some(last) => {
                tracing::info!(election = %name, last = %Instant(schedule, last), "the last slot claimed (its run started, and is never repeated)")
            }
        }
        let plan = schedule.catch_up(last, schedule.now());
        if let Some(missed) = plan.missed {
            tracing::warn!(election = %name, deadline = ?schedule.deadline(), "{} passed with no leader to claim them and will not run: the latest was past the starting deadline, or a later one runs late", Span(schedule, missed));
            crate::metrics::slots(name, "missed", missed.count);
        }
        Ok(plan.run_late.or_else(|| schedule.next_after(plan.after)))
    }
}

/// Sleep until the wall clock reaches `slot`, reading it again at least
/// every [`MAX_NAP`] (a clock that was set); `Err` if the term ends first.
async fn sleep_until(
    schedule: &Schedule,
    slot: SystemTime,
    term: &Leadership,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<(), TermEnd> {
    while let Ok(wait) = slot.duration_since(schedule.now()) {
        if wait.is_zero() {
            break;
        }
        sleep_in_term(term, shutdown.as_mut(), wait.min(MAX_NAP)).await?;
    }
    Ok(())
}

/// Run the claimed `slot`; `Ok` with the instant its run ended (slots
/// until then are skipped as overrun), or `Err` if the term is lost or
/// shutdown is requested meanwhile.
async fn run_slot(
    election: &Election,
    term: &Leadership,
    schedule: &Schedule,
    tick: &mut CronFn,
    shutdown: Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
    slot: SystemTime,
) -> std::result::Result<SystemTime, TermEnd> {
    let name = election.name();
    let late = schedule.now().duration_since(slot).unwrap_or_default();
    tracing::info!(election = %name, slot = %Instant(schedule, slot), token = term.token(), late = ?late, "running the slot");
    let run = tick(term.clone(), slot);
    let failure = match run_tick(election, term, run, shutdown, None, grace).await {
        Ok(failure) => failure,
        Err(end) => {
            tracing::warn!(election = %name, slot = %Instant(schedule, slot), "the slot's run was cut short (the term ended); it is not run again");
            crate::metrics::slots(name, "failed", 1);
            return Err(end);
        }
    };
    let end = schedule.now();
    match failure {
        None => {
            crate::metrics::slots(name, "ran", 1);
            crate::metrics::slot_succeeded(name, end);
        }
        Some(failure) => {
            tracing::warn!(election = %name, slot = %Instant(schedule, slot), error = %failure, "the slot's run failed; it is not run again (each slot runs at most once)");
            crate::metrics::slots(name, "failed", 1);
        }
    }
    if let Some(overrun) = schedule.slots_between(slot, end) {
        tracing::warn!(election = %name, slot = %Instant(schedule, slot), "the slot's run overran {}, which are skipped", Span(schedule, overrun));
        crate::metrics::slots(name, "overrun", overrun.count);
    }
    Ok(end.max(slot))
}
