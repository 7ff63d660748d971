//! The renewal cycle, once per renew interval: the heartbeat and every
//! renewal in one batch (one round trip up to 10,000 renewals on Redis),
//! then the target from the members seen, and the hand-over of what left
//! it. Apart from acquisitions, which run beside it so that they never
//! delay a renewal.

use std::sync::atomic::Ordering;

use std::time::Duration;

use tokio::time::Instant;

use super::target::assign;
use super::{PartitionSet, Running, Work};
use crate::backend::{Op, Reply, RENEW_MANY};
use crate::keeper::Keeper;
use crate::machine::{Reading, Timing};
use crate::{metrics, Error, LostReason, Result};

/// The most renewals sent in one batch (as [`RENEW_MANY`]-sized
/// operations): a set of up to 100,000 partitions renews in one batch (on
/// Redis one pipeline, written in slices of 10,000 renewals).
const RENEW_CHUNK: usize = 100_000;

/// What the renewal round trips of a cycle found.
struct Renewals {
    /// The live members, if the heartbeat was answered.
    members: Option<Vec<String>>,
    /// Whether some renewal went unanswered (its outcome is unknown).
    failed: bool,
}

/// The longest a renewal round trip waits, in call timeouts: a set whose
/// store stalls still serves its handles' commands, hands partitions over
/// and shuts down within a few call timeouts, whatever the ttl.
const LONGEST_RENEWAL_WAIT: u32 = 4;

/// How long a renewal round trip sent at `now` may wait for its answer,
/// when the latest deadline of the terms it renews is `latest` (`None`:
/// a heartbeat alone): until shortly before that deadline (an answer after
/// it saves none of them), at least the call timeout and at most
/// [`LONGEST_RENEWAL_WAIT`] of them.
///
/// Why longer than the call timeout: a busy store can take more than that
/// (about a second at a 3 s ttl) to renew 100,000 terms. Giving up on the
/// round trip does not take its work off the store: the retry queues
/// behind it and is answered later still, until every term lapses and is
/// won again, over and over. Waiting while an answer can still save a term
/// is safe: each term ends at its own deadline, answer or not, and a late
/// answer never revives one. It ends one retry interval before that
/// deadline, so that on a cluster whose one node does not answer, the
/// answers of the others are taken in while they still count. The cost: a
/// connection that died without a word is given up on later than before,
/// too late to save the terms by a retry.
fn renewal_limit(latest: Option<Instant>, timing: &Timing, now: Instant) -> Duration {
    let Some(latest) = latest else {
        return timing.call_timeout;
    };
    latest
        .saturating_duration_since(now)
        .saturating_sub(timing.retry_every)
        .clamp(
            timing.call_timeout,
            timing.call_timeout.saturating_mul(LONGEST_RENEWAL_WAIT),
        )
}

impl PartitionSet {
    /// One cycle: heartbeat and renewals (one batch), then the target
    /// from the members, and releases of what left it. Returns when to try
    /// again if the renewals failed. Acquisitions are not made here (see
    /// [`PartitionSet::next_acquisition`]).
    pub(super) async fn cycle(&self, running: &mut Running) -> Result<Option<Instant>> {
        self.observed.cycles.fetch_add(1, Ordering::Relaxed);
        running.look_for_work = true;
        let timing = &self.timing;
        let sent_at = Reading::take();
        // The terms to renew, and the latest of their deadlines (read in
        // the same pass: a set of 100,000 is not looked up again).
        let mut held: Vec<(usize, u64)> = Vec::new();
        let mut latest: Option<Instant> = None;
        for (index, kept) in running.keeper.iter() {
            held.push((index, kept.state.token));
            latest = latest.max(kept.state.deadline_as_of(sent_at.slept));
        }
        let renewals = self
            .renew(&mut running.keeper, &held, latest, sent_at)
            .await?;
        let now = Instant::now();
        let retry = (renewals.failed && !held.is_empty()).then(|| now + timing.retry_every);

        let Some(members) = renewals.members else {
            return Ok(retry);
        };
        self.take_members(running, members);
        self.hand_over(running, now).await;
        Ok(retry)
    }

