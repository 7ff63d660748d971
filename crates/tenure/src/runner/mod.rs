//! The callback style: campaign forever, do the leader's work while leader,
//! and hand over cleanly on shutdown.
//!
//! The loop is the familiar `on_elected` / `on_revoked` / `on_follower`
//! pattern, with the two things it usually leaves out: after losing
//! leadership the runner campaigns again by itself (no "zombie standby"),
//! and on shutdown it first stops the work and only then releases the lease,
//! so the next leader never overlaps with this one's last actions.
//!
//! Periodic work ([`Runner::every`]) is scheduled by the store, not by the
//! leader's memory: each successful tick is recorded in the store with the
//! term's token (the last-run marker, [`Leadership::record_run`]), and a
//! tick starts only once the last recorded one is a period old by the
//! store's clock, so a new leader does not repeat a tick its predecessor
//! completed within the period (ShedLock's "at most once per period").

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::{Election, LeaderInfo, Leadership, LostReason, Result};

mod cron;
mod every;
mod schedule;

pub use every::TickOutcome;
pub(crate) use schedule::{slot_ms, slot_time};
pub use schedule::{CatchUp, Schedule, Slots, DEFAULT_STARTING_DEADLINE};

type WorkFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
type WorkFn = Box<dyn FnMut(Leadership) -> WorkFuture + Send>;
/// A tick's future: `Some(why)` when it failed.
type TickFuture = Pin<Box<dyn Future<Output = Option<String>> + Send>>;
type TickFn = Box<dyn FnMut(Leadership) -> TickFuture + Send>;
type Callback<T> = Option<Box<dyn FnMut(&T) + Send>>;

enum Work {
    Idle,
    Every(Duration, TickFn),
    Cron(Box<Schedule>, cron::CronFn),
    Lead(WorkFn),
}

/// Runs an election in the callback style; made by [`Election::runner`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("scheduler").memory(&store).build().await?;
/// election
///     .runner()
///     .on_elected(|term| println!("elected, token {}", term.token()))
///     .on_revoked(|reason| println!("revoked: {reason}"))
///     .on_follower(|leader| println!("following {}", leader.id))
///     .every(Duration::from_secs(5), |term| async move {
///         // a scheduler: check due jobs, fenced by term.token()
///         let _ = term.token();
///     })
///     // In a service: .run_until_signal() waits for SIGTERM/SIGINT.
///     .run_until(tokio::time::sleep(Duration::from_millis(50)))
///     .await?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct Runner {
    election: Election,
    on_elected: Callback<Leadership>,
    on_revoked: Callback<LostReason>,
    on_follower: Callback<LeaderInfo>,
    work: Work,
    shutdown_grace: Option<Duration>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("election", &self.election)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish_non_exhaustive()
    }
}

/// How a term handled by the runner ended.
enum TermEnd {
    Lost(LostReason),
    /// Shutdown was requested; the work has stopped (or its grace ran out).
    Shutdown,
    /// The [`Runner::lead`] work returned by itself.
    WorkDone,
}

impl Election {
    /// A runner for the callback style: campaign, run work while leader,
    /// campaign again after losing, resign on shutdown.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// election
    ///     .runner()
    ///     .lead(|term| async move { assert!(term.is_leader()) }) // once, then resign
    ///     .run_until(std::future::pending())
    ///     .await?;
    /// assert!(store.holder("jobs").is_none());
    /// # Ok(()) }
    /// ```
    pub fn runner(&self) -> Runner {
        Runner::new(self.clone())
    }
}

impl Runner {
    pub(crate) fn new(election: Election) -> Self {
        Runner {
            election,
            on_elected: None,
            on_revoked: None,
            on_follower: None,
            work: Work::Idle,
            shutdown_grace: None,
        }
    }

    /// Called when this instance becomes leader, before the work starts.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let (tokens, mut elected) = tokio::sync::mpsc::unbounded_channel();
    /// election
    ///     .runner()
    ///     .on_elected(move |term| tokens.send(term.token()).unwrap())
    ///     .lead(|_term| async {})
    ///     .run_until(std::future::pending())
    ///     .await?;
    /// assert_eq!(elected.recv().await, Some(1));
    /// # Ok(()) }
    /// ```
    pub fn on_elected(mut self, f: impl FnMut(&Leadership) + Send + 'static) -> Self {
        self.on_elected = Some(Box::new(f));
        self
    }

