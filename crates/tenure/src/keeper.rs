//! The keeper: the one place where terms begin, are renewed and end.
//!
//! An [`Election`](crate::Election) keeps one term at a time and a
//! [`PartitionSet`](crate::PartitionSet) thousands, but every term needs the
//! same things done the same way: its [`Leadership`] handles made, its
//! deadline moved only by a renewal that succeeded (never revived), its end
//! recorded once with the first reason, its handles told at once, and its
//! metrics and logs written. The [`Keeper`] does all of that for any number
//! of terms, so none of it is written twice. How and when renewals are sent
//! stays with the owner: an election renews its one term on its own
//! schedule, a partition set renews all of its terms in one batch per
//! interval. Either way the replies come back here ([`Keeper::renewed`]).
//!
//! Handles reach their keeper through one channel per keeper, with
//! commands addressed by term, (name, token): a handle of a term that has
//! ended can never act on a later term of the same name
//! ([`Keeper::index_of`]).
//!
//! **Deadlines.** A term ends at its deadline whether or not its keeper is
//! able to act then (it may be waiting on a slow store). Each keeper has a
//! [`Watchdog`], a task of its own with one timer for all of the keeper's
//! terms: at the earliest deadline it marks every term that is past its
//! deadline lost, which wakes their [`Leadership::lost`] futures. One timer
//! per keeper instead of one per handle: a set of 100,000 partitions whose
//! deadlines move together wakes once per renewal, not 100,000 times.
//! [`Leadership::is_leader`] does not wait for it: it reads the clock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::{sleep_until, Instant};

use crate::clock::Reading;
use crate::leadership::{Command, TermShared};
use crate::machine::{LeaderState, LeaderStep, RenewReply, Timing};
use crate::term::LostReason;
use crate::{metrics, Leadership};

/// How a keeper labels its metrics.
#[derive(Debug, Clone)]
pub(crate) enum Report {
    /// One series per term's name (`name="ELECTION"`): elections, and
    /// partition sets that asked for per-partition metrics.
    PerTerm,
    /// One series for the whole set (`name="GROUP"`), plus the number of
    /// terms held: the default for partition sets, whose label count must
    /// not grow with the number of partitions.
    Group(String),
}

/// One term being kept, with what its owner keeps beside it.
pub(crate) struct Kept<T> {
    pub state: LeaderState,
    pub shared: Arc<TermShared>,
    pub extra: T,
}

/// The terms of one owner, by index (an election has index 0; a partition set
/// uses the partition's index).
pub(crate) struct Keeper<T> {
    id: Arc<str>,
    terms: BTreeMap<usize, Kept<T>>,
    /// Weak, so that the channel closes when the owner's handles (and its
    /// own sender, if it keeps one) are gone: an election's keeper learns
    /// that every handle of its term was dropped.
    commands: mpsc::WeakSender<Command>,
    report: Report,
    /// Term starts and ends are logged at info (an election) or at debug
    /// (thousands of partitions).
    loud: bool,
    /// See [`Keeper::generation`]; starts at 1, so that 0 means "never seen".
    generation: u64,
    watchdog: Arc<Watchdog>,
}

/// The terms of one keeper, as its watchdog task sees them.
#[derive(Default)]
struct Watchdog {
    watched: Mutex<Watched>,
    /// Set when the keeper is gone: the task ends once no term is left.
    closed: std::sync::atomic::AtomicBool,
    /// A term began (its deadline may be the earliest), or the keeper went
    /// away.
    changed: Notify,
}

/// The terms a watchdog watches, and when it wakes next (`None`: only when
/// told), under one lock so that a term that begins and the watchdog going
/// to sleep agree on whether it must be woken.
#[derive(Default)]
struct Watched {
    terms: BTreeMap<(usize, u64), Arc<TermShared>>,
    wakes_at: Option<Instant>,
}

