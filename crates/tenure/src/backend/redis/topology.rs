//! Where a Redis store's data lives: one server, the primary that Redis
//! Sentinel names, or the shards of a Redis Cluster; and which node each
//! command must go to.
//!
//! Everything above this module sees one store. [`Topology`] turns a slot
//! (or none, outside a cluster) into the node that serves it, and hears
//! back when a node failed, moved a slot or turned out to be a replica:
//!
//! - **Single server** (`redis://`, `rediss://`): always the same node
//!   (refused, naming the right scheme, when it is a cluster node or a
//!   sentinel).
//! - **Sentinel** (`redis+sentinel://`, `rediss+sentinel://`): every
//!   sentinel is asked at once for the primary; of the answers (every
//!   sentinel's at start, a majority's later) the one with the newest
//!   configuration epoch wins, and its primary is used only after it says
//!   `role:master` itself (a demoted primary that comes back still
//!   believes it is one until it is reconfigured). Sentinels that do not
//!   know each other are two groups, that is two stores: refused. tenure
//!   listens for `+switch-master` on every sentinel, so one hung sentinel
//!   cannot keep a failover from it; an announcement, a failed call, or a
//!   `READONLY` or `NOREPLICAS` reply makes the next call ask them all
//!   again. Nothing is cached across a failover.
//! - **Cluster** (`redis+cluster://`, `rediss+cluster://`): the slot map
//!   comes from `CLUSTER SLOTS` (at start from every seed, which must all
//!   be nodes of one cluster; later from the first node to answer, whose
//!   map must share a node with the one before); `MOVED` updates it, `ASK`
//!   sends one command to the importing node. Every key of an election
//!   shares the `{NAME}` hash tag, so each lease operation is one script on
//!   one node.
//!
//! Why tenure routes itself instead of using the redis crate's cluster and
//! sentinel clients: those build their TLS from the process-wide rustls
//! provider (see [`super::connection`]), retry commands on their own
//! (a lease operation must be sent once, at a time the keeper knows), and
//! hide which node answered, which the start-up hold-off and the
//! per-node batching of partition sets need to know.
//!
//! **Files.** This one holds the [`Topology`] and its nodes, and chooses
//! the node of each call; under `topology/`, `url.rs` takes store URLs
//! and node addresses apart, `slots.rs` maps keys to cluster slots,
//! `cluster.rs` reads a cluster's slot map, `sentinel.rs` asks the
//! sentinels for the primary, and `switches.rs` listens for their
//! `+switch-master`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::connection::{Connection as NodeConnection, Endpoint};
use super::target::RedisTarget;
use crate::{Error, Result};
use switches::watch_switches;
use url::{Layout, StoreUrl};

mod cluster;
mod sentinel;
mod slots;
mod switches;
mod url;

pub(crate) use slots::{slot_of, tag_of_slot};
pub(crate) use url::reply_addr;

/// One data node: its address, how to reach it, and a connection to it.
pub(crate) struct Node {
    pub addr: String,
    pub target: RedisTarget,
    pub endpoint: Endpoint,
    call_timeout: Duration,
    conn: Mutex<NodeConnection>,
}

impl Node {
    fn new(target: RedisTarget, addr: String, call_timeout: Duration) -> Result<Node> {
        let endpoint = target.endpoint()?;
        let conn = endpoint.connection(call_timeout)?;
        Ok(Node {
            addr,
            target,
            endpoint,
            call_timeout,
            conn: Mutex::new(conn),
        })
    }

    /// The node's connection (clones share it).
    pub fn conn(&self) -> NodeConnection {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Start over on a new connection. A call that timed out says nothing
    /// about the connection (the client does not reconnect on timeouts), and
    /// a silently dead connection would otherwise fail every later call.
    pub fn reset(&self) {
        match self.endpoint.connection(self.call_timeout) {
            Ok(fresh) => *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh,
            Err(err) => tracing::warn!(error = %err, "cannot open a new Redis connection"),
        }
    }
}

/// What a topology knows at the moment.
#[derive(Default)]
struct State {
    /// The single server, or the primary the sentinels named (`None`: ask
    /// them again).
    primary: Option<Arc<Node>>,
    /// Cluster: the primary serving each slot (`None`: unknown or
    /// unassigned).
    slots: Vec<Option<Arc<Node>>>,
    /// Cluster: every node met, by address.
    nodes: HashMap<String, Arc<Node>>,
    /// Cluster: the slot map is known to be out of date.
    stale: bool,
    /// Cluster: the node IDs of the last slot map read (primaries and
    /// replicas): the next map must share one, or it is another cluster's.
    cluster_ids: std::collections::HashSet<String>,
    /// Sentinel: the address of the last primary used (announced to the
    /// subscriber only when it changes).
    last_primary: Option<String>,
    /// Sentinel: primaries forgotten so far (`+switch-master`, failures).
    /// A discovery that saw this move while it ran asks again: its answer
    /// may predate the switch.
    forgotten: u64,
}

/// Which sentinels of a `redis+sentinel://` URL a store follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Following {
    /// Every one (see the module docs).
    #[default]
    Every,
    /// **Unsafe**, for failing-mode tests only: the first of the URL alone,
    /// both for `+switch-master` and when asking for the primary, as
    /// before issue 22 (simplified: that code asked every sentinel for the
    /// primary, and moved its one subscription to the next sentinel after
    /// a failure). With that sentinel hung, a failover through another one
    /// never reaches the leader, which keeps renewing on the old primary
    /// until it is demoted or the subscription's ping fails.
    FirstOnly,
}

