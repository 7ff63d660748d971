//! The election state machine: time and backend replies in, decisions out.
//!
//! Nothing in this module performs I/O or reads a clock. The driver in
//! [`crate::election`] sends a request, notes the instant it *sent* it,
//! and hands the reply (or the fact that none came) to these functions,
//! which say what to do next and until when this instance may act.
//!
//! # How renewal timing works
//!
//! A term starts when an acquire that was sent at instant `s` succeeds. The
//! server set the lease's TTL no earlier than `s`, so the lease cannot expire
//! on the server before `s + ttl`. Allowing `margin` for the server's and our
//! clocks running at different rates, this instance is leader until the
//! **local deadline** `s + ttl - margin`. Each successful renewal sent at `r`
//! moves the deadline to `r + ttl - margin`. Counting from the *send* time,
//! never the reply time, is what makes the bound safe: a reply that arrives
//! late can only make the deadline earlier than the server's expiry, never later.
//!
//! Renewals are due `renew_every` after the last successful one was sent.
//! A renewal that fails or times out is retried every `retry_every` until the
//! deadline; a timed-out renewal may have run on the server, but its outcome
//! is unknown, so it never moves the deadline. Past the deadline, the term is
//! over whether or not the store answers.
//!
//! # One owner of the deadline
//!
//! The deadline is kept here and nowhere else: [`LeaderState`] holds it,
//! every instant this module is given is a [`Reading`] (the monotonic clock
//! and the host's suspend time, read together), and a deadline passes
//! earlier by any time the host spent suspended after the request that set
//! it was sent. The machine's verdict is final: the keeper applies it, and
//! a term's shared state only mirrors the deadline for its handles, which
//! judge it against the clocks when asked.

use std::time::Duration;

use tokio::time::Instant;

pub(crate) use crate::clock::Reading;
use crate::term::{Holder, LostReason};
use crate::{Error, Result};

/// The validated timing of an election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// Lease time-to-live on the server.
    pub ttl: Duration,
    /// How long after the last successful renewal (send time) the next one is due.
    pub renew_every: Duration,
    /// Drift allowance subtracted from the TTL to get the local deadline.
    pub margin: Duration,
    /// Upper bound of one store call.
    pub call_timeout: Duration,
    /// Delay between retries of a failed renewal.
    pub retry_every: Duration,
    /// **Unsafe, for failing-mode tests only** (see
    /// `ElectionBuilder::unsafe_late_renewal_moves_deadline`): a renewal's
    /// deadline counts from its reply's arrival instead of its sending.
    pub late_renewal_bug: bool,
}

/// Below this TTL a warning is logged: scheduler pauses and network jitter
/// of a few hundred milliseconds would make the leader flap.
pub(crate) const SHORT_TTL: Duration = Duration::from_secs(1);

/// The shortest ttl accepted. Below it, one scheduling hiccup or round trip
/// is a large share of the lease, and a `tenure run` command would be
/// stopped and started again many times a second.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(100);

/// The longest ttl accepted. A crashed leader blocks its election for one
/// ttl, and the start-up hold-off lasts one (largest) ttl: a day is
/// already longer than anyone should wait for a takeover.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The shortest renew interval accepted: more often is load, not safety.
pub(crate) const MIN_RENEW_EVERY: Duration = Duration::from_millis(10);

/// How long the token counter and the epoch of an election outlive its last
/// acquire, at least (10 largest ttls if that is longer), so that
/// dynamically named elections do not pile up keys. An expired counter is
/// safe: the next token is still `max(last + 1, server time in ms)`.
pub(crate) const AUX_TTL: Duration = Duration::from_secs(24 * 3600);

