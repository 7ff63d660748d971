//! Leader election on Redis, etcd, ZooKeeper or PostgreSQL (or a SQLite file on
//! one host): one leader per named election, kept
//! while it is healthy, handed over fast when it dies or steps down, and told
//! the moment it may no longer act.
//!
//! This is the API reference; the manual (guarantees per store, the
//! `tenure` command, `tenure serve`'s HTTP API, operations, the key layout
//! and the evidence) is the book in the repository's `docs/` (`mdbook build
//! docs`).
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> tenure::Result<()> {
//! let election = tenure::Election::builder("report-mailer")
//!     .redis("redis://127.0.0.1:6379")
//!     .build()
//!     .await?;
//! let term = election.campaign().await?;           // wait until we lead
//! println!("leading with fencing token {}", term.token());
//! tokio::select! {
//!     reason = term.lost() => println!("stopped leading: {reason}"),
//!     _ = send_the_reports(term.token()) => term.resign().await?,
//! }
//! # Ok(()) }
//! # async fn send_the_reports(_: u64) {}
//! ```
//!
//! # What a Redis lease guarantees, and what it does not
//!
//! Like Kubernetes' client-go leader election, this is a lease: **at most one
//! instance believes it is leader at any instant, provided the clocks of the
//! hosts run at about the same rate** (each may be off by any amount; what
//! matters is that one ttl measured here is not longer than the same ttl
//! measured by the Redis server, minus the safety margin). A leader stops
//! believing at its *local deadline*, computed from its own monotonic clock
//! and the instant it *sent* its last successful renewal, so a paused or
//! partitioned leader never outlives its lease on the server. On Linux, time
//! the host spends suspended (which the monotonic clock does not count) is
//! taken off the deadline too, read from `CLOCK_BOOTTIME`; elsewhere a host
//! that sleeps through its deadline learns at its next renewal.
//!
//! What it does **not** guarantee:
//! - **Pauses between check and act.** A process can check
//!   [`Leadership::is_leader`], be paused for longer than the ttl, and then
//!   act. No lease can prevent that. **Fencing tokens** can: pass
//!   [`Leadership::token`] with every write and let the resource refuse
//!   older tokens ([`FencedKey`], or the SQL pattern in [`fence`]).
//! - **Redis failover with a partition.** Redis replication is
//!   asynchronous: a lease written to a primary that fails before replicating
//!   it is lost. tenure notices that the election's data is new to the
//!   promoted replica (its `run_id` differs from the one recorded) and grants
//!   no lease for one ttl, by when the old leader has passed its deadline.
//!   But if the old primary stays alive, partitioned away with the old
//!   leader, that leader keeps renewing there while a new one is elected. A
//!   single Redis node makes elections *efficient* (few duplicates, fast
//!   handover); correctness under every failure needs fencing tokens (or
//!   the etcd or ZooKeeper backends, behind the `etcd` and `zookeeper`
//!   features, whose leases are replicated by consensus; they still need
//!   fencing against pauses).
//! - **Restarts end terms early.** A Redis restart without persistence loses
//!   the lease: the leader learns at its next renewal and stops, and no new
//!   lease is granted (nor a lease restored from a snapshot adopted) until
//!   the largest ttl in use has passed since the restart (the start-up hold-off
//!   period; see [`ElectionBuilder::max_ttl`]). Token order survives: tokens
//!   are derived from the Redis server's clock and stay above every earlier
//!   token as long as that clock does not step backwards across the restart.
//! - **Eviction breaks leases.** A Redis whose `maxmemory-policy` may evict
//!   keys is refused ([`Error::Unsafe`]) unless
//!   [`ElectionBuilder::allow_eviction`] is set.
//! - **Ids must be unique.** A lease under this instance's id that one of
//!   this `Election`'s own campaigns did not write (another process using
//!   the id, a lease restored by a rollback) is treated as held by someone
//!   else, with a warning; the two processes never lead together, but they
//!   compete as a single candidate would not.
//!
//! # Glossary
//!
//! - **election**: a name (e.g. `nightly-cleanup`) for which at most one
//!   leader is chosen.
//! - **instance**: one process (or one [`Election`] value) taking part,
//!   named by its **id** ([`instance_id`]: host name and 128 random bits).
//! - **candidate**: an instance trying to become leader
//!   ([`Election::campaign`]); **follower**: a candidate that found another
//!   leader and waits for its lease to expire or be released.
//! - **lease**: what the store keeps for an election's leader (a Redis key,
//!   an etcd key on an etcd lease, an entry of a [`MemoryStore`]); it
//!   expires after the **ttl** unless renewed.
//! - **term**: one uninterrupted leadership of one instance, from acquire to
//!   loss or resignation. Its handle is a [`Leadership`] (cheap to clone:
//!   every clone is a handle of the same term).
//! - **token** (fencing token): the number of a term, strictly increasing per
//!   election. A term is named by (id, token) in every operation.
//! - **holder**: the instance whose term the lease records, by its id (a
//!   [`LeaderInfo`]'s `id`; [`LostReason::Taken`] names it `by`).
//! - **attempt**: a random name for one campaign, stored in the lease it
//!   writes; only a retry of the same attempt adopts a lease found under its
//!   own id (its first reply was lost), so every new term has a new token.
//! - **address**: where an election lives in a store: its key **prefix**
//!   and its name. Each store lays an address out its own way (the book's
//!   *Keys* page).
//! - **epoch**: the store process (on Redis its `run_id`) an election's
//!   data was first seen on; a new epoch means leases may have been lost or
//!   rolled back.
//! - **hold-off** (at start-up): no lease is granted for the largest
//!   ttl in use after a new epoch begins.
//! - **witness**: written beside each lease, deleted only by its holder's
//!   release: a lease that vanished any other way holds the election until
//!   the witness runs out, as a crash would.
//! - **grace**: the time work is given to stop before it is killed or
//!   abandoned ([`Runner::shutdown_grace`], `tenure run --kill-grace`).
//! - **keeper**: what renews terms and ends them (one per election; one for
//!   all the partitions of a partition-set member); its **watchdog** ends a
//!   term at its deadline even while the keeper waits on the store.
//! - **store**: where leases are kept (Redis, etcd, ZooKeeper, or [`MemoryStore`]); a
//!   [`Store`] is one connection to a store, shared by many elections of a
//!   process. In the code a store's kinds are `RedisStore`, `EtcdStore` and
//!   [`MemoryStore`]; a **backend** is one election's view of a store.
//! - **group**, **member**, **partition**: a partition set is a group of
//!   members sharing partitions, each partition an election of its own.
//! - **deadline**: the local instant a term ends unless renewed: send time of
//!   the last successful acquire/renew + ttl − margin, earlier by any time
//!   the host spends suspended. The state machine keeps it; nothing else
//!   moves it.
//! - **margin**: the safety allowance for clock-rate differences.
//! - **resign**: end one's own term and **release** its lease at once (the
//!   only way a follower gets in before the lease expires).
//! - **hint** (announcement): a message that the lease changed hands (Redis
//!   pub/sub, an etcd watch); it makes hand-over fast and is never needed
//!   for correctness.
//! - **run** (last run): a successful completion of the election's
//!   periodic work, recorded in the store by the term that did it
//!   ([`Leadership::record_run`]) in the election's **last-run marker**;
//!   [`Election::since_last_run`] reads its age by the store's clock.
//!   [`Runner::every`] and `tenure run --at-most-every` record it; a
//!   record's **keep** is how long the store remembers it.
//! - **seat**: one election that `tenure serve` campaigns for and holds.
//!
//! # Timing
//!
//! | setting | default | trade-off |
//! |---|---|---|
//! | ttl | 15 s | longer: survives longer store outages; shorter: faster takeover after a crash |
//! | renew every | ttl / 3 | more often: more load, more retries before the deadline |
//! | margin | ttl / 10, ≤ 2 s | larger: tolerates more clock-rate difference, loses leadership sooner when renewals fail |
//! | call timeout | renew interval, ≤ 2 s | bound of one store call |
//! | max ttl | ttl | the largest ttl of any instance: the start-up hold-off |
//!
//! How renewal timing works is explained in one place: the state machine,
//! `src/machine/`.
//!
//! # Keys
//!
//! Every key of the election `NAME` lives under a configurable prefix
//! (default `tenure`; [`DEFAULT_PREFIX`]), on Redis with the Cluster hash tag
//! `{NAME}`. The layout, every key and channel on Redis and on etcd, is kept
//! in one place: the book's *Keys* page (`docs/src/key-layout.md`). A key
//! holding anything else is reported as [`Error::ForeignData`] and never
//! written.
//!
//! # Redis requirements
//!
//! `maxmemory-policy noeviction` (or no `maxmemory`), and an ACL user with
//! at least [`MIN_ACL`]; both are checked when connecting.
//!
//! # Many elections: partition sets
//!
//! [`PartitionSet`] shares N partitions (each a full election) fairly among
//! the live members of a group, renewing all of a member's leases in one
//! round trip per interval (on Redis, one per 10,000 leases beyond that).
//! See [`PartitionSet`].
//!
//! # Metrics and logs
//!
//! Metrics go through the `metrics` facade (see [`describe_metrics`] for the
//! list); logs through `tracing`. Passwords are never logged.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` on nightly: feature-gated items show
// their feature there; stable builds never see the attribute.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_debug_implementations)]

mod backend;
mod clock;
mod election;
mod error;
pub mod fence;
mod keeper;
mod leadership;
mod machine;
mod metrics;
mod partitions;
mod runner;
mod semaphore;
mod store;
mod term;
mod testing;

pub use backend::memory::MemoryStore;
#[cfg(feature = "testing")]
pub use backend::memory::{Announcements, Calls, Fault, Snapshot};
#[cfg(feature = "postgres")]
pub use backend::postgres::{POSTGRES_GRANTS, POSTGRES_SCHEMA};
pub use election::{Election, ElectionBuilder, NextTerm, DEFAULT_PREFIX, DEFAULT_TTL};
pub use error::{redact_url, Error, Result, MIN_ACL};
pub use fence::{FencedKey, FencedWrite};
pub use leadership::Leadership;
pub use metrics::describe_metrics;
pub use partitions::{PartitionObserver, PartitionSet, PartitionSetBuilder};
pub use runner::{
    shutdown_signal, CatchUp, Runner, Schedule, Slots, TickOutcome, DEFAULT_STARTING_DEADLINE,
};
pub use semaphore::{Semaphore, MAX_PERMITS};
pub use store::{Store, StoreBuilder};
pub use term::{LeaderInfo, LostReason};

/// The `redis` crate this version of tenure is built with, for
/// [`FencedKey`] connections.
pub use redis;

/// Check an election name (or a partition's, or a group's) and a key
/// prefix as every builder and [`Store`] query checks them: non-empty, at
/// most 200 bytes, no braces, white space or control characters.
///
/// ```
/// assert!(tenure::validate_name(tenure::DEFAULT_PREFIX, "nightly-cleanup").is_ok());
/// assert!(tenure::validate_name(tenure::DEFAULT_PREFIX, "two words").is_err());
/// assert!(tenure::validate_name("", "jobs").is_err());
/// ```
pub fn validate_name(prefix: &str, name: &str) -> Result<()> {
    backend::validate_name("key prefix", prefix)?;
    backend::validate_name("election name", name)
}

/// A fresh instance id: this host's name, a dash, and 128 random bits in hex.
///
/// ```
/// let id = tenure::instance_id();
/// assert_eq!(id.rsplit('-').next().unwrap().len(), 32);
/// assert_ne!(id, tenure::instance_id());
/// ```
pub fn instance_id() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string());
    format!("{host}-{:032x}", rand::random::<u128>())
}

/// The Rust examples of the book (`docs/src/`), compiled as doctests so that
/// they cannot rot; `scripts/check-docs.py` checks that the README's example
/// is one of them.
#[cfg(doctest)]
mod book {
    #[doc = include_str!("../../../docs/src/library.md")]
    struct Library;
    #[doc = include_str!("../../../docs/src/partition-sets.md")]
    struct PartitionSets;
    #[doc = include_str!("../../../docs/src/scheduling.md")]
    struct Scheduling;
    #[doc = include_str!("../../../docs/src/semaphores.md")]
    struct Semaphores;
}
