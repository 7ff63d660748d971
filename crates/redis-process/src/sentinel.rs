//! A Redis Sentinel group for tests: one primary, its replicas and three
//! sentinels, all private processes on free ports of 127.0.0.1.
//!
//! Code that follows a primary through failovers can only be tested against
//! real sentinels doing real failovers: the address a client is sent to, the
//! window in which an old primary still accepts writes, a killed primary
//! coming back as a stale primary until Sentinel demotes it. So this module
//! starts the real thing, with timeouts short enough for a test (a primary
//! is judged down after one second by default), and offers the faults
//! (kill, pause, forced failover) together with waits on the exact state a
//! test needs next, so tests never sleep and hope.
//!
//! ```no_run
//! let group = redis_process::SentinelGroup::start()?;
//! println!("sentinels at {}", group.url());
//! let old = group.primary_port()?;
//! let new = group.failover()?;
//! assert_ne!(old, new);
//! # Ok::<(), redis_process::Error>(())
//! ```

use std::path::Path;
use std::time::Duration;

use crate::node::{
    common_config, info_field, not_yet, poll, quote, wait_for_offset, Kind, Node, NotYet, Ports,
    POLL_REPLY_TIMEOUT,
};
use crate::resp::Value;
use crate::{find_redis_server, Error};

/// How many sentinels a group has; two of them make a quorum and a majority.
const SENTINELS: usize = 3;

/// How long starting a group and the group's own waits may take. Expect a
/// few seconds; the margin is for loaded machines.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Options for a [`SentinelGroup`] before it starts.
#[derive(Debug, Clone)]
pub struct SentinelBuilder {
    service: String,
    password: Option<String>,
    sentinel_password: Option<String>,
    replicas: usize,
    down_after: Duration,
    failover_timeout: Duration,
    info_period: Duration,
    publish_period: Duration,
    tilt_period: Duration,
}

impl Default for SentinelBuilder {
    fn default() -> Self {
        SentinelBuilder {
            service: "tenure-test".into(),
            password: None,
            sentinel_password: None,
            replicas: 1,
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(5000),
            info_period: Duration::from_millis(1000),
            publish_period: Duration::from_millis(500),
            tilt_period: Duration::from_secs(5),
        }
    }
}

