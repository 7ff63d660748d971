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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Value;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::connection::{Connection as NodeConnection, Endpoint};
use super::target::RedisTarget;
use crate::{Error, Result};

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// The slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key
/// when it has none, modulo [`SLOTS`].
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
}

/// A short hash tag for every slot: `slot_of("{TAG}") == slot`. Keys that
/// must share a slot with an election but not its name (the cluster's
/// stand-in for the prefix's epoch) use it.
pub(crate) fn tag_of_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut n: u64 = 0;
        while missing > 0 {
            let tag = format!("s{n:x}");
            let slot = usize::from(slot_of(&tag));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot % SLOTS)]
}

/// The shape of a store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    Single,
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        /// `user:password` (as written in the URL, percent-encoded) for the
        /// sentinels, from the `sentinel_username`/`sentinel_password`
        /// query parameters.
        sentinel_userinfo: Option<String>,
    },
    Cluster {
        seeds: Vec<String>,
    },
}

/// A parsed store URL: its layout and what every node URL is made of.
#[derive(Debug, Clone)]
pub(crate) struct StoreUrl {
    pub layout: Layout,
    tls: bool,
    userinfo: Option<String>,
    db: u32,
}

const SENTINEL_FORM: &str =
    "redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB] \
     (rediss+sentinel:// for TLS)";
const CLUSTER_FORM: &str =
    "redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...] (rediss+cluster:// for TLS)";

impl StoreUrl {
    /// Parse a store URL. Single-server URLs are left to the redis crate's
    /// parser (in [`Endpoint::new`]); Sentinel and Cluster URLs are parsed
    /// here, into the node URLs they stand for.
    pub fn parse(url: &str) -> Result<StoreUrl> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let scheme = scheme.to_ascii_lowercase();
        let (tls, sentinel) = match scheme.as_str() {
            "redis+sentinel" => (false, true),
            "rediss+sentinel" => (true, true),
            "redis+cluster" => (false, false),
            "rediss+cluster" => (true, false),
            _ => {
                return Ok(StoreUrl {
                    layout: Layout::Single,
                    tls: false,
                    userinfo: None,
                    db: 0,
                })
            }
        };
        let form = if sentinel {
            SENTINEL_FORM
        } else {
            CLUSTER_FORM
        };
        let invalid = |detail: String| {
            Error::Config(format!(
                "invalid store URL {}: {detail} (expected {form})",
                crate::redact_url(url)
            ))
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo.to_string()), hosts),
            None => (None, authority),
        };
        let default_port = if sentinel { 26379 } else { 6379 };
        let addrs = hosts
            .split(',')
            .map(|host| host_port(host, default_port).map_err(&invalid))
            .collect::<Result<Vec<_>>>()?;
        let mut sentinel_user = None;
        let mut sentinel_password = None;
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            if param.is_empty() {
                continue;
            }
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            match key {
                "sentinel_username" if sentinel => sentinel_user = Some(value.to_string()),
                "sentinel_password" if sentinel => sentinel_password = Some(value.to_string()),
                _ => {
                    let known = if sentinel {
                        " (known: sentinel_username, sentinel_password)"
                    } else {
                        " (cluster URLs take none)"
                    };
                    return Err(invalid(format!("unknown query parameter {key:?}{known}")));
                }
            }
        }
        let (layout, db) = if sentinel {
            let mut parts = path.split('/');
            let service = parts.next().unwrap_or_default();
            if service.is_empty() {
                return Err(invalid("the service name (the path) is missing".into()));
            }
            let db = match parts.next() {
                None | Some("") => 0,
                Some(db) => db
                    .parse::<u32>()
                    .map_err(|_| invalid(format!("database {db:?} is not a number")))?,
            };
            if parts.next().is_some() {
                return Err(invalid("too many path segments".into()));
            }
            let sentinel_userinfo = match (sentinel_user, sentinel_password) {
                (None, None) => None,
                (user, Some(password)) => Some(format!("{}:{password}", user.unwrap_or_default())),
                (Some(user), None) => Some(user),
            };
            let layout = Layout::Sentinel {
                sentinels: addrs,
                service: service.to_string(),
                sentinel_userinfo,
            };
            (layout, db)
        } else {
            if !matches!(path, "" | "0") {
                return Err(invalid(format!(
                    "a cluster has only database 0, not {path:?}"
                )));
            }
            (Layout::Cluster { seeds: addrs }, 0)
        };
        Ok(StoreUrl {
            layout,
            tls,
            userinfo,
            db,
        })
    }

    /// The URL of a data node at `addr` (`host:port`).
    fn node_url(&self, addr: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.userinfo {
            Some(userinfo) => format!("{scheme}://{userinfo}@{addr}/{}", self.db),
            None => format!("{scheme}://{addr}/{}", self.db),
        }
    }

    /// The URL of a sentinel at `addr`.
    fn sentinel_url(&self, addr: &str, userinfo: Option<&str>) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match userinfo {
            Some(userinfo) => format!("{scheme}://{userinfo}@{addr}"),
            None => format!("{scheme}://{addr}"),
        }
    }
}

