//! Campaigning: acquire attempts, following a leader until its lease would
//! expire or a release is announced, and pacing so that announcements are
//! hints that never delay a failover beyond the lease's own expiry.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::keep::{keep, lease_changed, TERM};
use super::Election;
use crate::backend::Notices;
use crate::keeper::{Keeper, Report};
use crate::machine::{
    after_acquire, AcquireReply, AcquireRequest, CandidateStep, LeaderState, Reading,
};
use crate::term::{Holder, LeaderInfo};
use crate::{Leadership, Result};

impl Election {
    /// Campaign until this instance is leader, then return the term.
    ///
    /// Transient failures (Redis down, timeouts) are retried with backoff;
    /// errors that need a person (credentials, ACL, foreign data) are returned.
    ///
    /// # Cancel safety
    /// If cancelled while an acquire is in flight, a term may have been won
    /// that nobody renews; the next `campaign` (or `try_campaign`) of this
    /// `Election` retries the same attempt and so adopts it at once. Left
    /// alone, it lapses after one TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
    /// let store = tenure::MemoryStore::new();
    /// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
    /// let term = election.campaign().await?;
    /// assert!(term.is_leader());
    /// assert_eq!(store.holder("jobs").map(|h| h.token), Some(term.token()));
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self) -> Result<Leadership> {
        self.campaign_observed(|_| {}).await
    }

    /// [`Election::campaign`], calling `on_follower` each time another
    /// instance is seen leading with a new term.
    pub(crate) async fn campaign_observed(
        &self,
        mut on_follower: impl FnMut(&LeaderInfo),
    ) -> Result<Leadership> {
        let timing = &self.inner.timing;
        let mut notices = self.inner.backend.notices();
        let mut attempt = self.inner.attempts.begin();
        let mut failures: u32 = 0;
        let mut last_seen_token = None;
        let mut announced_hold_off = false;
        let mut pace = Pace::default();
        loop {
            let seen = *notices.borrow_and_update();
            let sent_at = Reading::take();
            let sent = sent_at.now;
            let reply = self.acquire_counted(&attempt.name, &mut failures).await?;
            let now_at = Reading::take();
            match after_acquire(timing, sent_at, now_at, reply, self.jitter(), failures) {
                CandidateStep::Elected(state) => {
                    attempt.won();
                    return Ok(self.start_term(state));
                }
                CandidateStep::Follow { until, holder } => {
                    if last_seen_token != Some(holder.token) {
                        last_seen_token = Some(holder.token);
                        self.note_holder(&holder);
                        tracing::debug!(election = %self.inner.name, leader = ?holder.id, token = holder.token, "following");
                        on_follower(&LeaderInfo::from(holder.clone()));
                    }
                    // A renewal announcement may push the wait back, but
                    // only to what this instance believes a lease can last,
                    // and never more than one such ttl past the expiry the
                    // store just reported: announcements are hints.
                    let ttl = holder.ttl.max(timing.ttl);
                    let (limit, ttl) = if self.inner.bugs.unbounded_announcements {
                        let unbounded = Duration::from_secs(365 * 24 * 3600);
                        (until + unbounded, unbounded)
                    } else {
                        (until + ttl, ttl)
                    };
                    let woken = wait_for_turn(&mut notices, seen, until, limit, ttl).await;
                    if woken == Woken::Announcement && !self.inner.bugs.unbounded_announcements {
                        pace.before_attempt(sent, timing.retry_every).await;
                    }
                }
                CandidateStep::HoldOff { until, wait } => {
                    if !announced_hold_off {
                        announced_hold_off = true;
                        tracing::info!(
                            election = %self.inner.name,
                            wait = ?wait,
                            "the store may have lost or rolled back leases (first use of the election, a restart or a failover): no lease is granted until any leader from before has passed its deadline"
                        );
                    }
                    self.wait_out_hold_off(&mut notices, seen, until, sent, &mut pace)
                        .await;
                }
                CandidateStep::Retry { at } => sleep_until(at).await,
            }
        }
    }

    /// [`Election::acquire_once`], counting consecutive failures a retry
    /// may fix in `failures` (the first is logged): `None` for one of
    /// those, the error itself when a person must act.
    async fn acquire_counted(
        &self,
        attempt: &str,
        failures: &mut u32,
    ) -> Result<Option<AcquireReply>> {
        match self.acquire_once(attempt).await {
            Ok(reply) => {
                *failures = 0;
                Ok(Some(reply))
            }
            Err(err) if !err.is_transient() => Err(err),
            Err(err) => {
                // After a timeout the outcome is unknown: the script may
                // have run. The next attempt adopts the term if it did.
                *failures = failures.saturating_add(1);
                if *failures == 1 {
                    tracing::warn!(election = %self.inner.name, error = %err, "acquire failed; retrying");
                }
                Ok(None)
            }
        }
    }

    /// Wait out the store's hold-off until `until`. A lease that vanished
    /// without its holder's release holds the election off until its
    /// witness runs out, or until the holder, having stopped, releases it:
    /// that release is announced, and the next attempt is paced after the
    /// one sent at `sent`.
    async fn wait_out_hold_off(
        &self,
        notices: &mut watch::Receiver<Notices>,
        seen: Notices,
        until: Instant,
        sent: Instant,
        pace: &mut Pace,
    ) {
        let mut since = seen;
        tokio::select! {
            _ = sleep_until(until) => {}
            _ = lease_changed(notices, &mut since, sent, Duration::ZERO) => {
                pace.before_attempt(sent, self.inner.timing.retry_every).await;
            }
        }
    }

    /// One acquire request for `attempt`, bounded by the call timeout.
    pub(super) async fn acquire_once(&self, attempt: &str) -> Result<AcquireReply> {
        let timing = &self.inner.timing;
        let bugs = self.inner.bugs;
        let request = AcquireRequest {
            id: &self.inner.id,
            attempt,
            ttl_ms: timing.ttl_ms(),
            hold_off_ms: if bugs.hold_off_own_ttl {
                timing.ttl_ms()
            } else {
                self.inner.hold_off_ms.load(Ordering::Relaxed)
            },
        };
        let acquire = self.inner.backend.acquire(&request);
        match self.inner.call(timing.call_timeout, acquire).await? {
            AcquireReply::Held(holder)
                if bugs.adopt_earlier_lease && holder.id == self.inner.id =>
            {
                Ok(AcquireReply::Won {
                    token: holder.token,
                })
            }
            reply => Ok(reply),
        }
    }

    /// Remember what a lease held by someone else tells: its ttl may be
    /// longer than ours, and it may carry our own id.
    pub(super) fn note_holder(&self, holder: &Holder) {
        let ttl_ms = (holder.ttl.min(crate::machine::MAX_TTL)).as_millis() as u64;
        self.inner.hold_off_ms.fetch_max(ttl_ms, Ordering::Relaxed);
        if holder.id == self.inner.id && !self.inner.attempts.is_ours(&holder.attempt) {
            tracing::warn!(
                election = %self.inner.name,
                id = %self.inner.id,
                token = holder.token,
                "the lease is held under this instance's id by a campaign that is not this process's: \
                 another process uses the same id, or the store restored an old lease (rollback); \
                 treating it as held by someone else. Give every process its own id"
            );
        }
    }

    /// A little randomness so followers woken by the same expiry or
    /// announcement do not all call Redis in the same instant.
    pub(super) fn jitter(&self) -> Duration {
        let max = (self.inner.timing.ttl / 200).min(Duration::from_millis(5));
        let max_us = max.as_micros() as u64;
        let us = match &self.inner.jitter {
            Some(rng) => rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .random_range(0..=max_us),
            None => rand::rng().random_range(0..=max_us),
        };
        Duration::from_micros(us)
    }

    /// A random index below `len` (`len` > 0), from the jitter's RNG when
    /// it is seeded, so that a seeded schedule replays.
    pub(crate) fn random_index(&self, len: usize) -> usize {
        let len = len.max(1);
        match &self.inner.jitter {
            Some(rng) => rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .random_range(0..len),
            None => rand::rng().random_range(0..len),
        }
    }

    /// Start the term that an acquire won, with a keeper of its own.
    pub(super) fn start_term(&self, state: LeaderState) -> Leadership {
        let (commands_tx, commands_rx) = mpsc::channel(8);
        let mut keeper = Keeper::new(&self.inner.id, &commands_tx, Report::PerTerm, true);
        let token = state.token;
        let term = keeper.begin(TERM, &self.inner.name, state, ());
        #[cfg(unix)]
        if let Some(source) = self.inner.backend.lock_source(&self.inner.id, token) {
            let _ = term.shared().lock.set(source);
        }
        #[cfg(not(unix))]
        let _ = token;
        // From now on the term's handles hold the only senders: the keeper
        // hears when the last one is dropped.
        drop(commands_tx);
        tokio::spawn(keep(self.clone(), keeper, commands_rx));
        term
    }
}

