//! `tenure run`: campaign, run CMD while leader, stop it before the lease
//! could pass to anyone else, campaign again.
//!
//! The one rule everything here serves: **CMD is gone before this
//! instance's local deadline.** Losing the lease to another owner (or the
//! lease vanishing) stops CMD at once; renewals failing start the stop early
//! enough that SIGKILL lands before the deadline; a shutdown stops CMD
//! first and releases the lease only after CMD is gone. Should tenure itself
//! be unable to act (stopped, wedged, killed), the guardian kills CMD at the
//! last kill instant tenure handed it ([`crate::supervisor`]).
//!
//! The lease is released on every way out that can run code: CMD exiting,
//! SIGTERM, SIGINT, SIGHUP, an error while leading, the guardian dying.

use std::ffi::OsString;
use std::time::Duration;

use metrics::{counter, gauge};
use tenure::{Election, Leadership, LostReason, NextTerm};

use crate::contest::Contest;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::cli::{CgroupMode, RunArgs};
use crate::complain;
use crate::exit::{self, Failure};
use crate::http::{self, Health, Phase};
use crate::supervisor::{Ended, Job, JobCgroup, Standby};

/// Time allowed between SIGKILL and the job being gone, kept free before the
/// deadline (less with a margin below it, so tiny ttls still work).
const KILL_SLACK: Duration = Duration::from_millis(100);

/// How long `tenure run`, exiting after its release, waits for the next
/// term to be announced ([`TermEnd::handed_over`]). A follower that was
/// waiting takes over within milliseconds; without one, this is what an
/// exit costs.
const SUCCESSOR_WAIT: Duration = Duration::from_millis(100);

/// How long it stays after the announcement, while the successor reads
/// its reply and starts its command.
const SUCCESSOR_GRACE: Duration = Duration::from_millis(20);

/// How one leadership term of CMD ended.
pub(crate) enum Outcome {
    /// CMD exited by itself with this code.
    Exited(i32),
    /// Leadership ended (or was about to); CMD was stopped.
    Lost(LostReason),
    /// We were asked to shut down; CMD was stopped and exited with this code.
    Shutdown(i32),
    /// A skip (`--at-most-every`): CMD did not run.
    Skipped,
}

pub async fn run(args: RunArgs) -> Result<i32, Failure> {
    // Whatever leaves CMD's tree while the guardian is gone is re-parented
    // here, not to PID 1, so that it can still be found and killed.
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %err, "cannot become a child subreaper; processes that escape a dead guardian cannot be killed");
    }
    let health = Health::default();
    let recorder = match args.metrics_addr {
        Some(addr) => Some((addr, http::install_recorder()?)),
        None => None,
    };
    let schedule = match &args.cron {
        Some(expression) => Some(
            tenure::Schedule::cron(expression)
                .and_then(|schedule| schedule.time_zone(&args.tz))?
                .starting_deadline(args.starting_deadline),
        ),
        None => None,
    };
    let contest = build_contest(&args).await?;
    let election = contest.first();
    let cgroup = CmdCgroup::create(args.cgroup)?;
    let cgroup = cgroup.as_ref().map(|c| &c.0);
    if let Some((addr, handle)) = recorder {
        http::serve(
            addr,
            handle,
            health.clone(),
            args.kill_grace + Duration::from_secs(1),
        )
        .await?;
    }
    let shutdown = cancel_on_shutdown();
    let kill_slack = KILL_SLACK.min(election.margin());
    let limits = StopLimits {
        stop_lead: stop_lead(election, args.kill_grace, kill_slack),
        kill_grace: args.kill_grace,
        kill_slack,
        extend_every: election.renew_every() / 4,
    };
    let name = args.election.clone();
    let mut backoff = RestartBackoff::new(election.ttl(), election.renew_every());
    let env = [
        ("TENURE_ELECTION", name.clone()),
        ("TENURE_ID", election.id().to_string()),
    ];
    loop {
        health.set(Phase::Campaigning);
        // The next term's guardian starts while we campaign, so that
        // winning costs only CMD's own start (see `crate::guardian`).
        let standby = Standby::spawn(&args.command, &env, cgroup)
            .await
            .map_err(cannot_start)?;
        tracing::info!(election = %name, guardian = standby.pid(), "the next term's guardian is ready; campaigning");
        let term = match campaign(&args, &contest, &name, &shutdown).await? {
            Campaigned::Term(term) => term,
            Campaigned::Exit(code) => return Ok(code),
        };
        health.set(Phase::Leading { term: term.clone() });
        // With --slots, the election of the permit won.
        let election = contest.of(&term);
        let began = Instant::now();
        let led = lead(
            (&args.command, &env, cgroup),
            standby,
            (&name, election),
            &term,
            (args.at_most_every, schedule.as_ref()),
            limits,
            &shutdown,
        )
        .await;
        gauge!("tenure_child_running", "election" => name.clone()).set(0.0);
        health.set(Phase::Campaigning);
        let ended = TermEnd {
            name: &name,
            election,
            once: args.once,
            began,
            shutdown: &shutdown,
        };
        if let Some(code) = ended.release(term, led, &mut backoff).await? {
            return Ok(code);
        }
    }
}