impl Timing {
    /// Validate user settings and fill in defaults:
    /// `renew_every = ttl / 3`, `margin = min(ttl / 10, 2 s)`,
    /// `call_timeout = min(renew_every, 2 s)`.
    pub fn new(
        ttl: Duration,
        renew_every: Option<Duration>,
        margin: Option<Duration>,
        call_timeout: Option<Duration>,
    ) -> Result<Self> {
        if ttl < MIN_TTL || ttl > MAX_TTL {
            return Err(Error::Config(format!(
                "ttl must be between {MIN_TTL:?} and 24h (got {ttl:?})"
            )));
        }
        if !ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::Config(format!(
                "ttl must be a whole number of milliseconds (got {ttl:?})"
            )));
        }
        let renew_every = renew_every.unwrap_or(ttl / 3);
        if renew_every < MIN_RENEW_EVERY {
            return Err(Error::Config(format!(
                "renew interval must be at least {MIN_RENEW_EVERY:?} (got {renew_every:?})"
            )));
        }
        if renew_every >= ttl {
            return Err(Error::Config(format!(
                "renew interval ({renew_every:?}) must be shorter than the ttl ({ttl:?}): \
                 a lease renewed no more often than it expires lapses between renewals \
                 (the default is ttl/3)"
            )));
        }
        let margin = margin.unwrap_or_else(|| (ttl / 10).min(Duration::from_secs(2)));
        if margin + renew_every >= ttl {
            return Err(Error::Config(format!(
                "safety margin ({margin:?}) plus renew interval ({renew_every:?}) must be \
                 shorter than the ttl ({ttl:?}), or the local deadline passes before the \
                 first renewal is due"
            )));
        }
        let call_timeout = call_timeout.unwrap_or_else(|| renew_every.min(Duration::from_secs(2)));
        if call_timeout.is_zero() {
            return Err(Error::Config(
                "call timeout must be greater than zero".into(),
            ));
        }
        let retry_every =
            (renew_every / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
        Ok(Timing {
            ttl,
            renew_every,
            margin,
            call_timeout,
            retry_every,
            late_renewal_bug: false,
        })
    }

    /// The local deadline of a term whose last successful acquire or renewal
    /// was sent at `sent_at`.
    pub fn deadline(&self, sent_at: Instant) -> Instant {
        sent_at + self.ttl - self.margin
    }

    /// Timeout for a call sent at `now` on behalf of a term ending at
    /// `deadline`: never longer than the time left, so no wait outlives the term.
    pub fn call_timeout_before(&self, now: Instant, deadline: Instant) -> Duration {
        self.call_timeout
            .min(deadline.saturating_duration_since(now))
    }

    /// The lease TTL in whole milliseconds, as sent to the server.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }
}

/// One acquire attempt, as sent to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AcquireRequest<'a> {
    /// The candidate's instance id.
    pub id: &'a str,
    /// A nonce naming this campaign: a lease found under `id` is adopted
    /// only if this same attempt wrote it (its reply was lost). A lease
    /// under our id from any other attempt is an earlier term of ours, a
    /// lease restored by a rollback, or another process using our id, and
    /// adopting it would make two terms share a token.
    pub attempt: &'a str,
    /// The lease ttl.
    pub ttl_ms: u64,
    /// The start-up hold-off: the largest ttl the candidate knows to be
    /// in use for the election (at least its own).
    pub hold_off_ms: u64,
}

impl AcquireRequest<'_> {
    /// The ttl of the election's auxiliary keys (token counter, epoch).
    pub fn aux_ttl_ms(&self) -> u64 {
        (AUX_TTL.as_millis() as u64).max(self.hold_off_ms.saturating_mul(10))
    }
}

/// Reply to an acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// We hold the lease: a new term, or the lease our own attempt wrote
    /// before its reply was lost.
    Won { token: u64 },
    /// Another term holds it.
    Held(Holder),
    /// Nobody holds it, but the store grants no lease for `wait` yet: it
    /// may have lost or rolled back a lease (the start-up hold-off).
    HoldOff { wait: Duration },
}

/// Reply to a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RenewReply {
    /// Still ours; TTL extended.
    Renewed,
    /// Not ours any more: gone (`None`) or held by another owner.
    NotOwner(Option<Holder>),
}

/// What a candidate does after an acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CandidateStep {
    /// A term began.
    Elected(LeaderState),
    /// Someone else leads: try again at `until`, or earlier when a release
    /// is announced.
    Follow { until: Instant, holder: Holder },
    /// The store is in its start-up hold-off: try again at `until`.
    HoldOff { until: Instant, wait: Duration },
    /// The attempt failed (error or timeout): try again at `at`.
    Retry { at: Instant },
}

/// Decide what a candidate does with the outcome of an acquire sent at `sent_at`.
///
/// `jitter` spreads followers so they do not all hit Redis in the same
/// millisecond when a lease expires; `failures` counts consecutive failed
/// attempts for the backoff.
pub(crate) fn after_acquire(
    timing: &Timing,
    sent_at: Reading,
    now: Reading,
    reply: Option<AcquireReply>,
    jitter: Duration,
    failures: u32,
) -> CandidateStep {
    let now_at = now;
    let now = now.now;
    match reply {
        Some(AcquireReply::Won { token }) => {
            let state = LeaderState::elected(timing, token, sent_at);
            if state.is_current(now_at) {
                CandidateStep::Elected(state)
            } else {
                // The reply came so late that the term it started may
                // already have expired; try again at once, which adopts the
                // term if it is still ours.
                CandidateStep::Retry { at: now }
            }
        }
        Some(AcquireReply::Held(holder)) => CandidateStep::Follow {
            // The holder's TTL was read after we sent; waiting it out from
            // the reply instant can only make us late, never early.
            until: now + holder.ttl_left + jitter,
            holder,
        },
        Some(AcquireReply::HoldOff { wait }) => CandidateStep::HoldOff {
            until: now + wait + jitter,
            wait,
        },
        None => {
            let backoff = timing
                .retry_every
                .saturating_mul(1 << failures.min(6))
                .min(timing.renew_every);
            CandidateStep::Retry {
                at: now + backoff + jitter,
            }
        }
    }
}

