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

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::machine::{effective, LeaderState};
use crate::term::LostReason;
use crate::{Error, Result};

/// State shared by every clone of a [`Leadership`] and its keeper.
///
/// Kept small on purpose (a lock and one `Notify`, no channels): a partition
/// set holds one per partition, and there may be 100,000 of them.
pub(crate) struct TermShared {
    pub election: String,
    /// Shared by every term of one keeper.
    pub id: Arc<str>,
    pub token: u64,
    /// The deadline as the monotonic clock counts it, and the host's
    /// suspend time ([`crate::clock::suspended`]) when its renewal was sent.
    pub deadline: Mutex<(Instant, Duration)>,
    /// Why the term is over (the first reason given), and whether it has
    /// ended: no renewal will happen any more.
    ends: Mutex<Ends>,
    /// Woken when either changes.
    changed: Notify,
    /// Where [`Leadership::lock_fd`] gets the term's OS lock (SQLite).
    #[cfg(unix)]
    pub lock: std::sync::OnceLock<crate::backend::LockSource>,
}

#[derive(Default)]
struct Ends {
    lost: Option<LostReason>,
    ended: bool,
}

impl TermShared {
    /// A term as the state machine began it (its token and deadline).
    pub fn new(election: String, id: Arc<str>, state: &LeaderState) -> Self {
        TermShared {
            election,
            id,
            token: state.token,
            deadline: Mutex::new((state.deadline, state.suspended)),
            ends: Mutex::new(Ends::default()),
            changed: Notify::new(),
            #[cfg(unix)]
            lock: std::sync::OnceLock::new(),
        }
    }

    fn ends(&self) -> std::sync::MutexGuard<'_, Ends> {
        self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deadline, moved earlier by any time the host spent suspended
    /// since the renewal that set it was sent (for time left and timers:
    /// whether it has passed is [`TermShared::passed`]).
    pub fn deadline(&self) -> Instant {
        // Long past: now, which is no later than any instant read after.
        self.deadline_as_of(crate::clock::suspended())
            .unwrap_or_else(Instant::now)
    }

    /// The deadline with the suspend time read as `slept`; `None` when it
    /// is before any instant the clock can name (a host suspended longer
    /// than it has been awake since the renewal): long past.
    pub fn deadline_as_of(&self, slept: Duration) -> Option<Instant> {
        let (deadline, suspended) = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        effective(deadline, suspended, slept)
    }

    /// Whether the deadline has passed at `now`: a deadline long past
    /// (`None`) has, whatever `now` is.
    pub fn passed(&self, now: Instant) -> bool {
        self.deadline_as_of(crate::clock::suspended())
            .is_none_or(|deadline| now >= deadline)
    }

    /// Mirror the deadline the state machine keeps for this term (see
    /// [`crate::machine`]: its verdict is final, and it never moves a
    /// passed deadline or revives a term).
    pub fn mirror(&self, state: &LeaderState) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) =
            (state.deadline, state.suspended);
    }

    /// Record why the term is over; the first reason wins. Returns whether
    /// this call set it.
    pub fn mark_lost(&self, reason: LostReason) -> bool {
        let set = {
            let mut ends = self.ends();
            if ends.lost.is_none() {
                ends.lost = Some(reason);
                true
            } else {
                false
            }
        };
        if set {
            self.changed.notify_waiters();
        }
        set
    }

    pub fn lost_reason(&self) -> Option<LostReason> {
        self.ends().lost.clone()
    }

    pub fn is_lost(&self) -> bool {
        self.ends().lost.is_some()
    }

    /// Record that the term has ended: no renewal will happen any more.
    pub fn mark_ended(&self) {
        self.ends().ended = true;
        self.changed.notify_waiters();
    }

    #[cfg(test)]
    pub fn has_ended(&self) -> bool {
        self.ends().ended
    }

    /// Wait until `done` holds of the term's ends. (The `Notify` is armed
    /// before the check, so a change between the check and the wait is not
    /// missed.)
    async fn until<T>(&self, mut done: impl FnMut(&Ends) -> Option<T>) -> T {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(value) = done(&self.ends()) {
                return value;
            }
            changed.await;
        }
    }

    /// Wait until the term has ended.
    pub async fn ended(&self) {
        self.until(|ends| ends.ended.then_some(())).await;
    }

    /// Wait until a reason is recorded.
    pub async fn lost(&self) -> LostReason {
        self.until(|ends| ends.lost.clone()).await
    }
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
    /// Record a successful run by this term, kept for `keep` (the store
    /// call runs beside the keeper, not in its way).
    RecordRun {
        election: String,
        token: u64,
        keep: Duration,
        /// The scheduled slot claimed (ms since the Unix epoch), if any.
        slot: Option<u64>,
        reply: oneshot::Sender<Result<bool>>,
    },
}

impl Command {
    /// The term the command is for: (election, token).
    pub fn term(&self) -> (&str, u64) {
        match self {
            Command::Confirm {
                election, token, ..
            }
            | Command::Resign {
                election, token, ..
            }
            | Command::RecordRun {
                election, token, ..
            } => (election, *token),
        }
    }
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