/// A token cancelled once a shutdown signal arrives (see
/// [`shutdown_signal`]).
fn cancel_on_shutdown() -> CancellationToken {
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            shutdown_signal().await;
            tracing::info!("shutdown requested");
            shutdown.cancel();
        }
    });
    shutdown
}

/// What a campaign of `tenure run` came to.
enum Campaigned {
    /// Elected: this term.
    Term(Leadership),
    /// Not elected (`--no-wait`, `--wait-timeout`) or shut down while
    /// campaigning: the exit code to end with.
    Exit(i32),
}

/// Campaign once, the way the options say: at once and only once
/// (`--no-wait`), for at most `--wait-timeout`, or until elected. A
/// shutdown meanwhile gives back any lease the campaign won.
async fn campaign(
    args: &RunArgs,
    contest: &Contest,
    name: &str,
    shutdown: &CancellationToken,
) -> Result<Campaigned, Failure> {
    if args.no_wait {
        return campaign_no_wait(args, contest, name, shutdown).await;
    }
    let what = match contest {
        Contest::Election(_) => format!("elected in election {name:?}"),
        Contest::Slots(_) => format!("given a permit of {name:?}"),
    };
    if let Some(wait) = args.wait_timeout {
        return Ok(tokio::select! {
            term = contest.campaign_timeout(wait) => match term? {
                Some(term) => Campaigned::Term(term),
                None => {
                    let holders = contest
                        .holders()
                        .await
                        .unwrap_or_else(|| "no lease was granted".to_string());
                    complain!(
                        "tenure: not {what} within {} ({holders}); giving up (--wait-timeout)",
                        humantime::format_duration(wait)
                    );
                    Campaigned::Exit(exit::SOMEONE_ELSE_LEADS)
                }
            },
            _ = shutdown.cancelled() => {
                contest.release_if_held().await;
                Campaigned::Exit(exit::OK)
            }
        });
    }
    Ok(tokio::select! {
        term = contest.campaign() => Campaigned::Term(term?),
        _ = shutdown.cancelled() => {
            contest.release_if_held().await;
            Campaigned::Exit(exit::OK)
        }
    })
}

/// `--no-wait`: one attempt; when nobody holds a term, wait out the
/// store's start-up hold-off (giving up as soon as others hold every term
/// there is: the election, or every permit).
async fn campaign_no_wait(
    args: &RunArgs,
    contest: &Contest,
    name: &str,
    shutdown: &CancellationToken,
) -> Result<Campaigned, Failure> {
    let election = contest.first();
    let mut term = contest.try_campaign().await?;
    if term.is_none() && contest.holders().await.is_none() {
        // Nobody leads: the store is new, restarted or failed over
        // less than the largest ttl ago, and grants no lease until
        // then. That is a wait, not a competitor: wait it out (it
        // ends within the largest ttl; one more ttl to campaign),
        // and give up as soon as another instance leads.
        let hold_off = args.term.max_ttl.unwrap_or(election.ttl()) + election.ttl();
        tracing::info!(election = %name, wait = ?hold_off, "the store grants no lease yet; waiting out its start-up hold-off (--no-wait)");
        term = tokio::select! {
            term = contest.campaign_timeout(hold_off) => term?,
            () = contest.taken_by_others() => {
                // The abandoned campaign cannot have won while
                // others held every term; release_if_held makes sure.
                contest.release_if_held().await;
                None
            }
            _ = shutdown.cancelled() => {
                contest.release_if_held().await;
                return Ok(Campaigned::Exit(exit::OK));
            }
        };
    }
    match term {
        Some(term) => Ok(Campaigned::Term(term)),
        None => {
            match (contest, contest.holders().await) {
                (Contest::Election(_), Some(holders)) => {
                    complain!("tenure: {holders} election {name:?}; not waiting (--no-wait)")
                }
                (Contest::Slots(_), Some(holders)) => {
                    complain!("tenure: {holders} in {name:?}; not waiting (--no-wait)")
                }
                (_, None) => complain!(
                    "tenure: election {name:?} granted no lease within its start-up \
                     hold-off; not waiting (--no-wait)"
                ),
            }
            Ok(Campaigned::Exit(exit::SOMEONE_ELSE_LEADS))
        }
    }
}

