//! Acquisitions: rounds of up to [`ACQUIRE_CHUNK`] partitions of this
//! member's target, sent beside the renewal cycle, and the terms they begin.
//! Apart from the cycle, because a round trip of acquisitions may take its
//! whole call timeout and must never hold up a renewal.

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::{PartitionSet, Running, Work, ACQUIRE_CHUNK};
use crate::backend::{Op, Reply};
use crate::machine::{
    after_acquire, AcquireReply, AcquireRequest, CandidateStep, LeaderState, Reading,
};
use crate::{Error, Leadership, LostReason, Result};

/// The outcome of one round trip of acquisitions.
pub(super) struct Acquired {
    chunk: Vec<usize>,
    sent: Reading,
    results: Option<Vec<Result<Reply>>>,
}

impl PartitionSet {
    /// The next round trip of acquisitions: target partitions not held and
    /// not waiting for a retry, up to [`ACQUIRE_CHUNK`]. (The run loop asks
    /// only when no round trip is in flight.)
    pub(super) fn next_acquisition(
        &self,
        running: &mut Running,
    ) -> Option<BoxFuture<'_, Acquired>> {
        if !running.look_for_work {
            return None;
        }
        let now = Instant::now();
        let chunk: Vec<usize> = running
            .mine
            .iter()
            .copied()
            .filter(|i| !running.keeper.contains(*i) && running.retry_at[*i] <= now)
            .take(ACQUIRE_CHUNK)
            .collect();
        if chunk.is_empty() {
            running.look_for_work = false;
            return None;
        }
        let attempts: Vec<String> = chunk.iter().map(|i| self.attempt(*i)).collect();
        Some(Box::pin(async move {
            let ttl_ms = self.timing.ttl_ms();
            let ops: Vec<Op<'_>> = chunk
                .iter()
                .zip(&attempts)
                .map(|(index, attempt)| Op::Acquire {
                    at: self.at(*index),
                    request: AcquireRequest {
                        id: &self.id,
                        attempt,
                        ttl_ms,
                        hold_off_ms: self.hold_off_ms,
                    },
                })
                .collect();
            let sent = Reading::take();
            let results = self.send(&ops, self.timing.call_timeout).await;
            drop(ops);
            Acquired {
                chunk,
                sent,
                results,
            }
        }))
    }

    /// Begin the terms a round trip of acquisitions won.
    pub(super) fn acquired<F, Fut>(
        &self,
        acquired: Acquired,
        running: &mut Running,
        work: &mut F,
    ) -> Result<()>
    where
        F: FnMut(String, Leadership) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let timing = &self.timing;
        let now_at = Reading::take();
        let now = now_at.now;
        running.look_for_work = true;
        let Some(results) = acquired.results else {
            // Unknown outcome: the next attempt of each adopts what won.
            for index in &acquired.chunk {
                running.retry_at[*index] = now + timing.retry_every;
            }
            return Ok(());
        };
        for (index, result) in acquired.chunk.iter().copied().zip(results) {
            let reply = match result.and_then(Reply::into_acquire) {
                Ok(reply) => reply,
                // One stray key costs its own partition only: it is left
                // alone and tried again a ttl later.
                Err(err @ Error::ForeignData { .. }) => {
                    tracing::error!(group = %self.group, partition = %self.partitions[index], error = %err, "cannot take the partition; trying again in one ttl");
                    running.retry_at[index] = now + timing.ttl;
                    continue;
                }
                Err(err) if !err.is_transient() => return Err(err),
                // Not again at once: the next look comes after a pause.
                Err(_) => {
                    running.retry_at[index] = now + timing.retry_every;
                    continue;
                }
            };
            self.take_up(index, reply, acquired.sent, now_at, running, work);
        }
        Ok(())
    }

    /// Act on the reply to the acquisition of partition `index`, sent as of
    /// `sent` and received as of `now_at`: begin the term it won, or note
    /// when to try again.
    fn take_up<F, Fut>(
        &self,
        index: usize,
        reply: AcquireReply,
        sent: Reading,
        now_at: Reading,
        running: &mut Running,
        work: &mut F,
    ) where
        F: FnMut(String, Leadership) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let timing = &self.timing;
        let now = now_at.now;
        match after_acquire(timing, sent, now_at, Some(reply.clone()), Duration::ZERO, 0) {
            CandidateStep::Elected(state) => self.begin(index, state, now, running, work),
            CandidateStep::Follow { holder, .. } => {
                // The holder releases it soon if it is a live member
                // outside its target; else its lease has to expire.
                running.retry_at[index] = now + holder.ttl_left.min(timing.renew_every);
            }
            CandidateStep::HoldOff { until, .. } => running.retry_at[index] = until,
            CandidateStep::Retry { at } => running.retry_at[index] = at,
        }
        if let AcquireReply::Won { .. } = reply {
            running.retry_at[index] = now;
        }
    }

    /// Begin the term won for partition `index` (at `now`), and its work if
    /// the partition is still in this member's target.
    fn begin<F, Fut>(
        &self,
        index: usize,
        state: LeaderState,
        now: Instant,
        running: &mut Running,
        work: &mut F,
    ) where
        F: FnMut(String, Leadership) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner())[index] += 1;
        let name = &self.partitions[index];
        let keeper = &mut running.keeper;
        // The target may have moved while the acquisition was in
        // flight: a partition no longer ours gets no work and
        // is released by the next cycle.
        let wanted = running.mine.contains(&index);
        let term = keeper.begin(index, name, state, Work::default());
        if wanted {
            let task = tokio::spawn(work(name.clone(), term));
            if let Some(kept) = keeper.get_mut(index) {
                kept.extra.task = Some(task);
            }
        } else {
            term.shared().mark_lost(LostReason::Resigned);
            if let Some(kept) = keeper.get_mut(index) {
                kept.extra.releasing = Some(now);
            }
        }
    }
}