    /// Called when a term ends, after the work has stopped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let (reasons, mut revoked) = tokio::sync::mpsc::unbounded_channel();
    /// election
    ///     .runner()
    ///     .on_revoked(move |reason| reasons.send(reason.clone()).unwrap())
    ///     .lead(|_term| async {}) // the job is done: resign
    ///     .run_until(std::future::pending())
    ///     .await?;
    /// assert_eq!(revoked.recv().await, Some(tenure::LostReason::Resigned));
    /// # Ok(()) }
    /// ```
    pub fn on_revoked(mut self, f: impl FnMut(&LostReason) + Send + 'static) -> Self {
        self.on_revoked = Some(Box::new(f));
        self
    }

    /// Called when another instance is seen leading a new term.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// # use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("jobs").memory(&store).id("a").build().await?;
    /// let b = tenure::Election::builder("jobs").memory(&store).id("b").build().await?;
    /// let _term = a.campaign().await?;
    /// let (leaders, mut seen) = tokio::sync::mpsc::unbounded_channel();
    /// b.runner()
    ///     .on_follower(move |leader| leaders.send(leader.id.clone()).unwrap())
    ///     .run_until(tokio::time::sleep(Duration::from_secs(1)))
    ///     .await?;
    /// assert_eq!(seen.recv().await.as_deref(), Some("a"));
    /// # Ok(()) }
    /// ```
    pub fn on_follower(mut self, f: impl FnMut(&LeaderInfo) + Send + 'static) -> Self {
        self.on_follower = Some(Box::new(f));
        self
    }

    /// While leader, run `tick` at most once per `period`, across
    /// failovers: a tick starts only once the last *successful* tick (of
    /// this instance or any other) completed at least `period` ago, by the
    /// store's clock. The first tick of a term starts at once unless a
    /// previous leader's last successful tick is younger than `period`;
    /// then it waits out the rest (a loss of leadership or a shutdown ends
    /// the wait). So ticks run `period` apart, counted from the end of one
    /// to the start of the next (a tick of duration `d` repeats every
    /// `period + d`), and a slow tick is never overlapped by the next.
    ///
    /// A tick returns `()` or a `Result` ([`TickOutcome`]). A success is
    /// recorded in the store with the term's token
    /// ([`Leadership::record_run`], kept for `period`); a failure (`Err`)
    /// is logged, not recorded, and tried again after the shorter of
    /// `period` and the ttl. If the marker cannot be read, no tick starts:
    /// the read is tried again after that same delay.
    ///
    /// What this does not promise: the record is made *after* the tick
    /// completes, so a leader that dies (or loses the store) while a tick
    /// runs, or between its completion and the record, leaves no record,
    /// and the next leader runs the tick again. Work that must never run
    /// twice still needs its own writes fenced with [`Leadership::token`].
    ///
    /// A tick is dropped the moment leadership is lost; a shutdown lets the
    /// running tick finish (and be recorded) within the shutdown grace
    /// ([`Runner::shutdown_grace`]) before the lease is released.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let a = tenure::Election::builder("digest").memory(&store).id("a").build().await?;
    /// // a sends the digest, and goes away before the hour is up.
    /// a.runner()
    ///     .every(Duration::from_secs(3600), |_term| async { println!("digest sent by a") })
    ///     .run_until(tokio::time::sleep(Duration::from_secs(60)))
    ///     .await?;
    /// // b takes over at once, and sends the next digest an hour after a's.
    /// let b = tenure::Election::builder("digest").memory(&store).id("b").build().await?;
    /// let started = tokio::time::Instant::now();
    /// b.runner()
    ///     .every(Duration::from_secs(3600), move |_term| async move {
    ///         assert_eq!(started.elapsed(), Duration::from_secs(3600 - 60));
    ///     })
    ///     .run_until(tokio::time::sleep(Duration::from_secs(3600)))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn every<F, Fut>(mut self, period: Duration, mut tick: F) -> Self
    where
        F: FnMut(Leadership) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: TickOutcome,
    {
        self.work = Work::Every(
            period,
            Box::new(move |term| {
                let run = tick(term);
                Box::pin(async move { run.await.failure() })
            }),
        );
        self
    }