/// What [`TermEnd::release`] needs of the loop of [`run`].
struct TermEnd<'a> {
    name: &'a str,
    election: &'a Election,
    /// `--once`: a lost term ends the command.
    once: bool,
    /// When the term began.
    began: Instant,
    shutdown: &'a CancellationToken,
}

impl TermEnd<'_> {
    /// Every way out of a term ends here, and CMD is gone by now: release
    /// the lease, count how CMD stopped, and say whether to end (the exit
    /// code) or to campaign again (`None`, after `backoff` if terms keep
    /// ending early).
    async fn release(
        &self,
        term: Leadership,
        led: Result<Outcome, Failure>,
        backoff: &mut RestartBackoff,
    ) -> Result<Option<i32>, Failure> {
        let name = self.name;
        // Exiting after this release: look out for the successor from now.
        let exiting = matches!(led, Ok(Outcome::Exited(_) | Outcome::Shutdown(_)));
        let next = exiting.then(|| self.election.next_term());
        let released = Instant::now();
        // The keeper checks the lease is still ours.
        let resigned = term.resign().await;
        let outcome = match led {
            Ok(outcome) => outcome,
            Err(failure) => {
                if resigned.is_ok() {
                    tracing::info!(election = %name, "lease released");
                }
                return Err(failure);
            }
        };
        match &resigned {
            Err(err) if !matches!(outcome, Outcome::Lost(_)) => {
                tracing::warn!(error = %err, "could not release the lease; it lapses at its ttl");
            }
            Err(_) => {}
            Ok(()) => self.handed_over(next, released).await,
        }
        match outcome {
            Outcome::Exited(code) => {
                counter!("tenure_child_stops_total", "election" => name.to_string(), "how" => "exited")
                    .increment(1);
                tracing::info!(election = %name, code, "command exited; lease released");
                Ok(Some(code))
            }
            Outcome::Shutdown(code) => {
                counter!("tenure_child_stops_total", "election" => name.to_string(), "how" => "shutdown").increment(1);
                Ok(Some(code))
            }
            Outcome::Skipped => Ok(Some(exit::OK)),
            Outcome::Lost(reason) => {
                counter!("tenure_child_stops_total", "election" => name.to_string(), "how" => "lost")
                    .increment(1);
                if self.once {
                    complain!(
                        "tenure: leadership lost while the command ran ({reason}); it was stopped"
                    );
                    return Ok(Some(exit::LOST));
                }
                let wait = backoff.after_lost(self.began.elapsed());
                if wait.is_zero() {
                    tracing::info!(election = %name, %reason, "command stopped; campaigning again");
                } else {
                    tracing::info!(election = %name, %reason, wait = ?wait, "command stopped; terms keep ending early, so waiting before campaigning again");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.shutdown.cancelled() => return Ok(Some(exit::OK)),
                    }
                }
                Ok(None)
            }
        }
    }

    /// Before exiting after a release, wait a moment for the next term to
    /// be announced ([`SUCCESSOR_WAIT`]), and a moment more for the
    /// successor to start ([`SUCCESSOR_GRACE`]); say when it was announced.
    ///
    /// Exiting is work for the host and the store: on PostgreSQL each
    /// closed session ends a server process. When that work ran while the
    /// successor was being elected and starting its command, the SIGTERM
    /// hand-over through two `tenure run` took 8–9 ms on average instead
    /// of 5–6 (a dozen rounds each, a 2-core host running the server and
    /// both instances). An announcement is a hint: it only decides when to
    /// exit.
    async fn handed_over(&self, next: Option<NextTerm>, released: Instant) {
        let Some(next) = next else {
            return;
        };
        if next.announced(SUCCESSOR_WAIT).await {
            tracing::info!(election = %self.name, after = ?released.elapsed(), "the next term was announced");
            // The successor is announced at its acquisition's commit: it
            // has yet to read the reply and start its command.
            sleep(SUCCESSOR_GRACE).await;
        }
    }
}

