//! The peers section: tenure beside the libraries a user would pick
//! instead, doing the same job on the same private servers in one run,
//! each candidate a process of its own: the Python Redis locks and rslock
//! on a redis-server, then etcd's own Election API (through `etcd-client`,
//! the client the library uses) on a private 3-member etcd cluster, then
//! kazoo's `Election` recipe on a private 3-member ZooKeeper ensemble, each
//! beside tenure on the same store.
//!
//! Every candidate, tenure's included, is driven through one line protocol
//! (described in `peers/driver.py`): it says `ready`, then `held NS` when
//! it holds, `releasing NS` when told to `release`. `NS` is the host's
//! `CLOCK_MONOTONIC`, which every process shares, so a hand-over is one
//! process's `releasing` to another's `held`, with no pipe in between. The
//! Python peers run in the virtualenv `scripts/install-deps.sh` makes
//! (`target/peers`, pinned in `peers/requirements.txt`); tenure's
//! candidate, and etcd-client's, is this binary's hidden `peer-child`,
//! each library used the way its docs show. The acts of the SIGSTOP rounds
//! go to a list on the redis-server whatever the store: the resource the
//! job writes to, apart from the lock.
//!
//! What a row can and cannot say: the same harness, ttl and server for
//! all, so the differences are the designs (polling, a signal list, an
//! announcement; a renewal loop by hand or the library's own; a flag, a
//! store read or a clock check before acting). A user's process adds its
//! own start-up, the same for all.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, ResignOptions};
use etcd_process::EtcdCluster;
use nix::sys::signal::Signal;
use redis::aio::MultiplexedConnection;
use redis_process::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;
use zk_process::ZkEnsemble;
use zookeeper_client as zk;

use crate::etcd_metrics::{metrics_endpoints, scrape};
use crate::fixture::{connect, requests_during, samples_len_jitter};
use crate::plan::Plan;
use crate::report::{Report, Row};
use crate::stats::Samples;
use crate::svg::{Chart, Kind, Series};
use crate::zk_metrics;

mod scale;

type Result<T> = std::result::Result<T, String>;

/// A library that can do tenure's job, with its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// tenure itself: `peer-child`.
    Tenure,
    /// redis-py's `Lock`, renewed by hand.
    RedisPy,
    /// python-redis-lock, with its auto-renewal and its signal list.
    PythonRedisLock,
    /// pottery's `Redlock` on one master, extended by hand.
    Pottery,
    /// rslock's Redlock on one master, its own renewal (`using`):
    /// `peer-child --peer rslock`.
    Rslock,
    /// tenure on etcd: `peer-child --etcd`.
    TenureEtcd,
    /// etcd's Election API through etcd-client, its lease kept alive by
    /// hand: `peer-child --peer etcd-election`.
    EtcdElection,
    /// tenure on ZooKeeper: `peer-child --store zk://...`.
    TenureZk,
    /// kazoo's `Election` recipe on ZooKeeper, in `peers/driver.py`.
    Kazoo,
}

impl Peer {
    /// The peers on Redis, tenure first.
    pub(crate) const REDIS: [Peer; 5] = [
        Peer::Tenure,
        Peer::RedisPy,
        Peer::PythonRedisLock,
        Peer::Pottery,
        Peer::Rslock,
    ];

    /// The peers on etcd, tenure first.
    pub(crate) const ETCD: [Peer; 2] = [Peer::TenureEtcd, Peer::EtcdElection];

    /// The peers on ZooKeeper, tenure first.
    pub(crate) const ZK: [Peer; 2] = [Peer::TenureZk, Peer::Kazoo];

    /// Whether this binary's `peer-child` is its driver (not Python).
    fn built_in(self) -> bool {
        matches!(
            self,
            Peer::Tenure | Peer::TenureEtcd | Peer::TenureZk | Peer::EtcdElection | Peer::Rslock
        )
    }

    /// Whether the lock is on a store other than the redis-server (which
    /// every peer's acts go to): the driver is given `--store`.
    fn off_redis(self) -> bool {
        self.store() != "Redis"
    }

    /// The store the peer's rows name.
    fn store(self) -> &'static str {
        match self {
            Peer::TenureEtcd | Peer::EtcdElection => "etcd",
            Peer::TenureZk | Peer::Kazoo => "ZooKeeper",
            Peer::Tenure | Peer::RedisPy | Peer::PythonRedisLock | Peer::Pottery | Peer::Rslock => {
                "Redis"
            }
        }
    }

    /// The name the driver takes (`--peer`).
    pub(crate) fn driver_name(self) -> &'static str {
        match self {
            Peer::Tenure | Peer::TenureEtcd | Peer::TenureZk => "tenure",
            Peer::Kazoo => "kazoo",
            Peer::RedisPy => "redis-py",
            Peer::PythonRedisLock => "python-redis-lock",
            Peer::Pottery => "pottery",
            Peer::Rslock => "rslock",
            Peer::EtcdElection => "etcd-election",
        }
    }

    /// The name the table prints.
    fn label(self) -> &'static str {
        match self {
            Peer::Tenure => "tenure",
            Peer::RedisPy => "redis-py Lock",
            Peer::PythonRedisLock => "python-redis-lock",
            Peer::Pottery => "pottery Redlock",
            Peer::Rslock => "rslock Redlock",
            Peer::TenureEtcd => "tenure on etcd",
            Peer::EtcdElection => "etcd-client election",
            Peer::TenureZk => "tenure on ZooKeeper",
            Peer::Kazoo => "kazoo Election",
        }
    }

    /// What the peer's job checks before it acts, for the notes.
    fn guard(self) -> &'static str {
        match self {
            Peer::Tenure | Peer::TenureEtcd | Peer::TenureZk => {
                "checks is_leader(), a clock check, and passes its token"
            }
            Peer::Kazoo => {
                "checks kazoo's connection state (CONNECTED, and the session never LOST), as kazoo's docs tell a leader to, so it acts on after SIGCONT until kazoo's connection thread has read that the ensemble closed its session"
            }
            Peer::EtcdElection => {
                "checks a flag its keep-alive task clears when etcd answers a keep-alive with ttl 0 or the stream fails, so it acts on until that task runs after SIGCONT"
            }
            Peer::RedisPy => {
                "checks a flag its renewal thread clears when reacquire() fails, so it acts on until that thread runs after SIGCONT"
            }
            Peer::PythonRedisLock => {
                "checks nothing: its docs run the job inside `with lock:`, and its renewal thread cannot stop the job"
            }
            Peer::Pottery => "reads the key (locked()) before each act: a store round trip an act",
            Peer::Rslock => {
                "checks nothing: it runs inside rslock's using(), which drops it only when a renewal fails, so it acts on after SIGCONT until that renewal's timer is polled"
            }
        }
    }

    /// How the peer renews and waits, for the idle rows' notes.
    fn renews(self) -> &'static str {
        match self {
            Peer::Tenure | Peer::TenureEtcd | Peer::TenureZk => "tenure every ttl/3",
            Peer::Kazoo => {
                "kazoo's session (timeout = the ttl) kept alive by its connection thread's pings; a follower's znode watches the one before it, and its session pings too"
            }
            Peer::RedisPy => {
                "redis-py's Lock renewed by hand (reacquire) every ttl/3; a follower's blocked acquire sends SET NX every 0.1 s"
            }
            Peer::PythonRedisLock => {
                "python-redis-lock's own renewal thread every 2/3 of the expiry (so fewer renewals than tenure, and a lock lost to a renewal that comes late); a follower blocks in BLPOP with the expiry as its timeout"
            }
            Peer::Pottery => {
                "pottery's extend() by hand every ttl/3; a follower's blocked acquire retries SET NX after up to 0.2 s, and unlocks after each failed try (Redlock's rule)"
            }
            Peer::Rslock => {
                "rslock's own renewal in using(), 0.5 s before the lock's validity ends (so fewer renewals than tenure, with half a second for one to arrive); a follower's acquire_no_guard() retries SET NX after up to 0.2 s, 3 tries a round and the next round at once, and unlocks after each failed try (Redlock's rule)"
            }
            Peer::EtcdElection => {
                "its lease kept alive by hand every ttl/3 on one stream; a follower waits in Campaign, in etcd, and keeps its own lease alive"
            }
        }
    }

    /// How the peer is used, for the pictures' legends.
    fn how(self) -> &'static str {
        match self {
            Peer::Tenure => "release announced, followers wake at the expiry",
            Peer::RedisPy => "SET NX PX, blocked acquire polls every 0.1 s",
            Peer::PythonRedisLock => "BLPOP on a signal list, timeout = expiry",
            Peer::Pottery => "SET NX PX, retries after up to 0.2 s",
            Peer::Rslock => "SET NX PX, retries after up to 0.2 s",
            Peer::TenureEtcd => "release announced on a watch, followers wake at the expiry",
            Peer::EtcdElection => "Campaign waits in etcd for the key before it to go",
            Peer::TenureZk => "release seen on a watch, followers wake at the expiry",
            Peer::Kazoo => "each contender watches the znode before its own",
        }
    }
}

