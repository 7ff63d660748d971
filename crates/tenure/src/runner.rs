//! The callback style: campaign forever, do the leader's work while leader,
//! and hand over cleanly on shutdown.
//!
//! The loop is the familiar `on_elected` / `on_revoked` / `on_follower`
//! pattern, with the two things it usually leaves out: after losing
//! leadership the runner campaigns again by itself (no "zombie standby"),
//! and on shutdown it first stops the work and only then releases the lease,
//! so the next leader never overlaps with this one's last actions.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{interval, MissedTickBehavior};

use crate::{Election, LeaderInfo, Leadership, LostReason, Result};

type WorkFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
type WorkFn = Box<dyn FnMut(Leadership) -> WorkFuture + Send>;
type Callback<T> = Option<Box<dyn FnMut(&T) + Send>>;

enum Work {
    Idle,
    Every(Duration, WorkFn),
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
    pub fn on_elected(mut self, f: impl FnMut(&Leadership) + Send + 'static) -> Self {
        self.on_elected = Some(Box::new(f));
        self
    }

    /// Called when a term ends, after the work has stopped.
    pub fn on_revoked(mut self, f: impl FnMut(&LostReason) + Send + 'static) -> Self {
        self.on_revoked = Some(Box::new(f));
        self
    }

    /// Called when another instance is seen leading a new term.
    pub fn on_follower(mut self, f: impl FnMut(&LeaderInfo) + Send + 'static) -> Self {
        self.on_follower = Some(Box::new(f));
        self
    }

    /// While leader, run `tick` every `period` (first at once). A tick is
    /// dropped the moment leadership is lost; a shutdown lets the running
    /// tick finish before the lease is released.
    pub fn every<F, Fut>(mut self, period: Duration, mut tick: F) -> Self
    where
        F: FnMut(Leadership) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.work = Work::Every(period, Box::new(move |term| Box::pin(tick(term))));
        self
    }

    /// While leader, run `work` once per term. It is dropped the moment
    /// leadership is lost; on shutdown `term.lost()` fires with
    /// [`LostReason::Shutdown`] and the work gets the grace period to return.
    /// If it returns by itself, the runner resigns and [`Runner::run_until`]
    /// returns: the job is done.
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
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = Some(grace);
        self
    }

    /// [`Runner::run_until`] SIGTERM or SIGINT (Ctrl-C).
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
            let end = lead_term(&term, &mut self.work, shutdown.as_mut(), grace).await;
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
            let mut ticker = interval(*period);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    reason = term.lost() => return TermEnd::Lost(reason),
                    _ = shutdown.as_mut() => return TermEnd::Shutdown,
                    _ = ticker.tick() => {}
                }
                let run = tick(term.clone());
                tokio::select! {
                    biased;
                    reason = term.lost() => return TermEnd::Lost(reason),
                    _ = run => {}
                }
            }
        }
        Work::Lead(start) => {
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
