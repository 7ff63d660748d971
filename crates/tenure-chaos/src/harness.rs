//! The harness: a real cluster of processes, faults on a seeded schedule.
//!
//! It starts the election's store, a private redis-server for the fenced
//! resource (reached directly), K instance processes, and then, until the
//! run time is up, picks a fault, applies it to the current leader (or to
//! the store), heals it, and waits. Everything it starts it stops by PID.
//! The schedule depends only on the seed.
//!
//! The election's store has one of six topologies (`--topology`, or its
//! alias `--store`):
//! - `single`: one redis-server, reached by every instance through its own
//!   fault-injecting proxy, so one instance can be cut off while the others
//!   carry on;
//! - `sentinel`: a [`SentinelGroup`] (a primary, two replicas, three
//!   sentinels, the data nodes set up with `min-replicas-to-write 1` as the
//!   book's "Topologies" page requires; with `--sentinel-without-min-replicas`,
//!   one replica and Redis's defaults), reached through its
//!   `redis+sentinel://` URL;
//! - `cluster`: a [`RedisCluster`] (three primaries, three replicas,
//!   `cluster-require-full-coverage no` as the book's "Topologies" page
//!   recommends; with `--cluster-full-coverage`, Redis's default `yes`),
//!   reached through its `redis+cluster://` URL;
//! - `etcd`: a private three-member [`EtcdCluster`] (election timeout
//!   500 ms), reached by every instance through three fault-injecting
//!   proxies of its own, one per member, so that its `etcd://` URL names
//!   three proxied endpoints and cutting the instance off cuts all three;
//! - `zk`: a private three-member [`ZkEnsemble`] (tick 100 ms), reached
//!   through three proxies per instance as etcd is (`zk://`);
//! - `sqlite`: one SQLite file in the run's directory that every instance
//!   opens (`sqlite://`), with no proxies (see `embedded.rs` for its
//!   faults);
//! - `postgres`: one private PostgreSQL server, behind a proxy per
//!   instance as the single Redis is (`postgres://`; see `sql.rs` for its
//!   faults).
//!
//! With Sentinel or a Cluster the instances connect to the nodes that the
//! sentinels or the cluster name, at their real addresses: a proxy placed
//! in front of a sentinel or a seed would carry only the discovery traffic,
//! and the lease operations would bypass it. So those topologies have no
//! proxies and no per-instance link faults (`cut`, `drop`, `delay`); they
//! keep the faults of instances (kill, pause, graceful, churn, dup-id,
//! forged, and the CLI's) and add faults of the store. On Sentinel, the
//! instance of slot *i* lists the sentinels from the *i*-th on (wrapping
//! around), as hosts that each name their own sentinel first would:
//! tenure follows every sentinel, so the order must not matter, while with
//! `--unsafe-bug first-sentinel-only` each instance follows the first of its
//! own list.
//! - `sentinel-kill-primary`: kill -9 the primary; once the sentinels have
//!   promoted a replica and after the hold, start the old one again (half
//!   the time from a snapshot taken just before the kill, so it comes back
//!   as a stale primary with a stale lease) and wait until the sentinels
//!   have demoted it to a replica of the new primary;
//! - `sentinel-failover`: `SENTINEL FAILOVER`, then wait until the old
//!   primary replicates from the new one;
//! - `sentinel-kill-sentinel`: kill -9 one of the three sentinels, start it
//!   again after the hold;
//! - `hang-sentinel`: SIGSTOP the sentinel the leader lists first (with no
//!   leader, one drawn from the seed), then `SENTINEL FAILOVER` through a
//!   healthy one; once a replica is promoted, the other two sentinels have
//!   demoted the old primary, and after the hold, SIGCONT the hung one
//!   (issue 22: a leader that heard only the hung sentinel kept renewing
//!   on the old primary, writable until its demotion, while a candidate
//!   was elected on the new one);
//! - `cluster-failover`: `CLUSTER FAILOVER` on the replica of the primary
//!   serving the election's slot;
//! - `cluster-kill-primary`: kill -9 the primary serving the election's
//!   slot; once its replica has taken over and after the hold, start it
//!   again (empty), and wait until it has rejoined as a replica;
//! - `kill-shard-primary`: the same for the primary of another shard (one
//!   that does not serve the election's slot). The election's shard keeps
//!   serving, so its leader must lose no term (see
//!   [`crate::checker::COSTS_NO_TERM`]); with `--cluster-full-coverage`
//!   every node answers `CLUSTERDOWN` until the replica has taken over, and
//!   a term shorter than that is lost (issue 22);
//! - `cluster-reshard`: move the election's slot to another primary while
//!   it is held: `MIGRATING`/`IMPORTING`, a third of the hold, the keys
//!   moved, another third, the keys written meanwhile moved, then the slot
//!   handed over.
//!
//! An etcd cluster lists every member in the URL (a client talks to all of
//! them), so proxies work there: the etcd topology keeps the link faults
//! (`cut`, `drop`, `delay`) and every fault of instances, and adds faults of
//! the store ([`ETCD_ONLY`]):
//! - `etcd-kill-member`: kill -9 a member (half the time the raft leader,
//!   else a follower); after the hold, start it again with its data and wait
//!   until the cluster is whole (every member healthy and following one
//!   leader);
//! - `etcd-pause-member`: SIGSTOP a member (half the time the raft leader),
//!   SIGCONT after the hold;
//! - `etcd-restart-all`: kill -9 every member, wait the hold, start them all
//!   again with their data (a power cut of the whole cluster);
//! - `etcd-compact`: compact the key-value history to the current revision
//!   while a leader holds its term;
//! - `pause-minority-member`: SIGSTOP a follower member (never the raft
//!   leader) for the hold. Two members answer throughout and tenure hedges
//!   a call the paused one holds to the others, so this must cost no term
//!   at all: the checker counts any term lost meanwhile
//!   ([`crate::checker::COSTS_NO_TERM`]). With `--unsafe-bug
//!   etcd-no-hedges` (every call sent once, to whichever member the
//!   balanced client picks) it costs about a term a pause. (The milder bug
//!   issue 22 fixed, hedges that gave up their first send, cost one in five
//!   to ten pauses in our runs: too rare for a short failing-mode run; the
//!   library's test `a_paused_follower_member_never_costs_a_term` covers
//!   it);
//! - `restore-snapshot`: an operator's backup and restore. Every member is
//!   stopped and its data copied (a cold backup), the cluster starts
//!   again, the leader of the moment hands over (SIGTERM) so that later
//!   terms exist, and after the hold the cluster is restored from the
//!   backup: keys, leases and revisions roll back. Tokens must keep rising
//!   (the checker counts tokens that fall or repeat); with `--unsafe-bug
//!   etcd-tokens-without-clock` (tokens from the rolled-back counter alone,
//!   as revision tokens were) they repeat.
//!
//! A ZooKeeper ensemble lists every member in the URL too, and its client
//! moves to another member when its connection breaks, so the zk topology
//! keeps the link faults and every fault of instances as etcd does, and
//! adds faults of the ensemble ([`ZK_ONLY`]; the member faults are written
//! once for both stores in [`crate::consensus`]):
//! - `zk-kill-member`: kill -9 a follower member; after the hold, start it
//!   again with its data and wait until the ensemble is whole (every member
//!   serving, one of them leading);
//! - `zk-kill-leader`: the same for the ensemble's leader: nobody can lead
//!   until the others have elected another;
//! - `zk-pause-member`: SIGSTOP a member (half the time the leader),
//!   SIGCONT after the hold;
//! - `zk-restart-all`: kill -9 every member, wait the hold, start them all
//!   again with their data;
//! - `restore-snapshot`: as on etcd, a cold backup, a hand-over, the hold,
//!   and a restore that rolls znodes and zxids back (`--unsafe-bug
//!   zk-tokens-without-clock`: the tokens repeat).
//!
//! A ZooKeeper session expires when its client is silent for the ttl (the
//! session timeout): `pause` (1.3 to 2.5 ttls) and `cut` expire the
//! leader's session on the ensemble, and its ephemeral lease and witness
//! go with it. `delete-lease` deletes the lease znode by hand (`delete` in
//! `zkCli.sh`), leaving the witness, which keeps every candidate out until
//! the holder stopped (`--unsafe-bug zk-ignore-witness`: a candidate takes
//! the election at once, and the checker sees two leaders). There is no
//! `revoke-lease`: only the client holding a session can close it.
//!
//! A fault of the etcd cluster is recorded as a store outage (like a Redis
//! restart, see [`crate::checker`]) only when the cluster could not serve:
//! from the kill or pause of the raft leader until another member led, and
//! from the kill of every member until a leader was back. Killing or pausing
//! a follower, and compacting, should cost no leader at all.
//!
//! A paused raft leader is how etcd's issue #15247 shows (etcd 3.4 before
//! the backport of its fix, in February 2024, Debian's 3.4.23 included): on
//! resuming, the old leader still believes it leads, finds by its stale
//! clock that leases have expired, and proposes their revocation, which
//! its successor commits although it kept renewing them. The key of a
//! holder whose keep-alives all succeeded then vanishes before its deadline,
//! another instance is elected, and the checker reports overlapping leaders
//! (the old holder's late writes are rejected by fencing). The book's
//! "Fault injection on etcd" page has the figures.
//!
//! The same holds for ZooKeeper's members.
//!
//! In the etcd topology the ttl is a whole number of seconds (etcd's leases
//! count seconds; with a 500 ms election timeout the smallest is 1 s), 2 s
//! unless `--ttl` says otherwise, so that a raft election (0.5 to 1 s) fits
//! well inside a ttl. `mixed-ttl` is kept only when half the ttl is whole
//! seconds too (instances at 1 s and 2 s with the default). Some kinds are
//! not injected there, because they are faults of Redis that etcd has no
//! counterpart of (see [`Topology::why_not`]):
//! - `restart` (a Redis restart losing every lease): etcd members keep their
//!   data across restarts; `etcd-restart-all` is the etcd counterpart.
//!   Losing an etcd cluster's data means restoring a backup, which
//!   `restore-snapshot` does;
//! - `rollback` (Redis started again from an older `SAVE`d snapshot): an
//!   etcd member restarts from its own write-ahead log, never from an older
//!   state; `restore-snapshot` is the operator's rollback of the whole
//!   cluster;
//! - `stall` (`CLIENT PAUSE`, a Redis command): `etcd-pause-member` stalls
//!   etcd members instead;
//! - `forged` (announcements forged on Redis pub/sub): etcd's announcements
//!   are watch events on the election's key, which only a client allowed to
//!   write that key can cause, and such a client can delete the key anyway.
//!
//! `mixed-ttl` cuts the leader off there without restarting the store
//! (the restart is what the kind needs on Redis: a store that lost the
//! lease); on etcd it checks that candidates with a shorter ttl never take
//! a key that a longer-ttl holder's lease still keeps.
//!
//! Before and after each fault of the store the harness waits until the
//! topology is whole again (every node running, replicas linked, the
//! sentinels, cluster nodes or etcd members agreeing), so no fault is left
//! half-applied;
//! when that fails, the run stops with an error after a best-effort repair.
//!
//! Besides crashes, pauses and broken links, the faults cover the ways an
//! application or an operator can make two instances believe they lead:
//! - `churn`: the leader drops its term without resigning and campaigns
//!   again at once, or resigns a stale handle (see [`crate::instance`]);
//! - `rollback`: Redis is snapshotted (`SAVE`) while A leads, A hands over
//!   to B, and Redis restarts from the snapshot, which restores A's lease;
//! - `mixed-ttl`: with this kind in the run, every second instance runs at
//!   half the ttl, and every instance passes `max_ttl` (the largest ttl), the
//!   documented setting for rolling ttl changes: a fresh instance cannot have
//!   seen a long-ttl holder. The fault cuts the leader off and restarts
//!   Redis (losing data) at once, so only the start-up grace period keeps a
//!   short-ttl candidate from leading while the leader's deadline runs;
//! - `dup-id`: a second process campaigns under the leader's id for a while;
//! - `delete-lease` (every topology): the leader's lease deleted by hand, as
//!   an operator forcing a re-election would (`DEL`, `etcdctl del`); and
//!   `revoke-lease` (etcd): the etcd lease its key hangs on revoked
//!   (`etcdctl lease revoke`). Only the holder's release may let a
//!   candidate in early, so the checker must see no overlap; with
//!   `--unsafe-lease-by-hand-without-witness` the lease's witness goes too,
//!   as if tenure kept none, and it must see one. Each time, a new
//!   candidate process starts right after and campaigns for the hold;
//! - `cut-delete-lease` (single, etcd, ZooKeeper): the same while the
//!   leader is cut off for the hold, as an operator forcing out a leader
//!   that looks hung would. The holder cannot hear of the deletion and
//!   leads on until its deadline, so a candidate elected before then
//!   overlaps it for sure. On ZooKeeper, where a holder that hears the
//!   deletion stops within a round trip, this is the fault that shows
//!   what the witness is for (`--unsafe-bug zk-ignore-witness`);
//! - `forged`: the leader is killed and a `renewed:1:3600000` announcement
//!   published, then, after the hold, a flood of `released:` ones.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;

