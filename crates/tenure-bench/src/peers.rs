//! The peers section: tenure beside the libraries a user would pick
//! instead, doing the same job on the same private redis-server in one
//! run, each candidate a process of its own.
//!
//! Every candidate, tenure's included, is driven through one line protocol
//! (described in `peers/driver.py`): it says `ready`, then `held NS` when
//! it holds, `releasing NS` when told to `release`. `NS` is the host's
//! `CLOCK_MONOTONIC`, which every process shares, so a hand-over is one
//! process's `releasing` to another's `held`, with no pipe in between. The
//! Python peers run in the virtualenv `scripts/install-deps.sh` makes
//! (`target/peers`, pinned in `peers/requirements.txt`); tenure's
//! candidate is this binary's hidden `peer-child`, the library used the
//! way its docs show.
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

use nix::sys::signal::Signal;
use redis::aio::MultiplexedConnection;
use redis_process::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::fixture::{connect, requests_during, samples_len_jitter};
use crate::plan::Plan;
use crate::report::{Report, Row};
use crate::stats::Samples;
use crate::svg::{Chart, Kind, Series};

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
}

impl Peer {
    pub(crate) const ALL: [Peer; 4] = [
        Peer::Tenure,
        Peer::RedisPy,
        Peer::PythonRedisLock,
        Peer::Pottery,
    ];

    /// The name the driver takes (`--peer`).
    pub(crate) fn driver_name(self) -> &'static str {
        match self {
            Peer::Tenure => "tenure",
            Peer::RedisPy => "redis-py",
            Peer::PythonRedisLock => "python-redis-lock",
            Peer::Pottery => "pottery",
        }
    }

    /// The name the table prints.
    fn label(self) -> &'static str {
        match self {
            Peer::Tenure => "tenure",
            Peer::RedisPy => "redis-py Lock",
            Peer::PythonRedisLock => "python-redis-lock",
            Peer::Pottery => "pottery Redlock",
        }
    }

    /// How the peer is used, for the pictures' legends.
    fn how(self) -> &'static str {
        match self {
            Peer::Tenure => "release announced, followers wake at the expiry",
            Peer::RedisPy => "SET NX PX, blocked acquire polls every 0.1 s",
            Peer::PythonRedisLock => "BLPOP on a signal list, timeout = expiry",
            Peer::Pottery => "SET NX PX, retries after up to 0.2 s",
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
        let mut command = match peer {
            Peer::Tenure => {
                let mut c = Command::new(&self.bench);
                c.arg("peer-child");
                c
            }
            _ => {
                let mut c = Command::new(&self.python);
                c.arg(&self.script);
                c
            }
        };
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
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}

/// What every candidate of a group does.
#[derive(Debug, Clone)]
struct Job {
    url: String,
    name: String,
    ttl: Duration,
    /// Act this often while holding (`--act-ms`).
    act: Option<Duration>,
    /// The list acts are pushed to.
    log: String,
}

/// A line a candidate printed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Key(String),
    Ready,
    Held(u64),
    Releasing(u64),
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
    /// The Redis key of the lock, as the drivers said.
    key: Option<String>,
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
            key: None,
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
            self.key = Some(key);
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
    let mut measured = Vec::new();
    for peer in Peer::ALL {
        eprintln!("  peers: {} ...", peer.label());
        let figures = measure(plan, &drivers, peer, &url, server.port(), &conn).await?;
        measured.push((peer, figures));
    }
    rows(plan, report, &measured);
    drop(server);
    Ok(())
}