impl Watchdog {
    fn watched(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mark every term past its deadline lost, forget ended ones, and
    /// return (and record) the earliest deadline left.
    fn sweep(&self) -> Option<Instant> {
        let at = Reading::take();
        let mut earliest: Option<Instant> = None;
        let mut watched = self.watched();
        watched.terms.retain(|_, shared| {
            if shared.is_lost() {
                return false;
            }
            let deadline = match shared.deadline_as_of(at.slept) {
                Some(deadline) if deadline > at.now => deadline,
                // Passed, or long past.
                _ => {
                    shared.mark_lost(LostReason::DeadlinePassed);
                    return false;
                }
            };
            earliest = Some(earliest.map_or(deadline, |e| e.min(deadline)));
            true
        });
        watched.wakes_at = earliest;
        earliest
    }

    /// The watchdog task: runs until its keeper is gone and every term it
    /// watched has ended, so that terms outlive a dropped keeper only until
    /// their deadlines.
    async fn run(self: Arc<Self>) {
        loop {
            match self.sweep() {
                Some(at) => {
                    tokio::select! {
                        _ = sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                None if self.closed.load(std::sync::atomic::Ordering::SeqCst) => return,
                None => self.changed.notified().await,
            }
        }
    }
}

impl<T> Keeper<T> {
    /// A keeper for instance `id` whose handles send to `commands`.
    pub fn new(id: &str, commands: &mpsc::Sender<Command>, report: Report, loud: bool) -> Self {
        Keeper {
            id: Arc::from(id),
            terms: BTreeMap::new(),
            commands: commands.downgrade(),
            report,
            loud,
            generation: 1,
            watchdog: {
                let watchdog = Arc::new(Watchdog::default());
                tokio::spawn(watchdog.clone().run());
                watchdog
            },
        }
    }

    /// Begin a term: an acquire won `state`. Returns its first handle.
    pub fn begin(&mut self, index: usize, name: &str, state: LeaderState, extra: T) -> Leadership {
        let shared = Arc::new(TermShared::new(name.to_string(), self.id.clone(), &state));
        if self.loud {
            tracing::info!(election = %name, id = %self.id, token = state.token, "elected leader");
        } else {
            tracing::debug!(partition = %name, token = state.token, "partition acquired");
        }
        // With the channel closed (the owner is going away) the handle's
        // requests fail as if the keeper had ended.
        let commands = self
            .commands
            .upgrade()
            .unwrap_or_else(|| mpsc::channel(1).0);
        let term = Leadership::new(shared.clone(), commands);
        let token = state.token;
        // An index holds one term: one still there (never the case when the
        // owner follows the protocol) ends before the next begins.
        self.end(index, LostReason::Resigned);
        self.generation += 1;
        {
            let mut watched = self.watchdog.watched();
            watched.terms.insert((index, token), shared.clone());
            // Only a deadline before the watchdog's next wake needs it now
            // (a new term's deadline rarely is: a set's thousands of new
            // terms must not make it look at every term thousands of times).
            if watched.wakes_at.is_none_or(|at| shared.deadline() < at) {
                watched.wakes_at = Some(shared.deadline());
                self.watchdog.changed.notify_one();
            }
        }
        self.terms.insert(
            index,
            Kept {
                state,
                shared,
                extra,
            },
        );
        match &self.report {
            Report::PerTerm => metrics::elected(name, token),
            Report::Group(group) => metrics::group_elected(group, self.terms.len()),
        }
        term
    }

    /// End the term in `index`, if any: record `reason` (unless one was
    /// recorded before), take away its right to act now, and tell its
    /// handles. Returns it, for the owner to release its lease.
    pub fn end(&mut self, index: usize, reason: LostReason) -> Option<Kept<T>> {
        let mut kept = self.terms.remove(&index)?;
        self.generation += 1;
        self.watchdog
            .watched()
            .terms
            .remove(&(index, kept.state.token));
        let shared = &kept.shared;
        shared.mark_lost(reason.clone());
        // No clone of a handle may believe in the term any more.
        kept.state.end(Reading::take());
        shared.mirror(&kept.state);
        shared.mark_ended();
        let reason = shared.lost_reason().unwrap_or(reason);
        let name = &shared.election;
        match (&reason, self.loud) {
            (_, false) => {
                tracing::debug!(partition = %name, token = shared.token, %reason, "partition released")
            }
            (LostReason::Resigned | LostReason::Shutdown, true) => {
                tracing::info!(election = %name, token = shared.token, %reason, "leadership ended")
            }
            (_, true) => {
                tracing::warn!(election = %name, token = shared.token, %reason, "leadership lost")
            }
        }
        match &self.report {
            Report::PerTerm => metrics::lost(name, &reason),
            Report::Group(group) => metrics::group_lost(group, &reason, self.terms.len()),
        }
        Some(kept)
    }

    /// Apply the reply to a renewal of `index`'s term sent at `sent`: `None`
    /// when it failed or timed out. The state machine moves the deadline
    /// (or ends the term), and its verdict is applied here: the term's
    /// handles see its deadline, and a term it ends ends here.
    pub fn renewed(
        &mut self,
        index: usize,
        timing: &Timing,
        sent: Reading,
        reply: Option<RenewReply>,
    ) -> Option<LeaderStep> {
        let slept = crate::clock::suspended();
        self.renewed_as_of(index, timing, sent, reply, slept)
    }

    /// [`Keeper::renewed`] with the host's suspend time read as `slept`,
    /// once for a whole batch (it costs two clock reads). The time itself is
    /// read here, for each term: a deadline that passed while the batch was
    /// being handled must count as passed.
    pub fn renewed_as_of(
        &mut self,
        index: usize,
        timing: &Timing,
        sent: Reading,
        reply: Option<RenewReply>,
        slept: Duration,
    ) -> Option<LeaderStep> {
        let now = Instant::now();
        let at = Reading { now, slept };
        let kept = self.terms.get_mut(&index)?;
        match (&self.report, reply.is_some()) {
            (Report::PerTerm, true) => metrics::renewed(&kept.shared.election, now - sent.now),
            (Report::PerTerm, false) => metrics::renewal_failed(&kept.shared.election),
            // A set reports its batches, not every term in them.
            (Report::Group(_), _) => {}
        }
        let step = kept.state.after_renew(timing, sent, at, reply);
        kept.shared.mirror(&kept.state);
        if let LeaderStep::Lost(reason) = &step {
            self.end(index, reason.clone());
        }
        Some(step)
    }

    /// The index of the term (`index`, `token`) if it is still kept: a
    /// command from a handle of an ended term finds nothing, even when a
    /// later term of the same name is kept.
    pub fn index_of(&self, index: Option<usize>, token: u64) -> Option<usize> {
        let index = index?;
        self.terms
            .get(&index)
            .filter(|kept| kept.state.token == token)
            .map(|_| index)
    }

    pub fn get(&self, index: usize) -> Option<&Kept<T>> {
        self.terms.get(&index)
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut Kept<T>> {
        self.terms.get_mut(&index)
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &Kept<T>)> {
        self.terms.iter().map(|(index, kept)| (*index, kept))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut Kept<T>)> {
        self.terms.iter_mut().map(|(index, kept)| (*index, kept))
    }

    pub fn indexes(&self) -> Vec<usize> {
        self.terms.keys().copied().collect()
    }

    /// Moves on whenever a term begins or ends.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn contains(&self, index: usize) -> bool {
        self.terms.contains_key(&index)
    }

    /// Record a batch of renewals as a set's one measurement.
    pub fn batch_renewed(&self, latency: Duration, failed: bool) {
        if let Report::Group(group) = &self.report {
            if failed {
                metrics::renewal_failed(group);
            } else {
                metrics::renewed(group, latency);
            }
        }
    }
}

impl<T> Drop for Keeper<T> {
    fn drop(&mut self) {
        // The watchdog ends once the terms it still watches are over.
        self.watchdog
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.watchdog.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Timing;

    fn timing() -> Timing {
        Timing::new(Duration::from_secs(3), None, None, None).expect("valid timing")
    }

    /// `now` on a host that was never suspended.
    fn never_suspended(now: Instant) -> Reading {
        Reading {
            now,
            slept: Duration::ZERO,
        }
    }

    fn state(token: u64) -> LeaderState {
        let now = Instant::now();
        LeaderState {
            token,
            deadline: now + Duration::from_secs(2),
            suspended: Duration::ZERO,
            next_renewal: now + Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn a_command_from_an_ended_term_never_reaches_a_later_term_of_the_name() {
        let (tx, _rx) = mpsc::channel(1);
        let mut keeper: Keeper<()> = Keeper::new("me", &tx, Report::PerTerm, false);
        let first = keeper.begin(3, "p", state(10), ());
        keeper.end(3, LostReason::Resigned);
        assert!(!first.is_leader());
        let second = keeper.begin(3, "p", state(11), ());
        assert_eq!(keeper.index_of(Some(3), first.token()), None);
        assert_eq!(keeper.index_of(Some(3), second.token()), Some(3));
        assert!(second.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_the_deadline_while_the_keeper_does_nothing() {
        let (tx, _rx) = mpsc::channel(1);
        let mut keeper: Keeper<()> = Keeper::new("me", &tx, Report::PerTerm, false);
        let start = Instant::now();
        let term = keeper.begin(0, "e", state(1), ());
        let reason = term.lost().await;
        assert_eq!(reason, LostReason::DeadlinePassed);
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        // Even with the keeper gone: the watchdog outlives it.
        let second = keeper.begin(1, "f", state(2), ());
        drop(keeper);
        assert_eq!(second.lost().await, LostReason::DeadlinePassed);
        assert_eq!(Instant::now() - start, Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_handled_after_a_deadline_does_not_revive_the_term() {
        let (tx, _rx) = mpsc::channel(1);
        let mut keeper: Keeper<()> = Keeper::new("me", &tx, Report::Group("g".into()), false);
        let term = keeper.begin(0, "p", state(1), ());
        // The batch's clocks were read just before the deadline (2 s), its
        // replies are handled just after it.
        let sent = Instant::now() + Duration::from_millis(1_900);
        tokio::time::advance(Duration::from_millis(1_990)).await;
        let slept = crate::clock::suspended();
        tokio::time::advance(Duration::from_millis(20)).await;
        let step = keeper.renewed_as_of(
            0,
            &timing(),
            Reading {
                now: sent,
                slept: Duration::ZERO,
            },
            Some(RenewReply::Renewed),
            slept,
        );
        assert_eq!(step, Some(LeaderStep::Lost(LostReason::DeadlinePassed)));
        assert!(!term.is_leader());
    }

    #[tokio::test]
    async fn a_term_ends_once_with_its_first_reason() {
        let (tx, _rx) = mpsc::channel(1);
        let mut keeper: Keeper<()> = Keeper::new("me", &tx, Report::Group("g".into()), true);
        let term = keeper.begin(0, "e", state(1), ());
        term.shared().mark_lost(LostReason::Shutdown);
        assert!(keeper.end(0, LostReason::DeadlinePassed).is_some());
        assert!(keeper.end(0, LostReason::Resigned).is_none());
        assert_eq!(term.lost_reason(), Some(LostReason::Shutdown));
        assert!(term.shared().has_ended());
    }

    /// A renewal that fails after the host slept must not give the sleep
    /// back: the lease kept expiring meanwhile (before the state machine
    /// owned deadlines, the keeper paired the old deadline with the failed
    /// renewal's suspend reading, moving it later by the suspend).
    #[tokio::test]
    async fn a_failed_renewal_after_a_suspend_does_not_give_the_suspend_back() {
        let (tx, _rx) = mpsc::channel(1);
        let mut keeper: Keeper<()> = Keeper::new("me", &tx, Report::PerTerm, false);
        let mut first = state(1);
        first.suspended = crate::clock::suspended();
        let term = keeper.begin(0, "e", first, ());
        let before = term.deadline();
        crate::clock::tests::simulate_suspend(Duration::from_millis(500));
        assert!(term.deadline() + Duration::from_millis(400) <= before);
        let step = keeper.renewed(0, &timing(), Reading::take(), None);
        assert!(matches!(step, Some(LeaderStep::RenewAt(_))), "{step:?}");
        assert!(
            term.deadline() + Duration::from_millis(400) <= before,
            "the failed renewal gave the suspended time back"
        );
    }

    #[tokio::test]
    async fn a_failed_renewal_never_moves_the_deadline_and_a_late_one_ends_the_term() {
        let (tx, _rx) = mpsc::channel(1);
        let mut keeper: Keeper<()> = Keeper::new("me", &tx, Report::PerTerm, false);
        let term = keeper.begin(0, "e", state(1), ());
        let deadline = term.deadline();
        let step = keeper.renewed(0, &timing(), never_suspended(Instant::now()), None);
        assert!(matches!(step, Some(LeaderStep::RenewAt(_))));
        assert_eq!(term.deadline(), deadline);
        // A term past its deadline is over, whatever a reply says: even a
        // success sent just now does not revive it.
        let mut late = state(2);
        late.deadline = Instant::now() - Duration::from_millis(1);
        let term = keeper.begin(1, "f", late, ());
        let step = keeper.renewed(
            1,
            &timing(),
            never_suspended(Instant::now()),
            Some(RenewReply::Renewed),
        );
        assert_eq!(step, Some(LeaderStep::Lost(LostReason::DeadlinePassed)));
        assert!(!term.is_leader());
        assert!(!keeper.contains(1));
    }
}
