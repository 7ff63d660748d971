//! A Redis Cluster for tests: primaries with replicas, all private processes
//! on free ports of 127.0.0.1 (client ports and cluster bus ports both
//! chosen free, so nothing depends on `port + 10000` being unused).
//!
//! Code that follows keys across a cluster meets `MOVED` and `ASK`
//! redirections, failovers that move a shard to another node, and a slot
//! held half-way through a migration. Only a real cluster produces those
//! faithfully, so this module starts one (built by hand with
//! `CLUSTER ADDSLOTSRANGE`, `MEET` and `REPLICATE`, which is quicker than
//! `redis-cli --cluster create` and needs no second tool) and offers the
//! faults and the migration steps, each followed by a wait until every
//! running node agrees on the new layout, so tests never sleep and hope.
//!
//! ```no_run
//! let cluster = redis_process::RedisCluster::start()?;
//! let slot = redis_process::slot_of("some-key");
//! let owner = cluster.primary_of_slot(slot)?;
//! cluster.node(owner)?.command(&["SET", "some-key", "1"])?;
//! let new_owner = cluster.failover(owner)?;
//! assert_ne!(owner, new_owner);
//! # Ok::<(), redis_process::Error>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::node::{
    common_config, info_field, not_yet, poll, quote, wait_for_offset, Kind, Node, NotYet, Ports,
};
use crate::resp::Value;
use crate::{find_redis_server, Error};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long starting a cluster and the cluster's own waits may take. Expect
/// a few seconds; the margin is for loaded machines.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many keys one `MIGRATE` moves.
const MIGRATE_BATCH: usize = 100;

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of the part
/// between the first `{` and the next `}` when that part is not empty,
/// modulo [`SLOTS`].
pub fn slot_of(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the one Redis
/// Cluster hashes keys with; bit by bit, as speed does not matter here.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Options for a [`RedisCluster`] before it starts.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    primaries: usize,
    replicas: usize,
    password: Option<String>,
    node_timeout: Duration,
    full_coverage: bool,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            primaries: 3,
            replicas: 1,
            password: None,
            node_timeout: Duration::from_millis(1000),
            full_coverage: true,
        }
    }
}

impl ClusterBuilder {
    /// How many primaries share the slots (default 3). A replica needs the
    /// votes of a majority of primaries to take over, so with fewer than
    /// three a dead primary is never replaced.
    pub fn primaries(mut self, count: usize) -> Self {
        self.primaries = count;
        self
    }

    /// How many replicas each primary has (default 1).
    pub fn replicas_per_primary(mut self, count: usize) -> Self {
        self.replicas = count;
        self
    }

    /// Require this password on every node (`requirepass`, and `masterauth`
    /// so replicas can sync). It appears in [`RedisCluster::url`] as given,
    /// so keep it URL-safe.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// `cluster-node-timeout` (default 1 s): how long a node may be
    /// unreachable before it is judged failing and its replica takes over.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// `cluster-require-full-coverage` (default `yes`, as Redis's own): with
    /// `yes`, every node refuses every command (`CLUSTERDOWN`) while any
    /// slot is unserved, as between a primary's failure and its replica's
    /// promotion; with `no`, only the failed shard's slots are refused.
    pub fn full_coverage(mut self, required: bool) -> Self {
        self.full_coverage = required;
        self
    }