use etcd_process::EtcdCluster;
use rand::{Rng, SeedableRng};
use redis_process::{RedisCluster, RedisServer, SentinelGroup};
use zk_process::ZkEnsemble;

use crate::consensus::{self, lock, Members, Shared, Whom};
use crate::embedded::SqliteFile;
use crate::outage::{blocking, Outage, TOPOLOGY_WAIT};
use crate::sql::PgStore;

use crate::instance::ELECTION;
use crate::log::{now_ns, Event, EventLog};
use crate::proxy::{Mode, Proxy};

/// Kinds of fault, as named in logs and reports. `pause-tenure-only` and
/// `kill-guardian` exist only in CLI mode (`--cli`); [`LIBRARY_ONLY`] kinds
/// only in library mode; [`PROXIED`], [`SINGLE_ONLY`], [`REDIS_ONLY`],
/// [`SENTINEL_ONLY`], [`CLUSTER_ONLY`] and [`ETCD_ONLY`] kinds only in the
/// topologies they name (see [`Topology::allows`]).
pub const FAULT_KINDS: [&str; 42] = [
    "kill",
    "pause",
    "restart",
    "cut",
    "drop",
    "delay",
    "stall",
    "graceful",
    "churn",
    "rollback",
    "mixed-ttl",
    "dup-id",
    "forged",
    "pause-tenure-only",
    "kill-guardian",
    "sentinel-kill-primary",
    "sentinel-failover",
    "sentinel-kill-sentinel",
    "hang-sentinel",
    "cluster-failover",
    "cluster-kill-primary",
    "cluster-reshard",
    "kill-shard-primary",
    "etcd-kill-member",
    "etcd-pause-member",
    "etcd-restart-all",
    "etcd-compact",
    "delete-lease",
    "cut-delete-lease",
    "revoke-lease",
    "pause-minority-member",
    "restore-snapshot",
    "zk-kill-member",
    "zk-kill-leader",
    "zk-pause-member",
    "zk-restart-all",
    "sqlite-lock",
    "sqlite-delete-file",
    "pg-restart",
    "pg-pause",
    "pg-lock",
    "pg-failover",
];

/// Kinds that need a fault-injecting proxy per instance, which only the
/// single server, etcd, ZooKeeper and PostgreSQL have: faults of one instance's link,
/// and `mixed-ttl` and `cut-delete-lease`, which cut the leader off.
pub const PROXIED: [&str; 5] = ["cut", "drop", "delay", "mixed-ttl", "cut-delete-lease"];

/// Kinds that need the single server: faults of the whole Redis (restart,
/// stall, rollback).
pub const SINGLE_ONLY: [&str; 3] = ["restart", "stall", "rollback"];

/// Kinds that need Redis, whatever its topology: `forged` publishes on the
/// election's pub/sub channel.
pub const REDIS_ONLY: [&str; 1] = ["forged"];

/// Kinds that need `--topology sentinel`.
pub const SENTINEL_ONLY: [&str; 4] = [
    "sentinel-kill-primary",
    "sentinel-failover",
    "sentinel-kill-sentinel",
    "hang-sentinel",
];

/// Kinds that need `--topology cluster`.
pub const CLUSTER_ONLY: [&str; 4] = [
    "cluster-failover",
    "cluster-kill-primary",
    "cluster-reshard",
    "kill-shard-primary",
];

/// Kinds that need `--topology etcd`.
pub const ETCD_ONLY: [&str; 5] = [
    "etcd-kill-member",
    "etcd-pause-member",
    "etcd-restart-all",
    "etcd-compact",
    "pause-minority-member",
];

/// Kinds that need `--topology zk`.
pub const ZK_ONLY: [&str; 4] = [
    "zk-kill-member",
    "zk-kill-leader",
    "zk-pause-member",
    "zk-restart-all",
];

/// Kinds that need `--topology sqlite` (see `embedded.rs`).
pub const SQLITE_ONLY: [&str; 2] = ["sqlite-lock", "sqlite-delete-file"];

/// Kinds that need `--topology postgres` (see `sql.rs`).
pub const PG_ONLY: [&str; 4] = ["pg-restart", "pg-pause", "pg-lock", "pg-failover"];

/// Kinds of an operator's restore from an older copy, which etcd,
/// ZooKeeper, SQLite and PostgreSQL have: every member of etcd or
/// ZooKeeper restored from a backup, the SQLite file from a copy, or the
/// PostgreSQL server from a copy of its data directory.
pub const RESTORES: [&str; 1] = ["restore-snapshot"];

/// Kinds of an operator acting on the lease by hand that need etcd:
/// `revoke-lease` revokes the etcd lease the election's key hangs on.
pub const ETCD_LEASES: [&str; 1] = ["revoke-lease"];

/// Where the election's data lives. The fenced resource is always a single
/// Redis server of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Topology {
    /// One redis-server behind a fault-injecting proxy per instance.
    Single,
    /// A primary, a replica and three sentinels (`redis+sentinel://`).
    Sentinel,
    /// Three primaries and three replicas (`redis+cluster://`).
    Cluster,
    /// Three etcd members, behind three fault-injecting proxies per
    /// instance (`etcd://`).
    Etcd,
    /// Three ZooKeeper members, behind three fault-injecting proxies per
    /// instance (`zk://`).
    Zk,
    /// One SQLite file that every instance opens (`sqlite://`; see
    /// `embedded.rs`).
    Sqlite,
    /// One PostgreSQL server behind a fault-injecting proxy per instance
    /// (`postgres://`; see `sql.rs`).
    Postgres,
}

impl Topology {
    const ALL: [Topology; 7] = [
        Topology::Single,
        Topology::Sentinel,
        Topology::Cluster,
        Topology::Etcd,
        Topology::Zk,
        Topology::Sqlite,
        Topology::Postgres,
    ];

    /// Whether `kind` can be injected in this topology.
    pub fn allows(self, kind: &str) -> bool {
        use Topology::*;
        let only = |kinds: &[&str], topologies: &[Topology]| {
            !kinds.contains(&kind) || topologies.contains(&self)
        };
        only(&PROXIED, &[Single, Etcd, Zk, Postgres])
            && only(&SINGLE_ONLY, &[Single])
            && only(&REDIS_ONLY, &[Single, Sentinel, Cluster])
            && only(&SENTINEL_ONLY, &[Sentinel])
            && only(&CLUSTER_ONLY, &[Cluster])
            && only(&ETCD_ONLY, &[Etcd])
            && only(&ETCD_LEASES, &[Etcd])
            && only(&ZK_ONLY, &[Zk])
            && only(&SQLITE_ONLY, &[Sqlite])
            && only(&PG_ONLY, &[Postgres])
            && only(&RESTORES, &[Etcd, Zk, Sqlite, Postgres])
    }

    /// Why `kind` is not injected in this topology, when that is a choice
    /// rather than plain impossibility (a Redis fault with no etcd or
    /// ZooKeeper counterpart).
    pub fn why_not(self, kind: &str) -> Option<&'static str> {
        match self {
            Topology::Etcd => Self::why_not_etcd(kind),
            Topology::Zk => Self::why_not_zk(kind),
            Topology::Sqlite => Self::why_not_sqlite(kind),
            Topology::Postgres => Self::why_not_postgres(kind),
            _ => None,
        }
    }

    fn why_not_sqlite(kind: &str) -> Option<&'static str> {
        Some(match kind {
            "cut" | "drop" | "delay" | "cut-delete-lease" | "mixed-ttl" => {
                "its instances open a file on their own host, with no network link to cut"
            }
            "restart" => {
                "there is no server to restart (sqlite-delete-file loses the file's data instead)"
            }
            "rollback" => {
                "restore-snapshot puts an older copy of the file back, in place or as a new file"
            }
            "stall" => "CLIENT PAUSE is a Redis command (sqlite-lock holds the file's write lock)",
            "forged" => {
                "its hand-over is the OS lock of the term's holder, which no other process can let go"
            }
            "revoke-lease" => "it has no etcd lease (delete-lease deletes the lease row)",
            _ => return None,
        })
    }

    fn why_not_postgres(kind: &str) -> Option<&'static str> {
        Some(match kind {
            "restart" => {
                "a Redis restart loses every lease, while PostgreSQL keeps its rows (pg-restart kills the server and starts it with its data; restore-snapshot brings older data back)"
            }
            "rollback" => {
                "restore-snapshot starts the server from an older copy of its data directory"
            }
            "stall" => {
                "CLIENT PAUSE is a Redis command (pg-lock holds the lease table, pg-pause stops the server)"
            }
            "forged" => {
                "it forges Redis pub/sub messages; PostgreSQL's hints are NOTIFY messages on the server, not forged here yet"
            }
            "revoke-lease" => "it has no etcd lease (delete-lease deletes the lease row)",
            _ => return None,
        })
    }

    fn why_not_zk(kind: &str) -> Option<&'static str> {
        Some(match kind {
            "restart" => {
                "a Redis restart loses every lease, while ZooKeeper members keep their data across restarts (zk-restart-all is the ZooKeeper counterpart); losing its data means restoring a backup (restore-snapshot)"
            }
            "rollback" => {
                "it restarts Redis from an older SAVEd snapshot, while a ZooKeeper member restarts from its own transaction log (restore-snapshot rolls the whole ensemble back)"
            }
            "stall" => "CLIENT PAUSE is a Redis command (zk-pause-member stalls ZooKeeper members)",
            "forged" => {
                "it forges Redis pub/sub announcements, while ZooKeeper's are watch events on the election's znode, which only a client allowed to write that znode can cause"
            }
            "revoke-lease" => {
                "only the client that holds a ZooKeeper session can close it; a session ends by expiry instead (pause, cut)"
            }
            _ => return None,
        })
    }

    fn why_not_etcd(kind: &str) -> Option<&'static str> {
        Some(match kind {
            "restart" => {
                "a Redis restart loses every lease, while etcd members keep their data across restarts (etcd-restart-all is the etcd counterpart); losing etcd's data means restoring a backup (restore-snapshot)"
            }
            "rollback" => {
                "it restarts Redis from an older SAVEd snapshot, while an etcd member restarts from its own write-ahead log, never from an older state (restore-snapshot rolls the whole cluster back)"
            }
            "stall" => "CLIENT PAUSE is a Redis command (etcd-pause-member stalls etcd members)",
            "forged" => {
                "it forges Redis pub/sub announcements, while etcd's are watch events on the election's key, which only a client allowed to write that key can cause"
            }
            _ => return None,
        })
    }

    /// Why `kind` cannot be injected in this topology, for an error message
    /// (`None` when it can).
    pub fn refusal(self, kind: &str) -> Option<String> {
        if self.allows(kind) {
            return None;
        }
        let names: Vec<&str> = Topology::ALL
            .iter()
            .filter(|t| t.allows(kind))
            .map(|t| t.name())
            .collect();
        let needs = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => "?".to_string(),
        };
        let why = self
            .why_not(kind)
            .map(|why| format!(" ({} has no such fault: {why})", self.name()))
            .unwrap_or_default();
        Some(format!("fault {kind:?} needs --topology {needs}{why}"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Sentinel => "sentinel",
            Topology::Cluster => "cluster",
            Topology::Etcd => "etcd",
            Topology::Zk => "zk",
            Topology::Sqlite => "sqlite",
            Topology::Postgres => "postgres",
        }
    }

    /// The ttl of a run that does not give one: 1 s on Redis; 2 s on etcd,
    /// whose leases count whole seconds, so that a raft election (one to two
    /// election timeouts of 500 ms) fits well inside a ttl; 2 s on
    /// ZooKeeper too, where a new leader of the ensemble is elected and
    /// synced in about a second (its tick is [`ZK_TICK`]).
    pub fn default_ttl(self) -> Duration {
        match self {
            Topology::Etcd | Topology::Zk => Duration::from_secs(2),
            _ => Duration::from_secs(1),
        }
    }

    /// Why `ttl` cannot be used in this topology (etcd: whole seconds, at
    /// least the smallest lease of its 500 ms election timeout; ZooKeeper:
    /// a margin, a tenth of the ttl, longer than the ensemble's tick, by
    /// which a session may expire early: see the book's ZooKeeper page).
    pub fn refuse_ttl(self, ttl: Duration) -> Option<String> {
        let ttl_text = humantime::format_duration(ttl);
        match self {
            Topology::Etcd if !whole_seconds(ttl) => Some(format!(
                "--ttl {ttl_text} does not suit etcd, whose leases count whole seconds: use 1s or more, in whole seconds"
            )),
            Topology::Zk if ttl < ZK_TICK * 10 => Some(format!(
                "--ttl {ttl_text} does not suit ZooKeeper here: its tick is {}, and the margin (a tenth of the ttl) must be longer; use {} or more",
                humantime::format_duration(ZK_TICK),
                humantime::format_duration(ZK_TICK * 10)
            )),
            _ => None,
        }
    }

    /// Whether `mixed-ttl` can run at `ttl` here: every second instance
    /// runs at half of it, which etcd must accept too.
    pub fn fits_mixed_ttl(self, ttl: Duration) -> bool {
        self.refuse_ttl(ttl / 2).is_none()
    }
}

