//! `tenure run --cron`: while leader, CMD once per slot of a calendar
//! schedule, each slot at most once across failovers.
//!
//! The rules are the library's `Runner::cron` (see its `schedule.rs` and
//! `cron.rs`): a term asks the store where the schedule stands
//! (`Election::next_slot`: slots that passed with no leader are skipped
//! and logged, the latest run late within `--starting-deadline`), waits
//! for the slot, claims it (`Leadership::claim_slot`), and only then runs
//! CMD, under the same guardian and stop rules as every `tenure run`. A
//! run that overruns later slots skips them. CMD's exit status is logged
//! and counted per run; it does not end this process, nor the term.

use std::time::{Duration, SystemTime};

use metrics::{counter, gauge};
use tenure::{Election, Leadership, Schedule};
use tokio_util::sync::CancellationToken;

use crate::exit::{self, Failure};
use crate::run::{cannot_start, run_cmd, Cmd, Outcome, StopLimits};
use crate::supervisor::Standby;

/// The longest wait before the wall clock is read again, so that a clock
/// that was set is noticed.
const MAX_NAP: Duration = Duration::from_secs(30);

/// One term of `tenure run --cron`.
pub(crate) struct Leader<'a> {
    pub cmd: Cmd<'a>,
    /// `--election`'s name, for logs and metrics.
    pub name: &'a str,
    pub election: &'a Election,
    pub term: &'a Leadership,
    pub limits: StopLimits,
    pub shutdown: &'a CancellationToken,
}

impl Leader<'_> {
    /// Run CMD once per slot of `schedule` this term claims, until the term
    /// ends or shutdown is requested; on return no CMD runs.
    pub async fn run(&self, mut standby: Standby, schedule: &Schedule) -> Result<Outcome, Failure> {
        let name = self.name;
        let retry = (self.election.ttl() / 3).max(Duration::from_millis(10));
        // Slots up to `after` are done with; `None`: ask the store.
        let mut after: Option<SystemTime> = None;
        loop {
            let next = match after {
                Some(after) => schedule.next_after(after),
                None => {
                    let read = tokio::select! {
                        biased;
                        reason = self.term.lost() => return Ok(Outcome::Lost(reason)),
                        _ = self.shutdown.cancelled() => return Ok(Outcome::Shutdown(exit::OK)),
                        read = self.election.next_slot(schedule) => read,
                    };
                    match read {
                        Ok(next) => next,
                        Err(err) => {
                            tracing::warn!(election = %name, error = %err, "cannot read the last slot claimed; no slot runs until it can be read");
                            if let Some(end) = self.wait(retry).await {
                                return Ok(end);
                            }
                            continue;
                        }
                    }
                }
            };
            let Some(slot) = next else {
                tracing::warn!(election = %name, schedule = %schedule.expression(), "the schedule has no more slots");
                return Ok(tokio::select! {
                    reason = self.term.lost() => Outcome::Lost(reason),
                    _ = self.shutdown.cancelled() => Outcome::Shutdown(exit::OK),
                });
            };
            while let Ok(wait) = slot.duration_since(schedule.now()) {
                if wait.is_zero() {
                    break;
                }
                if let Some(end) = self.wait(wait.min(MAX_NAP)).await {
                    return Ok(end);
                }
            }
            let claim = tokio::select! {
                biased;
                reason = self.term.lost() => return Ok(Outcome::Lost(reason)),
                claim = self.term.claim_slot(slot, schedule.keep_for(slot)) => claim,
            };
            let at = humantime::format_rfc3339_seconds(slot);
            match claim {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(election = %name, slot = %at, "the slot was claimed already, or this term no longer holds the lease; reading the schedule's position again");
                    after = None;
                    if let Some(end) = self.wait(retry).await {
                        return Ok(end);
                    }
                    continue;
                }
                Err(err) => {
                    tracing::warn!(election = %name, slot = %at, error = %err, "cannot claim the slot; it may have been claimed, and is then not run");
                    after = None;
                    if let Some(end) = self.wait(retry).await {
                        return Ok(end);
                    }
                    continue;
                }
            }
            let late = schedule.now().duration_since(slot).unwrap_or_default();
            tracing::info!(election = %name, slot = %at, late = ?late, token = self.term.token(), "running the command for the slot");
            let outcome = run_cmd(
                self.cmd,
                standby,
                name,
                self.term,
                self.limits,
                self.shutdown,
                Some(slot),
            )
            .await?;
            let code = match outcome {
                Outcome::Exited(code) => code,
                other => {
                    tracing::warn!(election = %name, slot = %at, "the slot's run was cut short (the term ended); it is not run again");
                    counted(name, "failed", 1);
                    return Ok(other);
                }
            };
            let end = schedule.now();
            if code == 0 {
                tracing::info!(election = %name, slot = %at, took = ?end.duration_since(slot).unwrap_or_default().saturating_sub(late), "the command succeeded");
                counted(name, "ran", 1);
                let seconds = end
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                gauge!("leader_election_schedule_last_success_timestamp_seconds", "name" => name.to_string()).set(seconds);
            } else {
                tracing::warn!(election = %name, slot = %at, code, "the command failed; the slot is not run again (each slot runs at most once)");
                counted(name, "failed", 1);
            }
            if let Some(overrun) = schedule.slots_between(slot, end) {
                let more = if overrun.at_least { " or more" } else { "" };
                tracing::warn!(election = %name, slot = %at, skipped = %format!("{}{more}", overrun.count), first = %humantime::format_rfc3339_seconds(overrun.first), last = %humantime::format_rfc3339_seconds(overrun.last), "the run overran later slots, which are skipped");
                counted(name, "overrun", overrun.count);
            }
            after = Some(end.max(slot));
            // The next run's guardian, ready before its slot.
            let (command, env, cgroup) = self.cmd;
            standby = Standby::spawn(command, env, cgroup)
                .await
                .map_err(cannot_start)?;
        }
    }

    /// Sleep `wait`: `Some` with how the term ended if it was lost or
    /// shutdown was requested first.
    async fn wait(&self, wait: Duration) -> Option<Outcome> {
        tokio::select! {
            biased;
            reason = self.term.lost() => Some(Outcome::Lost(reason)),
            _ = self.shutdown.cancelled() => Some(Outcome::Shutdown(exit::OK)),
            _ = tokio::time::sleep(wait) => None,
        }
    }
}

/// Count `count` slots of election `name` that ended as `outcome` (the
/// library's series, so that one alert covers both).
fn counted(name: &str, outcome: &'static str, count: u64) {
    counter!("leader_election_schedule_slots_total", "name" => name.to_string(), "outcome" => outcome)
        .increment(count);
}