/// Where the drivers are.
pub(crate) struct Drivers {
    /// The peers' virtualenv's Python.
    python: PathBuf,
    /// `peers/driver.py`.
    script: PathBuf,
    /// This binary, for tenure's `peer-child`.
    bench: PathBuf,
}

impl Drivers {
    /// The drivers of this checkout: the virtualenv is `target/peers`
    /// unless `TENURE_BENCH_PEERS_PYTHON` names another Python.
    pub(crate) fn locate() -> Result<Drivers> {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let python = match std::env::var_os("TENURE_BENCH_PEERS_PYTHON") {
            Some(python) => PathBuf::from(python),
            None => manifest.join("../../target/peers/bin/python"),
        };
        if !python.exists() {
            return Err(format!(
                "no Python for the peers at {}: run scripts/install-deps.sh (it makes the virtualenv target/peers from crates/tenure-bench/peers/requirements.txt)",
                python.display()
            ));
        }
        let bench = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
        Ok(Drivers {
            python,
            script: manifest.join("peers/driver.py"),
            bench,
        })
    }

    /// The command that starts one candidate.
    fn command(&self, peer: Peer, job: &Job, id: &str) -> Command {
        let mut command = if peer.built_in() {
            let mut c = Command::new(&self.bench);
            c.arg("peer-child");
            c
        } else {
            let mut c = Command::new(&self.python);
            c.arg(&self.script);
            c
        };
        if let (true, Store::Etcd { url, .. } | Store::Zk { url, .. }) =
            (peer.off_redis(), &job.store)
        {
            command.arg("--store").arg(url);
        }
        command
            .arg("--peer")
            .arg(peer.driver_name())
            .arg("--redis")
            .arg(&job.url)
            .arg("--name")
            .arg(&job.name)
            .arg("--ttl-ms")
            .arg(job.ttl.as_millis().to_string())
            .arg("--id")
            .arg(id);
        if let Some(every) = job.act {
            command
                .arg("--act-ms")
                .arg(every.as_millis().to_string())
                .arg("--act-log")
                .arg(&job.log);
        }
        if let Some(n) = job.scale {
            command.arg("--scale").arg(n.to_string());
        }
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}

/// The store a group's lock is on, as the harness counts its requests,
/// with its server processes' ids (whose CPU the scale round counts).
#[derive(Debug, Clone)]
enum Store {
    /// The redis-server of `Job::url`, on this port.
    Redis { port: u16, pids: Vec<u32> },
    /// An etcd cluster: its URL and its members' `HOST:PORT`s.
    Etcd {
        url: String,
        members: Vec<String>,
        pids: Vec<u32>,
    },
    /// A ZooKeeper ensemble: its `zk://` URL and its members' `HOST:PORT`s.
    Zk {
        url: String,
        members: Vec<String>,
        pids: Vec<u32>,
    },
}

impl Store {
    /// The store's server processes.
    fn pids(&self) -> &[u32] {
        match self {
            Store::Redis { pids, .. } | Store::Etcd { pids, .. } | Store::Zk { pids, .. } => pids,
        }
    }
}

/// What every candidate of a group does.
#[derive(Debug, Clone)]
struct Job {
    /// The redis-server: the store of the Redis peers, and the acts' log
    /// of all.
    url: String,
    store: Store,
    name: String,
    ttl: Duration,
    /// Act this often while holding (`--act-ms`).
    act: Option<Duration>,
    /// The list acts are pushed to.
    log: String,
    /// Hold this many locks at once (`--scale`).
    scale: Option<usize>,
}

/// A line a candidate printed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Key(String),
    Ready,
    Held(u64),
    Releasing(u64),
    /// A scale round's count of locks held so far.
    Holding(usize),
    Released,
    ReleaseFailed(String),
    /// Its stdout closed: it exited.
    Gone,
}

impl Event {
    fn parse(line: &str) -> Option<Event> {
        let mut words = line.split_whitespace();
        let event = match (words.next()?, words.next()) {
            ("key", Some(key)) => Event::Key(key.to_string()),
            ("ready", None) => Event::Ready,
            ("held", Some(ns)) => Event::Held(ns.parse().ok()?),
            ("releasing", Some(ns)) => Event::Releasing(ns.parse().ok()?),
            ("holding", Some(n)) => Event::Holding(n.parse().ok()?),
            ("released", None) => Event::Released,
            ("release-failed", why) => Event::ReleaseFailed(why.unwrap_or_default().to_string()),
            _ => return None,
        };
        Some(event)
    }
}

/// The host's `CLOCK_MONOTONIC` in ns: the clock the drivers print.
pub(crate) fn mono_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

struct Candidate {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: i32,
    /// The last lines of its stderr, for the error when it exits unasked
    /// (a peer's own threads may print tracebacks once its lock is lost).
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Candidate {
    fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|lines| lines.iter().cloned().collect::<Vec<_>>().join(" | "))
            .unwrap_or_default()
    }
}

/// Candidates of one peer doing one job, and their events in arrival order.
struct Group {
    peer: Peer,
    job: Job,
    sender: mpsc::UnboundedSender<(usize, Event)>,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    /// Events read while waiting for another.
    pending: VecDeque<(usize, Event)>,
    members: BTreeMap<usize, Candidate>,
    next_id: usize,
    /// Each member's key of the lock, as its driver said: one key for all
    /// on Redis, a key of each candidate's own with etcd's Election API.
    keys: BTreeMap<usize, String>,
}