    /// Start the nodes, give each primary an equal share of the slots,
    /// attach the replicas, and return once every node reports
    /// `cluster_state:ok`, all agree on the layout and every replica's link
    /// is up.
    pub fn start(self) -> Result<RedisCluster, Error> {
        if self.primaries == 0 || self.primaries > usize::from(SLOTS) {
            return Err(Error::Topology(format!(
                "a cluster needs 1 to {SLOTS} primaries, not {}",
                self.primaries
            )));
        }
        let binary = find_redis_server()?;
        let count = self.primaries * (1 + self.replicas);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(Node::start(
                Kind::Cluster,
                &binary,
                self.password.as_deref(),
                true,
                Vec::new(),
                |ports, dir| self.config(ports, dir),
            )?);
        }
        let mut ids = Vec::with_capacity(count);
        for node in &nodes {
            let id = node.ask(&["CLUSTER", "MYID"])?;
            ids.push(id.text().unwrap_or_default().to_owned());
        }
        let primaries = self.primaries;
        let mut expected = Layout::default();
        for (i, node) in nodes.iter().enumerate().take(primaries) {
            let (first, last) = share(i, primaries);
            let (first_text, last_text) = (first.to_string(), last.to_string());
            node.ask(&["CLUSTER", "ADDSLOTSRANGE", &first_text, &last_text])?;
            expected.ranges.push((first, last, node.port()));
        }
        // Distinct epochs up front, as redis-cli does, so the nodes need
        // not resolve colliding epochs after meeting.
        for (i, node) in nodes.iter().enumerate() {
            node.ask(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()])?;
        }
        for node in &nodes[1..] {
            let port = node.port().to_string();
            let bus = node.bus_port().unwrap_or_default().to_string();
            nodes[0].ask(&["CLUSTER", "MEET", "127.0.0.1", &port, &bus])?;
        }
        poll(READY_TIMEOUT, "every node knows every other", || {
            for node in &nodes {
                let seen = Seen::parse(node)?;
                let known = seen.entries.iter().filter(|e| e.usable()).count();
                if known != count {
                    return not_yet(format!("{} knows {known} of {count} nodes", node.port()));
                }
            }
            Ok(())
        })?;
        for (i, node) in nodes.iter().enumerate().skip(primaries) {
            let primary = (i - primaries) / self.replicas;
            node.ask(&["CLUSTER", "REPLICATE", &ids[primary]])?;
        }
        for (i, node) in nodes.iter().enumerate() {
            let primary = (i >= primaries).then(|| nodes[(i - primaries) / self.replicas].port());
            expected.roles.insert(node.port(), primary);
        }
        let cluster = RedisCluster {
            password: self.password,
            seeds: nodes[..primaries].iter().map(Node::port).collect(),
            nodes,
            ids,
            last: Mutex::new(Layout::default()),
            migrations: Mutex::new(HashMap::new()),
        };
        cluster.settle("the new cluster is ready", |layout| {
            if *layout != expected {
                return not_yet(format!("layout {layout:?}, want {expected:?}"));
            }
            Ok(())
        })?;
        Ok(cluster)
    }

    fn config(&self, ports: Ports, dir: &Path) -> String {
        let mut config = common_config(ports, dir);
        config.push_str(&format!(
            "cluster-port {}\nsave \"\"\nappendonly no\nenable-debug-command local\n\
             repl-diskless-sync-delay 0\ncluster-enabled yes\n\
             cluster-config-file nodes.conf\ncluster-node-timeout {}\n\
             cluster-announce-ip 127.0.0.1\ncluster-require-full-coverage {}\n",
            ports.bus.unwrap_or_default(),
            self.node_timeout.as_millis(),
            if self.full_coverage { "yes" } else { "no" },
        ));
        if let Some(password) = &self.password {
            config.push_str(&format!(
                "requirepass {0}\nmasterauth {0}\n",
                quote(password)
            ));
        }
        config
    }
}

/// The layout all running nodes agree on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Layout {
    /// `(first slot, last slot, owner port)`, ordered by first slot.
    ranges: Vec<(u16, u16, u16)>,
    /// Running node's port → the port of its primary (`None` for a
    /// primary).
    roles: BTreeMap<u16, Option<u16>>,
}

impl Layout {
    fn owner(&self, slot: u16) -> Option<u16> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, port)| *port)
    }

    fn slots_of(&self, port: u16) -> Vec<(u16, u16)> {
        self.ranges
            .iter()
            .filter(|(_, _, owner)| *owner == port)
            .map(|(first, last, _)| (*first, *last))
            .collect()
    }
}

/// A slot migration begun with [`RedisCluster::begin_migration`].
#[derive(Debug, Clone, Copy)]
struct Migration {
    from: u16,
    to: u16,
}