/// Why [`wait_for_turn`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// The holder's lease should have expired.
    Expiry,
    /// A release (or a resubscription) was announced.
    Announcement,
}

/// Wait for our turn to try again: until the holder's lease would expire
/// (`until`), pushed back whenever a renewal is announced (to at most `ttl`
/// after the announcement and never past `limit`), or at once when a
/// release is announced after `seen`. Announcements are hints: without them
/// this is a plain sleep until `until`, after which the lease is asked
/// again; with forged ones, it is a wait of at most `limit`.
async fn wait_for_turn(
    notices: &mut watch::Receiver<Notices>,
    seen: Notices,
    mut until: Instant,
    limit: Instant,
    ttl: Duration,
) -> Woken {
    let mut last = seen;
    loop {
        let current = *notices.borrow_and_update();
        if current.released != seen.released {
            return Woken::Announcement;
        }
        if current.renewed != last.renewed {
            // The lease was just extended: it cannot expire before a full
            // ttl from now, counted from when we heard, which is after the
            // renewal ran.
            let announced = Duration::from_millis(current.renewed_ttl_ms).min(ttl);
            until = until.max(Instant::now() + announced).min(limit);
        }
        last = current;
        tokio::select! {
            _ = sleep_until(until) => return Woken::Expiry,
            changed = notices.changed() => {
                if changed.is_err() {
                    // No more announcements: only the ttl is left to wait for.
                    sleep_until(until).await;
                    return Woken::Expiry;
                }
            }
        }
    }
}

/// Paces acquire attempts caused by announcements, which anyone allowed to
/// publish on the channel can send: a few right away (a real release is
/// acted on within milliseconds), then at most one per `gap`.
#[derive(Debug, Default)]
struct Pace {
    quick: u32,
}

impl Pace {
    const BURST: u32 = 3;

    async fn before_attempt(&mut self, previous: Instant, gap: Duration) {
        if Instant::now() >= previous + gap {
            self.quick = 0;
        }
        self.quick += 1;
        if self.quick > Self::BURST {
            sleep_until(previous + gap).await;
        }
    }
}