/// A whole number of seconds, at least one.
fn whole_seconds(ttl: Duration) -> bool {
    ttl.subsec_nanos() == 0 && ttl >= Duration::from_secs(1)
}

/// The default fault kinds of a run: every kind of the topology and mode
/// (library mode: all but [`CLI_ONLY`]; CLI mode: all but [`LIBRARY_ONLY`]),
/// and `mixed-ttl` only when half of `ttl` suits the topology.
pub fn default_kinds(topology: Topology, cli: bool, ttl: Duration) -> Vec<String> {
    let excluded: &[&str] = if cli { &LIBRARY_ONLY } else { &CLI_ONLY };
    FAULT_KINDS
        .iter()
        .filter(|kind| !excluded.contains(kind) && topology.allows(kind))
        .filter(|kind| **kind != "mixed-ttl" || topology.fits_mixed_ttl(ttl))
        .map(|kind| kind.to_string())
        .collect()
}

/// Kinds that exist only in CLI mode.
pub const CLI_ONLY: [&str; 2] = ["pause-tenure-only", "kill-guardian"];

/// CLI mode with `--escaping-cmd`: CMD starts the writer in a session of
/// its own through a double fork (so it is neither in CMD's process group
/// nor CMD's child), then idles. Only tenure's containment of every
/// descendant stops such a writer when the lease is lost.
const ESCAPING_CMD: &str = r#"( setsid "$0" "$@" & ); exec sleep 1000000"#;

/// Kinds that need instances campaigning through the library (they signal
/// the instance, or start it with settings `tenure run` does not take).
pub const LIBRARY_ONLY: [&str; 4] = ["churn", "rollback", "mixed-ttl", "dup-id"];

/// Forged `released:` announcements per `forged` fault.
const FORGED_RELEASES: usize = 2000;

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub seed: u64,
    pub duration: Duration,
    pub instances: usize,
    pub ttl: Duration,
    pub out: PathBuf,
    /// Run instances through `tenure run` instead of the library.
    pub cli: Option<PathBuf>,
    /// CLI mode: the writer escapes CMD's process group (see [`ESCAPING_CMD`]).
    pub escaping_cmd: bool,
    pub deadline: bool,
    pub fencing: bool,
    pub issue_9_bugs: bool,
    /// `delete-lease` and `revoke-lease` remove the witness too (unsafe:
    /// the behaviour before witnesses, for the failing-mode test).
    pub witness_too: bool,
    /// Fixed bugs of the store switched back on in every library-mode
    /// instance (see [`crate::instance::STORE_BUGS`]).
    pub store_bugs: Vec<String>,
    pub faults: Vec<String>,
    pub topology: Topology,
    /// Sentinel: configure the data nodes with `min-replicas-to-write` (see
    /// [`start_sentinel`]).
    pub sentinel_min_replicas: bool,
    /// Cluster: `cluster-require-full-coverage yes` (Redis's default)
    /// instead of `no`, the failing case of `kill-shard-primary`.
    pub cluster_full_coverage: bool,
}

impl RunConfig {
    fn mixed_ttl(&self) -> bool {
        self.faults.iter().any(|f| f == "mixed-ttl")
    }

    /// Library mode: this binary's `instance` campaigning as `inst`
    /// (under `id`, default `inst`) through `url`, with lease `ttl`.
    fn library_command(
        &self,
        exe: &std::path::Path,
        inst: &str,
        id: Option<&str>,
        url: &str,
        ttl: &str,
    ) -> Command {
        let mut c = Command::new(exe);
        c.args(["instance", "--inst", inst, "--redis", url, "--ttl", ttl]);
        if let Some(id) = id {
            c.args(["--id", id]);
        }
        if self.mixed_ttl() {
            c.arg("--max-ttl")
                .arg(humantime::format_duration(self.ttl).to_string());
        }
        if !self.deadline {
            c.arg("--unsafe-no-deadline");
        }
        if self.issue_9_bugs {
            c.arg("--unsafe-issue-9-bugs");
        }
        for bug in &self.store_bugs {
            c.args(["--unsafe-bug", bug]);
        }
        c
    }

    /// CLI mode: `tenure run` campaigning as `inst` (under `id`, default
    /// `inst`) through `url`, with lease `ttl`, running this binary's
    /// `writer` (through [`ESCAPING_CMD`] with `--escaping-cmd`).
    fn cli_command(
        &self,
        tenure: &std::path::Path,
        exe: &std::path::Path,
        inst: &str,
        id: Option<&str>,
        url: &str,
        ttl: &str,
    ) -> Command {
        let mut c = Command::new(tenure);
        c.args([
            "run",
            "--election",
            ELECTION,
            "--redis",
            url,
            "--ttl",
            ttl,
            "--id",
            id.unwrap_or(inst),
            "--kill-grace",
            "1s",
            "--",
        ]);
        if self.escaping_cmd {
            c.args(["sh", "-c", ESCAPING_CMD]);
        }
        c.arg(exe).args(["writer", "--inst", inst]);
        c
    }
}

struct Slot {
    name: String,
    incarnation: u32,
    child: Option<Child>,
    /// The instance's own links to the election's store: one proxy to the
    /// single server, or one per etcd member; none on Sentinel or a Cluster.
    links: Vec<Proxy>,
    ttl: Duration,
}

impl Slot {
    fn inst(&self) -> String {
        format!("{}#{}", self.name, self.incarnation)
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }
}

/// The election's store.
enum Store {
    Single {
        redis: Box<RedisServer>,
        /// Where `SAVE` writes its snapshot.
        snapshot: PathBuf,
    },
    Sentinel(Arc<SentinelGroup>),
    Cluster(Arc<RedisCluster>),
    /// Behind a mutex: killing and restarting members needs `&mut`, and
    /// is done off the runtime (see [`blocking`]).
    Etcd(Shared<EtcdCluster>),
    /// As etcd's.
    Zk(Shared<ZkEnsemble>),
    Sqlite(SqliteFile),
    Postgres(PgStore),
}

impl Store {
    /// Why `kind` is not a fault of this store.
    fn refusal(&self, kind: &str) -> String {
        let topology = match self {
            Store::Single { .. } => Topology::Single,
            Store::Sentinel(_) => Topology::Sentinel,
            Store::Cluster(_) => Topology::Cluster,
            Store::Etcd(_) => Topology::Etcd,
            Store::Zk(_) => Topology::Zk,
            Store::Sqlite(_) => Topology::Sqlite,
            Store::Postgres(_) => Topology::Postgres,
        };
        topology
            .refusal(kind)
            .unwrap_or_else(|| format!("fault {kind} is not a fault of the store"))
    }

    async fn start(config: &RunConfig) -> Result<Store, String> {
        let (min_replicas, full_coverage) =
            (config.sentinel_min_replicas, config.cluster_full_coverage);
        Ok(match config.topology {
            Topology::Single => {
                let redis = RedisServer::start().map_err(|e| e.to_string())?;
                let dir = redis
                    .command(&["CONFIG", "GET", "dir"])
                    .map_err(|e| e.to_string())?;
                let snapshot =
                    PathBuf::from(dir.lines().nth(1).unwrap_or_default()).join("dump.rdb");
                Store::Single {
                    redis: Box::new(redis),
                    snapshot,
                }
            }
            Topology::Sentinel => Store::Sentinel(Arc::new(
                blocking("starting a Sentinel group", move || {
                    start_sentinel(min_replicas)
                })
                .await?,
            )),
            Topology::Cluster => Store::Cluster(Arc::new(
                blocking("starting a Redis Cluster", move || {
                    RedisCluster::builder().full_coverage(full_coverage).start()
                })
                .await?,
            )),
            Topology::Etcd => Store::Etcd(Arc::new(Mutex::new(
                blocking("starting an etcd cluster", || {
                    EtcdCluster::builder()
                        .election_timeout(ETCD_ELECTION_TIMEOUT)
                        .start()
                })
                .await?,
            ))),
            Topology::Zk => Store::Zk(Arc::new(Mutex::new(
                blocking("starting a ZooKeeper ensemble", || {
                    ZkEnsemble::builder().tick_time(ZK_TICK).start()
                })
                .await?,
            ))),
            Topology::Sqlite => Store::Sqlite(SqliteFile::create(&config.out)?),
            Topology::Postgres => Store::Postgres(PgStore::start().await?),
        })
    }

    /// The URL the harness itself reaches the store at (directly).
    fn url(&self) -> String {
        match self {
            Store::Single { redis, .. } => redis.url(),
            Store::Sentinel(group) => group.url(),
            Store::Cluster(cluster) => cluster.url(),
            Store::Etcd(cluster) => lock(cluster).url(),
            Store::Zk(ensemble) => lock(ensemble).url(),
            Store::Sqlite(file) => file.url(),
            Store::Postgres(pg) => pg.url(),
        }
    }

    /// The ports each instance's proxies forward to: the single server's,
    /// or every etcd or ZooKeeper member's; none on Sentinel or a Cluster
    /// (see the module docs).
    fn upstreams(&self) -> Vec<u16> {
        match self {
            Store::Single { redis, .. } => vec![redis.port()],
            Store::Postgres(pg) => vec![pg.port()],
            Store::Etcd(cluster) => consensus::client_ports(cluster),
            Store::Zk(ensemble) => consensus::client_ports(ensemble),
            Store::Sentinel(_) | Store::Cluster(_) | Store::Sqlite(_) => Vec::new(),
        }
    }