/// How long a candidate may take to start or to release.
const START_LIMIT: Duration = Duration::from_secs(20);

impl Group {
    fn new(peer: Peer, job: Job) -> Group {
        let (sender, events) = mpsc::unbounded_channel();
        Group {
            peer,
            job,
            sender,
            events,
            pending: VecDeque::new(),
            members: BTreeMap::new(),
            next_id: 0,
            keys: BTreeMap::new(),
        }
    }

    /// Start a candidate and wait until it is about to acquire.
    async fn spawn(&mut self, drivers: &Drivers) -> Result<usize> {
        let id = self.next_id;
        self.next_id += 1;
        let mut child = drivers
            .command(self.peer, &self.job, &format!("c{id}"))
            .spawn()
            .map_err(|e| format!("{}: cannot start its driver: {e}", self.peer.label()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(pipe) = child.stderr.take() {
            let kept = stderr.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut kept) = kept.lock() {
                        if kept.len() == 8 {
                            kept.pop_front();
                        }
                        kept.push_back(line);
                    }
                }
            });
        }
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or("no pid")?;
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(event) = Event::parse(&line) {
                    if sender.send((id, event)).is_err() {
                        return;
                    }
                }
            }
            let _ = sender.send((id, Event::Gone));
        });
        self.members.insert(
            id,
            Candidate {
                child,
                stdin,
                pid,
                stderr,
            },
        );
        let (_, event) = self
            .next(START_LIMIT, |i, e| {
                i == id && matches!(e, Event::Key(_) | Event::Ready)
            })
            .await?;
        if let Event::Key(key) = event {
            self.keys.insert(id, key);
            self.next(START_LIMIT, |i, e| i == id && *e == Event::Ready)
                .await?;
        }
        Ok(id)
    }

    /// The next event `want` takes, earlier ones it passes over kept for
    /// later. A member that exits unasked is an error.
    async fn next(
        &mut self,
        limit: Duration,
        mut want: impl FnMut(usize, &Event) -> bool,
    ) -> Result<(usize, Event)> {
        if let Some(at) = self.pending.iter().position(|(i, e)| want(*i, e)) {
            if let Some(found) = self.pending.remove(at) {
                return Ok(found);
            }
        }
        let deadline = Instant::now() + limit;
        loop {
            let (i, event) = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .map_err(|_| format!("{}: no such event within {limit:?}", self.peer.label()))?
                .ok_or("the events ended")?;
            if want(i, &event) {
                return Ok((i, event));
            }
            if event == Event::Gone {
                if let Some(member) = self.members.get(&i) {
                    return Err(format!(
                        "{}: candidate c{i} exited unasked: {}",
                        self.peer.label(),
                        member.stderr_tail()
                    ));
                }
            }
            self.pending.push_back((i, event));
        }
    }

    /// When `id` came to hold the lock.
    async fn held(&mut self, id: usize, limit: Duration) -> Result<u64> {
        match self
            .next(limit, |i, e| i == id && matches!(e, Event::Held(_)))
            .await?
        {
            (_, Event::Held(ns)) => Ok(ns),
            _ => Err("not a hold".into()),
        }
    }

    /// Which of `ids` came to hold the lock next, and when.
    async fn held_any(&mut self, ids: &[usize], limit: Duration) -> Result<(usize, u64)> {
        match self
            .next(limit, |i, e| {
                ids.contains(&i) && matches!(e, Event::Held(_))
            })
            .await?
        {
            (i, Event::Held(ns)) => Ok((i, ns)),
            _ => Err("not a hold".into()),
        }
    }

    /// Tell `id` to release; returns when its release call started. It
    /// leaves the group.
    async fn release(&mut self, id: usize) -> Result<u64> {
        let mut member = self.members.remove(&id).ok_or("no such member")?;
        let stdin = member.stdin.as_mut().ok_or("no stdin")?;
        stdin
            .write_all(b"release\n")
            .await
            .map_err(|e| format!("{}: release: {e}", self.peer.label()))?;
        stdin.flush().await.map_err(|e| e.to_string())?;
        let (_, event) = self
            .next(START_LIMIT, |i, e| {
                i == id && matches!(e, Event::Releasing(_))
            })
            .await?;
        let Event::Releasing(at) = event else {
            return Err("not a release".into());
        };
        let (_, done) = self
            .next(START_LIMIT, |i, e| {
                i == id && matches!(e, Event::Released | Event::ReleaseFailed(_))
            })
            .await?;
        if let Event::ReleaseFailed(why) = done {
            return Err(format!(
                "{}: c{id}'s release failed: {why}",
                self.peer.label()
            ));
        }
        let _ = tokio::time::timeout(START_LIMIT, member.child.wait()).await;
        Ok(at)
    }

    /// `kill -9` of `id`; returns once it is gone. It leaves the group.
    async fn kill(&mut self, id: usize) -> Result<()> {
        let mut member = self.members.remove(&id).ok_or("no such member")?;
        member.child.start_kill().map_err(|e| e.to_string())?;
        let _ = member.child.wait().await;
        Ok(())
    }

    fn signal(&self, id: usize, signal: Signal) -> Result<()> {
        let member = self.members.get(&id).ok_or("no such member")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(member.pid), signal)
            .map_err(|e| e.to_string())
    }

    /// Stop every member that is left.
    async fn end(mut self) {
        let ids: Vec<usize> = self.members.keys().copied().collect();
        for id in ids {
            let _ = self.kill(id).await;
        }
    }
}

/// Between 100 and 400 ms, so that rounds fall at every phase of a
/// poller's period.
fn settle(round: usize) -> Duration {
    Duration::from_millis(100 + samples_len_jitter(round) % 300)
}

/// What one peer measured.
struct Figures {
    handover: Samples,
    takeover: Samples,
    /// Requests per ttl.
    idle_leader: f64,
    idle_follower: f64,
    /// Acts by a paused holder after another came to hold, over all rounds.
    stale_acts: usize,
    /// tenure only: stale acts the log's token check refused.
    refused: usize,
    /// The scale round.
    scale: scale::Scaled,
}