    /// The heartbeat and the renewal of every term `held`, as of `sent_at`:
    /// one batch per [`RENEW_CHUNK`] terms, each waiting as
    /// [`renewal_limit`] says for `latest`, the latest of their deadlines.
    async fn renew(
        &self,
        keeper: &mut Keeper<Work>,
        held: &[(usize, u64)],
        latest: Option<Instant>,
        sent_at: Reading,
    ) -> Result<Renewals> {
        let timing = &self.timing;
        let terms: Vec<(&str, u64)> = held
            .iter()
            .map(|(index, token)| (self.partitions[*index].as_str(), *token))
            .collect();
        // The heartbeat first, then the renewals, a thousand to an
        // operation. A partition whose deadline passes meanwhile ends at
        // its deadline by itself (its handle checks the clock), and the
        // others keep their renewal. Sets beyond RENEW_CHUNK partitions
        // renew in several batches; a failed one fails only its own.
        let mut renewals = Renewals {
            members: None,
            failed: false,
        };
        let round_trips: Vec<&[(&str, u64)]> = if terms.is_empty() {
            vec![&[]]
        } else {
            terms.chunks(RENEW_CHUNK).collect()
        };
        // Position in `held` of the first term of the current operation.
        let mut offset = 0;
        for (round, round_terms) in round_trips.into_iter().enumerate() {
            let mut ops = Vec::with_capacity(round_terms.len() / RENEW_MANY + 2);
            if round == 0 {
                ops.push(self.heartbeat(true));
            }
            ops.extend(round_terms.chunks(RENEW_MANY).map(|chunk| Op::RenewMany {
                prefix: &self.prefix,
                id: &self.id,
                ttl_ms: timing.ttl_ms(),
                terms: chunk,
            }));
            let chunk_sent = Instant::now();
            let results = self
                .send(&ops, renewal_limit(latest, timing, chunk_sent))
                .await;
            // A batch some of whose calls went unanswered (a node of a
            // cluster, or the later slices of a long pipeline) failed.
            let failed = results
                .as_ref()
                .is_none_or(|replies| replies.iter().any(Result::is_err));
            keeper.batch_renewed(chunk_sent.elapsed(), failed);
            let mut results = results.into_iter().flatten();
            let slept = crate::clock::suspended();
            if round == 0 {
                renewals.members = self.members_from(results.next())?;
            }
            for chunk in round_terms.chunks(RENEW_MANY) {
                let chunk_terms = &held[offset..offset + chunk.len()];
                offset += chunk.len();
                if self.apply_renewals(keeper, chunk_terms, results.next(), sent_at, slept)? {
                    renewals.failed = true;
                }
            }
        }
        Ok(renewals)
    }

    /// The live members from the heartbeat's reply (`None` if it went
    /// unanswered), warning of entries no member writes.
    fn members_from(&self, reply: Option<Result<Reply>>) -> Result<Option<Vec<String>>> {
        Ok(match reply {
            Some(Ok(reply)) => {
                let (members, phantoms) = reply.into_members()?;
                if phantoms > 0 {
                    metrics::phantom_members(&self.group, phantoms);
                    tracing::warn!(group = %self.group, prefix = %self.prefix, phantoms, "ignoring member entries whose heartbeat expires more than 2 ttl from now; no member writes those (forged or corrupted data)");
                }
                Some(members)
            }
            Some(Err(err)) if !err.is_transient() => return Err(err),
            Some(Err(_)) | None => None,
        })
    }