    /// The PIDs of the store's processes now.
    fn pids(&self) -> Vec<i32> {
        let pids: Vec<Option<u32>> = match self {
            Store::Single { redis, .. } => vec![redis.pid()],
            Store::Sentinel(group) => group
                .data_nodes()
                .iter()
                .chain(group.sentinels())
                .map(|node| node.pid())
                .collect(),
            Store::Cluster(cluster) => cluster.nodes().iter().map(|node| node.pid()).collect(),
            Store::Etcd(cluster) => consensus::pids(cluster),
            Store::Zk(ensemble) => consensus::pids(ensemble),
            Store::Sqlite(_) => Vec::new(),
            Store::Postgres(pg) => vec![pg.pid()],
        };
        pids.into_iter().flatten().map(|pid| pid as i32).collect()
    }

    /// Wait until a Sentinel group or cluster is whole and settled (see
    /// [`SentinelGroup::wait_until_ready`], [`RedisCluster::wait_until_ready`]),
    /// or every etcd member runs and follows one leader ([`etcd_whole`]).
    async fn settle(&self) -> Result<(), String> {
        match self {
            Store::Single { .. } | Store::Sqlite(_) | Store::Postgres(_) => Ok(()),
            Store::Sentinel(group) => {
                let group = group.clone();
                blocking("the Sentinel group is ready", move || {
                    group.wait_until_ready(TOPOLOGY_WAIT).map(|_| ())
                })
                .await
            }
            Store::Cluster(cluster) => {
                let cluster = cluster.clone();
                blocking("the cluster is settled", move || {
                    cluster.wait_until_ready(TOPOLOGY_WAIT)
                })
                .await
            }
            Store::Etcd(cluster) => {
                let cluster = cluster.clone();
                blocking("the etcd cluster is whole", move || {
                    etcd_whole(&lock(&cluster), TOPOLOGY_WAIT).map(|_| ())
                })
                .await
            }
            Store::Zk(ensemble) => {
                let ensemble = ensemble.clone();
                blocking("the ZooKeeper ensemble is whole", move || {
                    zk_whole(&lock(&ensemble), TOPOLOGY_WAIT)
                })
                .await
            }
        }
    }
}

/// etcd's `--election-timeout` in the etcd topology: failovers in about a
/// second, and leases of 1 s and up (1.5 election timeouts, rounded up to
/// whole seconds).
const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// ZooKeeper's `tickTime` in the zk topology: a dead leader of the
/// ensemble is noticed in five ticks and another elected soon after, and a
/// session expires at most a tick late, well within the margin of the
/// smallest ttl the topology takes ([`Topology::refuse_ttl`]).
pub const ZK_TICK: Duration = Duration::from_millis(100);

/// Wait until every ZooKeeper member runs (unpaused) and serves, one of
/// them as the leader of a quorum.
fn zk_whole(ensemble: &ZkEnsemble, timeout: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let last = consensus::all_running(ensemble).and_then(|()| {
            ensemble
                .wait_serving(Duration::from_millis(200))
                .map_err(|e| e.to_string())
        });
        match last {
            Ok(()) => return Ok(()),
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(last) => {
                return Err(format!(
                    "the ZooKeeper ensemble is not whole after {timeout:?}: {last}"
                ))
            }
        }
    }
}