/// The peers section.
pub(crate) async fn section(plan: &Plan, report: &mut Report) -> Result<()> {
    let drivers = Drivers::locate()?;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let url = server.url();
    let conn = connect(&url).await?;
    eprintln!("tenure-bench: redis-server on port {}", server.port());
    let store = Store::Redis {
        port: server.port(),
        pids: crate::scale::known([server.pid()]),
    };
    let observer = Observer::Redis(conn.clone());
    let on = (url.as_str(), &store, &observer, &conn);
    let measured = measure_all(plan, &drivers, &Peer::REDIS, on).await?;
    rows(
        plan,
        report,
        &measured,
        ("peers-handover", "peers-takeover"),
    );

    let cluster = start_etcd().await?;
    let outcome = async {
        let (store, observer) = etcd_store(&cluster).await?;
        eprintln!("tenure-bench: etcd cluster {} (3 members)", cluster.url());
        let on = (url.as_str(), &store, &observer, &conn);
        let measured = measure_all(plan, &drivers, &Peer::ETCD, on).await?;
        rows(
            plan,
            report,
            &measured,
            ("peers-etcd-handover", "peers-etcd-takeover"),
        );
        Ok::<_, String>(())
    }
    .await;
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .map_err(|e| e.to_string())?;
    outcome?;

    let ensemble = start_zk().await?;
    let outcome = async {
        let (store, observer) = zk_store(&ensemble);
        eprintln!(
            "tenure-bench: ZooKeeper ensemble {} (3 members)",
            ensemble.url()
        );
        let on = (url.as_str(), &store, &observer, &conn);
        let measured = measure_all(plan, &drivers, &Peer::ZK, on).await?;
        rows(
            plan,
            report,
            &measured,
            ("peers-zk-handover", "peers-zk-takeover"),
        );
        Ok::<_, String>(())
    }
    .await;
    tokio::task::spawn_blocking(move || drop((ensemble, server)))
        .await
        .map_err(|e| e.to_string())?;
    outcome
}

/// Every figure of each of `peers`, one after the other, on one store:
/// (the redis-server's URL, the store, its observer, a connection to the
/// redis-server).
async fn measure_all(
    plan: &Plan,
    drivers: &Drivers,
    peers: &[Peer],
    (url, store, observer, conn): (&str, &Store, &Observer, &MultiplexedConnection),
) -> Result<Vec<(Peer, Figures)>> {
    let mut measured = Vec::new();
    for &peer in peers {
        eprintln!("  peers: {} ...", peer.label());
        let figures = measure(plan, drivers, peer, url, store, observer, conn).await?;
        measured.push((peer, figures));
    }
    Ok(measured)
}

