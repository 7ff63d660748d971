//! The keep task of an election's term: renews on the machine's schedule,
//! serves its handles' commands, and releases the lease when it ends.

use std::ops::ControlFlow;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::Election;
use crate::backend::Notices;
use crate::keeper::Keeper;
use crate::leadership::{Command, TermShared};
use crate::machine::{LeaderStep, Reading};
use crate::term::LostReason;
use crate::{Error, Result};

/// An election's keeper keeps one term, at this index.
pub(super) const TERM: usize = 0;

/// The task that keeps an election's one term: renews on schedule, answers
/// confirm and resign requests, and ends the term on loss or when every
/// handle is dropped. The term itself begins and ends in the [`Keeper`].
pub(super) async fn keep(
    election: Election,
    mut keeper: Keeper<()>,
    mut commands: mpsc::Receiver<Command>,
) {
    let inner = &election.inner;
    let Some(shared) = keeper.get(TERM).map(|kept| kept.shared.clone()) else {
        return;
    };
    let mut notices = inner.backend.notices();
    let mut seen = *notices.borrow_and_update();
    let mut last_early = Instant::now();
    loop {
        let Some(wake) = keeper
            .get(TERM)
            .map(|kept| kept.state.next_renewal.min(kept.state.deadline))
        else {
            release_after_loss(&election, &shared).await;
            return;
        };
        let command = tokio::select! {
            command = commands.recv() => command,
            _ = sleep_until(wake) => {
                renew_once(&election, &mut keeper).await;
                continue;
            }
            // The lease vanished (a watch or an announcement says so): renew now, so that a term whose lease
            // was deleted or revoked by hand stops at once instead of at its
            // next renewal. A hint only ever brings a renewal forward, at
            // most once per retry interval (announcements can be forged).
            _ = lease_changed(&mut notices, &mut seen, last_early, inner.timing.retry_every),
                if !inner.bugs.no_early_renewal => {
                last_early = Instant::now();
                renew_once(&election, &mut keeper).await;
                continue;
            }
        };
        if serve(&election, &mut keeper, &shared, command)
            .await
            .is_break()
        {
            return;
        }
    }
}

/// After the term ended by its last renewal. A term that ran out of time
/// may still have its lease in the store (the renewals that failed may
/// have run): release it, so that the election (this instance's next
/// campaign included) need not wait for it to lapse. The release checks
/// the term, so it can only end this term's lease, which no handle acts on
/// any more.
///
/// A lease that vanished (deleted by hand, evicted, revoked) left its
/// witness behind, and no candidate is granted the election until the
/// witness runs out: the release deletes it now that this term has
/// stopped, so the next leader need not wait.
async fn release_after_loss(election: &Election, shared: &TermShared) {
    if matches!(
        shared.lost_reason(),
        Some(LostReason::DeadlinePassed | LostReason::Expired)
    ) {
        if let Err(err) = release(election, shared).await {
            tracing::debug!(election = %election.inner.name, error = %err, "could not release the lease of a term past its deadline; it lapses at its ttl");
        }
    }
}

/// Answer one command of the term's handles (`None`: every handle is
/// gone). `Break`: the term is over, and so is the task.
async fn serve(
    election: &Election,
    keeper: &mut Keeper<()>,
    shared: &TermShared,
    command: Option<Command>,
) -> ControlFlow<()> {
    let inner = &election.inner;
    match command {
        Some(Command::Confirm { token, reply, .. }) => {
            let outcome = confirm(election, keeper, shared, token).await;
            let _ = reply.send(outcome);
        }
        Some(Command::Resign {
            token,
            reason,
            reply,
            ..
        }) => {
            if keeper.index_of(Some(TERM), token).is_none() {
                let _ = reply.send(Ok(()));
                return ControlFlow::Continue(());
            }
            keeper.end(TERM, reason);
            let _ = reply.send(release(election, shared).await);
            return ControlFlow::Break(());
        }
        Some(Command::RecordRun {
            token,
            keep,
            slot,
            reply,
            ..
        }) => {
            if keeper.index_of(Some(TERM), token).is_none() {
                let _ = reply.send(Ok(false));
                return ControlFlow::Continue(());
            }
            // Beside the keeper, so that renewals never wait for it;
            // the store checks the term anyway.
            let election = election.clone();
            tokio::spawn(async move {
                let inner = &election.inner;
                let record = inner.backend.record_run(&inner.id, token, keep, slot);
                let _ = reply.send(inner.call(inner.timing.call_timeout, record).await);
            });
        }
        None => {
            // Every handle is gone: nobody can act on this term.
            keeper.end(TERM, LostReason::Resigned);
            if let Err(err) = release(election, shared).await {
                tracing::warn!(election = %inner.name, error = %err, "could not release the lease of a dropped term; it lapses at its ttl");
            }
            return ControlFlow::Break(());
        }
    }
    ControlFlow::Continue(())
}

