//! Periodic work ([`Runner::every`]): what a tick returns, the loop that
//! runs ticks while leader, and how a completed tick is recorded in the
//! store as the term's last run. Apart from the runner's campaign loop,
//! because the at-most-once-per-period schedule is its own concern, read
//! from and written to the store.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use super::{TermEnd, TickFn, TickFuture};
use crate::{Election, Leadership};

#[cfg(doc)]
use super::Runner;

/// What a [`Runner::every`] tick returns: `()` (always a success), or a
/// `Result` whose `Err` marks a failed tick, which is logged with the
/// error, not recorded as a run, and tried again sooner.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("billing").memory(&store).build().await?;
/// election
///     .runner()
///     .every(Duration::from_secs(60), |term| async move {
///         charge_due_invoices(term.token()).await?; // an Err is retried
///         Ok::<(), std::io::Error>(())
///     })
///     .run_until(tokio::time::sleep(Duration::from_millis(50)))
///     .await?;
/// # Ok(()) }
/// # async fn charge_due_invoices(_: u64) -> std::io::Result<()> { Ok(()) }
/// ```
pub trait TickOutcome: Send + 'static {
    /// `None` for a success; for a failure, what went wrong (for the log).
    fn failure(self) -> Option<String>;
}

impl TickOutcome for () {
    fn failure(self) -> Option<String> {
        None
    }
}

impl<T: Send + 'static, E: Display + Send + 'static> TickOutcome for std::result::Result<T, E> {
    fn failure(self) -> Option<String> {
        self.err().map(|err| err.to_string())
    }
}

/// Run `tick` at most once per `period` while `term` lasts (see
/// [`Runner::every`]), until it is lost or shutdown is requested.
pub(super) async fn lead_every(
    election: &Election,
    term: &Leadership,
    period: Duration,
    tick: &mut TickFn,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    grace: Duration,
) -> TermEnd {
    let retry = period.min(election.ttl());
    // Until the leader has recorded a tick of its own, the store
    // says when the next is due; after one, it is due a period
    // after the record was confirmed (only this term can record
    // while it holds the lease, so asking again would tell nothing
    // new; on etcd it would round the age down and add a second).
    let mut due: Option<Instant> = None;
    loop {
        // The wait before the next tick, and whether the store is
        // to be asked again after it.
        let next = next_wait(election, term, shutdown.as_mut(), due.take(), period, retry);
        let (wait, ask_again) = match next.await {
            Ok(next) => next,
            Err(end) => return end,
        };
        if !wait.is_zero() {
            if let Err(end) = sleep_in_term(term, shutdown.as_mut(), wait).await {
                return end;
            }
        }
        if ask_again {
            // Another leader's record is the store's to tell (and
            // a run recorded by a term this instance lost, too).
            continue;
        }
        let run = tick(term.clone());
        let failure =
            match run_tick(election, term, run, shutdown.as_mut(), Some(period), grace).await {
                Ok(failure) => failure,
                Err(end) => return end,
            };
        if let Some(failure) = failure {
            tracing::warn!(election = %election.name(), error = %failure, retry = ?retry, "tick failed; not recorded as a run, trying again");
            due = Some(later(retry));
            continue;
        }
        record(election, term, period).await;
        // Whether or not the store took the record, this leader
        // knows the tick ran: the next is due a period from now.
        due = Some(later(period));
    }
}

/// The wait before the next tick (until `due`, if this term knows it; else
/// as the store's last-run marker says), and whether the store is to be
/// asked again after it. `Err` if the term ends meanwhile.
async fn next_wait(
    election: &Election,
    term: &Leadership,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    due: Option<Instant>,
    period: Duration,
    retry: Duration,
) -> Result<(Duration, bool), TermEnd> {
    Ok(match due {
        Some(at) => (at.saturating_duration_since(Instant::now()), false),
        None => {
            let asked = tokio::select! {
                biased;
                reason = term.lost() => return Err(TermEnd::Lost(reason)),
                _ = shutdown.as_mut() => return Err(TermEnd::Shutdown),
                asked = election.since_last_run() => asked,
            };
            match asked {
                Ok(Some(age)) if age < period => (period - age, true),
                Ok(_) => (Duration::ZERO, false),
                Err(err) => {
                    tracing::warn!(election = %election.name(), error = %err, retry = ?retry, "cannot read when the work last ran; no tick until it can be read");
                    (retry, true)
                }
            }
        }
    })
}

/// Sleep `wait`, unless the term is lost or shutdown is requested first
/// (`Err`).
pub(super) async fn sleep_in_term(
    term: &Leadership,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    wait: Duration,
) -> Result<(), TermEnd> {
    tokio::select! {
        biased;
        reason = term.lost() => Err(TermEnd::Lost(reason)),
        _ = shutdown.as_mut() => Err(TermEnd::Shutdown),
        _ = tokio::time::sleep(wait) => Ok(()),
    }
}

/// Run one tick: its failure, if it failed (`Ok(None)` for a success), or
/// `Err` if the term is lost or shutdown is requested meanwhile. A tick
/// that completes within the shutdown grace is recorded as a run kept for
/// `record`, if given.
pub(super) async fn run_tick(
    election: &Election,
    term: &Leadership,
    run: TickFuture,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    record: Option<Duration>,
    grace: Duration,
) -> Result<Option<String>, TermEnd> {
    tokio::pin!(run);
    tokio::select! {
        biased;
        reason = term.lost() => Err(TermEnd::Lost(reason)),
        failure = &mut run => Ok(failure),
        _ = shutdown.as_mut() => {
            // The running tick gets the shutdown grace to
            // finish (and be recorded) while the keeper keeps
            // the lease; then it is dropped.
            let finished = tokio::select! {
                biased;
                _ = term.lost() => None,
                failure = &mut run => Some(failure),
                _ = tokio::time::sleep(grace) => {
                    tracing::warn!(election = %election.name(), ?grace, "tick did not finish within the shutdown grace; dropping it");
                    None
                }
            };
            if let (Some(None), Some(period)) = (finished, record) {
                self::record(election, term, period).await;
            }
            Err(TermEnd::Shutdown)
        }
    }
}

/// Record a completed tick as the last run, logging a refusal or failure.
async fn record(election: &Election, term: &Leadership, period: Duration) {
    match term.record_run(period).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(election = %election.name(), token = term.token(), "the tick completed, but the store refused to record it: this term no longer holds the lease, and the next leader may run it again");
        }
        Err(err) => {
            tracing::warn!(election = %election.name(), error = %err, "the tick completed, but could not be recorded; the next leader may run it again");
        }
    }
}

/// The instant `wait` from now, or a century away if that overflows (a
/// period of `Duration::MAX` means "once").
fn later(wait: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
