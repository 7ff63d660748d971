//! The seam's words: the operations every backend carries out ([`Op`]),
//! their replies, and the hints a backend gives an election that its lease
//! changed hands ([`Notices`]). A leaf of the backend module: the backends
//! import it, and nothing here knows any backend.

use tokio::sync::watch;

use super::address::Address;
use crate::machine::{AcquireReply, AcquireRequest, RenewReply};
use crate::term::Holder;
use crate::{Error, Result};

/// The most terms one [`Op::RenewMany`] carries: large enough that a set
/// of 100,000 partitions renews in 100 commands, small enough that one
/// script call keeps Redis busy for only a few milliseconds.
pub(crate) const RENEW_MANY: usize = 1_000;

/// Counters of lease events seen on the notification channel. They are
/// hints: a missed message costs at most one TTL of waiting, because the
/// lease itself stays the source of truth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Notices {
    /// Releases announced, plus one per (re)subscription, since a release
    /// may have been missed while unsubscribed.
    pub released: u64,
    /// New terms announced.
    pub acquired: u64,
    /// Renewals announced, and the ttl (ms) the last one set: the lease
    /// will not expire before that long after the announcement arrived.
    pub renewed: u64,
    pub renewed_ttl_ms: u64,
}

/// One operation on the store, addressed by election (or group): an
/// [`Address`], never a key. [`Store::batch`] carries out any number of
/// them in one round trip, and a single operation is a batch of one, so
/// each operation's layout (on Redis, the scripts' KEYS and ARGV) is written
/// exactly once, in the backend.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op<'a> {
    /// A partition-set member's heartbeat (`join`), or its farewell; the
    /// reply lists the live members.
    Heartbeat {
        group: Address<'a>,
        member: &'a str,
        ttl_ms: u64,
        join: bool,
    },
    Acquire {
        at: Address<'a>,
        request: AcquireRequest<'a>,
    },
    /// Renew the term (id, token). `announce` publishes `renewed:` so that
    /// followers stay quiet (elections; partition sets have no followers).
    Renew {
        at: Address<'a>,
        id: &'a str,
        token: u64,
        ttl_ms: u64,
        announce: bool,
    },
    /// Renew many terms of instance `id` at once, each (election name,
    /// token) under `prefix`, without announcements (partition sets): one
    /// operation per up to [`RENEW_MANY`] terms instead of one per term.
    RenewMany {
        prefix: &'a str,
        id: &'a str,
        ttl_ms: u64,
        terms: &'a [(&'a str, u64)],
    },
    Resign {
        at: Address<'a>,
        id: &'a str,
        token: u64,
    },
    Inspect {
        at: Address<'a>,
    },
    /// How long ago the election's last run was recorded, by the store's
    /// own clock, and the last scheduled slot claimed (`None`: no run is
    /// remembered).
    LastRun {
        at: Address<'a>,
    },
    /// Record a run now, only if the lease is held by exactly the term
    /// (id, token); remembered for at least `keep_ms`. A record of any
    /// other term (a stale one included) is refused: `false`. With a
    /// `slot` (a scheduled instant, ms since the Unix epoch), it is also a
    /// claim of that slot, refused unless it is later than the slot the
    /// record holds: each slot is claimed once, in order, whoever leads. A
    /// record without a slot keeps the slot already recorded.
    RecordRun {
        at: Address<'a>,
        id: &'a str,
        token: u64,
        keep_ms: u64,
        slot: Option<u64>,
    },
}

/// An election's last-run marker as the store keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunRecord {
    /// How long ago the run was recorded, by the store's clock.
    pub age: std::time::Duration,
    /// The last scheduled slot claimed (ms since the Unix epoch), if any.
    pub slot: Option<u64>,
}

/// The reply to one [`Op`].
#[derive(Debug)]
pub(crate) enum Reply {
    Members {
        members: Vec<String>,
        phantoms: u64,
    },
    Acquire(AcquireReply),
    Renew(RenewReply),
    /// One result per term of a [`Op::RenewMany`], in its order.
    RenewMany(Vec<Result<RenewReply>>),
    Resign(bool),
    Inspect(Option<Holder>),
    LastRun(Option<RunRecord>),
    RecordRun(bool),
}

impl Reply {
    fn mismatch(self) -> Error {
        Error::internal(format!("unexpected reply {self:?}"))
    }

    pub fn into_members(self) -> Result<(Vec<String>, u64)> {
        match self {
            Reply::Members { members, phantoms } => Ok((members, phantoms)),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_acquire(self) -> Result<AcquireReply> {
        match self {
            Reply::Acquire(reply) => Ok(reply),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_renew(self) -> Result<RenewReply> {
        match self {
            Reply::Renew(reply) => Ok(reply),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_renew_many(self) -> Result<Vec<Result<RenewReply>>> {
        match self {
            Reply::RenewMany(replies) => Ok(replies),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_resign(self) -> Result<bool> {
        match self {
            Reply::Resign(released) => Ok(released),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_inspect(self) -> Result<Option<Holder>> {
        match self {
            Reply::Inspect(holder) => Ok(holder),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_last_run(self) -> Result<Option<RunRecord>> {
        match self {
            Reply::LastRun(record) => Ok(record),
            other => Err(other.mismatch()),
        }
    }

    pub fn into_record_run(self) -> Result<bool> {
        match self {
            Reply::RecordRun(recorded) => Ok(recorded),
            other => Err(other.mismatch()),
        }
    }
}

/// What a backend gives an election it was asked for: the election's
/// [`Notices`], and whatever keeps them coming (a subscription, a watch),
/// which stops them when dropped.
pub(crate) struct Hints {
    pub notices: watch::Receiver<Notices>,
    pub guard: Option<Box<dyn Send + Sync>>,
}