/// A private 3-member etcd cluster, its election timeout the etcd
/// section's (leases from 1 s).
async fn start_etcd() -> Result<EtcdCluster> {
    tokio::task::spawn_blocking(|| {
        EtcdCluster::builder()
            .election_timeout(Duration::from_millis(500))
            .start()
            .map_err(|e| format!("cannot start an etcd cluster: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// A private 3-member ZooKeeper ensemble, ticking every 100 ms as in the
/// ZooKeeper section (sessions of any ttl from 200 ms to 60 s).
async fn start_zk() -> Result<ZkEnsemble> {
    tokio::task::spawn_blocking(|| {
        ZkEnsemble::builder()
            .tick_time(Duration::from_millis(100))
            .start()
            .map_err(|e| format!("cannot start a ZooKeeper ensemble: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
}

fn zk_store(ensemble: &ZkEnsemble) -> (Store, Observer) {
    let connect_string = ensemble.connect_string();
    let members = connect_string.split(',').map(str::to_string).collect();
    let store = Store::Zk {
        url: ensemble.url(),
        members,
        pids: crate::scale::known((0..ensemble.members()).map(|m| ensemble.pid(m))),
    };
    (store, Observer::Zk(connect_string))
}

async fn etcd_store(cluster: &EtcdCluster) -> Result<(Store, Observer)> {
    let members = cluster.endpoints();
    let observer = Observer::Etcd(Box::new(crate::etcd::client(&members).await?));
    let store = Store::Etcd {
        url: cluster.url(),
        members,
        pids: crate::scale::known((0..cluster.members()).map(|m| cluster.pid(m))),
    };
    Ok((store, observer))
}

/// The bench's own client of a group's store, that times a crashed
/// holder's expiry: Redis' PTTL of the key, or a watch on etcd that sees
/// the key's delete, or a watch on ZooKeeper that sees the first znode at
/// or under the driver's key deleted (the holder's, when its session
/// expires).
enum Observer {
    Redis(MultiplexedConnection),
    Etcd(Box<Client>),
    /// The ensemble's connect string: a session is opened for each crash
    /// round and closed after it, so that its pings are not counted in the
    /// idle windows.
    Zk(String),
}

/// Rounds of each peer's hand-over (each starts a process).
fn handover_rounds(plan: &Plan) -> usize {
    if plan.quick {
        10
    } else {
        40
    }
}

/// Locks one process holds in the scale round.
fn scale_locks(plan: &Plan) -> usize {
    if plan.quick {
        1_000
    } else {
        10_000
    }
}

/// SIGSTOP rounds per peer.
fn stop_rounds(plan: &Plan) -> usize {
    if plan.quick {
        1
    } else {
        3
    }
}

async fn measure(
    plan: &Plan,
    drivers: &Drivers,
    peer: Peer,
    url: &str,
    store: &Store,
    observer: &Observer,
    conn: &MultiplexedConnection,
) -> Result<Figures> {
    let ttl = plan.load_ttl;
    let job = |what: &str, act: Option<Duration>| Job {
        url: url.to_string(),
        store: store.clone(),
        name: format!("peers-{}-{}-{what}", peer.store(), peer.driver_name()),
        ttl,
        act,
        log: format!("bench:acts:{}:{}:{what}", peer.store(), peer.driver_name()),
        scale: None,
    };
    let handover = handovers(
        drivers,
        Group::new(peer, job("handover", None)),
        handover_rounds(plan),
    )
    .await?;
    let takeover = takeovers(
        drivers,
        Group::new(peer, job("crash", None)),
        observer,
        plan.crashes,
    )
    .await?;
    let (idle_leader, idle_follower) = idle(
        drivers,
        Group::new(peer, job("idle", None)),
        plan.load_terms,
    )
    .await?;
    let (mut stale_acts, mut refused) = (0, 0);
    for round in 0..stop_rounds(plan) {
        let group = Group::new(
            peer,
            job(&format!("stop-{round}"), Some(Duration::from_millis(10))),
        );
        let (stale, fenced) = paused_holder(drivers, group, conn).await?;
        stale_acts += stale;
        refused += fenced;
    }
    // A peer that cannot hold that many at all is a finding, not a
    // failure of the section: its rows say why.
    let n = scale_locks(plan);
    let group = Group::new(peer, job("scale", None));
    let scale = scale::measure(drivers, group, n, ttl * plan.load_terms)
        .await
        .unwrap_or_else(|why| scale::Scaled::failed(n, why));
    Ok(Figures {
        handover,
        takeover,
        idle_leader,
        idle_follower,
        stale_acts,
        refused,
        scale,
    })
}

/// How long a follower may take to come to hold after a release or a
/// crash: the ttl (a poller's period is shorter), plus start-up.
fn hold_limit(group: &Group) -> Duration {
    group.job.ttl * 3 + START_LIMIT
}

/// A holder and two waiting followers; each round the holder releases and
/// a new follower replaces it. From the holder's `releasing` to the next
/// holder's `held`.
async fn handovers(drivers: &Drivers, mut group: Group, rounds: usize) -> Result<Samples> {
    let mut holder = group.spawn(drivers).await?;
    // The first hold may wait out a store's start-up hold-off.
    group.held(holder, hold_limit(&group)).await?;
    let mut followers = vec![group.spawn(drivers).await?, group.spawn(drivers).await?];
    let mut samples = Samples::default();
    for round in 0..rounds {
        tokio::time::sleep(settle(round)).await;
        let released = group.release(holder).await?;
        let limit = hold_limit(&group);
        let (next, held) = group.held_any(&followers, limit).await?;
        samples.push(Duration::from_nanos(held.saturating_sub(released)));
        followers.retain(|f| *f != next);
        followers.push(group.spawn(drivers).await?);
        holder = next;
    }
    group.end().await;
    Ok(samples)
}

/// A holder and two followers; each round `kill -9` of the holder, then
/// from the lock's expiry to the next holder's `held`. The expiry is the
/// store's: on Redis the key's PTTL right after the kill, on etcd the
/// instant the key's delete (etcd revoking the lease) arrives on a watch of
/// the bench's own, opened before the kill.
async fn takeovers(
    drivers: &Drivers,
    mut group: Group,
    observer: &Observer,
    rounds: usize,
) -> Result<Samples> {
    let mut holder = group.spawn(drivers).await?;
    group.held(holder, hold_limit(&group)).await?;
    let mut followers = vec![group.spawn(drivers).await?, group.spawn(drivers).await?];
    let mut samples = Samples::default();
    for round in 0..rounds {
        tokio::time::sleep(settle(round)).await;
        let key = group
            .keys
            .get(&holder)
            .cloned()
            .ok_or("the driver named no key")?;
        let limit = hold_limit(&group);
        let expiry = match observer {
            Observer::Redis(conn) => {
                group.kill(holder).await?;
                let asked = mono_ns();
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                asked + u64::try_from(pttl.max(0)).unwrap_or(0) * 1_000_000
            }
            Observer::Etcd(client) => {
                let mut watched = crate::etcd::watch_key(client, &key).await?;
                group.kill(holder).await?;
                let deleted = watched.next(EventType::Delete, limit).await?;
                let ago = Instant::now().saturating_duration_since(deleted);
                mono_ns().saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX))
            }
            Observer::Zk(connect_string) => {
                let session = crate::zk::client(connect_string).await?;
                let mut watched =
                    crate::zk::watch_znode(&session, &key, zk::AddWatchMode::PersistentRecursive)
                        .await?;
                group.kill(holder).await?;
                let deleted = watched.next(zk::EventType::NodeDeleted, limit).await?;
                let ago = Instant::now().saturating_duration_since(deleted);
                drop(watched);
                drop(session);
                mono_ns().saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX))
            }
        };
        let (next, held) = group.held_any(&followers, limit).await?;
        samples.push(Duration::from_nanos(held.saturating_sub(expiry)));
        followers.retain(|f| *f != next);
        followers.push(group.spawn(drivers).await?);
        holder = next;
    }
    group.end().await;
    Ok(samples)
}

/// Requests per ttl of an idle holder, then of one follower waiting beside
/// it (the difference), each counted over `terms` ttls after half a ttl to
/// settle.
async fn idle(drivers: &Drivers, mut group: Group, terms: u32) -> Result<(f64, f64)> {
    let ttl = group.job.ttl;
    let holder = group.spawn(drivers).await?;
    group.held(holder, hold_limit(&group)).await?;
    tokio::time::sleep(ttl / 2).await;
    let leader = requests(&group.job.store, ttl * terms).await? / f64::from(terms);
    group.spawn(drivers).await?;
    tokio::time::sleep(ttl / 2).await;
    let both = requests(&group.job.store, ttl * terms).await? / f64::from(terms);
    group.end().await;
    Ok((leader, (both - leader).max(0.0)))
}

/// The requests a store received during `window`: the commands MONITOR
/// shows on Redis (not those scripts run), the gRPC messages etcd's
/// members received (`grpc_server_msg_received_total`, summed; each
/// keep-alive on a stream is one), the packets ZooKeeper's members
/// received (`zk_packets_received`, summed: requests and the sessions'
/// pings, less the four-letter words that read it).
async fn requests(store: &Store, window: Duration) -> Result<f64> {
    match store {
        Store::Redis { port, .. } => requests_during(*port, window).await,
        Store::Etcd { members, .. } => {
            let before = scrape(members).await?;
            tokio::time::sleep(window).await;
            Ok(scrape(members).await?.minus(&before).total())
        }
        Store::Zk { members, .. } => {
            let before = zk_metrics::Snapshot::read(members).await?;
            tokio::time::sleep(window).await;
            Ok(zk_metrics::Snapshot::read(members)
                .await?
                .since(&before)
                .packets)
        }
    }
}

/// A holder acting every 10 ms is stopped (SIGSTOP) until a follower holds
/// and has acted for a while, then continued (SIGCONT). Counts the acts of
/// the old holder that the log shows after the new holder's first: acts
/// while another held. tenure's acts carry the term's token and the log's
/// script refuses a stale one; those refusals are returned apart.
async fn paused_holder(
    drivers: &Drivers,
    mut group: Group,
    conn: &MultiplexedConnection,
) -> Result<(usize, usize)> {
    let mut conn = conn.clone();
    let old = group.spawn(drivers).await?;
    group.held(old, hold_limit(&group)).await?;
    let new = group.spawn(drivers).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    group.signal(old, Signal::SIGSTOP)?;
    let limit = hold_limit(&group);
    let held = group.held(new, limit);
    let outcome = held.await;
    // Let the new holder act, then wake the old one and give its threads
    // time to run (its renewal, its next checks).
    tokio::time::sleep(Duration::from_millis(300)).await;
    group.signal(old, Signal::SIGCONT)?;
    outcome?;
    tokio::time::sleep(Duration::from_secs(1).max(group.job.ttl / 2)).await;
    let acts: Vec<String> = redis::cmd("LRANGE")
        .arg(&group.job.log)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let refused: Option<usize> = redis::cmd("GET")
        .arg(format!("{}:refused", group.job.log))
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    group.end().await;
    let (old, new) = (format!("c{old}"), format!("c{new}"));
    if !acts.contains(&old) {
        return Err(format!("{}: the holder never acted", group_label(&acts)));
    }
    Ok((stale_acts(&acts, &old, &new), refused.unwrap_or(0)))
}

fn group_label(acts: &[String]) -> String {
    format!("{} acts logged", acts.len())
}

/// Acts of `old` after the first act of `new`.
fn stale_acts(acts: &[String], old: &str, new: &str) -> usize {
    acts.iter()
        .skip_while(|a| *a != new)
        .filter(|a| *a == old)
        .count()
}

/// One row per peer and figure: tenure's figure on the same store (the
/// first of `measured`), the peer's, the ratio; and the pictures, named
/// `files`.
fn rows(
    plan: &Plan,
    report: &mut Report,
    measured: &[(Peer, Figures)],
    files: (&'static str, &'static str),
) {
    let Some(((us, tenure), others)) = measured.split_first() else {
        return;
    };
    let ttl = plan.load_ttl.as_secs_f64();
    let store = us.store();
    let (expiry, counted) = match store {
        "etcd" => (
            "from the key's delete as a watch saw it",
            "gRPC messages the members received, summed (grpc_server_msg_received_total; each keep-alive on a stream is one)",
        ),
        "ZooKeeper" => (
            "from the holder's znode's delete (its session's expiry) as a watch saw it",
            "packets the members received, summed (zk_packets_received: requests and each session's pings)",
        ),
        _ => (
            "from the lock's expiry as Redis saw it",
            "commands MONITOR saw (not those its scripts ran)",
        ),
    };
    for (peer, theirs) in others {
        let name = peer.label();
        let leads = tenure.handover.p50() <= theirs.handover.p50()
            && tenure.handover.p99() <= theirs.handover.p99();
        report.push(
            Row::latency_target(
                &format!("peers: {name}: graceful hand-over on {store}, release → another holds"),
                &tenure.handover,
                Some(&theirs.handover),
                "tenure leads",
                leads,
            )
            .against(name),
        );
        let leads = tenure.takeover.p50() <= theirs.takeover.p50()
            && tenure.takeover.p99() <= theirs.takeover.p99();
        report.push(
            Row::latency_target(
                &format!("peers: {name}: takeover after kill -9, {expiry}"),
                &tenure.takeover,
                Some(&theirs.takeover),
                "tenure leads",
                leads,
            )
            .against(name),
        );
        report.push(
            Row::plain(
                &format!("peers: {name}: idle holder, {store} requests per ttl ({ttl} s)"),
                tenure.idle_leader,
                Some(theirs.idle_leader),
                "tenure leads",
                tenure.idle_leader <= theirs.idle_leader,
            )
            .against(name)
            .noted(format!(
                "the holder alone for {} ttls, then beside one waiting follower (the follower's row is the difference); counted: {counted}. How each renews: tenure every ttl/3; {}",
                plan.load_terms,
                peer.renews()
            )),
        );
        report.push(
            Row::plain(
                &format!("peers: {name}: idle follower, {store} requests per ttl ({ttl} s)"),
                tenure.idle_follower,
                Some(theirs.idle_follower),
                "tenure leads",
                tenure.idle_follower <= theirs.idle_follower,
            )
            .against(name),
        );
        report.push(
            Row::plain(
                &format!(
                    "peers: {name}: acts by a SIGSTOPped holder while another held, {} rounds",
                    stop_rounds(plan)
                ),
                tenure.stale_acts as f64,
                Some(theirs.stale_acts as f64),
                "tenure 0",
                tenure.stale_acts == 0,
            )
            .against(name)
            .noted(format!(
                "each round: the holder acts every 10 ms (an RPUSH to a log), is stopped until another holds and has acted 300 ms, then continued; counted from the log, the store's own order. {}'s job {}. tenure's job checks is_leader() (a clock check) and passes its token, which the log's script checks: the token refused {} of tenure's writes over all rounds",
                name,
                peer.guard(),
                tenure.refused
            )),
        );
    }
    for (peer, theirs) in others {
        scale_rows(report, store, (tenure, theirs), *peer);
    }
    let machine = report.machine.short(plan.quick);
    let series = |pick: fn(&Figures) -> &Samples| -> Vec<Series> {
        measured
            .iter()
            .enumerate()
            .map(|(n, (peer, figures))| Series {
                label: format!("{}: {}", peer.label(), peer.how()),
                kind: if peer.driver_name() == "tenure" {
                    Kind::Tenure
                } else {
                    Kind::Peer(n)
                },
                samples: pick(figures).clone(),
            })
            .collect()
    };
    report.charts.push(Chart {
        file: files.0,
        title: format!("Hand-over after a graceful release on {store}: tenure and the peers"),
        subtitle: machine.clone(),
        x_label: "the holder's release starts → another process holds".into(),
        series: series(|f| &f.handover),
    });
    report.charts.push(Chart {
        file: files.1,
        title: format!("Takeover after kill -9 of the holder on {store}: tenure and the peers"),
        subtitle: machine,
        x_label: match store {
            "etcd" => format!("etcd deletes the key (ttl {ttl} s) → another process holds"),
            "ZooKeeper" => {
                format!("the holder's session expires (ttl {ttl} s) → another process holds")
            }
            _ => format!("the lock expires (ttl {ttl} s) → another process holds"),
        },
        series: series(|f| &f.takeover),
    });
}

/// The scale round's rows of `peer` beside tenure's, on `store`.
fn scale_rows(
    report: &mut Report,
    store: &str,
    (tenure, theirs): (&Figures, &Figures),
    peer: Peer,
) {
    let name = peer.label();
    let (us, them) = (&tenure.scale, &theirs.scale);
    let what = format!(
        "peers: {name}: {} locks held in one process on {store}",
        us.asked
    );
    let held = |s: &scale::Scaled| match (&s.failure, s.held == s.asked) {
        (Some(why), _) => format!(
            "none: the process failed ({})",
            // The last line of its stderr: the exception, for Python.
            why.rsplit(" | ").next().unwrap_or(why).trim()
        ),
        (None, true) => format!("all {}", s.asked),
        (None, false) => format!(
            "{} of {} within {:?}",
            s.held,
            s.asked,
            scale::hold_limit(s.asked)
        ),
    };
    let rows = [
        (
            "requests per renew interval (ttl/3), counted by the store",
            us.requests_per_interval,
            them.requests_per_interval,
        ),
        ("CPU, % of one core", us.cpu_percent, them.cpu_percent),
        ("peak RSS, MB", us.peak_rss_mb, them.peak_rss_mb),
        (
            "the store's server processes' CPU meanwhile, % of one core",
            us.store_cpu_percent,
            them.store_cpu_percent,
        ),
    ];
    for (n, (figure, ours, peers)) in rows.into_iter().enumerate() {
        let row = Row::plain(
            &format!("{what}: {figure}"),
            ours,
            Some(peers),
            "tenure leads",
            us.held == us.asked && ours <= peers,
        )
        .against(name);
        report.push(match n {
            0 => row.noted(format!(
                "one process, each peer holding every lock the way its docs show for one (tenure: one partition set of as many partitions, its one member), once all are held; held: tenure {}, {name} {}. Its CPU and peak RSS from /proc and the store's CPU over one window of the idle rows' length, then the store's requests over a second (MONITOR, on Redis, costs the server), counted as in the idle rows",
                held(us),
                held(them)
            )),
            _ => row,
        });
    }
}

/// What `peer-child` is told.
pub(crate) struct ChildArgs {
    /// The redis-server: the store unless `store` is given, and the acts'
    /// log.
    pub(crate) redis: String,
    /// An `etcd://` or `zk://` URL: the store.
    pub(crate) store: Option<String>,
    pub(crate) name: String,
    pub(crate) ttl: Duration,
    pub(crate) id: String,
    /// Act this often, to this list.
    pub(crate) act: Option<(Duration, String)>,
    /// Hold this many locks at once (`scale.rs`).
    pub(crate) scale: Option<usize>,
}

/// `tenure-bench peer-child`: a candidate of one of the peers built in
/// (`tenure`, `rslock`, `etcd-election`), on the drivers' protocol.
pub(crate) async fn child(peer: &str, args: ChildArgs) -> Result<()> {
    if let Some(n) = args.scale {
        return scale::child(peer, args, n).await;
    }
    match (peer, &args.store) {
        ("tenure", _) => tenure_child(args).await,
        ("rslock", _) => rslock_child(args).await,
        ("etcd-election", Some(etcd)) if etcd.starts_with("etcd://") => {
            let etcd = etcd.clone();
            etcd_election_child(&etcd, args).await
        }
        ("etcd-election", _) => Err("the etcd-election peer needs --store etcd://...".into()),
        (other, _) => Err(format!(
            "no such peer built in: {other} (tenure, rslock, etcd-election; the Python peers run in peers/driver.py)"
        )),
    }
}

/// tenure's candidate: the library as its docs show, on Redis, etcd or
/// ZooKeeper.
async fn tenure_child(args: ChildArgs) -> Result<()> {
    let ChildArgs {
        redis,
        store,
        name,
        ttl,
        id,
        act,
        ..
    } = args;
    let url = store.as_deref().unwrap_or(&redis);
    let election = crate::fixture::election(url, &name, &id, ttl).await?;
    // The lease's key in each store's layout (docs/src/key-layout.md).
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("etcd") => println!("key tenure/{name}"),
        Some("zk") => println!("key /tenure/{name}"),
        _ => println!("key tenure:{{{name}}}:lease"),
    }
    println!("ready");
    let term = election.campaign().await.map_err(|e| e.to_string())?;
    println!("held {}", mono_ns());
    let url = redis;
    let actor = match act {
        Some((every, log)) => {
            let mut conn = connect(&url).await?;
            let term = term.clone();
            let id = id.to_string();
            Some(tokio::spawn(async move {
                // The resource's side: a write with a token older than the
                // newest it has seen is refused (and counted).
                let fenced = redis::Script::new(
                    r"local top = tonumber(redis.call('GET', KEYS[2]) or '0')
                      if tonumber(ARGV[1]) < top then return redis.call('INCR', KEYS[3]) end
                      redis.call('SET', KEYS[2], ARGV[1])
                      return redis.call('RPUSH', KEYS[1], ARGV[2])",
                );
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    if term.is_leader() {
                        let _: redis::RedisResult<i64> = fenced
                            .key(&log)
                            .key(format!("{log}:fence"))
                            .key(format!("{log}:refused"))
                            .arg(term.token())
                            .arg(&id)
                            .invoke_async(&mut conn)
                            .await;
                    }
                }
            }))
        }
        None => None,
    };
    until_release().await;
    println!("releasing {}", mono_ns());
    if let Some(actor) = actor {
        actor.abort();
    }
    match term.resign().await {
        Ok(()) => {
            println!("released");
            Ok(())
        }
        Err(err) => {
            println!("release-failed {err}");
            Err(err.to_string())
        }
    }
}

/// Until stdin says `release`, or ends.
async fn until_release() {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim() == "release" {
            break;
        }
    }
}

/// rslock (Redlock), the most used Rust Redis lock, the way its docs show
/// for work that outlives one ttl: `LockManager::using`, which acquires
/// (`acquire_no_guard`: `lock()` until it succeeds), runs the job, extends
/// the lock 0.5 s before its validity ends, drops the job when an
/// extension fails, and unlocks when the job returns. On one master, as
/// every Redis peer here runs. Its lock is a plain string key, the
/// resource's name.
async fn rslock_child(args: ChildArgs) -> Result<()> {
    let ChildArgs {
        redis,
        name,
        ttl,
        id,
        act,
        ..
    } = args;
    let manager = rslock::LockManager::new(vec![redis.clone()]);
    let mut log = match act {
        Some((every, list)) => Some((every, list, connect(&redis).await?)),
        None => None,
    };
    println!("key {name}");
    println!("ready");
    let job = async || {
        println!("held {}", mono_ns());
        let acting = async {
            let Some((every, list, conn)) = log.as_mut() else {
                return std::future::pending().await;
            };
            let mut tick = tokio::time::interval(*every);
            loop {
                tick.tick().await;
                let _: redis::RedisResult<i64> = redis::cmd("RPUSH")
                    .arg(&*list)
                    .arg(&id)
                    .query_async(conn)
                    .await;
            }
        };
        tokio::select! {
            () = until_release() => {}
            () = acting => {}
        }
        println!("releasing {}", mono_ns());
    };
    match manager.using(name.as_bytes(), ttl, job).await {
        Ok(()) => {
            println!("released");
            Ok(())
        }
        Err(err) => {
            // The lock was lost under the job (an extension failed); the
            // harness asks for the release later, or ends the process.
            until_release().await;
            println!("releasing {}", mono_ns());
            println!("release-failed the lock was lost: {err}");
            Err(format!("rslock: {err}"))
        }
    }
}

/// A lease of the ttl (whole seconds, as etcd grants them) on a client of
/// its own, kept alive every ttl/3 on one stream by a task: `alive` until
/// etcd answers ttl 0 or the stream fails. etcd-client has no session of
/// its own; this is what etcd's `concurrency.Session` does.
struct KeptLease {
    client: Client,
    lease: i64,
    alive: Arc<std::sync::atomic::AtomicBool>,
    keeping: tokio::task::JoinHandle<()>,
}

impl KeptLease {
    async fn grant(etcd: &str, ttl: Duration) -> Result<KeptLease> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let endpoints: Vec<String> = metrics_endpoints(etcd)
            .ok_or_else(|| format!("not an etcd:// URL: {etcd}"))?
            .into_iter()
            .map(|member| format!("http://{member}"))
            .collect();
        // No request timeout: Campaign waits as long as the holder holds.
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| format!("cannot connect to etcd: {e}"))?;
        let seconds = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let lease = client
            .lease_client()
            .grant(seconds, None)
            .await
            .map_err(|e| format!("lease grant: {e}"))?
            .id();
        let alive = Arc::new(AtomicBool::new(true));
        let (mut keeper, mut answers) = client
            .lease_client()
            .keep_alive(lease)
            .await
            .map_err(|e| format!("lease keep-alive: {e}"))?;
        let keeping = {
            let alive = alive.clone();
            let every = Duration::from_secs_f64(seconds as f64 / 3.0);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let kept = match keeper.keep_alive().await {
                        Ok(()) => matches!(answers.message().await, Ok(Some(a)) if a.ttl() > 0),
                        Err(_) => false,
                    };
                    if !kept {
                        alive.store(false, Ordering::SeqCst);
                        return;
                    }
                }
            })
        };
        Ok(KeptLease {
            client,
            lease,
            alive,
            keeping,
        })
    }
}