/// `host:port` from one entry of a host list, with the default port when
/// it has none.
fn host_port(host: &str, default_port: u16) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("a host is missing".into());
    }
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (name, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{host:?} lacks its closing bracket"))?;
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(format!("{host:?} is not HOST:PORT")),
        };
        (format!("[{name}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name.to_string(), Some(port)),
            None => (host.to_string(), None),
        }
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("{host:?} has no host name"));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{port:?} is not a port number"))?,
    };
    Ok(format!("{name}:{port}"))
}

/// `host:port`, with an IPv6 address in brackets (as URLs and the slot map
/// write it; Redis replies write it bare).
pub(crate) fn host_and_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A `host:port` from a Redis reply (`MOVED`, `ASK`), bracketed when the
/// host is an IPv6 address; `from`'s host when the reply leaves it out
/// (`:PORT`, a node that does not know its own address).
pub(crate) fn reply_addr(addr: &str, from: &str) -> String {
    let Some((host, port)) = addr.rsplit_once(':') else {
        return addr.to_string();
    };
    let Ok(port) = port.parse::<u16>() else {
        return addr.to_string();
    };
    if host.is_empty() {
        let from_host = from.rsplit_once(':').map_or(from, |(host, _)| host);
        return format!("{from_host}:{port}");
    }
    host_and_port(host, port)
}

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

    /// With Redis's default `cluster-require-full-coverage yes`, every node
    /// answers `CLUSTERDOWN` from the moment a primary is judged failed
    /// until its replica is promoted (about 2 s with a node timeout of
    /// 1 s), so every term whose ttl is shorter ends, on every shard. That
    /// costs terms, never safety (nobody is granted a lease meanwhile), so
    /// it is said, not refused. `CONFIG GET` may be refused (an ACL, a
    /// managed service): then that is said, and tenure carries on.
    async fn warn_about_full_coverage(&self) {
        let Ok(primaries) = self.primaries().await else {
            return;
        };
        let asked = primaries.iter().map(|node| async move {
            let reply = tokio::time::timeout(
                self.call_timeout,
                redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("cluster-require-full-coverage")
                    .query_async::<HashMap<String, String>>(&mut node.conn()),
            )
            .await;
            let reply = match reply {
                Ok(Ok(reply)) => Ok(reply.get("cluster-require-full-coverage").cloned()),
                Ok(Err(err)) => Err(crate::error::one_line(&err.to_string())),
                Err(_) => Err(format!("no answer within {:?}", self.call_timeout)),
            };
            (node.addr.clone(), reply)
        });
        let mut full = Vec::new();
        let mut unknown = Vec::new();
        for (addr, reply) in futures_util::future::join_all(asked).await {
            match reply {
                Ok(Some(value)) if value.eq_ignore_ascii_case("no") => {}
                Ok(Some(_)) => full.push(addr),
                Ok(None) => unknown.push(format!("{addr}: not reported")),
                Err(why) => unknown.push(format!("{addr}: {why}")),
            }
        }
        if !full.is_empty() {
            tracing::warn!(
                nodes = %full.join(", "),
                "cluster-require-full-coverage is yes (Redis's default): while any shard fails \
                 over, every node answers CLUSTERDOWN (cluster-node-timeout plus the replicas' \
                 election), and the terms of elections on healthy shards whose ttl is shorter \
                 end; set cluster-require-full-coverage no on every node, or use a ttl above \
                 that (the book's Topologies page, docs/src/stores/topologies.md)"
            );
        }
        if !unknown.is_empty() {
            tracing::warn!(
                nodes = %unknown.join("; "),
                "cannot read cluster-require-full-coverage (CONFIG GET refused or unanswered); \
                 if it is yes (Redis's default), a failover of any shard ends the terms on every \
                 shard whose ttl is shorter than the failover: make sure it is no (the book's \
                 Topologies page, docs/src/stores/topologies.md)"
            );
        }
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
            Layout::Single => Err(Error::redis("internal: the single node is missing")),
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

    /// Sentinel: stop using the primary at `addr` (if it is still the one
    /// in use).
    fn forget_primary(&self, addr: &str) {
        let mut state = self.lock();
        state.forgotten += 1;
        if state.primary.as_ref().is_some_and(|node| node.addr == addr) {
            state.primary = None;
            tracing::info!(primary = %addr, "asking the sentinels for the primary again");
        }
    }

    /// Ask every sentinel for the primary (see [`Topology::ask_sentinels`]),
    /// take the newest answer of one Sentinel group, and use that primary
    /// once it says it is one.
    async fn discover_primary(&self) -> Result<Arc<Node>> {
        let Layout::Sentinel { service, .. } = &self.url.layout else {
            return Err(Error::redis("internal: not a Sentinel store"));
        };
        let _one = self.discovery.lock().await;
        for _ in 0..3 {
            let (forgotten, first) = {
                let state = self.lock();
                if let Some(node) = &state.primary {
                    return Ok(node.clone());
                }
                (state.forgotten, state.last_primary.is_none())
            };
            let answers = self.ask_sentinels(first).await?;
            one_sentinel_group(&answers, service).map_err(Error::Config)?;
            let Some(newest) = newest_answer(&answers) else {
                return Err(Error::redis("internal: no sentinel answer"));
            };
            let (sentinel, addr) = (newest.sentinel.clone(), newest.primary.clone());
            let node = self.confirm_primary(&addr).await?;
            let moved = {
                let mut state = self.lock();
                if state.forgotten != forgotten {
                    // A switch was announced meanwhile: this answer may
                    // name the old primary. Ask again.
                    continue;
                }
                state.primary = Some(node.clone());
                state.nodes.insert(node.addr.clone(), node.clone());
                let moved = state.last_primary.as_deref() != Some(node.addr.as_str());
                state.last_primary = Some(node.addr.clone());
                moved
            };
            if moved {
                // The subscriber follows the primary.
                self.changes.send_modify(|n| *n += 1);
                tracing::info!(primary = %node.addr, %sentinel, "primary found through Sentinel");
                self.warn_without_min_replicas(&node).await;
            }
            return Ok(node);
        }
        Err(Error::Unreachable {
            url: self.target.redacted(),
            detail: "the sentinels keep announcing new primaries".into(),
        })
    }

    /// Every sentinel's answer, all asked at once. The first discovery
    /// (`all`) waits for every sentinel that answers within the timeout, so
    /// that a list spanning two Sentinel groups is refused at start; later
    /// ones wait for a majority of the list only (a hung sentinel must not
    /// hold up following a failover), or for every sentinel to reply.
    async fn ask_sentinels(&self, all: bool) -> Result<Vec<SentinelAnswer>> {
        let Layout::Sentinel {
            service,
            sentinel_userinfo,
            ..
        } = &self.url.layout
        else {
            return Err(Error::redis("internal: not a Sentinel store"));
        };
        let sentinels = self.followed();
        let limit = self.call_timeout.max(Duration::from_millis(500)) * 2;
        let asked = sentinels.iter().map(|sentinel| async move {
            let answer = tokio::time::timeout(
                limit,
                self.ask_sentinel(sentinel, service, sentinel_userinfo.as_deref()),
            )
            .await;
            match answer {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(err)) => Err((format!("{sentinel}: {err}"), Some(err))),
                Err(_) => Err((format!("{sentinel}: no answer in time"), None)),
            }
        });
        let needed = if all {
            sentinels.len()
        } else {
            sentinels.len() / 2 + 1
        };
        let mut pending: futures_util::stream::FuturesUnordered<_> = asked.collect();
        let mut answers = Vec::new();
        let mut problems = Vec::new();
        let mut final_error = None;
        while let Some(answer) = pending.next().await {
            match answer {
                Ok(answer) => answers.push(answer),
                Err((problem, err)) => {
                    problems.push(problem);
                    if let Some(err) = err.filter(|e| !e.is_transient()) {
                        final_error.get_or_insert(err);
                    }
                }
            }
            if answers.len() >= needed {
                break;
            }
        }
        if !answers.is_empty() {
            return Ok(answers);
        }
        if let Some(err) = final_error {
            return Err(err);
        }
        Err(Error::Unreachable {
            url: self.target.redacted(),
            detail: format!(
                "no sentinel named a primary for {service:?} ({})",
                problems.join("; ")
            ),
        })
    }

    /// Sentinel fails over asynchronously: a primary cut off from the
    /// sentinels keeps accepting writes, and a leader cut off with it keeps
    /// renewing there, unless the primary refuses writes it cannot
    /// replicate (`min-replicas-to-write`). Say so once per primary.
    async fn warn_without_min_replicas(&self, node: &Node) {
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut node.conn())
            .await;
        // Redis reports min_slaves_good_slaves only when
        // min-replicas-to-write and min-replicas-max-lag are set.
        if let Ok(info) = info {
            if !info.contains("min_slaves_good_slaves:") {
                tracing::warn!(
                    primary = %node.addr,
                    "the Sentinel primary accepts writes it cannot replicate (min-replicas-to-write 0): \
                     a leader cut off together with it keeps renewing there after a failover; set \
                     min-replicas-to-write 1 and min-replicas-max-lag below down-after-milliseconds \
                     (the book's Topologies page, docs/src/stores/topologies.md), and fence every \
                     write"
                );
            }
        }
    }

    /// One sentinel's answer: the primary of `service` with the
    /// configuration epoch it was announced in, and who the sentinel is and
    /// knows. Only the primary's address is required: a sentinel user may
    /// be allowed `SENTINEL GET-MASTER-ADDR-BY-NAME` alone.
    async fn ask_sentinel(
        &self,
        sentinel: &str,
        service: &str,
        userinfo: Option<&str>,
    ) -> Result<SentinelAnswer> {
        let sentinel_target = RedisTarget {
            url: self.url.sentinel_url(sentinel, userinfo),
            tls_ca: self.target.tls_ca.clone(),
        };
        let mut conn = sentinel_target.endpoint()?.connection(self.call_timeout)?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(service);
        pipe.cmd("SENTINEL").arg("master").arg(service);
        pipe.cmd("SENTINEL").arg("myid");
        pipe.cmd("SENTINEL").arg("sentinels").arg(service);
        let replies: Vec<redis::RedisResult<Value>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| sentinel_target.classify_first(e))?;
        let mut replies = replies.into_iter();
        let addr: Option<(String, u16)> = match replies.next() {
            Some(Ok(value)) => redis::from_redis_value(value).map_err(|e| {
                Error::redis(format!(
                    "sentinel {sentinel} answered SENTINEL GET-MASTER-ADDR-BY-NAME \
                     unexpectedly: {e}"
                ))
            })?,
            Some(Err(err)) => return Err(sentinel_target.classify_first(err)),
            None => return Err(Error::redis("internal: a pipeline reply is missing")),
        };
        let Some((host, port)) = addr else {
            return Err(Error::Config(format!(
                "sentinel {sentinel} does not monitor a service named {service:?}"
            )));
        };
        let epoch = match replies.next() {
            Some(Ok(master)) => field_of(&master, "config-epoch").and_then(|e| e.parse().ok()),
            _ => None,
        };
        let id = match replies.next() {
            Some(Ok(id)) => text_of(&id),
            _ => None,
        };
        let peers = match replies.next() {
            Some(Ok(Value::Array(peers))) => Some(
                peers
                    .iter()
                    .filter_map(|peer| field_of(peer, "runid"))
                    .collect(),
            ),
            _ => None,
        };
        Ok(SentinelAnswer {
            sentinel: sentinel.to_string(),
            primary: host_and_port(&host, port),
            epoch,
            id,
            peers,
        })
    }

    /// The node at `addr`, the primary a sentinel named, once it says with
    /// `ROLE` that it is one (a sentinel can be behind, and a demoted
    /// primary that comes back believes it is one until it is reconfigured).
    async fn confirm_primary(&self, addr: &str) -> Result<Arc<Node>> {
        let addr = addr.to_string();
        let node = match self.lock().nodes.get(&addr) {
            Some(node) => node.clone(),
            None => {
                let target = RedisTarget {
                    url: self.url.node_url(&addr),
                    tls_ca: self.target.tls_ca.clone(),
                };
                Arc::new(Node::new(target, addr.clone(), self.call_timeout)?)
            }
        };
        let role: Value = match redis::cmd("ROLE").query_async(&mut node.conn()).await {
            Ok(role) => role,
            Err(err) => {
                node.reset();
                return Err(node.target.classify_first(err));
            }
        };
        let role = match &role {
            Value::Array(items) => match items.first() {
                Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                Some(Value::SimpleString(text)) => text.clone(),
                _ => String::new(),
            },
            _ => String::new(),
        };
        if role != "master" {
            // Reset: the next discovery opens a fresh connection to it.
            node.reset();
            return Err(Error::Unreachable {
                url: self.target.redacted(),
                detail: format!(
                    "the primary the sentinels named, {addr}, says it is a {}",
                    if role.is_empty() {
                        "non-primary"
                    } else {
                        &role
                    }
                ),
            });
        }
        Ok(node)
    }

    /// Read the slot map with `CLUSTER SLOTS` from the first node that
    /// answers: the nodes of the current map, then the URL's seeds.
    async fn refresh_slots(&self) -> Result<()> {
        let Layout::Cluster { seeds } = &self.url.layout else {
            return Ok(());
        };
        let _one = self.discovery.lock().await;
        {
            let state = self.lock();
            if !state.stale && !state.slots.is_empty() {
                return Ok(());
            }
        }
        let mut candidates: Vec<String> = {
            let state = self.lock();
            let mut seen = std::collections::HashSet::new();
            state
                .slots
                .iter()
                .flatten()
                .map(|node| node.addr.clone())
                .filter(|addr| seen.insert(addr.clone()))
                .collect()
        };
        for seed in seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        // Every candidate at once, each within the call timeout: the first
        // map wins, so one silent node cannot hold up the others.
        let asked = candidates.iter().map(|addr| async move {
            let node = self.node_at(addr).map_err(|e| (e.to_string(), Some(e)))?;
            let reply = tokio::time::timeout(
                self.call_timeout,
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut node.conn()),
            )
            .await;
            match reply {
                Err(_) => {
                    node.reset();
                    Err((
                        format!("{addr}: no answer within {:?}", self.call_timeout),
                        None,
                    ))
                }
                Ok(Ok(value)) => {
                    parse_slots(value, addr).map_err(|why| (format!("{addr}: {why}"), None))
                }
                Ok(Err(err)) => {
                    let disabled = err
                        .detail()
                        .is_some_and(|d| d.contains("cluster support disabled"));
                    if disabled {
                        let err = Error::Config(format!(
                            "{addr} (of {}) is not in cluster mode; use redis:// for a single \
                             server or redis+sentinel:// for Sentinel",
                            self.target.redacted()
                        ));
                        return Err((err.to_string(), Some(err)));
                    }
                    let err = node.target.classify_first(err);
                    node.reset();
                    let text = format!("{addr}: {err}");
                    Err((text, (!err.is_transient()).then_some(err)))
                }
            }
        });
        // The first read waits for every node that answers in time, so that
        // seeds of two clusters are refused at start; later ones compare
        // the first map with the one before.
        let first_read = self.lock().cluster_ids.is_empty();
        let mut pending: futures_util::stream::FuturesUnordered<_> = asked.collect();
        let mut problems = Vec::new();
        let mut final_error = None;
        let mut accepted: Option<SlotMap> = None;
        while let Some(answer) = pending.next().await {
            let map = match answer {
                Ok(map) => map,
                Err((problem, fatal)) => {
                    problems.push(problem);
                    if final_error.is_none() {
                        final_error = fatal;
                    }
                    continue;
                }
            };
            let before = match &accepted {
                Some(first) => first.clone(),
                None => SlotMap {
                    from: "the nodes met before".into(),
                    ranges: Vec::new(),
                    ids: self.lock().cluster_ids.clone(),
                },
            };
            if !before.ids.is_empty() && !map.ids.is_empty() && before.ids.is_disjoint(&map.ids) {
                return Err(Error::Config(format!(
                    "the cluster nodes {} and {} belong to different Redis Clusters (their slot \
                     maps have no node in common): list nodes of one cluster only in {}",
                    before.from,
                    map.from,
                    self.target.redacted()
                )));
            }
            if accepted.is_none() {
                accepted = Some(map);
            }
            if !first_read {
                break;
            }
        }
        drop(pending);
        if let Some(map) = accepted {
            let mut slots = vec![None; usize::from(SLOTS)];
            for (start, end, owner) in &map.ranges {
                let owner = self.node_at(owner)?;
                for slot in *start..=(*end).min(SLOTS - 1) {
                    slots[usize::from(slot)] = Some(owner.clone());
                }
            }
            let mut state = self.lock();
            state.slots = slots;
            state.stale = false;
            if !map.ids.is_empty() {
                state.cluster_ids = map.ids;
            }
            return Ok(());
        }
        if let Some(err) = final_error {
            return Err(err);
        }
        Err(Error::Unreachable {
            url: self.target.redacted(),
            detail: format!(
                "no cluster node answered CLUSTER SLOTS ({})",
                problems.join("; ")
            ),
        })
    }
}