/// The nodes of one store and the way to each (see the module docs).
pub(crate) struct Topology {
    target: RedisTarget,
    url: StoreUrl,
    call_timeout: Duration,
    following: Following,
    state: Mutex<State>,
    /// One discovery (sentinels, `CLUSTER SLOTS`) at a time.
    discovery: tokio::sync::Mutex<()>,
    /// Bumped when the sentinels name another primary: the subscriber
    /// moves its connection there.
    changes: watch::Sender<u64>,
    _stop: DropGuard,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("url", &self.target.redacted())
            .finish_non_exhaustive()
    }
}

impl Topology {
    /// Parse the URL and find the nodes: the single server answers a PING,
    /// the sentinels name a primary that says it is one, or a cluster node
    /// answers `CLUSTER SLOTS`.
    pub async fn connect(
        target: RedisTarget,
        call_timeout: Duration,
        following: Following,
    ) -> Result<Arc<Topology>> {
        let url = StoreUrl::parse(&target.url)?;
        let stop = CancellationToken::new();
        let topology = Arc::new(Topology {
            url,
            call_timeout,
            following,
            state: Mutex::new(State::default()),
            discovery: tokio::sync::Mutex::new(()),
            changes: watch::channel(0).0,
            _stop: stop.clone().drop_guard(),
            target,
        });
        match &topology.url.layout {
            Layout::Single => {
                let addr = topology.target.redacted();
                let node = Node::new(topology.target.clone(), addr, call_timeout)?;
                redis::cmd("PING")
                    .query_async::<()>(&mut node.conn())
                    .await
                    .map_err(|e| topology.target.classify_first(e))?;
                topology.refuse_other_modes(&node).await?;
                topology.lock().primary = Some(Arc::new(node));
            }
            Layout::Sentinel { .. } => {
                topology.discover_primary().await?;
                for sentinel in topology.followed() {
                    let watch =
                        watch_switches(Arc::downgrade(&topology), sentinel.clone(), stop.clone());
                    tokio::spawn(watch);
                }
            }
            Layout::Cluster { .. } => {
                topology.refresh_slots().await?;
                topology.warn_about_full_coverage().await;
            }
        }
        Ok(topology)
    }