impl SentinelBuilder {
    /// The name the sentinels monitor the primary under (default
    /// `tenure-test`).
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service = name.into();
        self
    }

    /// Require this password on the data nodes (`requirepass`, and
    /// `masterauth` so replicas can sync); the sentinels are told it with
    /// `sentinel auth-pass`. It appears in [`SentinelGroup::url`] as given,
    /// so keep it URL-safe.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Require this password on the sentinels themselves (`requirepass` in
    /// their configuration; they use it with each other too).
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// How many replicas the primary has (default 1).
    pub fn replicas(mut self, count: usize) -> Self {
        self.replicas = count;
        self
    }

    /// How long a primary must be unreachable before a sentinel judges it
    /// down (`sentinel down-after-milliseconds`, default 1 s).
    pub fn down_after(mut self, after: Duration) -> Self {
        self.down_after = after;
        self
    }

    /// `sentinel failover-timeout` (default 5 s): among other things, how
    /// long a failed failover attempt blocks the next one (twice this).
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.failover_timeout = timeout;
        self
    }

    /// How often a sentinel reads `INFO` from the primary and replicas
    /// (`SENTINEL DEBUG info-period`; default 1 s, Redis's own is 10 s). It
    /// bounds how long a sentinel takes to notice a new replica or a node
    /// that changed role.
    pub fn info_period(mut self, period: Duration) -> Self {
        self.info_period = period;
        self
    }

    /// How often a sentinel announces itself on the `__sentinel__:hello`
    /// channels (`SENTINEL DEBUG publish-period`; default 0.5 s, Redis's own
    /// is 2 s). Sentinels find each other, and spread a new primary, at this
    /// pace; a node that comes back as a primary is demoted only once it has
    /// reported that role for four periods.
    pub fn publish_period(mut self, period: Duration) -> Self {
        self.publish_period = period;
        self
    }

    /// How long a sentinel stays in TILT mode, acting on nothing, after its
    /// timer stalled for more than two seconds (a [`Node::pause`], a loaded
    /// machine): `SENTINEL DEBUG tilt-period`; default 5 s, Redis's own is
    /// 30 s.
    pub fn tilt_period(mut self, period: Duration) -> Self {
        self.tilt_period = period;
        self
    }

    /// Start the primary, its replicas and three sentinels, and return once
    /// the group could fail over: see [`SentinelGroup::wait_until_ready`].
    /// Writes are replicated asynchronously, as ever; see
    /// [`SentinelGroup::wait_for_replication`].
    pub fn start(self) -> Result<SentinelGroup, Error> {
        let binary = find_redis_server()?;
        let password = self.password.as_deref();
        let primary = Node::start(
            Kind::Data,
            &binary,
            password,
            false,
            Vec::new(),
            |ports, dir| self.data_config(ports, dir, None),
        )?;
        let primary_port = primary.port();
        let mut data = vec![primary];
        for _ in 0..self.replicas {
            data.push(Node::start(
                Kind::Data,
                &binary,
                password,
                false,
                Vec::new(),
                |ports, dir| self.data_config(ports, dir, Some(primary_port)),
            )?);
        }
        // A sentinel learns replicas from the primary's INFO, which it reads
        // at once and then once per INFO period: start the sentinels after
        // the replicas have attached so that the first INFO lists them all.
        poll(READY_TIMEOUT, "the replicas are in sync", || {
            for replica in &data[1..] {
                replica_of(replica, primary_port)?;
            }
            Ok(())
        })?;
        // Runtime-only settings: Node sends them again after every resume.
        let timers = vec![
            "SENTINEL".to_owned(),
            "DEBUG".to_owned(),
            "info-period".to_owned(),
            self.info_period.as_millis().to_string(),
            "publish-period".to_owned(),
            self.publish_period.as_millis().to_string(),
            "tilt-period".to_owned(),
            self.tilt_period.as_millis().to_string(),
        ];
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(Node::start(
                Kind::Sentinel,
                &binary,
                self.sentinel_password.as_deref(),
                false,
                vec![timers.clone()],
                |ports, dir| self.sentinel_config(ports, dir, primary_port),
            )?);
        }
        let group = SentinelGroup {
            service: self.service,
            password: self.password,
            sentinel_password: self.sentinel_password,
            data,
            sentinels,
        };
        group.wait_until_ready(READY_TIMEOUT)?;
        Ok(group)
    }

    fn data_config(&self, ports: Ports, dir: &Path, primary: Option<u16>) -> String {
        let mut config = common_config(ports, dir);
        config.push_str(
            "save \"\"\nappendonly no\nenable-debug-command local\n\
             repl-diskless-sync-delay 0\nreplica-announce-ip 127.0.0.1\n",
        );
        if let Some(password) = &self.password {
            config.push_str(&format!(
                "requirepass {0}\nmasterauth {0}\n",
                quote(password)
            ));
        }
        if let Some(primary) = primary {
            config.push_str(&format!("replicaof 127.0.0.1 {primary}\n"));
        }
        config
    }

    fn sentinel_config(&self, ports: Ports, dir: &Path, primary: u16) -> String {
        let service = quote(&self.service);
        let mut config = common_config(ports, dir);
        config.push_str(&format!(
            "sentinel resolve-hostnames no\n\
             sentinel monitor {service} 127.0.0.1 {primary} {quorum}\n\
             sentinel down-after-milliseconds {service} {down}\n\
             sentinel failover-timeout {service} {failover}\n",
            quorum = SENTINELS / 2 + 1,
            down = self.down_after.as_millis(),
            failover = self.failover_timeout.as_millis(),
        ));
        if let Some(password) = &self.password {
            config.push_str(&format!(
                "sentinel auth-pass {service} {}\n",
                quote(password)
            ));
        }
        if let Some(password) = &self.sentinel_password {
            config.push_str(&format!("requirepass {}\n", quote(password)));
        }
        config
    }
}

/// A primary with replicas, watched by three sentinels; every process is
/// killed by PID and its directory removed on drop.
///
/// The data nodes start as [`SentinelGroup::data_nodes`]`()[0]` (primary)
/// and the rest (replicas), but which one is primary changes with
/// failovers: ask [`SentinelGroup::primary_port`].
#[derive(Debug)]
pub struct SentinelGroup {
    service: String,
    password: Option<String>,
    sentinel_password: Option<String>,
    data: Vec<Node>,
    sentinels: Vec<Node>,
}

impl SentinelGroup {
    /// Start a group with the defaults: one replica, no passwords, service
    /// `tenure-test`.
    pub fn start() -> Result<Self, Error> {
        SentinelBuilder::default().start()
    }