    /// Run `tick` on the leader once per slot of a calendar `schedule`
    /// (a cron expression in a time zone): **each slot runs at most
    /// once, across failovers**. Before running a slot, the leader claims
    /// it in the store ([`Leadership::claim_slot`]); a new leader runs
    /// neither a slot claimed before, nor slots that passed with no leader
    /// unless the latest is within the schedule's starting deadline (it
    /// runs late); skipped slots are logged and counted. A run that
    /// overruns later slots skips them. A tick gets the term and the
    /// slot's instant; an `Err` it returns is logged and counted, and the
    /// slot is not run again. Daylight saving time: see [`Schedule`].
    ///
    /// Unlike [`Runner::every`], which counts a period from the last run
    /// and drifts off the clock, slots stay on the calendar: the 02:00
    /// report runs at 02:00, once, on one replica.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::sync::{Arc, Mutex};
    /// use std::time::{Duration, SystemTime};
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("report").memory(&store).build().await?;
    /// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_170); // 01:59:30 UTC
    /// // In a service: Schedule::cron("0 2 * * *")?.time_zone("Europe/Berlin")?, on the host's clock.
    /// let schedule = tenure::Schedule::cron("0 2 * * *")?.on_tokio_clock(start);
    /// let ran = Arc::new(Mutex::new(Vec::new()));
    /// let log = ran.clone();
    /// election
    ///     .runner()
    ///     .cron(schedule, move |term, slot| {
    ///         let log = log.clone();
    ///         async move {
    ///             // mail the report for `slot`, fenced by term.token()
    ///             log.lock().unwrap().push(slot);
    ///             Ok::<(), std::io::Error>(())
    ///         }
    ///     })
    ///     .run_until(tokio::time::sleep(Duration::from_secs(2 * 24 * 3600)))
    ///     .await?;
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// let day = Duration::from_secs(24 * 3600);
    /// assert_eq!(*ran.lock().unwrap(), [two_am, two_am + day]);
    /// # Ok(()) }
    /// ```
    pub fn cron<F, Fut>(mut self, schedule: Schedule, mut tick: F) -> Self
    where
        F: FnMut(Leadership, std::time::SystemTime) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: TickOutcome,
    {
        self.work = Work::Cron(
            Box::new(schedule),
            Box::new(move |term, slot| {
                let run = tick(term, slot);
                Box::pin(async move { run.await.failure() })
            }),
        );
        self
    }

    /// While leader, run `work` once per term. It is dropped the moment
    /// leadership is lost; on shutdown `term.lost()` fires with
    /// [`LostReason::Shutdown`] and the work gets the grace period to return.
    /// If it returns by itself, the runner resigns and [`Runner::run_until`]
    /// returns: the job is done.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("migrate").memory(&store).build().await?;
    /// let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
    /// election
    ///     .runner()
    ///     .lead(move |term| {
    ///         let done = done.clone();
    ///         async move { done.send(term.token()).unwrap() }
    ///     })
    ///     .run_until(std::future::pending()) // returns once the work has
    ///     .await?;
    /// assert_eq!(finished.try_recv(), Ok(1));
    /// # Ok(()) }
    /// ```
    pub fn lead<F, Fut>(mut self, mut work: F) -> Self
    where
        F: FnMut(Leadership) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.work = Work::Lead(Box::new(move |term| Box::pin(work(term))));
        self
    }

    /// How long shutdown waits for the work to stop before releasing the
    /// lease anyway (default: the ttl).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let started = tokio::time::Instant::now();
    /// election
    ///     .runner()
    ///     .lead(|_term| std::future::pending()) // ignores the shutdown
    ///     .shutdown_grace(Duration::from_secs(1))
    ///     .run_until(tokio::time::sleep(Duration::from_secs(5)))
    ///     .await?;
    /// assert!(started.elapsed() < Duration::from_secs(7), "gave up on the work after 1 s");
    /// assert!(store.holder("jobs").is_none(), "and released the lease");
    /// # Ok(()) }
    /// ```
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// [`Runner::run_until`] SIGTERM or SIGINT (Ctrl-C).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> tenure::Result<()> {
    /// let election = tenure::Election::builder("reports")
    ///     .redis("redis://127.0.0.1:6379")
    ///     .build()
    ///     .await?;
    /// election
    ///     .runner()
    ///     .lead(|term| async move { term.lost().await; })
    ///     .run_until_signal() // systemd's stop, or Ctrl-C
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_until_signal(self) -> Result<()> {
        self.run_until(crate::shutdown_signal()).await
    }

    /// Campaign, work while leader, campaign again after each loss, until
    /// `shutdown` completes; then stop the work and resign.
    ///
    /// Returns an error only for problems that need a person (credentials,
    /// ACL, foreign data); transient Redis failures are ridden out.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping it mid-term drops the work at once and
    /// leaves the release to the keeper (in the background). Complete
    /// `shutdown` instead to stop the work first and then release.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// election
    ///     .runner()
    ///     .lead(|term| async move { term.lost().await; }) // works until told to stop
    ///     .run_until(tokio::time::sleep(Duration::from_secs(60)))
    ///     .await?;
    /// assert!(store.holder("jobs").is_none(), "resigned on shutdown");
    /// # Ok(()) }
    /// ```
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let on_follower = &mut self.on_follower;
            let campaign = self.election.campaign_observed(|leader| {
                if let Some(f) = on_follower.as_mut() {
                    f(leader);
                }
            });
            let term = tokio::select! {
                term = campaign => term?,
                _ = &mut shutdown => {
                    if let Err(err) = self.election.release_if_held().await {
                        tracing::warn!(election = %self.election.name(), error = %err, "could not check for a lease won by the abandoned campaign");
                    }
                    return Ok(());
                }
            };
            if let Some(f) = self.on_elected.as_mut() {
                f(&term);
            }
            let grace = self.shutdown_grace.unwrap_or(self.election.ttl());
            let end = lead_term(
                &self.election,
                &term,
                &mut self.work,
                shutdown.as_mut(),
                grace,
            )
            .await;
            let reason = match end {
                TermEnd::Lost(reason) => reason,
                TermEnd::Shutdown | TermEnd::WorkDone => {
                    let reason = if matches!(end, TermEnd::Shutdown) {
                        LostReason::Shutdown
                    } else {
                        LostReason::Resigned
                    };
                    if let Err(err) = term.resign_with(reason.clone()).await {
                        tracing::warn!(election = %self.election.name(), error = %err, "could not release the lease; it lapses at its ttl");
                    }
                    if let Some(f) = self.on_revoked.as_mut() {
                        f(&reason);
                    }
                    return Ok(());
                }
            };
            if let Some(f) = self.on_revoked.as_mut() {
                f(&reason);
            }
        }
    }
}

