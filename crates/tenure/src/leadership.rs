//! The handle a leader holds for one term.
//!
//! A [`Leadership`] is to a term what tokio-util's `CancellationToken` is to
//! a task: cheap to clone, safe to share with the work it guards, and able
//! to say at once whether acting is still allowed ([`Leadership::is_leader`],
//! no I/O) or to wake the work when it is not ([`Leadership::lost`]).
//!
//! A background *keeper* task renews the lease and ends the term; the handle
//! only reads the shared state and sends the keeper requests.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::term::LostReason;
use crate::{Error, Result};

/// State shared by every clone of a [`Leadership`] and its keeper.
pub(crate) struct TermShared {
    pub election: String,
    /// Shared by every term of one keeper.
    pub id: Arc<str>,
    pub token: u64,
    /// The deadline as the monotonic clock counts it, and the host's
    /// suspend time ([`crate::clock::suspended`]) when its renewal was sent.
    pub deadline: Mutex<(Instant, Duration)>,
    pub lost: watch::Sender<Option<LostReason>>,
    /// Cancelled when the term has ended: no more renewals will happen.
    pub ended: CancellationToken,
}

impl TermShared {
    /// A term whose deadline is `deadline` by the monotonic clock, set from
    /// a request sent when the host's suspend time read `suspended`.
    pub fn new(
        election: String,
        id: Arc<str>,
        token: u64,
        deadline: Instant,
        suspended: Duration,
    ) -> Self {
        let (lost, _) = watch::channel(None);
        TermShared {
            election,
            id,
            token,
            deadline: Mutex::new((deadline, suspended)),
            lost,
            ended: CancellationToken::new(),
        }
    }

    /// The deadline, moved earlier by any time the host spent suspended
    /// since the renewal that set it was sent.
    pub fn deadline(&self) -> Instant {
        let (deadline, suspended) = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        effective(deadline, suspended)
    }

    /// Move the deadline to `deadline`, set by a request sent when the
    /// suspend time read `suspended`. A deadline that has passed stays
    /// passed: nothing (a late reply, a renewal of another term) revives a
    /// term.
    pub fn set_deadline(&self, deadline: Instant, suspended: Duration) {
        let slept_until_now = crate::clock::suspended();
        let effective = |(deadline, since): (Instant, Duration)| {
            let slept = slept_until_now.saturating_sub(since);
            deadline.checked_sub(slept).unwrap_or_else(Instant::now)
        };
        let mut current = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        let now_effective = effective(*current);
        if Instant::now() < now_effective || effective((deadline, suspended)) < now_effective {
            *current = (deadline, suspended);
        }
    }

    /// End the term's right to act now: the deadline becomes the present
    /// instant, unless it is already earlier.
    pub fn clamp_deadline(&self) {
        let now = Instant::now();
        if self.deadline() > now {
            self.set_deadline(now, crate::clock::suspended());
        }
    }

    /// Record why the term is over; the first reason wins. Returns whether
    /// this call set it.
    pub fn mark_lost(&self, reason: LostReason) -> bool {
        self.lost.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        })
    }

    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lost.borrow().clone()
    }
}

/// `deadline` moved earlier by the suspend time since `suspended` was read.
fn effective(deadline: Instant, suspended: Duration) -> Instant {
    let slept = crate::clock::suspended().saturating_sub(suspended);
    deadline.checked_sub(slept).unwrap_or_else(Instant::now)
}

/// Requests from handles to the keeper task, addressed by the term:
/// (`election`, `token`), for keepers of many terms (partition sets).
pub(crate) enum Command {
    /// Renew now and report whether the term is still current.
    Confirm {
        election: String,
        token: u64,
        reply: oneshot::Sender<Result<Duration>>,
    },
    /// Mark the term lost with this reason, then release the lease.
    Resign {
        election: String,
        token: u64,
        reason: LostReason,
        reply: oneshot::Sender<Result<()>>,
    },
}

/// One term of leadership: the right to act until [`Leadership::lost`] fires.
///
/// Clones share the term. When every clone is dropped the keeper resigns in
/// the background (or, if the runtime is gone, the lease lapses after one
/// TTL); call [`Leadership::resign`] to hand over at a known point.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("reports").memory(&store).build().await?;
/// let term = election.campaign().await?;
/// println!("leading with fencing token {}", term.token());
/// if term.is_leader() {
///     // act, passing term.token() to anything that checks fencing tokens
/// }
/// term.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Leadership {
    shared: Arc<TermShared>,
    commands: mpsc::Sender<Command>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.shared.election)
            .field("id", &self.shared.id)
            .field("token", &self.shared.token)
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

impl Leadership {
    pub(crate) fn new(shared: Arc<TermShared>, commands: mpsc::Sender<Command>) -> Self {
        Leadership { shared, commands }
    }

    pub(crate) fn shared(&self) -> &Arc<TermShared> {
        &self.shared
    }

    /// The term's fencing token: larger than every token issued before in
    /// this election. Pass it to resources that reject stale leaders.
    pub fn token(&self) -> u64 {
        self.shared.token
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        &self.shared.election
    }

