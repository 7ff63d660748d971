//! The data a [`MemoryStore`] shares between its views: leases, witnesses,
//! tokens, members, last-run markers and the calls counted; and how each
//! operation changes it, as the Redis scripts do. Apart from the public
//! API and from the faults, which never touch it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::faults::Fault;
#[cfg(doc)]
use super::MemoryStore;
use crate::backend::op::{Notices, Op, Reply, RunRecord};
use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;

#[derive(Default)]
pub(super) struct StoreState {
    pub(super) leases: HashMap<String, Lease>,
    pub(super) last_tokens: HashMap<String, u64>,
    /// Survives [`MemoryStore::wipe`], standing in for the server clock
    /// that keeps Redis tokens rising across a restart.
    token_floor: u64,
    pub(super) notices: HashMap<String, watch::Sender<Notices>>,
    pub(super) fault: Fault,
    /// Set by [`MemoryStore::wipe`]: elections first asked for a lease
    /// after it wait one ttl from then (the start-up hold-off).
    pub(super) wiped: bool,
    pub(super) hold_off_since: HashMap<String, Instant>,
    pub(super) calls: HashMap<String, Calls>,
    /// Partition-set members by group: heartbeat expiry by member id.
    members: HashMap<String, BTreeMap<String, Instant>>,
    /// Last-run markers by election.
    pub(super) runs: HashMap<String, Run>,
    /// Each term's witness, by election: as on Redis and etcd, it lives as
    /// long as the lease would and is removed only by its holder's
    /// release, so a lease that vanishes any other way
    /// ([`MemoryStore::revoke`], [`MemoryStore::delete`]) holds the
    /// election off until its holder has surely stopped.
    pub(super) witnesses: HashMap<String, Witness>,
    /// See [`MemoryStore::unsafe_ignore_witness`].
    pub(super) ignore_witness: bool,
    /// Under [`Fault::Busy`]: when the server is through with the round
    /// trips sent so far.
    pub(super) busy_until: Option<Instant>,
}

/// A term's witness (see [`StoreState::witnesses`]).
#[derive(Debug, Clone)]
pub(super) struct Witness {
    owner: String,
    token: u64,
    expires: Instant,
}

/// A recorded successful run ([`Op::RecordRun`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    at: Instant,
    token: u64,
    expires: Instant,
    slot: Option<u64>,
}

/// How many requests an election's members made of a [`MemoryStore`]:
/// what they would have cost a Redis server.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let election = tenure::Election::builder("jobs").memory(&store).build().await?;
/// let term = election.campaign().await?;
/// term.resign().await?;
/// let calls: tenure::Calls = store.calls("jobs");
/// assert_eq!((calls.acquire, calls.resign), (1, 1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Calls {
    /// Acquire attempts (won or not).
    pub acquire: u64,
    /// Renewals.
    pub renew: u64,
    /// Resignations.
    pub resign: u64,
    /// Leader look-ups.
    pub inspect: u64,
    /// Partition-set heartbeats (counted under the group's name).
    pub heartbeat: u64,
    /// Reads of the last-run marker ([`crate::Election::since_last_run`]).
    pub last_run: u64,
    /// Records of a run ([`crate::Leadership::record_run`]), accepted or not.
    pub record_run: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) owner: String,
    pub(super) token: u64,
    pub(super) expires: Instant,
    pub(super) since_ms: u64,
    pub(super) attempt: String,
    pub(super) ttl: Duration,
}

/// The leases and token counters of a [`MemoryStore`] at one instant, for
/// [`MemoryStore::restore`]: what a Redis snapshot (RDB) holds.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> tenure::Result<()> {
/// let store = tenure::MemoryStore::new();
/// let snapshot = store.snapshot();
/// store.restore(&snapshot); // as a Redis restart that loads an old RDB file
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub struct Snapshot {
    pub(super) leases: HashMap<String, Lease>,
    pub(super) last_tokens: HashMap<String, u64>,
    pub(super) runs: HashMap<String, Run>,
    pub(super) witnesses: HashMap<String, Witness>,
}

impl StoreState {
    /// The live lease of an election, dropping it if it has expired.
    pub(super) fn live_lease(&mut self, election: &str, now: Instant) -> Option<&mut Lease> {
        if self
            .leases
            .get(election)
            .is_some_and(|lease| lease.expires <= now)
        {
            self.leases.remove(election);
        }
        self.leases.get_mut(election)
    }

    pub(super) fn next_token(&mut self, election: &str) -> u64 {
        let last = self.last_tokens.get(election).copied().unwrap_or(0);
        let token = (last + 1).max(self.token_floor + 1);
        self.last_tokens.insert(election.to_string(), token);
        self.token_floor = self.token_floor.max(token);
        token
    }