/// A Redis Cluster of private `redis-server` processes; every process is
/// killed by PID and its directory removed on drop.
///
/// Nodes are addressed by port. The layout changes with failovers and
/// migrations: ask [`RedisCluster::primary_of_slot`] and
/// [`RedisCluster::replica_of`] rather than remembering roles.
#[derive(Debug)]
pub struct RedisCluster {
    password: Option<String>,
    /// The nodes started as primaries: the URL's seed list.
    seeds: Vec<u16>,
    nodes: Vec<Node>,
    /// Cluster node IDs, by index of `nodes` (a node keeps its ID across a
    /// kill and resume, in `nodes.conf`).
    ids: Vec<String>,
    /// The layout of the last successful wait, to know which slots a killed
    /// primary held.
    last: Mutex<Layout>,
    migrations: Mutex<HashMap<u16, Migration>>,
}

impl RedisCluster {
    /// Start a cluster with the defaults: three primaries with one replica
    /// each, no password, a node timeout of one second.
    pub fn start() -> Result<Self, Error> {
        ClusterBuilder::default().start()
    }

    /// Options for a cluster of another shape, with a password or another
    /// node timeout.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// A URL for clients, the nodes started as primaries as a seed list:
    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`, with
    /// `:PASSWORD@` before the hosts when a password is set. The seeds stay
    /// the same after failovers (a client discovers the layout from any of
    /// them).
    pub fn url(&self) -> String {
        let hosts = self
            .seeds
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        match &self.password {
            Some(password) => format!("redis+cluster://:{password}@{hosts}"),
            None => format!("redis+cluster://{hosts}"),
        }
    }

    /// Every node, primaries first in the order they were started.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The ports of every node.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(Node::port).collect()
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> Result<&Node, Error> {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .ok_or_else(|| Error::Topology(format!("port {port} is not a node of this cluster")))
    }

    /// The cluster node ID of the node on `port` (as in `CLUSTER NODES` and
    /// `CLUSTER SETSLOT`).
    pub fn node_id(&self, port: u16) -> Result<&str, Error> {
        let index = self.index(port)?;
        Ok(&self.ids[index])
    }

    /// The ports of the nodes owning slots, as the running nodes agree,
    /// ordered by their first slot.
    pub fn primary_ports(&self) -> Result<Vec<u16>, Error> {
        let layout = self.layout()?;
        let mut ports: Vec<u16> = Vec::new();
        for (_, _, port) in layout.ranges {
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        Ok(ports)
    }

    /// The port of the primary owning `slot`, as the running nodes agree.
    pub fn primary_of_slot(&self, slot: u16) -> Result<u16, Error> {
        self.layout()?
            .owner(slot)
            .ok_or_else(|| Error::Topology(format!("no node owns slot {slot}")))
    }

    /// The port of a running replica of the primary on `primary_port`, as
    /// the running nodes agree.
    pub fn replica_of(&self, primary_port: u16) -> Result<u16, Error> {
        let layout = self.layout()?;
        replica_in(&layout, primary_port)
            .ok_or_else(|| Error::Topology(format!("{primary_port} has no running replica")))
    }

    /// Wait until every running replica of the primary on `primary_port`
    /// has applied every write it acknowledged before this call.
    /// Replication is asynchronous: a write still on its way when the
    /// primary dies is lost, and right after a replica (re)attaches the
    /// primary streams nothing to it until the replica's first
    /// acknowledgement, up to a second later. Call this between a write and
    /// a crash that it must survive.
    pub fn wait_for_replication(&self, primary_port: u16, timeout: Duration) -> Result<(), Error> {
        let layout = self.layout()?;
        let replicas = layout
            .roles
            .iter()
            .filter(|(_, p)| **p == Some(primary_port))
            .map(|(port, _)| self.node(*port))
            .collect::<Result<Vec<_>, _>>()?;
        wait_for_offset(self.node(primary_port)?, &replicas, timeout)
    }

    /// Send one command to the node on `port` (see [`Node::command`]).
    pub fn command(&self, port: u16, args: &[&str]) -> Result<String, Error> {
        self.node(port)?.command(args)
    }

    /// Kill the node on `port` (SIGKILL by PID). When it was a primary, its
    /// replica takes over after the node timeout: wait with
    /// [`RedisCluster::wait_for_failover`].
    pub fn kill(&self, port: u16) -> Result<(), Error> {
        self.node(port)?.kill();
        Ok(())
    }

    /// Stop the node on `port` with SIGSTOP (see [`Node::pause`]).
    pub fn pause(&self, port: u16) -> Result<(), Error> {
        self.node(port)?.pause()
    }

    /// Let the paused node on `port` run again (SIGCONT).
    pub fn unpause(&self, port: u16) -> Result<(), Error> {
        self.node(port)?.unpause()
    }

    /// Start the killed node on `port` again, empty, from its `nodes.conf`,
    /// and wait until it has rejoined: an old primary whose slots were taken
    /// over comes back as a replica of the node that took them, and every
    /// running node agrees on the layout again.
    pub fn resume(&self, port: u16) -> Result<(), Error> {
        let node = self.node(port)?;
        node.resume()?;
        let what = format!("{port} has rejoined the cluster");
        self.settle(&what, |layout| match layout.roles.get(&port) {
            None => not_yet(format!("{port} is not in the layout")),
            Some(None) if layout.slots_of(port).is_empty() => {
                not_yet(format!("{port} is a primary without slots"))
            }
            Some(_) => Ok(()),
        })?;
        Ok(())
    }

    /// Wait until the slots the killed (or paused) primary on `old_primary`
    /// held are owned by another running node and every running node agrees
    /// on that; return the new owner's port.
    pub fn wait_for_failover(&self, old_primary: u16) -> Result<u16, Error> {
        let slots = self.last().slots_of(old_primary);
        if slots.is_empty() {
            return Err(Error::Topology(format!(
                "{old_primary} owned no slots at the last agreed layout"
            )));
        }
        let what = format!("the slots of {old_primary} have moved to another node");
        let layout = self.settle(&what, |layout| {
            let owners: Vec<Option<u16>> = slots.iter().map(|(f, _)| layout.owner(*f)).collect();
            match owners.first().copied().flatten() {
                Some(owner) if owner != old_primary && owners.iter().all(|o| *o == Some(owner)) => {
                    Ok(())
                }
                _ => not_yet(format!(
                    "the slots of {old_primary} are owned by {owners:?}"
                )),
            }
        })?;
        layout
            .owner(slots[0].0)
            .ok_or_else(|| Error::Topology("the new owner disappeared".into()))
    }

    /// Fail the primary on `primary_port` over to one of its replicas
    /// (`CLUSTER FAILOVER` on the replica, a coordinated switch that loses no
    /// acknowledged write), wait until every running node agrees that the
    /// replica owns those slots and the old primary replicates from it, and
    /// return the new primary's port.
    pub fn failover(&self, primary_port: u16) -> Result<u16, Error> {
        let before = self.settle("the cluster is settled before a failover", |_| Ok(()))?;
        let slots = before.slots_of(primary_port);
        if slots.is_empty() {
            return Err(Error::Topology(format!("{primary_port} owns no slots")));
        }
        let replica = replica_in(&before, primary_port)
            .ok_or_else(|| Error::Topology(format!("{primary_port} has no running replica")))?;
        self.node(replica)?.ask(&["CLUSTER", "FAILOVER"])?;
        let what = format!("{replica} has taken over the slots of {primary_port}");
        self.settle(&what, |layout| {
            if layout.slots_of(replica) != slots {
                return not_yet(format!("{replica} owns {:?}", layout.slots_of(replica)));
            }
            match layout.roles.get(&primary_port) {
                Some(Some(p)) if *p == replica => Ok(()),
                None => Ok(()), // not running (killed or paused meanwhile)
                other => not_yet(format!("{primary_port} has primary {other:?}")),
            }
        })?;
        Ok(replica)
    }

    /// Start moving `slot` to the primary on `to_port`: `CLUSTER SETSLOT
    /// slot IMPORTING` on the target, then `MIGRATING` on the current
    /// owner. Until [`RedisCluster::finish_migration`], the owner answers
    /// `ASK` for keys of the slot it no longer holds.
    pub fn begin_migration(&self, slot: u16, to_port: u16) -> Result<(), Error> {
        let from = self.primary_of_slot(slot)?;
        if from == to_port {
            return Err(Error::Topology(format!(
                "slot {slot} already belongs to {to_port}"
            )));
        }
        let slot_text = slot.to_string();
        let target = self.node(to_port)?;
        let source = self.node(from)?;
        let from_id = self.node_id(from)?;
        let to_id = self.node_id(to_port)?;
        target.ask(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", from_id])?;
        source.ask(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", to_id])?;
        self.migrations()
            .insert(slot, Migration { from, to: to_port });
        Ok(())
    }

    /// Move every key of a slot under migration from its owner to the
    /// target (`CLUSTER GETKEYSINSLOT`, then `MIGRATE ... KEYS`, in batches,
    /// authenticating when the cluster has a password); return how many
    /// moved. Keys must be valid UTF-8.
    pub fn migrate_keys(&self, slot: u16) -> Result<usize, Error> {
        let migration = self.migration(slot)?;
        let source = self.node(migration.from)?;
        let slot_text = slot.to_string();
        let batch = MIGRATE_BATCH.to_string();
        let to_port = migration.to.to_string();
        let mut moved = 0;
        loop {
            let keys = source.ask(&["CLUSTER", "GETKEYSINSLOT", &slot_text, &batch])?;
            let keys: Vec<&str> = keys.items().iter().filter_map(Value::text).collect();
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "10000"];
            if let Some(password) = &self.password {
                args.extend(["AUTH", password]);
            }
            args.push("KEYS");
            args.extend(&keys);
            source.ask(&args)?;
            moved += keys.len();
        }
    }

    /// End a migration: `CLUSTER SETSLOT slot NODE target` on the target,
    /// the old owner and every other primary, then wait until every
    /// running node agrees the target owns the slot. The old owner must hold
    /// no keys of the slot any more ([`RedisCluster::migrate_keys`]).
    pub fn finish_migration(&self, slot: u16) -> Result<(), Error> {
        let migration = self.migration(slot)?;
        let slot_text = slot.to_string();
        let to_id = self.node_id(migration.to)?;
        let before = self.layout()?;
        let mut order = vec![migration.to, migration.from];
        for (_, _, owner) in &before.ranges {
            if !order.contains(owner) {
                order.push(*owner);
            }
        }
        for port in order {
            let node = self.node(port)?;
            if node.is_live() {
                node.ask(&["CLUSTER", "SETSLOT", &slot_text, "NODE", to_id])?;
            }
        }
        self.migrations().remove(&slot);
        let what = format!("slot {slot} belongs to {}", migration.to);
        self.settle(&what, |layout| match layout.owner(slot) {
            Some(owner) if owner == migration.to => Ok(()),
            owner => not_yet(format!("slot {slot} is owned by {owner:?}")),
        })?;
        Ok(())
    }

    /// Move `slot` and its keys to the primary on `to_port`:
    /// [`RedisCluster::begin_migration`], [`RedisCluster::migrate_keys`],
    /// [`RedisCluster::finish_migration`].
    pub fn migrate_slot(&self, slot: u16, to_port: u16) -> Result<(), Error> {
        self.begin_migration(slot, to_port)?;
        self.migrate_keys(slot)?;
        self.finish_migration(slot)
    }

    /// Wait until the cluster is settled: every running node reports
    /// `cluster_state:ok`, sees every other running node as healthy and
    /// connected, all agree on the layout, and every running replica's link
    /// to its primary is up.
    pub fn wait_until_ready(&self, timeout: Duration) -> Result<(), Error> {
        self.settle_within(timeout, "the cluster is settled", |_| Ok(()))?;
        Ok(())
    }

    fn index(&self, port: u16) -> Result<usize, Error> {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .ok_or_else(|| Error::Topology(format!("port {port} is not a node of this cluster")))
    }

    fn last(&self) -> MutexGuard<'_, Layout> {
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn migrations(&self) -> MutexGuard<'_, HashMap<u16, Migration>> {
        self.migrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn migration(&self, slot: u16) -> Result<Migration, Error> {
        self.migrations()
            .get(&slot)
            .copied()
            .ok_or_else(|| Error::Topology(format!("no migration of slot {slot} was begun")))
    }

    /// The layout the running nodes agree on, waiting for agreement (it is
    /// immediate unless a change is still spreading).
    fn layout(&self) -> Result<Layout, Error> {
        poll(
            READY_TIMEOUT,
            "the running nodes agree on the layout",
            || Ok(self.agreed()?.0),
        )
    }

    fn settle(
        &self,
        what: &str,
        expect: impl FnMut(&Layout) -> Result<(), NotYet>,
    ) -> Result<Layout, Error> {
        self.settle_within(READY_TIMEOUT, what, expect)
    }

    /// Wait until the cluster is settled (see
    /// [`RedisCluster::wait_until_ready`]) and its layout passes `expect`.
    fn settle_within(
        &self,
        timeout: Duration,
        what: &str,
        mut expect: impl FnMut(&Layout) -> Result<(), NotYet>,
    ) -> Result<Layout, Error> {
        let layout = poll(timeout, what, || {
            let (layout, views) = self.agreed()?;
            for (node, seen) in &views {
                let info = node.ask(&["CLUSTER", "INFO"])?;
                let state = info_field(info.text().unwrap_or_default(), "cluster_state");
                if state.as_deref() != Some("ok") {
                    return not_yet(format!("{} has cluster_state {state:?}", node.port()));
                }
                for other in layout.roles.keys() {
                    let entry = seen.entries.iter().find(|e| e.port == *other);
                    match entry {
                        Some(e) if e.healthy() => {}
                        _ => return not_yet(format!("{} sees {other} as {entry:?}", node.port())),
                    }
                }
            }
            for (port, primary) in &layout.roles {
                let Some(primary) = primary else { continue };
                let node = self.node(*port)?;
                let info = node.ask(&["INFO", "replication"])?;
                let info = info.text().unwrap_or_default();
                let link = info_field(info, "master_link_status");
                let master = info_field(info, "master_port");
                if link.as_deref() != Some("up") || master != Some(primary.to_string()) {
                    return not_yet(format!(
                        "replica {port} has link {link:?} to primary port {master:?} \
                         (want {primary}, up)"
                    ));
                }
            }
            expect(&layout)?;
            Ok(layout)
        })?;
        *self.last() = layout.clone();
        Ok(layout)
    }

    /// Every running node's view, and the layout they all agree on.
    fn agreed(&self) -> Result<(Layout, Views<'_>), NotYet> {
        let live: Vec<&Node> = self.nodes.iter().filter(|n| n.is_live()).collect();
        let mut views = Vec::with_capacity(live.len());
        let mut agreed: Option<(u16, Layout)> = None;
        for node in live.iter().copied() {
            let seen = Seen::parse(node)?;
            let layout = seen.layout(&live);
            match &agreed {
                None => agreed = Some((node.port(), layout)),
                Some((_, first)) if *first == layout => {}
                Some((port, first)) => {
                    return not_yet(format!(
                        "{port} sees {first:?} but {} sees {layout:?}",
                        node.port()
                    ))
                }
            }
            views.push((node, seen));
        }
        match agreed {
            Some((_, layout)) => Ok((layout, views)),
            None => not_yet("no node is running"),
        }
    }
}

/// Each running node with its `CLUSTER NODES`.
type Views<'a> = Vec<(&'a Node, Seen)>;