/// Spaces out restarts of CMD when terms keep ending early, so that an
/// unhealthy store or a too-short ttl cannot start CMD many times a second.
/// The first early end restarts at once (one lost renewal should cost
/// little); each further one in a row waits twice as long as the last,
/// from one renew interval up to [`RestartBackoff::MAX`]. A term that lasts
/// two ttls starts the count afresh.
#[derive(Debug)]
struct RestartBackoff {
    early: u32,
    first: Duration,
    long_enough: Duration,
}

impl RestartBackoff {
    const MAX: Duration = Duration::from_secs(30);

    fn new(ttl: Duration, renew_every: Duration) -> Self {
        RestartBackoff {
            early: 0,
            first: renew_every,
            long_enough: ttl * 2,
        }
    }

    /// How long to wait before campaigning again after a term that
    /// `lasted` this long was lost.
    fn after_lost(&mut self, lasted: Duration) -> Duration {
        if lasted >= self.long_enough {
            self.early = 0;
            return Duration::ZERO;
        }
        self.early = self.early.saturating_add(1);
        if self.early == 1 {
            return Duration::ZERO;
        }
        self.first
            .saturating_mul(1 << (self.early - 2).min(16))
            .min(Self::MAX)
    }
}

/// CMD, its environment and its cgroup: what starts each run.
pub(crate) type Cmd<'a> = (
    &'a [OsString],
    &'a [(&'a str, String)],
    Option<&'a JobCgroup>,
);

/// One term: run CMD (unless `--at-most-every` says skip) and supervise it
/// until it ends; with `--cron`, once per slot the term claims. On return
/// CMD's whole tree is gone; the caller resigns.
async fn lead(
    cmd: Cmd<'_>,
    standby: Standby,
    (name, election): (&str, &Election),
    term: &Leadership,
    (at_most_every, schedule): (Option<Duration>, Option<&tenure::Schedule>),
    limits: StopLimits,
    shutdown: &CancellationToken,
) -> Result<Outcome, Failure> {
    if let Some(schedule) = schedule {
        let leader = crate::cron::Leader {
            cmd,
            name,
            election,
            term,
            limits,
            shutdown,
        };
        return leader.run(standby, schedule).await;
    }
    if let Some(period) = at_most_every {
        // The library's last-run marker, on whatever store the election uses.
        if let Some(age) = election.since_last_run().await?.filter(|age| *age < period) {
            complain!(
                "tenure: skipping: the command last succeeded {} ago, within --at-most-every {}",
                humantime::format_duration(Duration::from_secs(age.as_secs())),
                humantime::format_duration(period)
            );
            return Ok(Outcome::Skipped);
        }
    }
    let outcome = run_cmd(cmd, standby, name, term, limits, shutdown, None).await?;
    if let (Outcome::Exited(0), Some(period)) = (&outcome, at_most_every) {
        // Best effort: without the record, the next cron run repeats the job.
        match term.record_run(period).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(token = term.token(), "the command succeeded, but this term no longer holds the lease, so the run was not recorded; another host may repeat it")
            }
            Err(err) => {
                tracing::error!(error = %err, "could not record the run; another host may repeat it")
            }
        }
    }
    Ok(outcome)
}

/// Start CMD for `term` (with `--cron`, for `slot`) through the waiting
/// guardian, and supervise it until it ends; on return its whole tree is
/// gone.
pub(crate) async fn run_cmd(
    (command, env, cgroup): Cmd<'_>,
    standby: Standby,
    name: &str,
    term: &Leadership,
    limits: StopLimits,
    shutdown: &CancellationToken,
    slot: Option<std::time::SystemTime>,
) -> Result<Outcome, Failure> {
    // Metrics carry `--election`'s name; with --slots, the log names the
    // permit's election too.
    let name = name.to_string();
    let started = match standby.start(term, limits.kill_at(term), slot).await {
        Ok(job) => Ok(job),
        Err(err) => {
            tracing::warn!(error = %err, "the waiting guardian is gone; starting another");
            match Standby::spawn(command, env, cgroup).await {
                Ok(standby) => standby.start(term, limits.kill_at(term), slot).await,
                Err(err) => Err(err),
            }
        }
    };
    let mut job = started.map_err(cannot_start)?;
    tracing::info!(election = %name, term_election = %term.election(), token = term.token(), group = job.group(), "started command as leader");
    gauge!("tenure_child_running", "election" => name.clone()).set(1.0);
    counter!("tenure_child_starts_total", "election" => name.clone()).increment(1);
    let outcome = supervise(term, &mut job, limits, shutdown).await;
    job.ensure_gone().await;
    gauge!("tenure_child_running", "election" => name).set(0.0);
    outcome
}