    /// This instance's id, as recorded in the lease.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Whether this instance may act as leader right now: the term has not
    /// been lost and its local deadline has not passed. No I/O; checked
    /// against the clock on every call, so a process that was paused learns
    /// the truth the moment it looks, not at its next renewal.
    pub fn is_leader(&self) -> bool {
        self.shared.lost_reason().is_none() && Instant::now() < self.shared.deadline()
    }

    /// The local deadline: the instant this term ends unless renewed.
    pub fn deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// Time left until the local deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.shared
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// Wait until the term is over and say why. Returns at once if it
    /// already is. Fires at the local deadline by itself, even if the keeper
    /// is stuck waiting on Redis.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs")
    ///     .memory(&store)
    ///     .ttl(std::time::Duration::from_millis(300))
    ///     .build()
    ///     .await?;
    /// let term = election.campaign().await?;
    /// store.steal("jobs", "someone-else", std::time::Duration::from_secs(15));
    /// // The work stops the moment the term ends, whatever it was doing.
    /// let reason = tokio::select! {
    ///     reason = term.lost() => reason,
    ///     _ = std::future::pending::<()>() => unreachable!(),
    /// };
    /// assert_eq!(reason.label(), "taken");
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes state.
    pub async fn lost(&self) -> LostReason {
        let mut lost = self.shared.lost.subscribe();
        loop {
            if let Some(reason) = lost.borrow_and_update().clone() {
                return reason;
            }
            if Instant::now() >= self.shared.deadline() {
                return LostReason::DeadlinePassed;
            }
            // The keeper's watchdog marks the term lost at its deadline
            // (see `crate::keeper`): no timer per handle.
            if lost.changed().await.is_err() {
                // Cannot happen while this handle holds the state; the
                // deadline still bounds the term.
                tokio::time::sleep_until(self.shared.deadline()).await;
            }
        }
    }

    /// The reason the term ended, or `None` while it is current (deadline
    /// checked too).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason().or_else(|| {
            (Instant::now() >= self.shared.deadline()).then_some(LostReason::DeadlinePassed)
        })
    }

    /// Renew the lease now, and succeed only if the term is still current
    /// afterwards: call it right before a side effect that must not happen
    /// twice. Returns the time left until the (new) deadline.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("mailer").memory(&store).build().await?;
    /// let term = election.campaign().await?;
    /// let time_left = term.confirm().await?; // still leader: send the e-mail now
    /// assert!(time_left > std::time::Duration::ZERO);
    /// store.revoke("mailer");
    /// assert!(term.confirm().await.is_err()); // not any more: do not send
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: the renewal, once sent, completes in the keeper.
    pub async fn confirm(&self) -> Result<Duration> {
        if let Some(reason) = self.lost_reason() {
            return Err(Error::NotLeader(reason));
        }
        let (reply, answer) = oneshot::channel();
        let command = Command::Confirm {
            election: self.shared.election.clone(),
            token: self.shared.token,
            reply,
        };
        if self.commands.send(command).await.is_err() {
            return Err(Error::NotLeader(
                self.lost_reason().unwrap_or(LostReason::Resigned),
            ));
        }
        match answer.await {
            Ok(result) => result,
            Err(_) => Err(Error::NotLeader(
                self.lost_reason().unwrap_or(LostReason::Resigned),
            )),
        }
    }

    /// End the term: stop being leader at once (every clone's
    /// [`Leadership::is_leader`] turns false before the lease is deleted),
    /// then release the lease and announce it so a waiting candidate takes
    /// over within milliseconds.
    ///
    /// An error means the release could not be confirmed (e.g. Redis is
    /// down); leadership is over all the same and the lease lapses at its TTL.
    ///
    /// # Cancel safety
    /// Cancel safe: once sent, the request is carried out by the keeper; the
    /// term is over either way.
    pub async fn resign(&self) -> Result<()> {
        self.resign_with(LostReason::Resigned).await
    }

    pub(crate) async fn resign_with(&self, reason: LostReason) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        let command = Command::Resign {
            election: self.shared.election.clone(),
            token: self.shared.token,
            reason: reason.clone(),
            reply,
        };
        if self.commands.send(command).await.is_err() {
            // The keeper already ended the term.
            self.shared.mark_lost(reason);
            return Ok(());
        }
        answer.await.unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::TermShared;
    use crate::clock;

    #[test]
    fn time_the_host_spent_suspended_ends_the_term() {
        // A runtime is needed for tokio's Instant; its clock is not paused:
        // only the simulated suspend moves.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let shared = TermShared::new(
                "jobs".into(),
                "a".into(),
                1,
                Instant::now() + Duration::from_secs(60),
                clock::suspended(),
            );
            assert!(shared.deadline() > Instant::now() + Duration::from_secs(59));
            // The host sleeps for two minutes: the monotonic clock did not
            // count them, the lease on the server did.
            clock::tests::SIMULATED.fetch_add(120_000_000_000, Ordering::Relaxed);
            assert!(
                shared.deadline() <= Instant::now(),
                "still leading after a suspend"
            );
            // A renewal sent before the suspend, answered after it, does not
            // revive the term.
            let before = clock::suspended() - Duration::from_secs(120);
            shared.set_deadline(Instant::now() + Duration::from_secs(60), before);
            assert!(shared.deadline() <= Instant::now());
        });
    }
}