/// etcd's Election API through etcd-client, the way etcd's own
/// `concurrency` package uses it: a lease of the ttl (whole seconds, as
/// etcd grants them), kept alive every ttl/3 on one stream; `Campaign`
/// with it, which etcd answers once every key of the election created
/// before this one is gone; `Resign`, then the lease revoked, on release.
/// The job acts while the keep-alives succeed: a flag the keep-alive task
/// clears when etcd answers ttl 0 or the stream fails. etcd-client has no
/// session or deadline of its own to check instead.
async fn etcd_election_child(etcd: &str, args: ChildArgs) -> Result<()> {
    use std::sync::atomic::Ordering;
    let kept = KeptLease::grant(etcd, args.ttl).await?;
    let (client, lease, alive) = (&kept.client, kept.lease, kept.alive.clone());
    // etcd's election key: the name, '/', the lease in hex.
    println!("key {}/{lease:x}", args.name);
    println!("ready");
    let mut elections = client.election_client();
    let leader = elections
        .campaign(args.name.as_str(), args.id.as_str(), lease)
        .await
        .map_err(|e| format!("campaign: {e}"))?
        .take_leader()
        .ok_or("campaign answered without a leader key")?;
    println!("held {}", mono_ns());
    let actor = match args.act {
        Some((every, log)) => {
            let mut conn = connect(&args.redis).await?;
            let (alive, id) = (alive.clone(), args.id.clone());
            Some(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    if alive.load(Ordering::SeqCst) {
                        let _: redis::RedisResult<i64> = redis::cmd("RPUSH")
                            .arg(&log)
                            .arg(&id)
                            .query_async(&mut conn)
                            .await;
                    }
                }
            }))
        }
        None => None,
    };
    until_release().await;
    println!("releasing {}", mono_ns());
    if let Some(actor) = actor {
        actor.abort();
    }
    kept.keeping.abort();
    let resigned = elections
        .resign(Some(ResignOptions::new().with_leader(leader)))
        .await;
    let _ = client.lease_client().revoke(lease).await;
    match resigned {
        Ok(_) => {
            println!("released");
            Ok(())
        }
        Err(err) => {
            println!("release-failed {err}");
            Err(err.to_string())
        }
    }
}