/// The cgroup of this `tenure run`'s commands, removed when it ends.
struct CmdCgroup(JobCgroup);

impl CmdCgroup {
    fn create(mode: CgroupMode) -> Result<Option<CmdCgroup>, Failure> {
        if mode == CgroupMode::Off {
            return Ok(None);
        }
        match tenure_procs::cgroup::Cgroup::create() {
            Ok((cgroup, created)) => {
                for (dir, processes) in created.killed_leftovers {
                    tracing::warn!(
                        cgroup = %dir.display(),
                        processes,
                        "killed processes left by a tenure run that died together with its guardian"
                    );
                }
                tracing::info!(cgroup = %cgroup.dir().display(), "the command runs in a cgroup of its own");
                Ok(Some(CmdCgroup(JobCgroup {
                    cgroup,
                    required: mode == CgroupMode::Require,
                })))
            }
            Err(reason) if mode == CgroupMode::Require => Err(Failure::new(
                exit::INTERNAL,
                format!("no cgroup for the command (--cgroup require): {reason}"),
            )),
            Err(reason) => {
                tracing::info!(%reason, "no cgroup for the command; process groups and subreapers contain it");
                Ok(None)
            }
        }
    }
}

impl Drop for CmdCgroup {
    fn drop(&mut self) {
        // Every job is gone by now; should something still be in there,
        // this is the last chance to stop it.
        let cgroup = &self.0.cgroup;
        if let (_, Err(err)) = cgroup.kill_and_remove(Duration::from_secs(1)) {
            tracing::warn!(cgroup = %cgroup.dir().display(), error = %err, "cannot remove the command's cgroup");
        }
    }
}

pub(crate) fn cannot_start(err: std::io::Error) -> Failure {
    Failure::new(
        exit::INTERNAL,
        format!("cannot start the command's guardian: {err}"),
    )
}

/// Resolves on SIGTERM, SIGINT or SIGHUP: each asks `tenure run` to stop CMD
/// and release the lease. (SIGHUP too: a closed terminal or a reloading
/// supervisor must not end tenure without a release.)
pub(crate) async fn shutdown_signal() {
    shutdown_signals().await
}

/// Listen for SIGTERM, SIGINT and SIGHUP from now on; the future completes
/// at the first of them. Registering before any term begins means a signal
/// that arrives at once is not lost to its default action (which would
/// leave a lease to lapse at its ttl).
pub(crate) fn shutdown_signals() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let kinds = [
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
    ];
    let mut streams = Vec::new();
    for kind in kinds {
        match signal(kind) {
            Ok(stream) => streams.push(stream),
            Err(err) => tracing::warn!(error = %err, "cannot listen for a shutdown signal"),
        }
    }
    async move {
        if streams.is_empty() {
            std::future::pending::<()>().await;
        }
        let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
        futures_util::future::select_all(waits).await;
    }
}

/// The election of `--election`, or with `--slots N` a semaphore of N
/// permits under that name.
async fn build_contest(args: &RunArgs) -> Result<Contest, Failure> {
    let builder = Election::builder(&args.election)
        .open(args.redis.store())
        .prefix(&args.redis.prefix)
        .allow_eviction(args.redis.allow_eviction);
    Ok(Contest::build(args.term.apply(builder), args.slots).await?)
}

/// How long before the deadline CMD's stop must begin when renewals fail:
/// the kill grace, but never so much that a merely late renewal stops CMD.
/// Half the time between the renewal being due and the deadline.
fn stop_lead(election: &Election, kill_grace: Duration, kill_slack: Duration) -> Duration {
    let slack = election
        .ttl()
        .saturating_sub(election.margin())
        .saturating_sub(election.renew_every());
    kill_grace.min(slack / 2) + kill_slack
}

/// When and how fast CMD must be stopped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StopLimits {
    /// Begin stopping when no more than this is left before the deadline.
    stop_lead: Duration,
    /// SIGTERM-to-SIGKILL time of a normal stop.
    kill_grace: Duration,
    /// Kept free between SIGKILL and the deadline.
    kill_slack: Duration,
    /// How often a renewed deadline is passed on to the guardian: often
    /// enough that the guardian's kill instant, one renewal behind at worst,
    /// is never reached while renewals succeed.
    extend_every: Duration,
}