/// What one sentinel says about the service ([`Topology::ask_sentinel`]).
#[derive(Debug, Clone)]
struct SentinelAnswer {
    /// The sentinel asked (`host:port`, as listed in the URL).
    sentinel: String,
    /// The primary it names (`host:port`).
    primary: String,
    /// The configuration epoch of that primary (each failover takes a new,
    /// larger one); `None` when `SENTINEL MASTER` is refused.
    epoch: Option<u64>,
    /// The sentinel's own run ID (`SENTINEL MYID`), when it tells.
    id: Option<String>,
    /// The run IDs of the other sentinels it knows for the service.
    peers: Option<Vec<String>>,
}

/// A text reply.
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The field `name` of a Sentinel reply: a flat array of names and
/// values (RESP2) or a map (RESP3).
fn field_of(value: &Value, name: &str) -> Option<String> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| text_of(&pair[0]).as_deref() == Some(name))
            .and_then(|pair| pair.get(1))
            .and_then(text_of),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(key, _)| text_of(key).as_deref() == Some(name))
            .and_then(|(_, value)| text_of(value)),
        _ => None,
    }
}

/// Whether the sentinels that answered are of one Sentinel group: each is
/// known to another (directly or through others) by run ID. Sentinels of
/// two groups that monitor the same service name (the docs' `mymaster`
/// makes that likely) would send tenure to two primaries, that is two
/// stores. A sentinel that does not tell its run ID or peers is taken to
/// belong. The error is one line naming the sentinels that disagree.
fn one_sentinel_group(
    answers: &[SentinelAnswer],
    service: &str,
) -> std::result::Result<(), String> {
    let knows = |a: &SentinelAnswer, b: &SentinelAnswer| match (&a.peers, &b.id) {
        (Some(peers), Some(id)) => peers.contains(id),
        _ => true,
    };
    // Grow the group of the first answer until it stops growing.
    let mut group = vec![false; answers.len()];
    if let Some(first) = group.first_mut() {
        *first = true;
    }
    loop {
        let mut grew = false;
        for i in 0..answers.len() {
            if group[i] {
                continue;
            }
            let linked = (0..answers.len()).any(|j| {
                group[j] && (knows(&answers[i], &answers[j]) || knows(&answers[j], &answers[i]))
            });
            if linked {
                group[i] = true;
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let Some(outsider) = group.iter().position(|member| !member) else {
        return Ok(());
    };
    let (a, b) = (&answers[0], &answers[outsider]);
    Err(format!(
        "the sentinels {} and {} are of different Sentinel groups (neither knows the other;          they name {} and {} as the primary of {service:?}): list the sentinels of one group          only, or give each group's primary its own service name",
        a.sentinel, b.sentinel, a.primary, b.primary
    ))
}

/// The answer to follow: the primary of the newest configuration epoch (a
/// sentinel that has not yet heard of the last failover names the primary
/// before it, with an older epoch), the most named on a tie.
fn newest_answer(answers: &[SentinelAnswer]) -> Option<&SentinelAnswer> {
    let named = |primary: &str| answers.iter().filter(|a| a.primary == primary).count();
    answers
        .iter()
        .rev()
        .max_by_key(|a| (a.epoch.unwrap_or(0), named(&a.primary)))
}

/// One node's `CLUSTER SLOTS`.
#[derive(Debug, Clone)]
struct SlotMap {
    /// The node that answered.
    from: String,
    /// (first slot, last slot, primary `host:port`).
    ranges: Vec<(u16, u16, String)>,
    /// The IDs of every node in the map, primaries and replicas (empty
    /// when the server does not send them).
    ids: std::collections::HashSet<String>,
}

/// Parse `CLUSTER SLOTS`. A primary announced without an address is the
/// node asked (`asked`).
fn parse_slots(value: Value, asked: &str) -> std::result::Result<SlotMap, String> {
    let Value::Array(ranges) = value else {
        return Err(format!("CLUSTER SLOTS replied {value:?}"));
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(host, _)| host);
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for range in ranges {
        let Value::Array(items) = range else {
            return Err("a slot range is not an array".into());
        };
        let (Some(start), Some(end)) = (items.first().and_then(int), items.get(1).and_then(int))
        else {
            return Err("a slot range without its bounds".into());
        };
        let Some(Value::Array(primary)) = items.get(2) else {
            return Err("a slot range without its primary".into());
        };
        let host = primary.first().and_then(text).unwrap_or_default();
        let Some(port) = primary.get(1).and_then(int) else {
            return Err("a primary without a port".into());
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_string()
        } else if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        out.push((start, end, format!("{host}:{port}")));
        for node in items.iter().skip(2) {
            if let Value::Array(node) = node {
                if let Some(id) = node.get(2).and_then(text).filter(|id| !id.is_empty()) {
                    ids.insert(id);
                }
            }
        }
    }
    Ok(SlotMap {
        from: asked.to_string(),
        ranges: out,
        ids,
    })
}

/// Sentinel: listen for `+switch-master` on `sentinel` and stop using the
/// old primary as soon as one is announced, instead of at the next failed
/// call. One of these runs for every sentinel of the URL: a failover is
/// announced by every sentinel that takes part, so one hung sentinel (or
/// one cut off) cannot keep the news from a leader that listens to the
/// others.
async fn watch_switches(topology: Weak<Topology>, sentinel: String, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(strong) = topology.upgrade() else {
            return;
        };
        let Layout::Sentinel {
            service,
            sentinel_userinfo,
            ..
        } = &strong.url.layout
        else {
            return;
        };
        let service = service.clone();
        let target = RedisTarget {
            url: strong
                .url
                .sentinel_url(&sentinel, sentinel_userinfo.as_deref()),
            tls_ca: strong.target.tls_ca.clone(),
        };
        drop(strong);
        let mut subscribed = false;
        let session = async {
            let limit = Duration::from_secs(5);
            let pubsub = target
                .endpoint()?
                .pubsub(limit)
                .await
                .map_err(|e| target.classify(e))?;
            let (mut sink, mut messages) = pubsub.split();
            tokio::time::timeout(limit, sink.subscribe("+switch-master"))
                .await
                .map_err(|_| Error::Timeout(limit))?
                .map_err(|e| target.classify(e))?;
            // A switch may have been announced while we were not listening:
            // check the primary again at the next call.
            forget_current_primary(&topology);
            subscribed = true;
            // A half-open connection delivers nothing: ping it.
            let mut keepalive = tokio::time::interval(limit);
            keepalive.tick().await;
            loop {
                let message = tokio::select! {
                    message = messages.next() => message,
                    _ = keepalive.tick() => {
                        tokio::time::timeout(limit, sink.ping::<()>())
                            .await
                            .map_err(|_| Error::Timeout(limit))?
                            .map_err(|e| target.classify(e))?;
                        continue;
                    }
                };
                let Some(message) = message else {
                    return Ok::<(), Error>(());
                };
                // "SERVICE OLD-IP OLD-PORT NEW-IP NEW-PORT"
                let payload = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
                let mut words = payload.split(' ');
                if words.next() != Some(service.as_str()) {
                    continue;
                }
                let old = match (
                    words.next(),
                    words.next().and_then(|p| p.parse::<u16>().ok()),
                ) {
                    (Some(host), Some(port)) => host_and_port(host, port),
                    _ => continue,
                };
                let Some(topology) = topology.upgrade() else {
                    return Ok(());
                };
                tracing::info!(%payload, "Sentinel announced a new primary");
                topology.forget_primary(&old);
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            ended = session => {
                if let Err(err) = ended {
                    tracing::debug!(%sentinel, error = %err, "+switch-master subscription failed");
                    if subscribed {
                        // A failed call (the keepalive ping): the sentinel
                        // may have announced a switch we did not hear.
                        forget_current_primary(&topology);
                    }
                } else {
                    backoff = Duration::from_millis(100);
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Ask the sentinels for the primary again at the next call.
fn forget_current_primary(topology: &Weak<Topology>) {
    if let Some(topology) = topology.upgrade() {
        let current = topology.lock().primary.as_ref().map(|n| n.addr.clone());
        if let Some(current) = current {
            topology.forget_primary(&current);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        assert_eq!(slot_of("foo{}{bar}"), slot_of("foo{}{bar}"));
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        assert_eq!(slot_of("tenure:{reports}:lease"), slot_of("reports"));
    }

    #[test]
    fn addresses_from_replies_are_bracketed_and_completed() {
        assert_eq!(reply_addr("::1:7001", "[::1]:7000"), "[::1]:7001");
        assert_eq!(
            reply_addr("10.0.0.2:7001", "10.0.0.1:7000"),
            "10.0.0.2:7001"
        );
        assert_eq!(reply_addr(":7001", "10.0.0.1:7000"), "10.0.0.1:7001");
        assert_eq!(reply_addr(":7001", "[::1]:7000"), "[::1]:7001");
        assert_eq!(host_and_port("fe80::1", 6379), "[fe80::1]:6379");
    }

    #[test]
    fn every_slot_has_a_tag() {
        for slot in [0, 1, 777, 12739, SLOTS - 1] {
            assert_eq!(slot_of(&format!("x:{{{}}}:y", tag_of_slot(slot))), slot);
        }
    }

    #[test]
    fn sentinel_urls_parse() {
        let url = StoreUrl::parse(
            "redis+sentinel://app:pw@s1:26379,s2,[::1]:26380/mymaster/2?sentinel_password=spw",
        )
        .unwrap();
        assert_eq!(
            url.layout,
            Layout::Sentinel {
                sentinels: vec!["s1:26379".into(), "s2:26379".into(), "[::1]:26380".into()],
                service: "mymaster".into(),
                sentinel_userinfo: Some(":spw".into()),
            }
        );
        assert_eq!(
            url.node_url("10.0.0.1:6379"),
            "redis://app:pw@10.0.0.1:6379/2"
        );
        assert_eq!(
            url.sentinel_url("s1:26379", Some(":spw")),
            "redis://:spw@s1:26379"
        );
        let tls = StoreUrl::parse("rediss+sentinel://s1/svc").unwrap();
        assert_eq!(tls.node_url("h:1"), "rediss://h:1/0");
    }

    #[test]
    fn cluster_urls_parse() {
        let url = StoreUrl::parse("redis+cluster://u:p@a:7000,b").unwrap();
        assert_eq!(
            url.layout,
            Layout::Cluster {
                seeds: vec!["a:7000".into(), "b:6379".into()]
            }
        );
        assert_eq!(url.node_url("c:7001"), "redis://u:p@c:7001/0");
        assert_eq!(StoreUrl::parse("redis://h").unwrap().layout, Layout::Single);
    }

    fn answer(
        sentinel: &str,
        primary: &str,
        epoch: u64,
        id: &str,
        peers: &[&str],
    ) -> SentinelAnswer {
        SentinelAnswer {
            sentinel: sentinel.into(),
            primary: primary.into(),
            epoch: Some(epoch),
            id: Some(id.into()),
            peers: Some(peers.iter().map(|p| p.to_string()).collect()),
        }
    }

    #[test]
    fn sentinels_of_two_groups_are_refused_by_name() {
        let one = [
            answer("s1:1", "p:1", 3, "a", &["b", "c"]),
            answer("s2:2", "p:1", 3, "b", &["a"]),
            // Knows nobody yet, but is known.
            answer("s3:3", "p:1", 3, "c", &[]),
        ];
        assert!(one_sentinel_group(&one, "svc").is_ok());
        let two = [
            answer("s1:1", "p:1", 3, "a", &["b"]),
            answer("s2:2", "p:1", 3, "b", &["a"]),
            answer("x9:9", "q:2", 1, "z", &[]),
        ];
        let err = one_sentinel_group(&two, "svc").unwrap_err();
        assert!(err.contains("s1:1") && err.contains("x9:9"), "{err}");
        assert!(err.contains("p:1") && err.contains("q:2"), "{err}");
        let mut silent = two.clone();
        silent[2].id = None;
        assert!(one_sentinel_group(&silent, "svc").is_ok(), "cannot tell");
    }

    #[test]
    fn the_newest_epoch_names_the_primary() {
        let answers = [
            answer("s1:1", "old:1", 3, "a", &[]),
            answer("s2:2", "new:2", 4, "b", &[]),
            answer("s3:3", "old:1", 3, "c", &[]),
        ];
        assert_eq!(
            newest_answer(&answers).map(|a| a.primary.as_str()),
            Some("new:2")
        );
        let mut unknown = answers.clone();
        unknown.iter_mut().for_each(|a| a.epoch = None);
        assert_eq!(
            newest_answer(&unknown).map(|a| a.primary.as_str()),
            Some("old:1")
        );
    }

    #[test]
    fn bad_urls_name_the_problem_without_the_password() {
        for (url, needle) in [
            ("redis+sentinel://u:secret@s1", "service name"),
            ("redis+sentinel://s1:0/svc", "port"),
            ("redis+sentinel://s1/svc/x", "not a number"),
            (
                "redis+sentinel://s1/svc?sentinel_pass=1",
                "unknown query parameter",
            ),
            ("redis+cluster://u:secret@a,/", "host is missing"),
            ("redis+cluster://a/3", "only database 0"),
            ("redis+cluster://a?x=1", "take none"),
        ] {
            let err = StoreUrl::parse(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