/// Do the work of one term until it is lost or shutdown is requested.
async fn lead_term(
    election: &Election,
    term: &Leadership,
    work: &mut Work,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
) -> TermEnd {
    match work {
        Work::Idle => tokio::select! {
            reason = term.lost() => TermEnd::Lost(reason),
            _ = shutdown.as_mut() => TermEnd::Shutdown,
        },
        Work::Every(period, tick) => {
            every::lead_every(election, term, *period, tick, shutdown, grace).await
        }
        Work::Cron(schedule, tick) => {
            cron::lead_cron(election, term, schedule, tick, shutdown, grace).await
        }
        Work::Lead(start) => lead_once(term, start, shutdown, grace).await,
    }
}

/// Run the [`Runner::lead`] work of one term until it returns by itself,
/// the term is lost, or shutdown is requested (then the work gets `grace`
/// to stop).
async fn lead_once(
    term: &Leadership,
    start: &mut WorkFn,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
) -> TermEnd {
    let mut run = start(term.clone());
    tokio::select! {
        reason = term.lost() => TermEnd::Lost(reason),
        _ = run.as_mut() => TermEnd::WorkDone,
        _ = shutdown.as_mut() => {
            // Tell the work to stop while the keeper keeps the
            // lease, so nobody else starts before it has stopped.
            term.shared().mark_lost(LostReason::Shutdown);
            tokio::select! {
                _ = run => {}
                _ = term.shared().ended() => {}
                _ = tokio::time::sleep(grace) => {
                    tracing::warn!(election = %term.election(), ?grace, "work did not stop within the shutdown grace; dropping it");
                }
            }
            TermEnd::Shutdown
        }
    }
}

/// Wait for SIGTERM or SIGINT (Ctrl-C elsewhere than Unix).
///
/// ```no_run
/// # #[tokio::main] async fn main() {
/// tenure::shutdown_signal().await;
/// println!("shutting down");
/// # }
/// ```
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                return;
            }
            (Err(err), _) | (_, Err(err)) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM; waiting for Ctrl-C only");
            }
        }
    }
    if let Err(err) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %err, "cannot listen for Ctrl-C; shutdown only by other means");
        std::future::pending::<()>().await;
    }
}