impl StopLimits {
    /// The kill grace, capped so SIGKILL lands before the local deadline.
    fn grace(&self, term: &Leadership) -> Duration {
        self.kill_grace
            .min(term.remaining().saturating_sub(self.kill_slack))
    }

    /// When the guardian must kill CMD if tenure has not done so: the same
    /// instant tenure's own SIGKILL lands at the latest.
    fn kill_at(&self, term: &Leadership) -> Instant {
        let deadline = term.deadline();
        deadline.checked_sub(self.kill_slack).unwrap_or(deadline)
    }
}

/// Run one term's CMD until it exits, leadership ends, or shutdown.
async fn supervise(
    term: &Leadership,
    job: &mut Job,
    limits: StopLimits,
    shutdown: &CancellationToken,
) -> Result<Outcome, Failure> {
    let stop_lead = limits.stop_lead;
    loop {
        if let Err(err) = job.extend(limits.kill_at(term)) {
            // A dead guardian closed the channel: wait() reports it next.
            // Anything else means it stopped listening, and an unheard
            // guardian would kill CMD at an old deadline: stop it now.
            if !matches!(
                err.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                tracing::error!(error = %err, "cannot pass the deadline on to the guardian; stopping the command");
                let ended = job.stop(limits.grace(term)).await;
                checked(ended)?;
                return Err(Failure::new(
                    exit::INTERNAL,
                    format!(
                        "the command's guardian stopped listening ({err}); the command was stopped"
                    ),
                ));
            }
        }
        let stop_by = term
            .deadline()
            .checked_sub(stop_lead)
            .unwrap_or_else(Instant::now);
        tokio::select! {
            ended = job.wait() => {
                return Ok(match checked(ended)? {
                    Ended::Exited(code) => Outcome::Exited(code),
                    _ => {
                        tracing::warn!("the guardian killed the command at its kill instant; tenure could not act in time");
                        Outcome::Lost(LostReason::DeadlinePassed)
                    }
                });
            }
            reason = term.lost() => {
                tracing::warn!(%reason, "leadership lost; stopping the command now");
                checked(job.stop(limits.grace(term)).await)?;
                return Ok(Outcome::Lost(reason));
            }
            _ = sleep_until(stop_by) => {
                // The deadline may have moved on since (a renewal succeeded).
                if term.remaining() > stop_lead {
                    continue;
                }
                tracing::warn!(time_left = ?term.remaining(), "renewals are failing; stopping the command before the lease deadline");
                checked(job.stop(limits.grace(term)).await)?;
                return Ok(Outcome::Lost(LostReason::DeadlinePassed));
            }
            _ = sleep(limits.extend_every) => {}
            _ = shutdown.cancelled() => {
                // Stopped by our SIGTERM/SIGKILL counts as a clean shutdown.
                let code = match checked(job.stop(limits.grace(term)).await)? {
                    Ended::Exited(code) if code < 128 => code,
                    _ => exit::OK,
                };
                return Ok(Outcome::Shutdown(code));
            }
        }
    }
}

/// A dead guardian is an internal failure, never CMD's exit; by the time
/// [`Job`] reports it, tenure has killed what was left of CMD.
fn checked(ended: Ended) -> Result<Ended, Failure> {
    match ended {
        Ended::GuardianDied(signal) => Err(Failure::new(
            exit::INTERNAL,
            format!(
                "the command's guardian was killed (signal {signal}); \
                 what was left of the command was killed, CMD's own status is unknown"
            ),
        )),
        ended => Ok(ended),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_after_early_losses_back_off_and_a_long_term_resets_them() {
        let ttl = Duration::from_secs(1);
        let mut backoff = RestartBackoff::new(ttl, ttl / 4);
        let short = Duration::from_millis(10);
        assert_eq!(backoff.after_lost(short), Duration::ZERO);
        assert_eq!(backoff.after_lost(short), ttl / 4);
        assert_eq!(backoff.after_lost(short), ttl / 2);
        assert_eq!(backoff.after_lost(short), ttl);
        for _ in 0..40 {
            assert!(backoff.after_lost(short) <= RestartBackoff::MAX);
        }
        assert_eq!(backoff.after_lost(short), RestartBackoff::MAX);
        assert_eq!(backoff.after_lost(ttl * 2), Duration::ZERO);
        assert_eq!(backoff.after_lost(short), Duration::ZERO);
    }
}