/// A handle's confirm: renew now, and say how long the term has left (or
/// why it is over).
async fn confirm(
    election: &Election,
    keeper: &mut Keeper<()>,
    shared: &TermShared,
    token: u64,
) -> Result<Duration> {
    if keeper.index_of(Some(TERM), token).is_none() {
        return Err(Error::NotLeader(
            shared.lost_reason().unwrap_or(LostReason::Resigned),
        ));
    }
    match renew_once(election, keeper).await {
        LeaderStep::RenewAt(_) if shared.lost_reason().is_none() => {
            Ok(shared.deadline().saturating_duration_since(Instant::now()))
        }
        LeaderStep::RenewAt(_) => Err(Error::NotLeader(
            shared.lost_reason().unwrap_or(LostReason::Shutdown),
        )),
        LeaderStep::Lost(reason) => Err(Error::NotLeader(reason)),
    }
}

/// Resolves when a release is announced after `seen` (on etcd, any delete
/// of the election's key: the lease vanished), but not before `gap` after
/// `last`. A new term of someone else's is announced only after such a
/// delete, and this instance's own term is announced too, so new terms are
/// not counted.
///
/// # Cancel safety
/// Cancel safe: `seen` is updated only when it resolves.
pub(super) async fn lease_changed(
    notices: &mut watch::Receiver<Notices>,
    seen: &mut Notices,
    last: Instant,
    gap: Duration,
) {
    loop {
        let current = *notices.borrow_and_update();
        if current.released != seen.released {
            sleep_until(last + gap).await;
            *seen = *notices.borrow_and_update();
            return;
        }
        if notices.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One renewal round trip, applied by the keeper (which ends the term if
/// the renewal says so).
pub(super) async fn renew_once(election: &Election, keeper: &mut Keeper<()>) -> LeaderStep {
    let inner = &election.inner;
    let timing = &inner.timing;
    let Some(kept) = keeper.get(TERM) else {
        return LeaderStep::Lost(LostReason::Resigned);
    };
    let token = kept.state.token;
    let sent_at = Reading::take();
    let sent = sent_at.now;
    // The machine's deadline, which counts time the host spent suspended.
    let deadline = match kept.state.deadline_as_of(sent_at.slept) {
        Some(deadline) if kept.state.is_current(sent_at) => deadline,
        _ => {
            keeper.end(TERM, LostReason::DeadlinePassed);
            return LeaderStep::Lost(LostReason::DeadlinePassed);
        }
    };
    let renew = inner.backend.renew(&inner.id, token, timing.ttl_ms());
    let limit = timing.call_timeout_before(sent, deadline);
    let reply = match inner.call(limit, renew).await {
        Ok(reply) => Some(reply),
        Err(err) => {
            // A timed-out renewal may have run, but its outcome is unknown,
            // so it does not move the deadline.
            tracing::warn!(election = %inner.name, error = %err, time_left = ?deadline.saturating_duration_since(Instant::now()), "renewal failed");
            None
        }
    };
    keeper
        .renewed(TERM, timing, sent_at, reply)
        .unwrap_or(LeaderStep::Lost(LostReason::Resigned))
}

/// Delete the lease if this term still owns it, and announce the release.
pub(super) async fn release(election: &Election, shared: &TermShared) -> Result<()> {
    let inner = &election.inner;
    let resign = inner.backend.resign(&inner.id, shared.token);
    inner
        .call(inner.timing.call_timeout, resign)
        .await
        .map(|_released| ())
}