    /// Apply the reply to one renewal operation to its terms,
    /// sent as of `sent_at`, with `slept` the suspend time read after the
    /// round trip. Returns whether some went unanswered.
    fn apply_renewals(
        &self,
        keeper: &mut Keeper<Work>,
        terms: &[(usize, u64)],
        result: Option<Result<Reply>>,
        sent_at: Reading,
        slept: Duration,
    ) -> Result<bool> {
        let timing = &self.timing;
        let mut failed = false;
        let each = match result.map(|r| r.and_then(Reply::into_renew_many)) {
            Some(Ok(each)) if each.len() == terms.len() => each,
            Some(Err(err)) if !err.is_transient() => return Err(err),
            // No answer: the outcome is unknown, the deadlines stay.
            _ => {
                for (index, _) in terms {
                    keeper.renewed_as_of(*index, timing, sent_at, None, slept);
                }
                return Ok(true);
            }
        };
        for ((index, _), reply) in terms.iter().zip(each) {
            let reply = match reply {
                Ok(reply) => Some(reply),
                // Foreign data in one lease: that term cannot be
                // renewed (it ends at its deadline); the rest go on.
                Err(err @ Error::ForeignData { .. }) => {
                    tracing::error!(group = %self.group, partition = %self.partitions[*index], error = %err, "cannot renew the partition's lease");
                    None
                }
                // A person must act (a cluster node with other ACLs).
                Err(err) if !err.is_transient() => return Err(err),
                // No answer from the node of this lease (one shard of
                // a cluster): unknown, the deadline stays; try again
                // soon, as for a failed round trip.
                Err(_) => {
                    failed = true;
                    None
                }
            };
            // Ends the term if the renewal says so.
            keeper.renewed_as_of(*index, timing, sent_at, reply, slept);
        }
        Ok(failed)
    }

    /// Take in the live members a heartbeat returned: if they changed, show
    /// them to observers and compute this member's target again.
    fn take_members(&self, running: &mut Running, members: Vec<String>) {
        if members != running.members {
            *self
                .observed
                .members
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = members.clone();
            let target = assign(&self.partitions, &members);
            running.mine = target.get(self.id.as_str()).cloned().unwrap_or_default();
            running.members = members;
        }
    }

    /// Tell work outside the target to stop; resign what has stopped (or
    /// has had one ttl since it was told, as of `now`).
    async fn hand_over(&self, running: &mut Running, now: Instant) {
        let timing = &self.timing;
        let keeper = &mut running.keeper;
        let mut resign = Vec::new();
        for (index, kept) in keeper.iter_mut() {
            if !running.mine.contains(&index) && kept.extra.releasing.is_none() {
                kept.extra.releasing = Some(now);
                kept.shared.mark_lost(LostReason::Resigned);
            }
            if let Some(since) = kept.extra.releasing {
                if kept.extra.is_finished() || now >= since + timing.ttl {
                    resign.push(index);
                }
            }
        }
        if !resign.is_empty() {
            self.resign_all(keeper, &resign).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        // ttl 3 s: renew every 1 s, call timeout 1 s, retry every 100 ms.
        Timing::new(Duration::from_secs(3), None, None, None).unwrap()
    }

    #[test]
    fn a_renewal_waits_until_a_retry_interval_before_the_latest_deadline() {
        let (timing, now) = (timing(), Instant::now());
        let latest = now + Duration::from_millis(1700);
        assert_eq!(
            renewal_limit(Some(latest), &timing, now),
            Duration::from_millis(1600)
        );
    }

    #[test]
    fn a_renewal_waits_at_least_one_call_timeout_and_at_most_four() {
        let (timing, now) = (timing(), Instant::now());
        // A heartbeat alone, terms past their deadline, a deadline far off.
        assert_eq!(renewal_limit(None, &timing, now), timing.call_timeout);
        let past = now.checked_sub(Duration::from_secs(1));
        assert_eq!(renewal_limit(past, &timing, now), timing.call_timeout);
        let far = now + Duration::from_secs(3600);
        assert_eq!(
            renewal_limit(Some(far), &timing, now),
            timing.call_timeout * LONGEST_RENEWAL_WAIT
        );
    }
}