    /// On a SQLite store, a new duplicate of the OS lock this term holds on
    /// its election; `None` on every other store, and once the term has
    /// let go of its lock.
    ///
    /// On one host, a follower takes over the instant the leader's process
    /// dies: the kernel lets go of this lock then. When the leader's work
    /// runs in another process (a child it started), hand that process a
    /// duplicate and keep it open there until the work is done: the lock,
    /// and so the election, stays held until both have let go, so a
    /// follower takes over at once only when the work is gone too (and
    /// otherwise when the lease expires). `tenure run` passes it to the
    /// guardian of its command. Never pass it to a process that outlives
    /// the work: the election would then wait for every lease to expire.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let term = election.campaign().await?;
    /// assert!(term.lock_fd().is_none(), "only SQLite terms hold an OS lock");
    /// # Ok(()) }
    /// ```
    #[cfg(unix)]
    pub fn lock_fd(&self) -> Option<std::os::fd::OwnedFd> {
        self.shared.lock.get().and_then(|source| source())
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
        self.shared.lost_reason().is_none() && !self.shared.passed(Instant::now())
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
        if self.shared.passed(Instant::now()) {
            return self
                .shared
                .lost_reason()
                .unwrap_or(LostReason::DeadlinePassed);
        }
        // The keeper's watchdog records the loss at the deadline (see
        // `crate::keeper`): no timer per handle.
        self.shared.lost().await
    }

    /// The reason the term ended, or `None` while it is current (deadline
    /// checked too).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason().or_else(|| {
            self.shared
                .passed(Instant::now())
                .then_some(LostReason::DeadlinePassed)
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

    /// Record in the store that the election's work ran successfully,
    /// now: [`crate::Election::since_last_run`] (on any instance) then
    /// counts from this instant, by the store's clock, and the store keeps
    /// the record for at least `keep` (at most a hundred years). Returns `false` when refused: the
    /// lease is no longer held by this term (a stale leader cannot record a
    /// run), or a newer term has recorded one.
    ///
    /// This is the marker that [`crate::Runner::every`] and `tenure run
    /// --at-most-every` keep; call it after work that must not run twice
    /// within a period, once it has completed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::Duration;
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("reports").memory(&store).build().await?;
    /// let term = election.campaign().await?;
    /// // ... send the reports ...
    /// assert!(term.record_run(Duration::from_secs(3600)).await?);
    /// assert!(election.since_last_run().await?.is_some());
    /// term.resign().await?;
    /// assert!(!term.record_run(Duration::from_secs(3600)).await?, "the term is over");
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: once sent, the record is made (or refused) all the same.
    pub async fn record_run(&self, keep: Duration) -> Result<bool> {
        self.record(keep, None).await
    }

    /// Claim the scheduled slot `slot` for this term: record in the store,
    /// as [`Leadership::record_run`] does, that the run of the slot at
    /// that instant has started. Returns `false` when refused: this term no
    /// longer holds the lease, or a slot at or after `slot` was claimed
    /// already (by this term or any other). So each slot is claimed at most
    /// once, in order, across failovers: run the slot's work only after a
    /// `true`. [`crate::Election::last_slot`] reads the last slot claimed.
    ///
    /// This is the marker [`crate::Runner::cron`] and `tenure run --cron`
    /// keep. Slots are compared to the millisecond; earlier ones are
    /// refused from then on.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// use std::time::{Duration, SystemTime};
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("report").memory(&store).build().await?;
    /// let term = election.campaign().await?;
    /// let two_am = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_263_200);
    /// let keep = Duration::from_secs(2 * 24 * 3600);
    /// assert!(term.claim_slot(two_am, keep).await?);
    /// assert!(!term.claim_slot(two_am, keep).await?, "a slot is claimed once");
    /// assert_eq!(election.last_slot().await?, Some(two_am));
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: once sent, the claim is made (or refused) all the
    /// same; a claim cancelled before its answer may have been made, so
    /// read [`crate::Election::last_slot`] before trying again.
    pub async fn claim_slot(&self, slot: std::time::SystemTime, keep: Duration) -> Result<bool> {
        let Some(ms) = crate::runner::slot_ms(slot) else {
            return Err(crate::Error::Config(format!(
                "a slot must be after 1970 and before the year 584,556,019: {slot:?}"
            )));
        };
        self.record(keep, Some(ms)).await
    }

    async fn record(&self, keep: Duration, slot: Option<u64>) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        let command = Command::RecordRun {
            election: self.shared.election.clone(),
            token: self.shared.token,
            keep,
            slot,
            reply,
        };
        if self.commands.send(command).await.is_err() {
            // The keeper is gone: the term is over.
            return Ok(false);
        }
        answer.await.unwrap_or(Ok(false))
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
    use std::time::Duration;

    use tokio::time::Instant;

    use super::TermShared;
    use crate::clock::{self, Reading};
    use crate::machine::{LeaderState, RenewReply, Timing};

    #[test]
    fn time_the_host_spent_suspended_ends_the_term() {
        // A runtime is needed for tokio's Instant; its clock is not paused:
        // only the simulated suspend moves.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut state = LeaderState {
                token: 1,
                deadline: Instant::now() + Duration::from_secs(60),
                suspended: clock::suspended(),
                next_renewal: Instant::now(),
            };
            let shared = TermShared::new("jobs".into(), "a".into(), &state);
            assert!(shared.deadline() > Instant::now() + Duration::from_secs(59));
            // The host sleeps for two minutes: the monotonic clock did not
            // count them, the lease on the server did.
            clock::tests::simulate_suspend(Duration::from_secs(120));
            assert!(
                shared.deadline() <= Instant::now(),
                "still leading after a suspend"
            );
            // A renewal sent before the suspend, answered after it, does not
            // revive the term.
            let timing = Timing::new(
                Duration::from_secs(61),
                None,
                Some(Duration::from_secs(1)),
                None,
            )
            .expect("timing");
            let before = Reading {
                now: Instant::now(),
                slept: clock::suspended() - Duration::from_secs(120),
            };
            state.after_renew(&timing, before, Reading::take(), Some(RenewReply::Renewed));
            shared.mirror(&state);
            assert!(shared.deadline() <= Instant::now());
        });
    }
}