    /// A `redis://` URL that names a cluster node or a sentinel: say so,
    /// and which URL to use, instead of failing later with `MOVED`,
    /// `CROSSSLOT` or an unknown `EVALSHA`. A server that refuses `INFO`
    /// (an ACL) is taken as a single server.
    async fn refuse_other_modes(&self, node: &Node) -> Result<()> {
        let Ok(info) = redis::cmd("INFO")
            .arg("server")
            .query_async::<String>(&mut node.conn())
            .await
        else {
            return Ok(());
        };
        let mode = info
            .lines()
            .find_map(|line| line.strip_prefix("redis_mode:"))
            .map(str::trim);
        let url = self.target.redacted();
        let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url.as_str()));
        let hosts = rest.split('/').next().unwrap_or(rest);
        let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, hosts)| hosts);
        match mode {
            Some("cluster") => Err(Error::Config(format!(
                "{url} is a Redis Cluster node: use {scheme}+cluster://{hosts} (more nodes may \
                 follow, comma-separated), which routes each election to the node of its slot"
            ))),
            Some("sentinel") => Err(Error::Config(format!(
                "{url} is a Redis Sentinel, not a data node: use \
                 {scheme}+sentinel://{hosts}[,MORE-SENTINELS]/SERVICE, which follows the \
                 primary the sentinels name for SERVICE"
            ))),
            _ => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sentinels listened to and asked (see [`Following`]); none
    /// outside Sentinel.
    fn followed(&self) -> &[String] {
        match (&self.url.layout, self.following) {
            (Layout::Sentinel { sentinels, .. }, Following::Every) => sentinels,
            (Layout::Sentinel { sentinels, .. }, Following::FirstOnly) => {
                &sentinels[..sentinels.len().min(1)]
            }
            _ => &[],
        }
    }

    pub fn target(&self) -> &RedisTarget {
        &self.target
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.url.layout, Layout::Cluster { .. })
    }

    /// Counts the primaries the sentinels named; the subscriber follows it.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The node that serves `slot` (cluster), or the primary.
    pub async fn node_for(&self, slot: u16) -> Result<Arc<Node>> {
        match &self.url.layout {
            Layout::Single | Layout::Sentinel { .. } => self.primary().await,
            Layout::Cluster { .. } => {
                {
                    let state = self.lock();
                    if !state.stale {
                        if let Some(Some(node)) = state.slots.get(usize::from(slot)) {
                            return Ok(node.clone());
                        }
                    }
                }
                if let Err(err) = self.refresh_slots().await {
                    // Keep serving from the map we have: the node may well
                    // still serve the slot, and a failed call marks it again.
                    let known = self.lock().slots.get(usize::from(slot)).cloned().flatten();
                    return known.ok_or(err);
                }
                let state = self.lock();
                match state.slots.get(usize::from(slot)) {
                    Some(Some(node)) => Ok(node.clone()),
                    _ => Err(Error::Unreachable {
                        url: self.target.redacted(),
                        detail: format!(
                            "no cluster node serves slot {slot} (the cluster is down or \
                             being reconfigured)"
                        ),
                    }),
                }
            }
        }
    }

    /// The single server, the primary the sentinels name, or any primary
    /// of a cluster.
    pub async fn primary(&self) -> Result<Arc<Node>> {
        if let Some(node) = self.lock().primary.clone() {
            return Ok(node);
        }
        match &self.url.layout {
            Layout::Sentinel { .. } => self.discover_primary().await,
            Layout::Cluster { .. } => self.any_cluster_node().await,
            Layout::Single => Err(Error::internal("the single node is missing")),
        }
    }

    /// Any primary of the cluster (keyless commands, pub/sub).
    async fn any_cluster_node(&self) -> Result<Arc<Node>> {
        let first = || self.lock().slots.iter().flatten().next().cloned();
        if let Some(node) = first() {
            return Ok(node);
        }
        self.refresh_slots().await?;
        first().ok_or_else(|| Error::Unreachable {
            url: self.target.redacted(),
            detail: "no cluster node serves any slot".into(),
        })
    }

    /// Every primary: the single server, the sentinels' primary, or each
    /// cluster node that serves a slot.
    pub async fn primaries(&self) -> Result<Vec<Arc<Node>>> {
        if !self.is_cluster() {
            return Ok(vec![self.primary().await?]);
        }
        if self.lock().stale || self.lock().slots.is_empty() {
            self.refresh_slots().await?;
        }
        let state = self.lock();
        let mut seen = std::collections::HashSet::new();
        Ok(state
            .slots
            .iter()
            .flatten()
            .filter(|node| seen.insert(node.addr.clone()))
            .cloned()
            .collect())
    }

    /// The node at `addr` (a `MOVED` or `ASK` target), met before or new.
    pub fn node_at(&self, addr: &str) -> Result<Arc<Node>> {
        let mut state = self.lock();
        if let Some(node) = state.nodes.get(addr) {
            return Ok(node.clone());
        }
        let target = RedisTarget {
            url: self.url.node_url(addr),
            tls_ca: self.target.tls_ca.clone(),
        };
        let node = Arc::new(Node::new(target, addr.to_string(), self.call_timeout)?);
        state.nodes.insert(addr.to_string(), node.clone());
        Ok(node)
    }

    /// Whether `node` is the one a call for `slot` goes to (by the map,
    /// or as the primary).
    pub fn serves(&self, slot: u16, node: &Arc<Node>) -> bool {
        let state = self.lock();
        let owner = if self.is_cluster() {
            state.slots.get(usize::from(slot)).cloned().flatten()
        } else {
            state.primary.clone()
        };
        owner.is_some_and(|owner| Arc::ptr_eq(&owner, node))
    }

    /// A `MOVED` reply: `slot` is served by `addr` now. The rest of the map
    /// is read again before the next command that needs it (a slot rarely
    /// moves alone).
    pub fn moved(&self, slot: u16, addr: &str) -> Result<Arc<Node>> {
        let node = self.node_at(addr)?;
        let mut state = self.lock();
        if let Some(entry) = state.slots.get_mut(usize::from(slot)) {
            *entry = Some(node.clone());
        }
        state.stale = true;
        Ok(node)
    }

    /// A call to `node` failed (no answer, a dropped connection) or was
    /// refused because it is not the primary (`READONLY`): ask which node
    /// serves before the next call.
    pub fn failed(&self, node: &Node) {
        match &self.url.layout {
            Layout::Single => node.reset(),
            Layout::Sentinel { .. } => {
                // A silently dead connection would fail the ROLE check too.
                node.reset();
                self.forget_primary(&node.addr);
            }
            Layout::Cluster { .. } => {
                node.reset();
                self.lock().stale = true;
            }
        }
    }

    /// Cluster: read the slot map again before the next command (a shard
    /// channel moved, a subscription's node went away).
    pub fn slots_changed(&self) {
        if self.is_cluster() {
            self.lock().stale = true;
        }
    }

    /// Every connection anew (after a timeout).
    pub fn reset(&self) {
        if !self.is_cluster() {
            // The one node in use, as after a failed call to it.
            let primary = self.lock().primary.clone();
            if let Some(node) = primary {
                self.failed(&node);
            }
            return;
        }
        let nodes: Vec<Arc<Node>> = self.lock().nodes.values().cloned().collect();
        nodes.iter().for_each(|node| node.reset());
        self.lock().stale = true;
    }
}