    /// Options for a group with passwords, another service name or other
    /// timeouts.
    pub fn builder() -> SentinelBuilder {
        SentinelBuilder::default()
    }

    /// The name the sentinels monitor the primary under.
    pub fn service_name(&self) -> &str {
        &self.service
    }

    /// A URL for clients:
    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/SERVICE`,
    /// with `:PASSWORD@` before the hosts when the data nodes have a
    /// password and `?sentinel_password=PW` when the sentinels have one.
    pub fn url(&self) -> String {
        self.url_from(0)
    }

    /// [`SentinelGroup::url`], listing the sentinels from the `first`-th
    /// on (counted modulo three, wrapping around): as a host that names its
    /// own sentinel first would. A client that follows only the first
    /// sentinel of its URL follows that one.
    pub fn url_from(&self, first: usize) -> String {
        let count = self.sentinels.len();
        let hosts = (0..count)
            .map(|i| format!("127.0.0.1:{}", self.sentinels[(first + i) % count].port()))
            .collect::<Vec<_>>()
            .join(",");
        let auth = match &self.password {
            Some(password) => format!(":{password}@"),
            None => String::new(),
        };
        let query = match &self.sentinel_password {
            Some(password) => format!("?sentinel_password={password}"),
            None => String::new(),
        };
        format!("redis+sentinel://{auth}{hosts}/{}{query}", self.service)
    }

    /// The data nodes, in the order they were started (the first was the
    /// first primary).
    pub fn data_nodes(&self) -> &[Node] {
        &self.data
    }

    /// The three sentinels.
    pub fn sentinels(&self) -> &[Node] {
        &self.sentinels
    }

    /// The ports of the three sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(Node::port).collect()
    }

    /// The data node or sentinel listening on `port`.
    pub fn node(&self, port: u16) -> Result<&Node, Error> {
        self.data
            .iter()
            .chain(&self.sentinels)
            .find(|n| n.port() == port)
            .ok_or_else(|| {
                Error::Topology(format!("port {port} is not a node of this Sentinel group"))
            })
    }

    /// The primary's port according to the sentinels
    /// (`SENTINEL get-master-addr-by-name`): the answer of a majority of the
    /// three, or an error when no majority agrees (too few sentinels
    /// running, or one is still switching).
    pub fn primary_port(&self) -> Result<u16, Error> {
        let mut answers: Vec<(u16, usize)> = Vec::new();
        let mut problems = Vec::new();
        for sentinel in self.live_sentinels() {
            match self.primary_addr(sentinel) {
                Ok(port) => match answers.iter_mut().find(|(p, _)| *p == port) {
                    Some((_, count)) => *count += 1,
                    None => answers.push((port, 1)),
                },
                Err(e) => problems.push(format!("sentinel {}: {e}", sentinel.port())),
            }
        }
        let majority = self.sentinels.len() / 2 + 1;
        match answers.iter().find(|(_, count)| *count >= majority) {
            Some((port, _)) => Ok(*port),
            None => Err(Error::Topology(format!(
                "no majority of sentinels agrees on a primary: answers {answers:?} \
                 (port, sentinels), problems {problems:?}"
            ))),
        }
    }

    /// The current primary (see [`SentinelGroup::primary_port`]).
    pub fn primary(&self) -> Result<&Node, Error> {
        self.node(self.primary_port()?)
    }

    /// Force a failover (`SENTINEL FAILOVER`, no agreement needed, sent to
    /// the first sentinel that runs and is not paused) and wait until every
    /// such sentinel reports the new primary and that node's `ROLE` says
    /// master. Returns the new primary's port. The old primary is demoted
    /// to a replica some seconds later (Sentinel waits four
    /// [`SentinelBuilder::publish_period`]s before reconfiguring it);
    /// [`SentinelGroup::wait_until_ready`] waits for that.
    pub fn failover(&self) -> Result<u16, Error> {
        let old = self.primary_port()?;
        // Right after a failover the sentinels may have no replica they
        // consider fit yet (NOGOODSLAVE), or still be finishing (INPROG).
        poll(
            READY_TIMEOUT,
            "a sentinel accepts SENTINEL FAILOVER",
            || {
                let sentinel = self.live_sentinels().next();
                let Some(sentinel) = sentinel else {
                    return not_yet("no sentinel is running");
                };
                match sentinel.call(&["SENTINEL", "FAILOVER", &self.service], POLL_REPLY_TIMEOUT)? {
                    Value::Error(e) => not_yet(format!("sentinel {}: {e}", sentinel.port())),
                    _ => Ok(()),
                }
            },
        )?;
        self.wait_for_new_primary(old, READY_TIMEOUT)
    }

    /// Kill the current primary (SIGKILL by PID) and return its port. The
    /// sentinels fail over after [`SentinelBuilder::down_after`]; wait with
    /// [`SentinelGroup::wait_for_new_primary`]. Resumed with
    /// [`Node::resume`], the node comes back empty and as a primary until
    /// Sentinel demotes it.
    pub fn kill_primary(&self) -> Result<u16, Error> {
        let port = self.primary_port()?;
        self.node(port)?.kill();
        Ok(port)
    }

    /// Like [`SentinelGroup::kill_primary`], but `SAVE` first, so that
    /// [`Node::resume`] brings the old primary back with the data it had:
    /// a stale primary with stale keys.
    pub fn kill_primary_keep_snapshot(&self) -> Result<u16, Error> {
        let port = self.primary_port()?;
        self.node(port)?.kill_keep_snapshot()?;
        Ok(port)
    }

    /// Wait until every running replica has applied every write the primary
    /// acknowledged before this call. Replication is asynchronous: a write
    /// still on its way when the primary dies is lost, and right after a
    /// replica (re)attaches the primary streams nothing to it until the
    /// replica's first acknowledgement, up to a second later. Call this
    /// between a write and a crash that it must survive.
    pub fn wait_for_replication(&self, timeout: Duration) -> Result<(), Error> {
        let primary = self.primary()?;
        let replicas: Vec<&Node> = self
            .data
            .iter()
            .filter(|n| n.port() != primary.port() && n.is_live())
            .collect();
        wait_for_offset(primary, &replicas, timeout)
    }

    /// Wait until every running sentinel reports the same primary, other
    /// than `old_port`, and that node's `ROLE` says master; return its port.
    /// The sentinels may not have heard from it yet: call
    /// [`SentinelGroup::wait_until_ready`] before bringing the old primary
    /// back when it must return as a replica of this one.
    pub fn wait_for_new_primary(&self, old_port: u16, timeout: Duration) -> Result<u16, Error> {
        let what = format!("the sentinels agree on a new primary instead of {old_port}");
        poll(timeout, &what, || {
            let port = self.agreed_primary()?;
            if port == old_port {
                return not_yet(format!("the sentinels still report {old_port}"));
            }
            Ok(port)
        })
    }

    /// Wait until the group could fail over again, and return the primary's
    /// port: every running sentinel reports the same primary (whose `ROLE`
    /// says master) with no failover in progress; every other running data
    /// node replicates from it with `master_link_status:up`; and every
    /// running sentinel, out of TILT mode, has an answer to its last PING
    /// of the primary and lists each of those replicas as healthy and each
    /// of the other running sentinels. A paused sentinel
    /// counts as not running here, as in every wait of this type: with one
    /// paused, this waits until the others have finished a failover.
    pub fn wait_until_ready(&self, timeout: Duration) -> Result<u16, Error> {
        poll(timeout, "the Sentinel group is ready to fail over", || {
            let primary = self.agreed_primary()?;
            let replicas: Vec<&Node> = self
                .data
                .iter()
                .filter(|n| n.port() != primary && n.is_live())
                .collect();
            for replica in &replicas {
                replica_of(replica, primary)?;
            }
            for sentinel in self.live_sentinels() {
                self.sentinel_knows(sentinel, primary, &replicas)?;
            }
            Ok(primary)
        })
    }

    fn live_sentinels(&self) -> impl Iterator<Item = &Node> {
        self.sentinels.iter().filter(|s| s.is_live())
    }

    /// The primary every running sentinel reports, when they agree and that
    /// node says it is a master.
    fn agreed_primary(&self) -> Result<u16, NotYet> {
        let mut agreed = None;
        for sentinel in self.live_sentinels() {
            let port = self.primary_addr(sentinel)?;
            match agreed {
                None => agreed = Some(port),
                Some(p) if p == port => {}
                Some(p) => {
                    return not_yet(format!(
                        "sentinels disagree: one reports {p}, sentinel {} reports {port}",
                        sentinel.port()
                    ))
                }
            }
        }
        let Some(port) = agreed else {
            return not_yet("no sentinel is running");
        };
        let Ok(node) = self.node(port) else {
            return not_yet(format!("the sentinels report {port}, not one of our nodes"));
        };
        if !node.is_live() {
            return not_yet(format!("the sentinels report {port}, which is not running"));
        }
        let role = node.ask(&["ROLE"])?;
        match role.items().first().and_then(Value::text) {
            Some("master") => Ok(port),
            other => not_yet(format!("{port}, reported as primary, has ROLE {other:?}")),
        }
    }

    /// One sentinel's answer to `SENTINEL get-master-addr-by-name`.
    fn primary_addr(&self, sentinel: &Node) -> Result<u16, Error> {
        let reply = sentinel.ask(&["SENTINEL", "get-master-addr-by-name", &self.service])?;
        let (ip, port) = match reply.items() {
            [ip, port] => (ip.text(), port.text().and_then(|p| p.parse::<u16>().ok())),
            _ => (None, None),
        };
        match (ip, port) {
            (Some("127.0.0.1"), Some(port)) => Ok(port),
            _ => Err(Error::Topology(format!(
                "sentinel {} reports the primary at {reply:?}",
                sentinel.port()
            ))),
        }
    }

    /// Whether `sentinel` sees `primary` as a healthy master, each of
    /// `replicas` as a healthy replica and every other running sentinel.
    fn sentinel_knows(
        &self,
        sentinel: &Node,
        primary: u16,
        replicas: &[&Node],
    ) -> Result<(), NotYet> {
        let who = format!("sentinel {}", sentinel.port());
        let info = sentinel.ask(&["INFO", "sentinel"])?;
        let tilt = info_field(info.text().unwrap_or_default(), "sentinel_tilt");
        if tilt.as_deref() != Some("0") {
            // A sentinel whose timer stalled (a paused process, a loaded
            // machine) acts on nothing for the TILT period.
            return not_yet(format!("{who} has sentinel_tilt {tilt:?}"));
        }
        let master = sentinel.ask(&["SENTINEL", "master", &self.service])?;
        if master.field("flags") != Some("master") {
            return not_yet(format!(
                "{who} flags primary {primary} {:?}",
                master.field("flags")
            ));
        }
        // A sentinel that has just switched to a new primary counts it as
        // down unless its first PING is answered within down-after: until
        // then a busy machine can see a second failover, to whichever
        // replica is left (a stale primary that came back, say).
        let pending = master.field("last-ping-sent");
        if pending != Some("0") {
            return not_yet(format!(
                "{who} has a PING to primary {primary} unanswered for {pending:?} ms"
            ));
        }
        let known = sentinel.ask(&["SENTINEL", "replicas", &self.service])?;
        for replica in replicas {
            let port = replica.port().to_string();
            let entry = known
                .items()
                .iter()
                .find(|r| r.field("ip") == Some("127.0.0.1") && r.field("port") == Some(&port));
            let Some(entry) = entry else {
                return not_yet(format!("{who} does not list replica {port}"));
            };
            let flags = entry.field("flags");
            let link = entry.field("master-link-status");
            let master_port = entry.field("master-port");
            if flags != Some("slave")
                || link != Some("ok")
                || master_port != Some(&primary.to_string())
            {
                return not_yet(format!(
                    "{who} sees replica {port} with flags {flags:?}, link {link:?}, \
                     primary port {master_port:?}"
                ));
            }
        }
        let peers = sentinel.ask(&["SENTINEL", "sentinels", &self.service])?;
        for other in self
            .live_sentinels()
            .filter(|s| s.port() != sentinel.port())
        {
            let port = other.port().to_string();
            let flags = peers
                .items()
                .iter()
                .find(|s| s.field("ip") == Some("127.0.0.1") && s.field("port") == Some(&port))
                .and_then(|s| s.field("flags"));
            if flags != Some("sentinel") {
                return not_yet(format!("{who} sees sentinel {port} with flags {flags:?}"));
            }
        }
        Ok(())
    }
}

/// Whether `node` replicates from `primary` with its link up.
fn replica_of(node: &Node, primary: u16) -> Result<(), NotYet> {
    let info = node.ask(&["INFO", "replication"])?;
    let info = info.text().unwrap_or_default();
    let field = |name| info_field(info, name);
    let (role, port, link) = (
        field("role"),
        field("master_port"),
        field("master_link_status"),
    );
    if role.as_deref() != Some("slave")
        || port != Some(primary.to_string())
        || link.as_deref() != Some("up")
    {
        return not_yet(format!(
            "{} has role {role:?}, primary port {port:?}, link {link:?} (want a replica of {primary}, link up)",
            node.port()
        ));
    }
    Ok(())
}