/// Wait until every etcd member runs (unpaused) and follows one leader,
/// which leads by its own account and by a quorum's; that leader.
fn etcd_whole(cluster: &EtcdCluster, timeout: Duration) -> Result<usize, etcd_process::Error> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let last = match etcd_agreed(cluster, deadline) {
            Ok(leader) => return Ok(leader),
            Err(why) => why,
        };
        if std::time::Instant::now() >= deadline {
            return Err(etcd_process::Error::Topology(format!(
                "the etcd cluster is not whole after {timeout:?}: {last}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One look at the cluster for [`etcd_whole`]: its leader, or why it is not
/// whole.
fn etcd_agreed(cluster: &EtcdCluster, deadline: std::time::Instant) -> Result<usize, String> {
    consensus::all_running(cluster)?;
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let leader = cluster
        .wait_for_leader(left.max(Duration::from_millis(100)))
        .map_err(|e| e.to_string())?;
    let leader_id = cluster.member_id(leader);
    for member in 0..cluster.members() {
        let status = cluster
            .post(member, "/v3/maintenance/status", "{}")
            .map_err(|e| format!("m{member}: {e}"))?;
        let json: serde_json::Value =
            serde_json::from_str(&status).map_err(|e| format!("m{member}: {e}"))?;
        // The gateway writes 64-bit ids as strings.
        let follows = match &json["leader"] {
            serde_json::Value::String(id) => id.parse::<u64>().ok(),
            other => other.as_u64(),
        };
        if follows != Some(leader_id) {
            return Err(format!(
                "m{member} follows {follows:?}, not m{leader} ({leader_id})"
            ));
        }
    }
    Ok(leader)
}

/// Start the Sentinel group. With `min_replicas`, configured as the book
/// ("Topologies") requires: every data node refuses writes unless a replica
/// acknowledged within a second (`min-replicas-to-write 1`,
/// `min-replicas-max-lag 1`), below the sentinels' `down-after` of two
/// seconds; and two replicas, so that the primary keeps one while another
/// is killed or resyncing. Without it, Redis's defaults: one replica, writes
/// always accepted, a primary judged down after one second, and the
/// sentinels' announcements at Redis's own pace (every 2 s, not the test
/// groups' 0.5 s): a primary failed over while it runs is demoted four
/// announcements later, so it stays writable for about eight seconds, as
/// in production.
fn start_sentinel(min_replicas: bool) -> Result<SentinelGroup, redis_process::Error> {
    if !min_replicas {
        return SentinelGroup::builder()
            .publish_period(Duration::from_secs(2))
            .start();
    }
    let group = SentinelGroup::builder()
        .replicas(2)
        .down_after(Duration::from_secs(2))
        .start()?;
    for node in group.data_nodes() {
        node.command(&["CONFIG", "SET", "min-replicas-to-write", "1"])?;
        node.command(&["CONFIG", "SET", "min-replicas-max-lag", "1"])?;
        // Kept across a kill and resume: nodes restart from this file.
        node.command(&["CONFIG", "REWRITE"])?;
    }
    Ok(group)
}

/// The slot of the election's keys on a cluster (they share its hash tag).
fn election_slot() -> u16 {
    redis_process::slot_of(ELECTION)
}

/// The primary serving the election's slot, and the other primaries.
async fn primaries(cluster: &Arc<RedisCluster>) -> Result<(u16, Vec<u16>), String> {
    let c = cluster.clone();
    let (own, all) = blocking("the cluster's primaries", move || {
        Ok::<_, redis_process::Error>((c.primary_of_slot(election_slot())?, c.primary_ports()?))
    })
    .await?;
    Ok((own, all.into_iter().filter(|p| *p != own).collect()))
}

/// kill -9 the primary on `old`; once its replica has taken over and after
/// `hold`, start it again (empty) and wait until it has rejoined as a
/// replica of its successor. Returns the window the fault is recorded
/// for: from the kill until the replica took over, when the shard serves
/// again (the rejoin does not stop it).
async fn kill_and_rejoin(
    cluster: &Arc<RedisCluster>,
    old: u16,
    hold: Duration,
) -> Result<(u64, u64), String> {
    let t = now_ns();
    cluster.kill(old).map_err(|e| e.to_string())?;
    let c = cluster.clone();
    let moved = blocking("a replica takes over", move || c.wait_for_failover(old)).await;
    let until = now_ns();
    if moved.is_ok() {
        tokio::time::sleep(hold).await;
    }
    let c = cluster.clone();
    let resumed = blocking("the old primary rejoins", move || c.resume(old)).await;
    moved?;
    resumed?;
    Ok((t, until))
}

/// A fault under way, as [`Harness::inject`] records it: its kind, the
/// instance aimed at (empty when none), when it began and when its hold
/// ends (ns).
struct Aim<'a> {
    kind: &'a str,
    target: String,
    t: u64,
    until: u64,
}

impl Aim<'_> {
    /// The fault's event, recorded as lasting until `until`.
    fn ending(&self, until: u64) -> Event {
        self.event(until, None)
    }

    /// The fault's event, recorded as lasting until `until`, saying
    /// whether the store could not serve meanwhile.
    fn event(&self, until: u64, store_down: Option<bool>) -> Event {
        Event::Fault {
            kind: self.kind.to_string(),
            target: self.target.clone(),
            t: self.t,
            until,
            store_down,
        }
    }
}

/// `sentinel-kill-primary`: kill the primary (keeping its snapshot or not,
/// by `coin`), wait for a replica's promotion, hold, then start the old
/// primary again as a stale primary, until the sentinels demote it.
async fn sentinel_kill_primary(
    group: &Arc<SentinelGroup>,
    coin: bool,
    hold: Duration,
) -> Result<Outage, String> {
    let g = group.clone();
    let t = now_ns();
    let old = blocking("killing the primary", move || {
        if coin {
            g.kill_primary_keep_snapshot()
        } else {
            g.kill_primary()
        }
    })
    .await?;
    let g = group.clone();
    let promoted = blocking("a replica is promoted", move || {
        g.wait_for_new_primary(old, TOPOLOGY_WAIT)
    })
    .await;
    let until = now_ns();
    if promoted.is_ok() {
        tokio::time::sleep(hold).await;
    }
    // Back as a stale primary, until the sentinels demote it.
    let g = group.clone();
    let resumed = blocking("the old primary starts again", move || {
        g.node(old)?.resume()
    })
    .await;
    promoted?;
    resumed?;
    Ok(Outage::of((t, until), None))
}

/// `sentinel-failover`: `SENTINEL FAILOVER`, recorded until it returns.
async fn sentinel_failover(group: &Arc<SentinelGroup>) -> Result<Outage, String> {
    let g = group.clone();
    let t = now_ns();
    blocking("SENTINEL FAILOVER", move || g.failover()).await?;
    Ok(Outage::of((t, now_ns()), None))
}

/// `hang-sentinel`: pause the sentinel at `first` (modulo their number),
/// fail over through a healthy one, wait until the old primary is
/// demoted, hold, then let the hung sentinel run again.
async fn hang_sentinel(
    group: &Arc<SentinelGroup>,
    first: usize,
    hold: Duration,
) -> Result<Outage, String> {
    let ports = group.sentinel_ports();
    let hung = ports[first % ports.len()];
    let t = now_ns();
    group
        .node(hung)
        .map_err(|e| e.to_string())?
        .pause()
        .map_err(|e| e.to_string())?;
    // `failover` and `wait_until_ready` skip paused sentinels:
    // the failover goes through a healthy one, and the others
    // demote the old primary without the hung one.
    let g = group.clone();
    let promoted = blocking("SENTINEL FAILOVER while a sentinel hangs", move || {
        g.failover()
    })
    .await;
    let until = now_ns();
    let demoted = match promoted {
        Ok(_) => {
            let g = group.clone();
            blocking("the old primary is demoted", move || {
                g.wait_until_ready(TOPOLOGY_WAIT)
            })
            .await
        }
        Err(_) => Ok(0),
    };
    if promoted.is_ok() && demoted.is_ok() {
        tokio::time::sleep(hold).await;
    }
    let g = group.clone();
    let resumed = blocking("the hung sentinel runs again", move || {
        g.node(hung)?.unpause()
    })
    .await;
    promoted?;
    demoted?;
    resumed?;
    Ok(Outage::of((t, until), None))
}

/// `sentinel-kill-sentinel`: kill the sentinel at `pick` (modulo their
/// number), hold, start it again.
async fn sentinel_kill_sentinel(
    group: &Arc<SentinelGroup>,
    pick: usize,
    hold: Duration,
) -> Result<Outage, String> {
    let ports = group.sentinel_ports();
    let port = ports[pick % ports.len()];
    let t = now_ns();
    group.node(port).map_err(|e| e.to_string())?.kill();
    tokio::time::sleep(hold).await;
    let g = group.clone();
    blocking("the sentinel starts again", move || g.node(port)?.resume()).await?;
    Ok(Outage::of((t, now_ns()), None))
}

/// `cluster-failover`: `CLUSTER FAILOVER` on the replica of the election's
/// primary, recorded until it returns.
async fn cluster_failover(cluster: &Arc<RedisCluster>) -> Result<Outage, String> {
    let c = cluster.clone();
    let t = now_ns();
    blocking("CLUSTER FAILOVER", move || {
        c.failover(c.primary_of_slot(election_slot())?)
    })
    .await?;
    Ok(Outage::of((t, now_ns()), None))
}

/// `kill-shard-primary`: another shard's primary (the one at `pick` among
/// them) killed and rejoined; the election's shard keeps serving.
async fn kill_shard_primary(
    cluster: &Arc<RedisCluster>,
    pick: usize,
    hold: Duration,
) -> Result<Outage, String> {
    let (_, others) = primaries(cluster).await?;
    let Some(old) = others.get(pick % others.len().max(1)).copied() else {
        return Err("the cluster has no primary but the election's to kill".into());
    };
    Ok(Outage::of(
        kill_and_rejoin(cluster, old, hold).await?,
        Some(false),
    ))
}

/// `cluster-reshard`: migrate the election's slot to another primary (the
/// one at `pick` among them) in three steps a third of `hold` apart.
async fn cluster_reshard(
    cluster: &Arc<RedisCluster>,
    pick: usize,
    hold: Duration,
) -> Result<Outage, String> {
    let slot = election_slot();
    let (_, others) = primaries(cluster).await?;
    let Some(to) = others.get(pick % others.len().max(1)).copied() else {
        return Err("the cluster has no other primary to move the slot to".into());
    };
    let c = cluster.clone();
    let t = now_ns();
    blocking("beginning the migration", move || {
        c.begin_migration(slot, to)
    })
    .await?;
    tokio::time::sleep(hold / 3).await;
    let c = cluster.clone();
    let moved = blocking("moving the slot's keys", move || c.migrate_keys(slot)).await;
    if moved.is_ok() {
        tokio::time::sleep(hold / 3).await;
    }
    // Keys written meanwhile (on the importing node, after ASK,
    // or on the old owner while the lease was still there), then
    // the hand-over; tried even after a failed step, so the slot
    // is not left half-migrated.
    let c = cluster.clone();
    let finished = blocking("handing the slot over", move || {
        c.migrate_keys(slot)?;
        c.finish_migration(slot)
    })
    .await;
    moved?;
    finished?;
    Ok(Outage::of((t, now_ns()), None))
}

/// `etcd-compact`: compact etcd's history now; the store keeps serving.
async fn etcd_compact(cluster: &Shared<EtcdCluster>) -> Result<Outage, String> {
    let c = cluster.clone();
    let t = now_ns();
    blocking("compacting etcd", move || lock(&c).compact_now()).await?;
    Ok(Outage::of((t, now_ns()), Some(false)))
}

pub struct Harness {
    config: RunConfig,
    rng: StdRng,
    store: Store,
    resource_redis: RedisServer,
    slots: Vec<Slot>,
    /// The links of `dup-id`'s second process (single and etcd).
    twin_links: Vec<Proxy>,
    /// The harness's own client of an etcd or ZooKeeper store (to find
    /// the leader).
    client: Option<tenure::Store>,
    twins: u32,
    log: EventLog,
    /// Every PID ever started (instances and the store's processes), to
    /// check for leaks at the end.
    started: Vec<i32>,
}

impl Harness {
    pub async fn start(config: RunConfig) -> Result<Harness, String> {
        std::fs::create_dir_all(&config.out).map_err(|e| e.to_string())?;
        for entry in std::fs::read_dir(&config.out)
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let path = entry.path();
            if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("jsonl" | "stderr")
            ) {
                let _ = std::fs::remove_file(path);
            }
        }
        let store = Store::start(&config).await?;
        let resource_redis = RedisServer::start().map_err(|e| e.to_string())?;
        let log = EventLog::create(&config.out.join("harness.jsonl")).map_err(|e| e.to_string())?;
        // Proxies only in front of a single server or etcd's members (see
        // the module docs).
        let upstreams = store.upstreams();
        let links = || {
            let upstreams = upstreams.clone();
            async move {
                let mut links = Vec::new();
                for port in upstreams {
                    links.push(Proxy::start(port).await.map_err(|e| e.to_string())?);
                }
                Ok::<_, String>(links)
            }
        };
        let mut slots = Vec::new();
        for i in 1..=config.instances {
            slots.push(Slot {
                name: format!("i{i}"),
                incarnation: 0,
                child: None,
                links: links().await?,
                ttl: if config.mixed_ttl() && i.is_multiple_of(2) {
                    config.ttl / 2
                } else {
                    config.ttl
                },
            });
        }
        let twin_links = links().await?;
        let rng = StdRng::seed_from_u64(config.seed);
        let mut started = store.pids();
        started.extend(resource_redis.pid().map(|pid| pid as i32));
        let mut harness = Harness {
            config,
            rng,
            store,
            resource_redis,
            slots,
            twin_links,
            client: None,
            twins: 0,
            log,
            started,
        };
        for index in 0..harness.slots.len() {
            harness.spawn(index)?;
        }
        Ok(harness)
    }

    fn spawn(&mut self, index: usize) -> Result<(), String> {
        self.slots[index].incarnation += 1;
        let slot = &self.slots[index];
        let (inst, ttl) = (slot.inst(), slot.ttl);
        let url = self.instance_url(&slot.links, index);
        let child = self.launch(&inst, None, ttl, &url)?;
        self.slots[index].child = Some(child);
        Ok(())
    }

    /// The URL an instance campaigns through: its proxies', or the store's
    /// (on Sentinel, listing the sentinels from the `first_sentinel`-th on:
    /// see the module docs).
    fn instance_url(&self, links: &[Proxy], first_sentinel: usize) -> String {
        let endpoints: Vec<String> = links
            .iter()
            .map(|proxy| format!("127.0.0.1:{}", proxy.port))
            .collect();
        match (&self.store, links.is_empty()) {
            (Store::Sentinel(group), true) => group.url_from(first_sentinel),
            (_, true) => self.store.url(),
            (Store::Etcd(_), false) => format!("etcd://{}", endpoints.join(",")),
            (Store::Zk(_), false) => format!("zk://{}", endpoints.join(",")),
            (Store::Postgres(_), false) => format!("postgres://postgres@{}/postgres", endpoints[0]),
            (_, false) => format!("redis://{}", endpoints[0]),
        }
    }

    /// Start one instance process named `inst`, campaigning under `id`
    /// (default: `inst`) through `url`.
    fn launch(
        &mut self,
        inst: &str,
        id: Option<&str>,
        ttl: Duration,
        url: &str,
    ) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let config = &self.config;
        let file_stem = inst.replace('#', "-");
        let log_path = config.out.join(format!("{file_stem}.jsonl"));
        let stderr = std::fs::File::create(config.out.join(format!("{file_stem}.stderr")))
            .map_err(|e| e.to_string())?;
        let proxy_url = url;
        let ttl = humantime::format_duration(ttl).to_string();
        let mut command = match &config.cli {
            None => config.library_command(&exe, inst, id, proxy_url, &ttl),
            Some(tenure) => config.cli_command(tenure, &exe, inst, id, proxy_url, &ttl),
        };
        command
            .args(["--resource", &self.resource_redis.url()])
            .arg("--log")
            .arg(&log_path)
            .args(if config.fencing {
                &[][..]
            } else {
                &["--unsafe-no-fencing"][..]
            })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .process_group(0);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start an instance: {e}"))?;
        self.started.push(child.id() as i32);
        self.log.record(&Event::Start {
            inst: inst.to_string(),
            t: now_ns(),
        });
        Ok(child)
    }

    /// The slot whose instance leads now, read from the store directly.
    async fn leader_slot(&mut self) -> Option<usize> {
        let url = self.store.url();
        let leader = if let Store::Etcd(_) | Store::Zk(_) | Store::Sqlite(_) | Store::Postgres(_) =
            self.store
        {
            // One client for the whole run (etcd's and ZooKeeper's
            // clients reconnect by themselves, a SQLite file is reopened
            // when replaced), dropped after an error all the same.
            let client = match self.client.take() {
                Some(client) => client,
                None => tenure::Store::open(url)
                    .call_timeout(Duration::from_secs(1))
                    .connect()
                    .await
                    .ok()?,
            };
            let leader = client
                .leader_of(tenure::DEFAULT_PREFIX, ELECTION)
                .await
                .ok()?;
            self.client = Some(client);
            leader?
        } else {
            let store = tenure::Store::open(url)
                .call_timeout(Duration::from_secs(1))
                .connect()
                .await
                .ok()?;
            store
                .leader_of(tenure::DEFAULT_PREFIX, ELECTION)
                .await
                .ok()??
        };
        self.slots.iter().position(|s| s.inst() == leader.id)
    }

    fn signal_slot(&self, index: usize, signal: Signal) {
        if let Some(pid) = self.slots[index].pid() {
            // In CLI mode the command runs below tenure's guardian, in a
            // process group of its own, and with --escaping-cmd its writer
            // left that group too; signal every process below tenure, as a
            // VM pause or an OOM kill of the whole container would.
            let below = if self.config.cli.is_some() {
                tenure_procs::descendants(&tenure_procs::all(), pid.as_raw())
            } else {
                Vec::new()
            };
            let _ = killpg(pid, signal);
            for p in below {
                let _ = kill(Pid::from_raw(p.pid), signal);
            }
        }
    }

    fn reap(&mut self, index: usize, how: &str) {
        let inst = self.slots[index].inst();
        if let Some(mut child) = self.slots[index].child.take() {
            let status = child.wait();
            let how = match (how, status) {
                ("exit", Ok(status)) => describe(status),
                // tenure's documented exit after its guardian was killed.
                ("guardian-killed", Ok(status)) if status.code() != Some(70) => describe(status),
                (how, _) => how.to_string(),
            };
            self.log.record(&Event::Exit {
                inst,
                t: now_ns(),
                how,
            });
        }
    }

    /// Inject faults until the run time is up (or SIGINT or SIGTERM asks
    /// to stop: the fault under way is healed first), then stop everything.
    pub async fn run(mut self) -> Result<RunOutcome, String> {
        let ttl = self.config.ttl;
        let end = tokio::time::Instant::now() + self.config.duration;
        let mut stop = stop_requests();
        // Let the first election happen. A new Sentinel group or cluster
        // may take longer than one ttl (its start-up hold-off counts from
        // the first acquire that reaches the primary): wait for a leader,
        // within ten ttls, so the first fault has one to aim at.
        tokio::time::sleep(ttl).await;
        if self.config.topology != Topology::Single {
            let deadline = tokio::time::Instant::now() + ttl * 10;
            while self.leader_slot().await.is_none() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(ttl / 10).await;
            }
        }
        while tokio::time::Instant::now() + ttl * 3 < end && !*stop.borrow() {
            let kind =
                self.config.faults[self.rng.random_range(0..self.config.faults.len())].clone();
            let hold = ttl.mul_f64(self.rng.random_range(1.3..2.5));
            let target = self.leader_slot().await;
            self.inject(&kind, target, hold).await?;
            self.respawn_dead()?;
            self.log.healthy()?;
            let pause = ttl.mul_f64(self.rng.random_range(0.5..2.0));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
        }
        if *stop.borrow() {
            eprintln!("tenure-chaos: asked to stop; stopping every process");
        } else {
            tokio::select! {
                _ = tokio::time::sleep_until(end) => {}
                _ = stop.wait_for(|stop| *stop) => {}
            }
        }
        self.stop().await?;
        self.log.healthy()?;
        Ok(RunOutcome {
            started: std::mem::take(&mut self.started),
        })
    }

    /// Inject one fault of `kind`, aimed at the instance in slot `target`
    /// (the leader, if there is one), held for `hold`, and record it. A
    /// kind that needs a target does nothing without one.
    async fn inject(
        &mut self,
        kind: &str,
        target: Option<usize>,
        hold: Duration,
    ) -> Result<(), String> {
        let t = now_ns();
        let aim = Aim {
            kind,
            target: target.map(|i| self.slots[i].inst()).unwrap_or_default(),
            t,
            until: t + hold.as_nanos() as u64,
        };
        match (kind, target) {
            ("kill", Some(i)) => {
                self.log.record(&aim.ending(t));
                self.signal_slot(i, Signal::SIGKILL);
                self.reap(i, "killed");
            }
            ("graceful", Some(i)) => {
                self.log.record(&aim.ending(t));
                if let Some(pid) = self.slots[i].pid() {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                self.wait_exit(i, Duration::from_secs(10), "exit").await;
            }
            ("pause", Some(i)) => {
                self.log.record(&aim.ending(aim.until));
                self.signal_slot(i, Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                self.signal_slot(i, Signal::SIGCONT);
            }
            ("pause-tenure-only", Some(i)) if self.config.cli.is_some() => {
                self.pause_tenure_only(&aim, i, hold).await;
            }
            ("kill-guardian", Some(i)) if self.config.cli.is_some() => {
                self.kill_guardian(&aim, i).await;
            }
            ("cut" | "drop" | "delay", Some(i)) => self.bad_link(&aim, i, hold).await,
            ("restart", _) => {
                self.log.record(&aim.ending(t));
                self.restart_redis(false)?;
            }
            ("churn", Some(i)) => {
                self.log.record(&aim.ending(t));
                if let Some(pid) = self.slots[i].pid() {
                    let _ = kill(pid, Signal::SIGUSR1);
                }
            }
            ("rollback", Some(i)) => self.rollback(&aim, i).await?,
            ("mixed-ttl", Some(i)) => self.mixed_ttl(&aim, i, hold).await?,
            ("dup-id", Some(i)) => self.dup_id(&aim, i, hold).await?,
            ("forged", Some(i)) => self.forged(&aim, i, hold).await?,
            ("stall", _) => self.stall(&aim, hold).await?,
            ("delete-lease" | "cut-delete-lease" | "revoke-lease", Some(i)) => {
                self.lease_by_hand_and_newcomer(&aim, i, hold).await?;
            }
            ("restore-snapshot", _) if matches!(self.store, Store::Sqlite(_)) => {
                self.restore_sqlite(hold).await?;
            }
            ("restore-snapshot", _) if matches!(self.store, Store::Postgres(_)) => {
                self.restore_postgres(hold).await?;
            }
            ("pg-restart", _) => {
                let Store::Postgres(pg) = &self.store else {
                    return Err(self.store.refusal(kind));
                };
                let restarted = pg.restart().await;
                self.log.record(&aim.event(now_ns(), Some(true)));
                restarted?;
                if let Some(pid) = pg.pid() {
                    self.started.push(pid as i32);
                }
            }
            ("pg-pause", _) => {
                let Store::Postgres(pg) = &self.store else {
                    return Err(self.store.refusal(kind));
                };
                self.log.record(&aim.event(aim.until, Some(true)));
                pg.pause(hold).await;
            }
            ("pg-failover", _) => self.fail_over_postgres(hold).await?,
            ("pg-lock", _) => {
                let Store::Postgres(pg) = &self.store else {
                    return Err(self.store.refusal(kind));
                };
                self.log.record(&aim.event(aim.until, Some(true)));
                pg.hold_lock(hold).await?;
            }
            ("restore-snapshot", _) => {
                self.restore_snapshot(hold).await?;
            }
            ("sqlite-lock", _) => {
                let Store::Sqlite(file) = &self.store else {
                    return Err(self.store.refusal(kind));
                };
                self.log.record(&aim.event(aim.until, Some(true)));
                file.hold_lock(hold).await?;
            }
            ("sqlite-delete-file", _) => {
                let Store::Sqlite(file) = &self.store else {
                    return Err(self.store.refusal(kind));
                };
                self.log.record(&aim.event(aim.until, Some(true)));
                file.delete()?;
                self.newcomer(self.config.ttl, hold).await?;
            }
            (store, _)
                if SENTINEL_ONLY.contains(&store)
                    || CLUSTER_ONLY.contains(&store)
                    || ETCD_ONLY.contains(&store)
                    || ZK_ONLY.contains(&store) =>
            {
                self.store_fault(store, aim.target.clone(), hold).await?;
            }
            // No leader to aim at right now: nothing to do this round.
            _ => {}
        }
        Ok(())
    }

    /// `pause-tenure-only` (CLI mode): tenure stopped while its guardian
    /// and command run on: the guardian must kill the command at the
    /// deadline by itself.
    async fn pause_tenure_only(&mut self, aim: &Aim<'_>, i: usize, hold: Duration) {
        self.log.record(&aim.ending(aim.until));
        if let Some(pid) = self.slots[i].pid() {
            let _ = kill(pid, Signal::SIGSTOP);
            tokio::time::sleep(hold).await;
            let _ = kill(pid, Signal::SIGCONT);
        }
    }

    /// `kill-guardian` (CLI mode): the guardian dies; tenure must kill the
    /// command before it resigns (and then exits; the harness starts it
    /// again).
    async fn kill_guardian(&mut self, aim: &Aim<'_>, i: usize) {
        self.log.record(&aim.ending(aim.t));
        if let Some(pid) = self.slots[i].pid() {
            for guardian in child_groups(pid.as_raw()) {
                let _ = kill(Pid::from_raw(guardian), Signal::SIGKILL);
            }
        }
        self.wait_exit(i, Duration::from_secs(10), "guardian-killed")
            .await;
    }

    /// `cut`, `drop` or `delay`: the instance's links black-holed, dropped
    /// or slowed for the hold.
    async fn bad_link(&mut self, aim: &Aim<'_>, i: usize, hold: Duration) {
        self.log.record(&aim.ending(aim.until));
        let mode = match aim.kind {
            "cut" => Mode::Blackhole,
            "drop" => Mode::Drop,
            // A slow link (each chunk ttl/20 late each way) that
            // leases must survive.
            _ => Mode::Delay(self.config.ttl / 20),
        };
        self.set_link(i, mode);
        tokio::time::sleep(hold).await;
        self.set_link(i, Mode::Pass);
    }

    /// `rollback`: the snapshot holds the leader's lease; it hands over; a
    /// moment later Redis comes back from the snapshot, with that lease and
    /// an older token counter. The lease must still be live then, so the
    /// restart follows within a tenth of a ttl.
    async fn rollback(&mut self, aim: &Aim<'_>, i: usize) -> Result<(), String> {
        self.single_redis()?
            .command(&["SAVE"])
            .map_err(|e| e.to_string())?;
        if let Some(pid) = self.slots[i].pid() {
            let _ = kill(pid, Signal::SIGUSR2);
        }
        let after = self.config.ttl.mul_f64(self.rng.random_range(0.03..0.1));
        tokio::time::sleep(after).await;
        self.restart_redis(true)?;
        self.log.record(&aim.ending(now_ns()));
        Ok(())
    }

    /// `mixed-ttl`: the instance cut off for the hold and, on Redis and
    /// PostgreSQL, the store restarted meanwhile. On etcd and ZooKeeper, only the cut: the
    /// store keeps the lease (see the module docs), and the fault is not an
    /// outage of the store.
    async fn mixed_ttl(&mut self, aim: &Aim<'_>, i: usize, hold: Duration) -> Result<(), String> {
        if matches!(self.store, Store::Etcd(_) | Store::Zk(_)) {
            self.log.record(&aim.event(aim.until, Some(false)));
            self.set_link(i, Mode::Blackhole);
            tokio::time::sleep(hold).await;
            self.set_link(i, Mode::Pass);
        } else if let Store::Postgres(pg) = &self.store {
            // The server restarted with its data: a process new to the
            // election, whose hold-off must be the largest ttl in use.
            self.log.record(&aim.event(aim.until, Some(true)));
            self.set_link(i, Mode::Blackhole);
            pg.restart().await?;
            tokio::time::sleep(hold).await;
            self.set_link(i, Mode::Pass);
        } else {
            self.log.record(&aim.ending(aim.until));
            self.set_link(i, Mode::Blackhole);
            self.restart_redis(false)?;
            tokio::time::sleep(hold).await;
            self.set_link(i, Mode::Pass);
        }
        Ok(())
    }

    /// `dup-id`: a second process campaigning under the instance's id, for
    /// the hold.
    async fn dup_id(&mut self, aim: &Aim<'_>, i: usize, hold: Duration) -> Result<(), String> {
        self.log.record(&aim.ending(aim.until));
        self.twins += 1;
        let twin = format!("dup#{}", self.twins);
        let (id, ttl) = (self.slots[i].inst(), self.slots[i].ttl);
        let url = self.instance_url(&self.twin_links, 0);
        let mut child = self.launch(&twin, Some(&id), ttl, &url)?;
        tokio::time::sleep(hold).await;
        let how = stop_child(&mut child, Duration::from_secs(10)).await;
        self.log.record(&Event::Exit {
            inst: twin,
            t: now_ns(),
            how,
        });
        Ok(())
    }

    /// `forged`: the leader killed, then announcements forged on its
    /// channel: a renewal of its lease, and after the hold a flood of
    /// releases.
    async fn forged(&mut self, aim: &Aim<'_>, i: usize, hold: Duration) -> Result<(), String> {
        self.log.record(&aim.ending(aim.until));
        self.signal_slot(i, Signal::SIGKILL);
        self.reap(i, "killed");
        // As anyone allowed to publish on the channel could: a
        // renewal that claims the dead leader's lease lasts an hour.
        self.publish(&["renewed:1:3600000".to_string()]).await?;
        // Kept down for the hold, so a respawned instance does not
        // hide followers that overslept.
        tokio::time::sleep(hold).await;
        let releases: Vec<String> = (0..FORGED_RELEASES)
            .map(|n| format!("released:{n}"))
            .collect();
        self.publish(&releases).await?;
        Ok(())
    }

    /// `stall`: the single redis-server paused (`CLIENT PAUSE`) for the
    /// hold.
    async fn stall(&mut self, aim: &Aim<'_>, hold: Duration) -> Result<(), String> {
        let ms = hold.as_millis().to_string();
        self.log.record(&aim.ending(aim.until));
        // CLIENT PAUSE answers at once; the blocking call is brief.
        self.single_redis()?
            .command(&["CLIENT", "PAUSE", &ms, "ALL"])
            .map_err(|e| e.to_string())?;
        tokio::time::sleep(hold).await;
        Ok(())
    }

    /// `delete-lease` or `revoke-lease`: an operator forces a re-election
    /// by hand: the leader's lease deleted (`DEL`, `etcdctl del`) or its
    /// etcd lease revoked. Only the holder's release may let a candidate in
    /// early, so nobody may be elected until the holder stopped; the wait
    /// it costs (up to a ttl for a holder that does not notice) is by
    /// design.
    ///
    /// A candidate that starts right after (a new process of a deploy)
    /// campaigns at once, while the followers that were running may be
    /// asleep until the lease's old expiry.
    async fn lease_by_hand_and_newcomer(
        &mut self,
        aim: &Aim<'_>,
        i: usize,
        hold: Duration,
    ) -> Result<(), String> {
        self.log.record(&aim.event(aim.until, Some(true)));
        let cut = aim.kind == "cut-delete-lease";
        if cut {
            self.set_link(i, Mode::Blackhole);
        }
        let by_hand = self.lease_by_hand(aim.kind == "revoke-lease").await;
        if by_hand.is_err() && cut {
            self.set_link(i, Mode::Pass);
        }
        by_hand?;
        let launched = self.newcomer(self.slots[i].ttl, hold).await;
        if cut {
            self.set_link(i, Mode::Pass);
        }
        launched
    }

    /// A new instance (a process of a deploy) that campaigns at once with
    /// lease `ttl`, for the hold.
    async fn newcomer(&mut self, ttl: Duration, hold: Duration) -> Result<(), String> {
        self.twins += 1;
        let newcomer = format!("new#{}", self.twins);
        let url = self.instance_url(&self.twin_links, 0);
        let mut child = self.launch(&newcomer, None, ttl, &url)?;
        tokio::time::sleep(hold).await;
        let how = stop_child(&mut child, Duration::from_secs(10)).await;
        self.log.record(&Event::Exit {
            inst: newcomer,
            t: now_ns(),
            how,
        });
        Ok(())
    }

    /// `restore-snapshot` on SQLite (see `embedded.rs`): a copy, a
    /// hand-over, the hold, the copy put back and a newcomer. One store
    /// outage from the copy until the newcomer's hold is over.
    async fn restore_sqlite(&mut self, hold: Duration) -> Result<(), String> {
        let in_place = self.rng.random_bool(0.5);
        let t = now_ns();
        let Store::Sqlite(file) = &self.store else {
            return Err(self.store.refusal("restore-snapshot"));
        };
        let copy = file.copy().await?;
        self.hand_over().await;
        tokio::time::sleep(hold).await;
        if let Store::Sqlite(file) = &self.store {
            file.restore(copy, in_place).await?;
        }
        let launched = self.newcomer(self.config.ttl, hold).await;
        self.log.record(&Event::Fault {
            kind: "restore-snapshot".to_string(),
            target: String::new(),
            t,
            until: now_ns(),
            store_down: Some(true),
        });
        launched
    }

    /// `restore-snapshot` on PostgreSQL (see `sql.rs`): a copy of the data
    /// directory, a hand-over, the hold, the server started from the copy
    /// and a newcomer. One store outage from the copy until the
    /// newcomer's hold is over.
    async fn restore_postgres(&mut self, hold: Duration) -> Result<(), String> {
        let t = now_ns();
        let Store::Postgres(pg) = &self.store else {
            return Err(self.store.refusal("restore-snapshot"));
        };
        let copy = pg.back_up().await?;
        self.hand_over().await;
        tokio::time::sleep(hold).await;
        if let Store::Postgres(pg) = &self.store {
            pg.restore(copy).await?;
            if let Some(pid) = pg.pid() {
                self.started.push(pid as i32);
            }
        }
        let launched = self.newcomer(self.config.ttl, hold).await;
        self.log.record(&Event::Fault {
            kind: "restore-snapshot".to_string(),
            target: String::new(),
            t,
            until: now_ns(),
            store_down: Some(true),
        });
        launched
    }

    /// `pg-failover` (see `sql.rs`): a replica, caught up and by the seed
    /// cut off, a hand-over, the hold, the server killed, the replica
    /// promoted and every proxy turned to it, and a newcomer. One store
    /// outage from the kill until the newcomer's hold is over (before the
    /// kill the server serves, and a gap then counts), so that the fault's
    /// time to the next leader is the failover's.
    async fn fail_over_postgres(&mut self, hold: Duration) -> Result<(), String> {
        let cut_off = self.rng.random_bool(0.5);
        let Store::Postgres(pg) = &self.store else {
            return Err(self.store.refusal("pg-failover"));
        };
        let replica = pg.start_replica(cut_off).await?;
        self.started.extend(replica.pid().map(|pid| pid as i32));
        self.hand_over().await;
        tokio::time::sleep(hold).await;
        let t = now_ns();
        if let Store::Postgres(pg) = &self.store {
            let port = pg.fail_over(replica).await?;
            for proxy in self.slots.iter().flat_map(|slot| &slot.links) {
                proxy.retarget(port);
            }
            for proxy in &self.twin_links {
                proxy.retarget(port);
            }
            // The harness's own client reconnects to the promoted replica.
            self.client = None;
        }
        let launched = self.newcomer(self.config.ttl, hold).await;
        self.log.record(&Event::Fault {
            kind: "pg-failover".to_string(),
            target: if cut_off { "cut-off" } else { "streaming" }.to_string(),
            t,
            until: now_ns(),
            store_down: Some(true),
        });
        launched
    }

    /// Whoever leads (once someone does, within ten ttls) hands over, and
    /// another is elected (within ten ttls).
    async fn hand_over(&mut self) {
        let ttl = self.config.ttl;
        let deadline = tokio::time::Instant::now() + ttl * 10;
        let mut leader = self.leader_slot().await;
        while leader.is_none() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(ttl / 10).await;
            leader = self.leader_slot().await;
        }
        if let Some(i) = leader {
            if let Some(pid) = self.slots[i].pid() {
                let _ = kill(pid, Signal::SIGTERM);
            }
            self.wait_exit(i, Duration::from_secs(10), "exit").await;
            let deadline = tokio::time::Instant::now() + ttl * 10;
            while self.leader_slot().await.is_none() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(ttl / 10).await;
            }
        }
    }

    /// A fault of a Sentinel group or cluster (see the module docs). The
    /// topology is whole before it begins and again when this returns. It
    /// is recorded from when it began until the store could serve the
    /// election again: a replica promoted, the slot handed over, the
    /// sentinel back.
    async fn store_fault(
        &mut self,
        kind: &str,
        target: String,
        hold: Duration,
    ) -> Result<(), String> {
        // Drawn for every such fault, so the schedule depends on the seed alone.
        let coin = self.rng.random_bool(0.5);
        let pick: usize = self.rng.random_range(0..1000);
        self.store.settle().await?;
        let Outage {
            t,
            until,
            store_down,
        } = match (&self.store, kind) {
            (Store::Sentinel(group), "sentinel-kill-primary") => {
                sentinel_kill_primary(group, coin, hold).await?
            }
            (Store::Sentinel(group), "sentinel-failover") => sentinel_failover(group).await?,
            (Store::Sentinel(group), "hang-sentinel") => {
                // The sentinel the leader lists first (see `instance_url`):
                // the one an instance following a single sentinel hears.
                let first = self
                    .slots
                    .iter()
                    .position(|slot| slot.inst() == target)
                    .unwrap_or(pick);
                hang_sentinel(group, first, hold).await?
            }
            (Store::Sentinel(group), "sentinel-kill-sentinel") => {
                sentinel_kill_sentinel(group, pick, hold).await?
            }
            (Store::Cluster(cluster), "cluster-failover") => cluster_failover(cluster).await?,
            (Store::Cluster(cluster), "cluster-kill-primary") => {
                let (own, _) = primaries(cluster).await?;
                Outage::of(kill_and_rejoin(cluster, own, hold).await?, None)
            }
            (Store::Cluster(cluster), "kill-shard-primary") => {
                kill_shard_primary(cluster, pick, hold).await?
            }
            (Store::Cluster(cluster), "cluster-reshard") => {
                cluster_reshard(cluster, pick, hold).await?
            }
            (Store::Etcd(cluster), "etcd-kill-member" | "etcd-pause-member") => {
                let kill = kind == "etcd-kill-member";
                let whom = if coin {
                    Whom::Leader
                } else {
                    Whom::Follower(pick)
                };
                consensus::stop_member(cluster, kill, whom, hold).await?
            }
            (Store::Etcd(cluster), "etcd-restart-all") => {
                consensus::restart_all(cluster, hold).await?
            }
            (Store::Etcd(cluster), "pause-minority-member") => {
                consensus::pause_minority_member(cluster, pick, hold).await?
            }
            (Store::Zk(ensemble), "zk-kill-member" | "zk-kill-leader" | "zk-pause-member") => {
                let whom = match kind {
                    "zk-kill-member" => Whom::Follower(pick),
                    "zk-kill-leader" => Whom::Leader,
                    _ if coin => Whom::Leader,
                    _ => Whom::Follower(pick),
                };
                let kill = kind != "zk-pause-member";
                consensus::stop_member(ensemble, kill, whom, hold).await?
            }
            (Store::Zk(ensemble), "zk-restart-all") => {
                consensus::restart_all(ensemble, hold).await?
            }
            (Store::Etcd(cluster), "etcd-compact") => etcd_compact(cluster).await?,
            (store, kind) => return Err(store.refusal(kind)),
        };
        self.log.record(&Event::Fault {
            kind: kind.to_string(),
            target,
            t,
            until,
            store_down,
        });
        self.store.settle().await?;
        for pid in self.store.pids() {
            if !self.started.contains(&pid) {
                self.started.push(pid);
            }
        }
        Ok(())
    }

    /// `restore-snapshot` (see the module docs): a cold backup of every
    /// member, a hand-over, the hold, and a restore from the backup. One
    /// store outage from the backup's start until the restored store has
    /// a leader.
    async fn restore_snapshot(&mut self, hold: Duration) -> Result<(), String> {
        self.store.settle().await?;
        let t = now_ns();
        match &self.store {
            Store::Etcd(cluster) => self.back_up_and_restore(&cluster.clone(), hold).await?,
            Store::Zk(ensemble) => self.back_up_and_restore(&ensemble.clone(), hold).await?,
            store => return Err(store.refusal("restore-snapshot")),
        }
        self.log.record(&Event::Fault {
            kind: "restore-snapshot".to_string(),
            target: String::new(),
            t,
            until: now_ns(),
            store_down: Some(true),
        });
        self.store.settle().await?;
        for pid in self.store.pids() {
            if !self.started.contains(&pid) {
                self.started.push(pid);
            }
        }
        Ok(())
    }

    /// The steps of `restore-snapshot` on `members`.
    async fn back_up_and_restore<C: Members>(
        &mut self,
        members: &Shared<C>,
        hold: Duration,
    ) -> Result<(), String> {
        let backup = consensus::back_up(members).await?;
        // Terms after the backup, whose tokens the restore must not issue
        // again: whoever leads hands over, and another is elected.
        self.hand_over().await;
        tokio::time::sleep(hold).await;
        consensus::restore(members, backup).await
    }

    /// Kill the election's Redis and start it again: from the snapshot
    /// `SAVE` wrote when `from_snapshot`, else empty (the snapshot, if any,
    /// is removed first). No snapshot is left behind either way.
    fn restart_redis(&mut self, from_snapshot: bool) -> Result<(), String> {
        let Store::Single { redis, snapshot } = &mut self.store else {
            return Err(needs_single("restarting Redis"));
        };
        if !from_snapshot {
            remove_snapshot(snapshot)?;
        }
        redis.restart().map_err(|e| e.to_string())?;
        remove_snapshot(snapshot)?;
        let pid = redis.pid().map(|pid| pid as i32);
        self.started.extend(pid);
        Ok(())
    }

    /// The election's Redis, in the single topology.
    fn single_redis(&self) -> Result<&RedisServer, String> {
        match &self.store {
            Store::Single { redis, .. } => Ok(redis),
            _ => Err(needs_single("this fault")),
        }
    }

    /// Set instance `index`'s links, all of them (single and etcd; elsewhere
    /// there is no proxy, and the kinds that use them are not drawn).
    fn set_link(&self, index: usize, mode: Mode) {
        for proxy in &self.slots[index].links {
            proxy.set(mode);
        }
    }

    /// Publish on the election's events channel, straight to the node
    /// that serves it: the single server, the primary the sentinels name,
    /// or (with `SPUBLISH`, as tenure's scripts do on a cluster) the primary
    /// of the channel's slot.
    /// Delete the election's lease by hand (with `revoke`, on etcd, revoke
    /// the etcd lease its key hangs on), as an operator forcing a
    /// re-election would; with `--unsafe-lease-by-hand-without-witness`
    /// the lease's witness goes too.
    async fn lease_by_hand(&self, revoke: bool) -> Result<(), String> {
        let prefix = tenure::DEFAULT_PREFIX;
        if let Store::Etcd(cluster) = &self.store {
            let cluster = cluster.clone();
            let witness_too = self.config.witness_too;
            return blocking("the lease is deleted by hand", move || {
                let cluster = lock(&cluster);
                let mut keys = vec![format!("{prefix}/{ELECTION}")];
                if witness_too {
                    keys.push(format!("{prefix}/{{{ELECTION}}}/witness"));
                }
                for key in keys {
                    etcd_by_hand(&cluster, &key, revoke)?;
                }
                Ok::<(), String>(())
            })
            .await;
        }
        if let Store::Zk(ensemble) = &self.store {
            let connect = lock(ensemble).connect_string();
            return zk_by_hand(&connect, self.config.witness_too).await;
        }
        if let Store::Sqlite(file) = &self.store {
            return file.delete_lease(self.config.witness_too).await;
        }
        if let Store::Postgres(pg) = &self.store {
            return pg.delete_lease(self.config.witness_too).await;
        }
        let lease = format!("{prefix}:{{{ELECTION}}}:lease");
        let url = self.primary_of(&lease).await?;
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let mut del = redis::cmd("DEL");
        del.arg(&lease);
        if self.config.witness_too {
            del.arg(format!("{prefix}:{{{ELECTION}}}:witness"));
        }
        del.query_async::<()>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }

    /// The URL of the Redis node that serves `key` now: the single
    /// server, the primary the sentinels name, or the cluster primary of
    /// its slot.
    async fn primary_of(&self, key: &str) -> Result<String, String> {
        match &self.store {
            Store::Single { redis, .. } => Ok(redis.url()),
            Store::Sentinel(group) => {
                let group = group.clone();
                let port =
                    blocking("the sentinels name a primary", move || group.primary_port()).await?;
                Ok(format!("redis://127.0.0.1:{port}"))
            }
            Store::Cluster(cluster) => {
                let cluster = cluster.clone();
                let slot = redis_process::slot_of(key);
                let port = blocking("the cluster names the slot's primary", move || {
                    cluster.primary_of_slot(slot)
                })
                .await?;
                Ok(format!("redis://127.0.0.1:{port}"))
            }
            Store::Etcd(_) | Store::Zk(_) | Store::Sqlite(_) | Store::Postgres(_) => {
                Err(format!("{key} is not on Redis"))
            }
        }
    }

    async fn publish(&self, messages: &[String]) -> Result<(), String> {
        let channel = format!("{}:{{{ELECTION}}}:events", tenure::DEFAULT_PREFIX);
        let command = match &self.store {
            Store::Cluster(_) => "SPUBLISH",
            Store::Etcd(_) | Store::Zk(_) | Store::Sqlite(_) | Store::Postgres(_) => {
                return Err(self.store.refusal("forged"))
            }
            _ => "PUBLISH",
        };
        let url = self.primary_of(&channel).await?;
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let mut pipe = redis::pipe();
        for message in messages {
            pipe.cmd(command).arg(&channel).arg(message).ignore();
        }
        pipe.query_async::<()>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }

    /// Wait for an instance to exit, SIGKILL it after `limit`, and record
    /// its end as `how` (`exit`: as its status says).
    async fn wait_exit(&mut self, index: usize, limit: Duration, how: &str) {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Some(child) = self.slots[index].child.as_mut() {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(pid) = self.slots[index].pid() {
            let _ = killpg(pid, Signal::SIGKILL);
        }
        self.reap(index, how);
    }

    /// Whether instance `index` is gone or has logged its start (a library
    /// instance does so once it listens for SIGTERM).
    fn listening(&mut self, index: usize) -> bool {
        use std::io::BufRead;
        let running = match self.slots[index].child.as_mut() {
            None => false,
            Some(child) => matches!(child.try_wait(), Ok(None)),
        };
        if !running {
            return true;
        }
        let stem = self.slots[index].inst().replace('#', "-");
        let mut first = String::new();
        std::fs::File::open(self.config.out.join(format!("{stem}.jsonl")))
            .map(|file| std::io::BufReader::new(file).read_line(&mut first))
            .is_ok()
            && first.contains(r#""ev":"start""#)
    }

    /// Restart any instance that is gone (killed, stopped, or crashed).
    fn respawn_dead(&mut self) -> Result<(), String> {
        for index in 0..self.slots.len() {
            let exited = match self.slots[index].child.as_mut() {
                None => true,
                Some(child) => !matches!(child.try_wait(), Ok(None)),
            };
            if exited {
                if self.slots[index].child.is_some() {
                    self.reap(index, "exit");
                }
                self.spawn(index)?;
            }
        }
        Ok(())
    }

    /// Stop every instance and save the resource's record of accepted
    /// writes; an error when that evidence could not be saved.
    async fn stop(&mut self) -> Result<(), String> {
        // Library mode: an instance respawned a moment ago may not listen
        // for SIGTERM yet; wait (within 5 s) until each has logged its start.
        if self.config.cli.is_none() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while tokio::time::Instant::now() < deadline
                && (0..self.slots.len()).any(|index| !self.listening(index))
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        for slot in &self.slots {
            if let Some(pid) = slot.pid() {
                let _ = kill(pid, Signal::SIGTERM);
            }
        }
        for index in 0..self.slots.len() {
            self.wait_exit(index, Duration::from_secs(10), "exit").await;
        }
        // The checker reads the accepted writes in the order the resource
        // accepted them.
        let accepted = self
            .resource_redis
            .command(&["LRANGE", "resource:accepted", "0", "-1"])
            .map_err(|e| format!("cannot read the resource's accepted writes: {e}"))?;
        let resource = self.config.out.join("resource.txt");
        std::fs::write(&resource, accepted)
            .map_err(|e| format!("cannot write {}: {e}", resource.display()))?;
        // etcd members log errors only; kept as evidence beside the run's
        // logs (their directories go with the cluster).
        let logs: Vec<(String, PathBuf)> = match &self.store {
            Store::Etcd(cluster) => {
                let cluster = lock(cluster);
                (0..cluster.members())
                    .map(|m| (format!("etcd-m{m}.log"), cluster.dir(m).join("etcd.log")))
                    .collect()
            }
            Store::Zk(ensemble) => {
                let ensemble = lock(ensemble);
                (0..ensemble.members())
                    .map(|m| {
                        (
                            format!("zk-m{m}.log"),
                            ensemble.dir(m).join("zookeeper.log"),
                        )
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        for (name, log) in logs {
            let copy = self.config.out.join(name);
            std::fs::copy(&log, &copy)
                .map_err(|e| format!("cannot write {}: {e}", copy.display()))?;
        }
        Ok(())
    }
}

impl Drop for Harness {
    /// A run that ends early (an error) leaves no instance behind; the
    /// store's processes are killed by their own handles' drops.
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.wait();
            }
        }
    }
}

/// A flag that turns true on SIGINT or SIGTERM.
fn stop_requests() -> tokio::sync::watch::Receiver<bool> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = tokio::sync::watch::channel(false);
    let signals = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    tokio::spawn(async move {
        match signals {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
                let _ = tx.send(true);
            }
            // No handler: never asked to stop (and the sender lives on, so
            // waiting on the flag waits).
            _ => std::future::pending::<()>().await,
        }
    });
    rx
}