/// The leader's side of a term, and the one owner of its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaderState {
    pub token: u64,
    /// The local deadline as the monotonic clock counts it...
    pub deadline: Instant,
    /// ...and the host's suspend time when the request that set it was
    /// sent: the deadline passes earlier by any suspend since.
    pub suspended: Duration,
    pub next_renewal: Instant,
}

/// What the leader does after a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaderStep {
    /// Renew (or retry) at this instant.
    RenewAt(Instant),
    /// The term is over.
    Lost(LostReason),
}

/// `deadline`, set by a request sent when the suspend time read
/// `suspended`, moved earlier by the suspend time since (`slept`: the
/// suspend time now); `None` when that is before any instant the clock can
/// name (a suspend longer than the host's uptime: long past).
pub(crate) fn effective(
    deadline: Instant,
    suspended: Duration,
    slept: Duration,
) -> Option<Instant> {
    deadline.checked_sub(slept.saturating_sub(suspended))
}

impl LeaderState {
    fn elected(timing: &Timing, token: u64, sent_at: Reading) -> Self {
        LeaderState {
            token,
            deadline: timing.deadline(sent_at.now),
            suspended: sent_at.slept,
            next_renewal: sent_at.now + timing.renew_every,
        }
    }

    /// The deadline with the host's suspend time read as `slept` (`None`:
    /// long past).
    pub fn deadline_as_of(&self, slept: Duration) -> Option<Instant> {
        effective(self.deadline, self.suspended, slept)
    }

    /// Whether this term still allows acting at `now`.
    pub fn is_current(&self, now: Reading) -> bool {
        self.deadline_as_of(now.slept)
            .is_some_and(|deadline| now.now < deadline)
    }

    /// Apply the outcome of a renewal sent at `sent_at`; `None` means no
    /// answer (error or timeout), which never moves the deadline.
    pub fn after_renew(
        &mut self,
        timing: &Timing,
        sent_at: Reading,
        now: Reading,
        reply: Option<RenewReply>,
    ) -> LeaderStep {
        if !self.is_current(now) {
            // Whatever the reply says, the term ended at its deadline: a
            // late answer never revives it.
            return LeaderStep::Lost(LostReason::DeadlinePassed);
        }
        match reply {
            Some(RenewReply::Renewed) => {
                let from = if timing.late_renewal_bug {
                    now
                } else {
                    sent_at
                };
                // A late reply to an old request must not pull the deadline back.
                let renewed = timing.deadline(from.now);
                // The suspend reading is always the send's (as it was with
                // the failing-mode bug before the machine owned deadlines).
                if effective(renewed, sent_at.slept, now.slept) > self.deadline_as_of(now.slept) {
                    // (`None`, long past, is less than any instant.)
                    (self.deadline, self.suspended) = (renewed, sent_at.slept);
                }
                self.next_renewal = sent_at.now + timing.renew_every;
                if !self.is_current(now) {
                    return LeaderStep::Lost(LostReason::DeadlinePassed);
                }
                LeaderStep::RenewAt(self.next_renewal.max(now.now))
            }
            Some(RenewReply::NotOwner(None)) => LeaderStep::Lost(LostReason::Expired),
            Some(RenewReply::NotOwner(Some(holder))) => LeaderStep::Lost(LostReason::Taken {
                by: holder.id,
                token: holder.token,
            }),
            None => {
                // Current (checked above), so the deadline is an instant.
                let deadline = self.deadline_as_of(now.slept).unwrap_or(now.now);
                self.next_renewal = (now.now + timing.retry_every).min(deadline);
                LeaderStep::RenewAt(self.next_renewal)
            }
        }
    }

    /// End the term's right to act at `now` (it resigned or was lost): the
    /// deadline becomes the present instant, unless it is already earlier.
    pub fn end(&mut self, now: Reading) {
        if self.deadline_as_of(now.slept) > Some(now.now) {
            (self.deadline, self.suspended) = (now.now, now.slept);
        }
    }
}

#[cfg(test)]
mod tests;
