//! Periodic work ([`Runner::every`]): what a tick returns, and how a
//! completed tick is recorded in the store as the term's last run. Apart
//! from the runner's loop, because the at-most-once-per-period schedule is
//! its own concern, read from and written to the store.

use std::fmt::Display;
use std::time::Duration;

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

/// Record a completed tick as the last run, logging a refusal or failure.
pub(super) async fn record(election: &Election, term: &Leadership, period: Duration) {
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
pub(super) fn later(wait: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