/// A running replica of `primary` in `layout`.
fn replica_in(layout: &Layout, primary: u16) -> Option<u16> {
    layout
        .roles
        .iter()
        .find(|(_, p)| **p == Some(primary))
        .map(|(port, _)| *port)
}

/// The slots primary `index` of `primaries` starts with: an equal share,
/// as `(first, last)`.
fn share(index: usize, primaries: usize) -> (u16, u16) {
    // index < primaries <= SLOTS: each bound is at most SLOTS, and the next
    // one at least 1.
    let bound = |i: usize| (i * usize::from(SLOTS) / primaries) as u16;
    (bound(index), bound(index + 1) - 1)
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct Entry {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The primary's ID, for a replica.
    primary: Option<String>,
    connected: bool,
    /// Owned slot ranges (migration markers left out).
    slots: Vec<(u16, u16)>,
}

impl Entry {
    /// Known by address and ID, not still being introduced.
    fn usable(&self) -> bool {
        self.port != 0 && !self.has("handshake") && !self.has("noaddr")
    }

    /// Usable, not suspected or judged failing, and its link up.
    fn healthy(&self) -> bool {
        self.usable() && !self.has("fail") && !self.has("fail?") && self.connected
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn parse(line: &str) -> Option<Entry> {
        let mut fields = line.split_whitespace();
        let id = fields.next()?.to_owned();
        let address = fields.next()?;
        let port = address
            .split('@')
            .next()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        let flags = fields.next()?.split(',').map(str::to_owned).collect();
        let primary = Some(fields.next()?)
            .filter(|p| *p != "-")
            .map(str::to_owned);
        let connected = fields.nth(3)? == "connected";
        let mut slots = Vec::new();
        for token in fields.filter(|t| !t.starts_with('[')) {
            let (first, last) = token.split_once('-').unwrap_or((token, token));
            slots.push((first.parse().ok()?, last.parse().ok()?));
        }
        Some(Entry {
            id,
            port,
            flags,
            primary,
            connected,
            slots,
        })
    }
}

/// One node's `CLUSTER NODES`.
#[derive(Debug)]
struct Seen {
    entries: Vec<Entry>,
}

impl Seen {
    fn parse(node: &Node) -> Result<Seen, NotYet> {
        let reply = node.ask(&["CLUSTER", "NODES"])?;
        let text = reply.text().unwrap_or_default();
        let mut entries = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match Entry::parse(line) {
                Some(entry) => entries.push(entry),
                None => {
                    return not_yet(format!(
                        "{} printed a CLUSTER NODES line we cannot read: {line:?}",
                        node.port()
                    ))
                }
            }
        }
        Ok(Seen { entries })
    }

    /// Slot owners, and the roles of the `live` nodes.
    fn layout(&self, live: &[&Node]) -> Layout {
        let port_of: HashMap<&str, u16> = self
            .entries
            .iter()
            .map(|e| (e.id.as_str(), e.port))
            .collect();
        let mut ranges: Vec<(u16, u16, u16)> = self
            .entries
            .iter()
            .filter(|e| e.has("master"))
            .flat_map(|e| e.slots.iter().map(|(f, l)| (*f, *l, e.port)))
            .collect();
        ranges.sort_unstable();
        let mut roles = BTreeMap::new();
        for node in live {
            if let Some(entry) = self.entries.iter().find(|e| e.port == node.port()) {
                let primary = match &entry.primary {
                    Some(id) if entry.has("slave") => {
                        Some(port_of.get(id.as_str()).copied().unwrap_or(0))
                    }
                    _ => None,
                };
                roles.insert(node.port(), primary);
            }
        }
        Layout { ranges, roles }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of("123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of(""), 0);
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        // Empty tag: the whole key is hashed.
        assert_eq!(slot_of("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        // Only the first `{` counts, up to the next `}`.
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
        // No closing brace: the whole key.
        assert_eq!(slot_of("foo{bar"), crc16(b"foo{bar") % SLOTS);
    }

    #[test]
    fn primaries_share_every_slot() {
        assert_eq!(share(0, 1), (0, SLOTS - 1));
        assert_eq!(share(0, 3), (0, 5460));
        assert_eq!(share(1, 3), (5461, 10921));
        assert_eq!(share(2, 3), (10922, 16383));
        assert_eq!(share(16383, 16384), (16383, 16383));
    }

    #[test]
    fn reads_cluster_nodes_lines() {
        let line = "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host \
                    slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected";
        let entry = Entry::parse(line).expect("a replica line");
        assert_eq!(entry.port, 30004);
        assert!(entry.has("slave") && entry.healthy());
        assert_eq!(
            entry.primary.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        let line = "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 \
                    myself,master - 0 0 1 connected 0-5460 5462 [5461->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]";
        let entry = Entry::parse(line).expect("a primary line");
        assert_eq!(entry.slots, vec![(0, 5460), (5462, 5462)]);
        assert!(entry.primary.is_none());
        let line = "6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 \
                    master,fail - 1426238316232 1426238316232 5 disconnected";
        let entry = Entry::parse(line).expect("a failed line");
        assert!(!entry.healthy());
    }
}