    pub(super) fn notify(&mut self, election: &str, change: impl FnOnce(&mut Notices)) {
        self.notices
            .entry(election.to_string())
            .or_insert_with(|| watch::channel(Notices::default()).0)
            .send_modify(change);
    }

    /// When a round trip of `ops` sent now is served under `fault`: under
    /// [`Fault::Busy`], after the work queued before it and its own (one
    /// unit a lease it touches); otherwise at once (`None`).
    pub(super) fn serve(&mut self, fault: Fault, ops: &[Op<'_>]) -> Option<Instant> {
        // The queue is cleared when the store's fault is set (see
        // `MemoryStore::set_fault`), not by a call under another fault.
        let Fault::Busy(each) = fault else {
            return None;
        };
        let leases: usize = ops
            .iter()
            .map(|op| match op {
                Op::RenewMany { terms, .. } => terms.len(),
                _ => 1,
            })
            .sum();
        let now = Instant::now();
        let start = self.busy_until.map_or(now, |busy| busy.max(now));
        let served_at = start + each * u32::try_from(leases).unwrap_or(u32::MAX);
        self.busy_until = Some(served_at);
        Some(served_at)
    }

    pub(super) fn count(&mut self, op: &Op<'_>) {
        let (name, count): (&str, fn(&mut Calls)) = match op {
            Op::Heartbeat { group, .. } => (group.name, |c| c.heartbeat += 1),
            Op::Acquire { at, .. } => (at.name, |c| c.acquire += 1),
            Op::Renew { at, .. } => (at.name, |c| c.renew += 1),
            Op::RenewMany { terms, .. } => {
                for (name, _) in terms.iter() {
                    self.calls.entry(name.to_string()).or_default().renew += 1;
                }
                return;
            }
            Op::Resign { at, .. } => (at.name, |c| c.resign += 1),
            Op::Inspect { at, .. } => (at.name, |c| c.inspect += 1),
            Op::LastRun { at, .. } => (at.name, |c| c.last_run += 1),
            Op::RecordRun { at, .. } => (at.name, |c| c.record_run += 1),
        };
        count(self.calls.entry(name.to_string()).or_default());
    }

    pub(super) fn apply(&mut self, op: &Op<'_>, now: Instant) -> Reply {
        match *op {
            Op::Heartbeat {
                group,
                member,
                ttl_ms,
                join,
            } => {
                let members = self.members.entry(group.name.to_string()).or_default();
                members.retain(|_, expires| *expires > now);
                if join {
                    members.insert(member.to_string(), now + Duration::from_millis(ttl_ms));
                } else {
                    members.remove(member);
                }
                Reply::Members {
                    members: members.keys().cloned().collect(),
                    phantoms: 0,
                }
            }
            Op::Acquire { at, request } => Reply::Acquire(self.acquire(at.name, &request, now)),
            Op::Renew {
                at,
                id,
                token,
                ttl_ms,
                announce,
            } => Reply::Renew(self.renew(at.name, id, token, ttl_ms, announce, now)),
            Op::RenewMany {
                id, ttl_ms, terms, ..
            } => Reply::RenewMany(
                terms
                    .iter()
                    .map(|(name, token)| Ok(self.renew(name, id, *token, ttl_ms, false, now)))
                    .collect(),
            ),
            Op::Resign { at, id, token } => Reply::Resign(self.resign(at.name, id, token, now)),
            Op::Inspect { at } => Reply::Inspect(
                self.live_lease(at.name, now)
                    .map(|lease| holder_of(lease, now)),
            ),
            Op::LastRun { at } => Reply::LastRun(
                self.runs
                    .get(at.name)
                    .filter(|run| run.expires > now)
                    .map(|run| RunRecord {
                        age: now.saturating_duration_since(run.at),
                        slot: run.slot,
                    }),
            ),
            Op::RecordRun {
                at,
                id,
                token,
                keep_ms,
                slot,
            } => Reply::RecordRun(self.record_run(at.name, id, token, keep_ms, slot, now)),
        }
    }

    /// The last slot claimed in `election` and still kept at `now`.
    pub(super) fn last_slot(&self, election: &str, now: Instant) -> Option<u64> {
        self.runs
            .get(election)
            .filter(|run| run.expires > now)
            .and_then(|run| run.slot)
    }

    /// As `record_run.lua`: only the term holding the lease records, never
    /// over a newer term's record, and a slot only after the one recorded.
    fn record_run(
        &mut self,
        election: &str,
        id: &str,
        token: u64,
        keep_ms: u64,
        slot: Option<u64>,
        now: Instant,
    ) -> bool {
        let holds = self
            .live_lease(election, now)
            .is_some_and(|lease| lease.owner == id && lease.token == token);
        let kept = self.runs.get(election).filter(|run| run.expires > now);
        let newer = kept.is_some_and(|run| run.token > token);
        let kept_slot = kept.and_then(|run| run.slot);
        let slot_taken = matches!((slot, kept_slot), (Some(new), Some(old)) if new <= old);
        if !holds || newer || slot_taken {
            return false;
        }
        let run = Run {
            at: now,
            token,
            expires: now + Duration::from_millis(keep_ms),
            slot: slot.or(kept_slot),
        };
        self.runs.insert(election.to_string(), run);
        true
    }

    /// As `acquire.lua`: a lease of another term is reported; in the
    /// start-up hold-off nothing is granted or adopted; a lease written
    /// by this same attempt is adopted; else a new term begins.
    fn acquire(
        &mut self,
        election: &str,
        request: &AcquireRequest<'_>,
        now: Instant,
    ) -> AcquireReply {
        let ttl = Duration::from_millis(request.ttl_ms);
        let ours = match self.live_lease(election, now) {
            Some(lease) if lease.owner == request.id && lease.attempt == request.attempt => true,
            Some(lease) => return AcquireReply::Held(holder_of(lease, now)),
            None => false,
        };
        if self.wiped {
            let since = *self
                .hold_off_since
                .entry(election.to_string())
                .or_insert(now);
            let hold_off = ttl.max(Duration::from_millis(request.hold_off_ms));
            if now < since + hold_off {
                return AcquireReply::HoldOff {
                    wait: since + hold_off - now,
                };
            }
        }
        if ours {
            if let Some(lease) = self.live_lease(election, now) {
                lease.expires = now + ttl;
                let (owner, token) = (lease.owner.clone(), lease.token);
                self.witness(election, owner, token, now + ttl);
                return AcquireReply::Won { token };
            }
        }
        // As on Redis and etcd: a lease that vanished without its
        // holder's release leaves its witness, and nobody is granted the
        // election until it runs out.
        if let Some(witness) = self.witnesses.get(election) {
            if witness.expires > now && !self.ignore_witness {
                return AcquireReply::HoldOff {
                    wait: witness.expires - now,
                };
            }
        }
        let token = self.next_token(election);
        self.leases.insert(
            election.to_string(),
            Lease {
                owner: request.id.to_string(),
                token,
                expires: now + ttl,
                since_ms: 0,
                attempt: request.attempt.to_string(),
                ttl,
            },
        );
        self.witness(election, request.id.to_string(), token, now + ttl);
        self.notify(election, |n| n.acquired += 1);
        AcquireReply::Won { token }
    }

    /// Set the witness of term (`owner`, `token`) to expire at `expires`.
    pub(super) fn witness(&mut self, election: &str, owner: String, token: u64, expires: Instant) {
        self.witnesses.insert(
            election.to_string(),
            Witness {
                owner,
                token,
                expires,
            },
        );
    }

    fn renew(
        &mut self,
        election: &str,
        id: &str,
        token: u64,
        ttl_ms: u64,
        announce: bool,
        now: Instant,
    ) -> RenewReply {
        match self.live_lease(election, now) {
            Some(lease) if lease.owner == id && lease.token == token => {
                let expires = now + Duration::from_millis(ttl_ms);
                lease.expires = expires;
                self.witness(election, id.to_string(), token, expires);
                if announce {
                    self.notify(election, |n| {
                        n.renewed += 1;
                        n.renewed_ttl_ms = ttl_ms;
                    });
                }
                RenewReply::Renewed
            }
            Some(lease) => RenewReply::NotOwner(Some(holder_of(lease, now))),
            None => RenewReply::NotOwner(None),
        }
    }

    fn resign(&mut self, election: &str, id: &str, token: u64, now: Instant) -> bool {
        let ours = self
            .live_lease(election, now)
            .is_some_and(|lease| lease.owner == id && lease.token == token);
        let witnessed = self
            .witnesses
            .get(election)
            .is_some_and(|w| w.owner == id && w.token == token);
        if ours || witnessed {
            // The holder's release: of the lease, or, when the lease
            // vanished some other way, of its witness alone.
            if ours {
                self.leases.remove(election);
            }
            self.witnesses.remove(election);
            self.notify(election, |n| n.released += 1);
        }
        ours
    }
}

pub(super) fn holder_of(lease: &Lease, now: Instant) -> Holder {
    Holder {
        id: lease.owner.clone(),
        token: lease.token,
        ttl_left: lease.expires.saturating_duration_since(now),
        since_ms: lease.since_ms,
        attempt: lease.attempt.clone(),
        ttl: lease.ttl,
    }
}
