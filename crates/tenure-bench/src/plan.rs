//! What a run does: the sections it can run (`--only`) and how much of
//! everything each does (`--quick` or not). A leaf: every section reads it.

use std::time::Duration;

/// A part of the bench that can be run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    /// Every row on one private redis-server (floor, operations, hand-over,
    /// CLI, takeover, idle load, scale).
    Single,
    /// Hand-over and takeover on a Sentinel group.
    Sentinel,
    /// Hand-over, takeover and a large partition set on a Redis Cluster.
    Cluster,
    /// Hand-over, takeover, idle load and a large partition set on a
    /// 3-member etcd cluster, beside the same figures on a redis-server.
    Etcd,
    /// Hand-over, takeover, idle load and a large partition set on a
    /// 3-member ZooKeeper ensemble, beside the same figures on a
    /// redis-server.
    Zk,
    /// Hand-over, takeover after a crash and a large partition set on a
    /// SQLite file, beside the same figures on a redis-server.
    Sqlite,
    /// Hand-over, takeover, `tenure run` and a large partition set on a
    /// PostgreSQL server, beside the same figures on a redis-server.
    Postgres,
    /// tenure beside the libraries a user would pick instead (redis-py's
    /// Lock, python-redis-lock, pottery's Redlock), each candidate a
    /// process, on one redis-server: hand-over, takeover, idle requests,
    /// acts of a paused holder.
    Peers,
}

impl Section {
    pub const ALL: [Section; 8] = [
        Section::Single,
        Section::Sentinel,
        Section::Cluster,
        Section::Etcd,
        Section::Zk,
        Section::Sqlite,
        Section::Postgres,
        Section::Peers,
    ];

    /// The name `--only` takes.
    pub fn name(self) -> &'static str {
        match self {
            Section::Single => "single",
            Section::Sentinel => "sentinel",
            Section::Cluster => "cluster",
            Section::Etcd => "etcd",
            Section::Zk => "zk",
            Section::Sqlite => "sqlite",
            Section::Postgres => "postgres",
            Section::Peers => "peers",
        }
    }
}

/// How much of everything to do.
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) ops: usize,
    /// Samples of calls made after an idle pause (20 ms each).
    pub(crate) idle_ops: usize,
    /// Lease ttls per load window.
    pub(crate) load_terms: u32,
    pub(crate) handovers: usize,
    pub(crate) naive_handovers: usize,
    /// Rounds of two real `tenure run` processes.
    pub(crate) cli_handovers: usize,
    pub(crate) crashes: usize,
    pub(crate) load_ttl: Duration,
    pub(crate) scales: Vec<usize>,
    pub(crate) naive_scales: Vec<usize>,
    pub(crate) scale_seconds: u64,
    /// Partitions of the set on the Redis Cluster (and on etcd and
    /// ZooKeeper).
    pub(crate) cluster_partitions: usize,
    /// Samples of each etcd floor (a read, a write, a write seen by a
    /// watcher) and each ZooKeeper floor: each costs a consensus round, so
    /// fewer than `ops`.
    pub(crate) etcd_ops: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                ops: 200,
                idle_ops: 60,
                load_terms: 2,
                handovers: 20,
                // Enough rounds that the pictures' CDFs are curves, not
                // two or three steps.
                naive_handovers: 10,
                cli_handovers: 20,
                crashes: 6,
                load_ttl: Duration::from_secs(1),
                scales: vec![1_000, 10_000],
                naive_scales: vec![1_000],
                scale_seconds: 2,
                cluster_partitions: 10_000,
                etcd_ops: 100,
            }
        } else {
            Plan {
                quick,
                ops: 2_000,
                idle_ops: 300,
                load_terms: 4,
                handovers: 100,
                naive_handovers: 20,
                cli_handovers: 100,
                crashes: 10,
                load_ttl: Duration::from_secs(3),
                scales: vec![1_000, 10_000, 100_000],
                naive_scales: vec![1_000, 10_000],
                scale_seconds: 12,
                cluster_partitions: 10_000,
                etcd_ops: 500,
            }
        }
    }
}