/// Rounds of each peer's hand-over (each starts a process).
fn handover_rounds(plan: &Plan) -> usize {
    if plan.quick {
        10
    } else {
        40
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
    port: u16,
    conn: &MultiplexedConnection,
) -> Result<Figures> {
    let ttl = plan.load_ttl;
    let job = |what: &str, act: Option<Duration>| Job {
        url: url.to_string(),
        name: format!("peers-{}-{what}", peer.driver_name()),
        ttl,
        act,
        log: format!("bench:acts:{}:{what}", peer.driver_name()),
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
        conn,
        plan.crashes,
    )
    .await?;
    let (idle_leader, idle_follower) = idle(
        drivers,
        Group::new(peer, job("idle", None)),
        port,
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
    Ok(Figures {
        handover,
        takeover,
        idle_leader,
        idle_follower,
        stale_acts,
        refused,
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
/// from the lock's expiry as Redis saw it (its PTTL right after the kill)
/// to the next holder's `held`.
async fn takeovers(
    drivers: &Drivers,
    mut group: Group,
    conn: &MultiplexedConnection,
    rounds: usize,
) -> Result<Samples> {
    let mut conn = conn.clone();
    let mut holder = group.spawn(drivers).await?;
    group.held(holder, hold_limit(&group)).await?;
    let mut followers = vec![group.spawn(drivers).await?, group.spawn(drivers).await?];
    let key = group.key.clone().ok_or("the driver named no key")?;
    let mut samples = Samples::default();
    for round in 0..rounds {
        tokio::time::sleep(settle(round)).await;
        group.kill(holder).await?;
        let asked = mono_ns();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let expiry = asked + u64::try_from(pttl.max(0)).unwrap_or(0) * 1_000_000;
        let limit = hold_limit(&group);
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
/// it (the difference), each counted with MONITOR over `terms` ttls after
/// half a ttl to settle.
async fn idle(drivers: &Drivers, mut group: Group, port: u16, terms: u32) -> Result<(f64, f64)> {
    let ttl = group.job.ttl;
    let holder = group.spawn(drivers).await?;
    group.held(holder, hold_limit(&group)).await?;
    tokio::time::sleep(ttl / 2).await;
    let leader = requests_during(port, ttl * terms).await? / f64::from(terms);
    group.spawn(drivers).await?;
    tokio::time::sleep(ttl / 2).await;
    let both = requests_during(port, ttl * terms).await? / f64::from(terms);
    group.end().await;
    Ok((leader, (both - leader).max(0.0)))
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

/// One row per peer and figure: tenure's figure, the peer's, the ratio.
fn rows(plan: &Plan, report: &mut Report, measured: &[(Peer, Figures)]) {
    let Some((_, tenure)) = measured.iter().find(|(p, _)| *p == Peer::Tenure) else {
        return;
    };
    let ttl = plan.load_ttl.as_secs_f64();
    for (peer, theirs) in measured.iter().filter(|(p, _)| *p != Peer::Tenure) {
        let name = peer.label();
        let leads = tenure.handover.p50() <= theirs.handover.p50()
            && tenure.handover.p99() <= theirs.handover.p99();
        report.push(
            Row::latency_target(
                &format!("peers: {name}: graceful hand-over, release → another holds"),
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
                &format!(
                    "peers: {name}: takeover after kill -9, from the lock's expiry as Redis saw it"
                ),
                &tenure.takeover,
                Some(&theirs.takeover),
                "tenure leads",
                leads,
            )
            .against(name),
        );
        report.push(
            Row::plain(
                &format!("peers: {name}: idle holder, Redis requests per ttl ({ttl} s)"),
                tenure.idle_leader,
                Some(theirs.idle_leader),
                "tenure leads",
                tenure.idle_leader <= theirs.idle_leader,
            )
            .against(name),
        );
        report.push(
            Row::plain(
                &format!("peers: {name}: idle follower, Redis requests per ttl ({ttl} s)"),
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
                "each round: the holder acts every 10 ms (an RPUSH to a log), is stopped until another holds and has acted 300 ms, then continued; counted from the log, the store's own order. tenure's job checks is_leader() (a clock check) and passes its token, which the log's script checks: {} stale writes refused by the token in all",
                tenure.refused
            )),
        );
    }
    let machine = report.machine.short(plan.quick);
    let series = |pick: fn(&Figures) -> &Samples| -> Vec<Series> {
        measured
            .iter()
            .enumerate()
            .map(|(n, (peer, figures))| Series {
                label: format!("{}: {}", peer.label(), peer.how()),
                kind: if *peer == Peer::Tenure {
                    Kind::Tenure
                } else {
                    Kind::Peer(n)
                },
                samples: pick(figures).clone(),
            })
            .collect()
    };
    report.charts.push(Chart {
        file: "peers-handover",
        title: "Hand-over after a graceful release: tenure and the peers".into(),
        subtitle: machine.clone(),
        x_label: "the holder's release starts → another process holds".into(),
        series: series(|f| &f.handover),
    });
    report.charts.push(Chart {
        file: "peers-takeover",
        title: "Takeover after kill -9 of the holder: tenure and the peers".into(),
        subtitle: machine,
        x_label: format!("the lock expires (ttl {ttl} s) → another process holds"),
        series: series(|f| &f.takeover),
    });
}

/// `tenure-bench peer-child`: tenure's candidate, on the drivers' protocol.
pub(crate) async fn child(
    url: &str,
    name: &str,
    ttl: Duration,
    id: &str,
    act: Option<(Duration, String)>,
) -> Result<()> {
    let election = crate::fixture::election(url, name, id, ttl).await?;
    println!("key tenure:{{{name}}}:lease");
    println!("ready");
    let term = election.campaign().await.map_err(|e| e.to_string())?;
    println!("held {}", mono_ns());
    let actor = match act {
        Some((every, log)) => {
            let mut conn = connect(url).await?;
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
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim() == "release" {
            break;
        }
    }
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

/// `tenure-bench peer-smoke`: each driver holds, hands over on release
/// and is counted by the harness, one round of each measurement on a
/// private redis-server. The test suite runs it (tests/peers.rs): it needs
/// this binary itself, for tenure's `peer-child`.
pub(crate) async fn smoke() -> Result<()> {
    let drivers = Drivers::locate()?;
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .map_err(|e| format!("redis-server: {e}"))?
        .map_err(|e| format!("redis-server: {e}"))?;
    let url = server.url();
    let conn = connect(&url).await?;
    for peer in Peer::ALL {
        let job = |what: &str, act| Job {
            url: url.clone(),
            name: format!("smoke-{}-{what}", peer.driver_name()),
            ttl: Duration::from_secs(1),
            act,
            log: format!("smoke:acts:{}:{what}", peer.driver_name()),
        };
        let samples = handovers(&drivers, Group::new(peer, job("handover", None)), 2).await?;
        if samples.sorted_ms().len() != 2 {
            return Err(format!(
                "{peer:?}: {} hand-overs of 2",
                samples.sorted_ms().len()
            ));
        }
        let samples = takeovers(&drivers, Group::new(peer, job("crash", None)), &conn, 1).await?;
        if samples.sorted_ms().len() != 1 {
            return Err(format!(
                "{peer:?}: {} takeovers of 1",
                samples.sorted_ms().len()
            ));
        }
        let group = Group::new(peer, job("stop", Some(Duration::from_millis(10))));
        let (stale, _) = paused_holder(&drivers, group, &conn).await?;
        match peer {
            // Its clock check stops it, and its token fences the rest:
            // never an act in the log after the new holder's first.
            Peer::Tenure if stale != 0 => {
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
        eprintln!("peer-smoke: {peer:?} ok ({stale} late acts)");
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
