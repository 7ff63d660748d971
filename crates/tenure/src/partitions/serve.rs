//! Commands from the [`Leadership`] handles of the partitions (confirm,
//! resign, record a run), addressed by partition and token. Apart from the
//! cycle, because they arrive at any time and each concerns one term.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

use super::{PartitionSet, Work};
use crate::backend::{Address, Op, Reply};
use crate::keeper::Keeper;
use crate::leadership::Command;
use crate::machine::{LeaderStep, Reading, RenewReply};
use crate::{Error, LostReason};

#[cfg(doc)]
use crate::Leadership;

impl PartitionSet {
    /// Requests from a partition's [`Leadership`], addressed by (partition,
    /// token): a handle of an earlier term of the partition never reaches a
    /// later one.
    pub(super) async fn serve(&self, command: Command, keeper: &mut Keeper<Work>) {
        let (election, token) = command.term();
        let index = self
            .by_name
            .binary_search_by(|i| self.partitions[*i as usize].as_str().cmp(election))
            .ok()
            .map(|found| self.by_name[found] as usize);
        let found = match command {
            Command::Resign { .. } if self.resign_by_name => index.filter(|i| keeper.contains(*i)),
            _ => keeper.index_of(index, token),
        };
        let Some(index) = found else {
            // A term that is over (this member's later term of the same
            // partition, if any, is not this handle's).
            answer_over(command);
            return;
        };
        let reply = match command {
            Command::RecordRun {
                keep, slot, reply, ..
            } => {
                self.record_run(index, token, keep, slot, reply);
                return;
            }
            Command::Resign { reason, reply, .. } => {
                if let Some(kept) = keeper.get(index) {
                    kept.shared.mark_lost(reason);
                }
                self.resign_all(keeper, &[index]).await;
                let _ = reply.send(Ok(()));
                return;
            }
            Command::Confirm { reply, .. } => reply,
        };
        let outcome = self.confirm(keeper, index, token).await;
        let _ = reply.send(outcome);
    }

    /// Record a run of the term `token` of partition `index`, kept for
    /// `keep`, and send the outcome to `reply`.
    fn record_run(
        &self,
        index: usize,
        token: u64,
        keep: Duration,
        slot: Option<u64>,
        reply: oneshot::Sender<crate::Result<bool>>,
    ) {
        // Beside the keeper, so that renewals never wait for it;
        // the store checks the term anyway.
        let store = self.store.clone();
        let (prefix, name) = (self.prefix.clone(), self.partitions[index].clone());
        let id = self.id.clone();
        let limit = self.timing.call_timeout;
        tokio::spawn(async move {
            let at = Address::new(&prefix, &name);
            let record = crate::backend::record_run(&store, at, &id, token, keep, slot);
            let recorded = match timeout(limit, record).await {
                Ok(recorded) => recorded,
                Err(_) => Err(Error::Timeout(limit)),
            };
            let _ = reply.send(recorded);
        });
    }

    /// Renew the term `token` of partition `index` now: the time left
    /// until its deadline, or why it is over.
    async fn confirm(
        &self,
        keeper: &mut Keeper<Work>,
        index: usize,
        token: u64,
    ) -> crate::Result<Duration> {
        let sent = Reading::take();
        let term = [(self.partitions[index].as_str(), token)];
        let op = Op::RenewMany {
            prefix: &self.prefix,
            id: &self.id,
            ttl_ms: self.timing.ttl_ms(),
            terms: &term,
        };
        let renewed: Option<RenewReply> = self
            .send(&[op], self.timing.call_timeout)
            .await
            .and_then(|mut replies| replies.pop())
            .and_then(|reply| reply.and_then(Reply::into_renew_many).ok())
            .and_then(|mut each| each.pop())
            .and_then(Result::ok);
        match keeper.renewed(index, &self.timing, sent, renewed) {
            Some(LeaderStep::Lost(reason)) => Err(Error::NotLeader(reason)),
            _ => match keeper.get(index) {
                Some(kept) if kept.shared.lost_reason().is_none() => Ok(kept
                    .shared
                    .deadline()
                    .saturating_duration_since(Instant::now())),
                Some(kept) => Err(Error::NotLeader(
                    kept.shared.lost_reason().unwrap_or(LostReason::Resigned),
                )),
                None => Err(Error::NotLeader(LostReason::Resigned)),
            },
        }
    }
}

/// Answer a command for a term that is over: it is not the leader, its
/// resignation is done, and it records no run.
fn answer_over(command: Command) {
    match command {
        Command::Confirm { reply, .. } => {
            let _ = reply.send(Err(Error::NotLeader(LostReason::Resigned)));
        }
        Command::Resign { reply, .. } => {
            let _ = reply.send(Ok(()));
        }
        Command::RecordRun { reply, .. } => {
            let _ = reply.send(Ok(false));
        }
    }
}