/// `tenure-bench peer-smoke`: each driver holds, hands over on release
/// and is counted by the harness, one round of each measurement on a
/// private redis-server, etcd cluster and ZooKeeper ensemble. The test suite runs it (tests/peers.rs): it needs
/// this binary itself, for tenure's `peer-child`.
pub(crate) async fn smoke() -> Result<()> {
    let drivers = Drivers::locate()?;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| format!("redis-server: {e}"))?
        .map_err(|e| format!("redis-server: {e}"))?;
    let url = server.url();
    let conn = connect(&url).await?;
    let redis = (
        Store::Redis {
            port: server.port(),
            pids: crate::scale::known([server.pid()]),
        },
        Observer::Redis(conn.clone()),
    );
    let cluster = start_etcd().await?;
    let ensemble = match start_zk().await {
        Ok(ensemble) => ensemble,
        Err(err) => {
            tokio::task::spawn_blocking(move || drop((cluster, server)))
                .await
                .map_err(|e| e.to_string())?;
            return Err(err);
        }
    };
    let outcome = async {
        smoke_peers(&drivers, &url, &conn, &Peer::REDIS, &redis).await?;
        let etcd = etcd_store(&cluster).await?;
        smoke_peers(&drivers, &url, &conn, &Peer::ETCD, &etcd).await?;
        smoke_peers(&drivers, &url, &conn, &Peer::ZK, &zk_store(&ensemble)).await
    }
    .await;
    tokio::task::spawn_blocking(move || drop((ensemble, cluster, server)))
        .await
        .map_err(|e| e.to_string())?;
    outcome
}