pub struct RunOutcome {
    /// Every instance PID started, for the leak check.
    pub started: Vec<i32>,
}

fn needs_single(what: &str) -> String {
    format!("{what} needs --topology single")
}

/// Remove a snapshot `SAVE` wrote, if there is one.
fn remove_snapshot(snapshot: &std::path::Path) -> Result<(), String> {
    match std::fs::remove_file(snapshot) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("cannot remove {}: {err}", snapshot.display()))
        }
        _ => Ok(()),
    }
}

/// SIGTERM, then SIGKILL after `limit`; how it ended.
async fn stop_child(child: &mut Child, limit: Duration) -> String {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return describe(status);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = killpg(pid, Signal::SIGKILL);
    match child.wait() {
        Ok(status) => describe(status),
        Err(_) => "unknown".into(),
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit:{code}"),
        (None, Some(signal)) => format!("signal:{signal}"),
        _ => "unknown".into(),
    }
}

/// Process groups led by children of the guardian below `tenure_pid`
/// (CLI mode: tenure -> guardian (own group) -> command).
fn child_groups(tenure_pid: i32) -> Vec<i32> {
    tenure_procs::all()
        .into_iter()
        .filter(|p| p.ppid == tenure_pid && p.pgrp == p.pid)
        .map(|p| p.pid)
        .collect()
}

/// Delete `key` by hand through a member's JSON gateway (`etcdctl del`),
/// or with `revoke`, revoke the etcd lease it hangs on (`etcdctl lease
/// revoke`). A key that is not there (no leader right now) is no error.
fn etcd_by_hand(cluster: &EtcdCluster, key: &str, revoke: bool) -> Result<(), String> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(key);
    let body = format!(r#"{{"key":"{b64}"}}"#);
    let members: Vec<usize> = (0..cluster.members())
        .filter(|m| cluster.is_running(*m) && !cluster.is_paused(*m))
        .collect();
    let mut last = "no etcd member is running".to_string();
    for member in members {
        let answer = if revoke {
            cluster
                .post(member, "/v3/kv/range", &body)
                .and_then(|found| {
                    let lease = found
                        .split(r#""lease":""#)
                        .nth(1)
                        .and_then(|rest| rest.split('"').next())
                        .map(str::to_string);
                    match lease {
                        Some(lease) => {
                            let body = format!(r#"{{"ID":"{lease}"}}"#);
                            cluster.post(member, "/v3/lease/revoke", &body)
                        }
                        None => Ok(found),
                    }
                })
        } else {
            cluster.post(member, "/v3/kv/deleterange", &body)
        };
        match answer {
            Ok(_) => return Ok(()),
            Err(err) => last = err.to_string(),
        }
    }
    Err(format!("cannot change {key} by hand: {last}"))
}

/// Delete the election's lease znode by hand through a client of the
/// harness's own (`deleteall`/`delete` in `zkCli.sh`); with `witness_too`,
/// the witness of its term too. A znode that is not there (no leader right
/// now) is no error.
async fn zk_by_hand(connect: &str, witness_too: bool) -> Result<(), String> {
    use zookeeper_client as zk;
    let prefix = tenure::DEFAULT_PREFIX;
    let client = tokio::time::timeout(ZK_BY_HAND_TIMEOUT, zk::Client::connect(connect))
        .await
        .map_err(|_| "cannot reach ZooKeeper to delete the lease by hand: timed out".to_string())?
        .map_err(|e| format!("cannot reach ZooKeeper to delete the lease by hand: {e}"))?;
    let mut paths = vec![format!("/{prefix}/{ELECTION}")];
    if witness_too {
        let dir = format!("/{prefix}/{{{ELECTION}}}");
        let children = match client.list_children(&dir).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(format!("cannot list {dir}: {e}")),
        };
        paths.extend(
            children
                .into_iter()
                .filter(|child| child.starts_with("w-"))
                .map(|child| format!("{dir}/{child}")),
        );
    }
    for path in paths {
        match client.delete(&path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(format!("cannot delete {path} by hand: {e}")),
        }
    }
    Ok(())
}

/// How long deleting a lease by hand on ZooKeeper may take.
const ZK_BY_HAND_TIMEOUT: Duration = Duration::from_secs(10);