async fn smoke_peers(
    drivers: &Drivers,
    url: &str,
    conn: &MultiplexedConnection,
    peers: &[Peer],
    (store, observer): &(Store, Observer),
) -> Result<()> {
    for &peer in peers {
        let job = |what: &str, act| Job {
            url: url.to_string(),
            store: store.clone(),
            name: format!("smoke-{}-{}-{what}", peer.store(), peer.driver_name()),
            ttl: Duration::from_secs(1),
            act,
            log: format!("smoke:acts:{}:{}:{what}", peer.store(), peer.driver_name()),
            scale: None,
        };
        let samples = handovers(drivers, Group::new(peer, job("handover", None)), 2).await?;
        if samples.sorted_ms().len() != 2 {
            return Err(format!(
                "{peer:?}: {} hand-overs of 2",
                samples.sorted_ms().len()
            ));
        }
        let samples = takeovers(drivers, Group::new(peer, job("crash", None)), observer, 1).await?;
        if samples.sorted_ms().len() != 1 {
            return Err(format!(
                "{peer:?}: {} takeovers of 1",
                samples.sorted_ms().len()
            ));
        }
        let group = Group::new(peer, job("stop", Some(Duration::from_millis(10))));
        let (stale, _) = paused_holder(drivers, group, conn).await?;
        let (leader, follower) = idle(drivers, Group::new(peer, job("idle", None)), 1).await?;
        if leader <= 0.0 {
            return Err(format!("{peer:?}: an idle holder sent no request in a ttl"));
        }
        let group = Group::new(peer, job("scale", None));
        let scaled = scale::measure(drivers, group, 20, Duration::from_secs(1)).await?;
        if scaled.held != scaled.asked || scaled.requests_per_interval <= 0.0 {
            return Err(format!(
                "{peer:?}: the scale round held {} of {} locks, with {} requests per interval",
                scaled.held, scaled.asked, scaled.requests_per_interval
            ));
        }
        match peer {
            // Its clock check stops it, and its token fences the rest:
            // never an act in the log after the new holder's first.
            Peer::Tenure | Peer::TenureEtcd | Peer::TenureZk if stale != 0 => {
                return Err(format!("tenure acted {stale} times after its successor"));
            }
            // Its job checks nothing: it acts on at once, which the
            // harness must count.
            Peer::PythonRedisLock if stale == 0 => {
                return Err("python-redis-lock's late acts were not counted".into());
            }
            // A flag its stopped renewal loop clears, a store read:
            // whether they act late depends on which thread runs first
            // after SIGCONT.
            _ => {}
        }
        eprintln!(
            "peer-smoke: {peer:?} on {} ok ({stale} late acts, idle {leader} + {follower} requests a ttl)",
            peer.store()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_protocol_parses_every_line_and_nothing_else() {
        assert_eq!(
            Event::parse("key lock:x"),
            Some(Event::Key("lock:x".into()))
        );
        assert_eq!(Event::parse("ready"), Some(Event::Ready));
        assert_eq!(Event::parse("held 12"), Some(Event::Held(12)));
        assert_eq!(Event::parse("releasing 13"), Some(Event::Releasing(13)));
        assert_eq!(Event::parse("released"), Some(Event::Released));
        assert_eq!(Event::parse("holding 12"), Some(Event::Holding(12)));
        assert_eq!(Event::parse("holding some"), None);
        assert_eq!(
            Event::parse("release-failed NotAcquired"),
            Some(Event::ReleaseFailed("NotAcquired".into()))
        );
        assert_eq!(Event::parse("held soon"), None);
        assert_eq!(Event::parse("Traceback (most recent call last):"), None);
        assert_eq!(Event::parse(""), None);
    }

    #[test]
    fn stale_acts_are_the_old_holders_after_the_new_holders_first() {
        let log = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(stale_acts(&log("a a a b b a b"), "a", "b"), 1);
        assert_eq!(stale_acts(&log("a a b b"), "a", "b"), 0);
        assert_eq!(stale_acts(&log("a a"), "a", "b"), 0, "b never acted");
        assert_eq!(stale_acts(&log("b a a"), "a", "b"), 2);
    }
}
