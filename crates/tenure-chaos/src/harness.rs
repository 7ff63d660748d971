//! The harness: a real cluster of processes, faults on a seeded schedule.
//!
//! It starts two private redis-servers (the election's, reached by every
//! instance through its own fault-injecting proxy, and the fenced resource,
//! reached directly), K instance processes, and then, until the run time is
//! up, picks a fault, applies it to the current leader (or to Redis), heals
//! it, and waits. Everything it starts it stops by PID. The schedule
//! depends only on the seed.
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
//! - `forged`: the leader is killed and a `renewed:1:3600000` announcement
//!   published, then, after the hold, a flood of `released:` ones.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis_process::RedisServer;

use crate::instance::ELECTION;
use crate::log::{now_ns, Event, EventLog};
use crate::proxy::{Mode, Proxy};

/// Kinds of fault, as named in logs and reports. `pause-tenure-only` and
/// `kill-guardian` exist only in CLI mode (`--cli`); [`LIBRARY_ONLY`] kinds
/// only in library mode.
pub const FAULT_KINDS: [&str; 15] = [
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
];

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
    pub faults: Vec<String>,
}

impl RunConfig {
    fn mixed_ttl(&self) -> bool {
        self.faults.iter().any(|f| f == "mixed-ttl")
    }
}

struct Slot {
    name: String,
    incarnation: u32,
    child: Option<Child>,
    proxy: Proxy,
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

pub struct Harness {
    config: RunConfig,
    rng: StdRng,
    election_redis: RedisServer,
    resource_redis: RedisServer,
    slots: Vec<Slot>,
    /// The link of `dup-id`'s second process.
    twin_proxy: Proxy,
    twins: u32,
    /// Where `SAVE` writes the election Redis's snapshot.
    snapshot: PathBuf,
    log: EventLog,
    /// Every PID ever started, to check for leaks at the end.
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
        let election_redis = RedisServer::start().map_err(|e| e.to_string())?;
        let resource_redis = RedisServer::start().map_err(|e| e.to_string())?;
        let log = EventLog::create(&config.out.join("harness.jsonl")).map_err(|e| e.to_string())?;
        let mut slots = Vec::new();
        for i in 1..=config.instances {
            let proxy = Proxy::start(election_redis.port())
                .await
                .map_err(|e| e.to_string())?;
            slots.push(Slot {
                name: format!("i{i}"),
                incarnation: 0,
                child: None,
                proxy,
                ttl: if config.mixed_ttl() && i.is_multiple_of(2) {
                    config.ttl / 2
                } else {
                    config.ttl
                },
            });
        }
        let twin_proxy = Proxy::start(election_redis.port())
            .await
            .map_err(|e| e.to_string())?;
        let dir = election_redis
            .command(&["CONFIG", "GET", "dir"])
            .map_err(|e| e.to_string())?;
        let snapshot = PathBuf::from(dir.lines().nth(1).unwrap_or_default()).join("dump.rdb");
        let rng = StdRng::seed_from_u64(config.seed);
        let mut harness = Harness {
            config,
            rng,
            election_redis,
            resource_redis,
            slots,
            twin_proxy,
            twins: 0,
            snapshot,
            log,
            started: Vec::new(),
        };
        for index in 0..harness.slots.len() {
            harness.spawn(index)?;
        }
        Ok(harness)
    }

    fn spawn(&mut self, index: usize) -> Result<(), String> {
        let slot = &mut self.slots[index];
        slot.incarnation += 1;
        let (inst, ttl, port) = (slot.inst(), slot.ttl, slot.proxy.port);
        let child = self.launch(&inst, None, ttl, port)?;
        self.slots[index].child = Some(child);
        Ok(())
    }

    /// Start one instance process named `inst`, campaigning under `id`
    /// (default: `inst`) through the proxy on `proxy_port`.
    fn launch(
        &mut self,
        inst: &str,
        id: Option<&str>,
        ttl: Duration,
        proxy_port: u16,
    ) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let config = &self.config;
        let file_stem = inst.replace('#', "-");
        let log_path = config.out.join(format!("{file_stem}.jsonl"));
        let stderr = std::fs::File::create(config.out.join(format!("{file_stem}.stderr")))
            .map_err(|e| e.to_string())?;
        let proxy_url = format!("redis://127.0.0.1:{proxy_port}");
        let ttl = humantime::format_duration(ttl).to_string();
        let mut command = match &config.cli {
            None => {
                let mut c = Command::new(&exe);
                c.args([
                    "instance", "--inst", inst, "--redis", &proxy_url, "--ttl", &ttl,
                ]);
                if let Some(id) = id {
                    c.args(["--id", id]);
                }
                if config.mixed_ttl() {
                    c.arg("--max-ttl")
                        .arg(humantime::format_duration(config.ttl).to_string());
                }
                if !config.deadline {
                    c.arg("--unsafe-no-deadline");
                }
                if config.issue_9_bugs {
                    c.arg("--unsafe-issue-9-bugs");
                }
                c
            }
            Some(tenure) => {
                let mut c = Command::new(tenure);
                c.args([
                    "run",
                    "--election",
                    ELECTION,
                    "--redis",
                    &proxy_url,
                    "--ttl",
                    &ttl,
                    "--id",
                    id.unwrap_or(inst),
                    "--kill-grace",
                    "1s",
                    "--",
                ]);
                if config.escaping_cmd {
                    c.args(["sh", "-c", ESCAPING_CMD]);
                }
                c.arg(&exe).args(["writer", "--inst", inst]);
                c
            }
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

    /// The slot whose instance leads now, read from Redis directly.
    async fn leader_slot(&self) -> Option<usize> {
        let url = self.election_redis.url();
        let mut conn = tenure::admin::connect(&url, None, Duration::from_secs(1))
            .await
            .ok()?;
        let leader = tenure::admin::leader_of(&mut conn, tenure::DEFAULT_PREFIX, ELECTION)
            .await
            .ok()??;
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

    /// Inject faults until the run time is up, then stop everything.
    pub async fn run(mut self) -> Result<RunOutcome, String> {
        let ttl = self.config.ttl;
        let end = tokio::time::Instant::now() + self.config.duration;
        // Let the first election happen.
        tokio::time::sleep(ttl).await;
        while tokio::time::Instant::now() + ttl * 3 < end {
            let kind =
                self.config.faults[self.rng.random_range(0..self.config.faults.len())].clone();
            let hold = ttl.mul_f64(self.rng.random_range(1.3..2.5));
            let target = self.leader_slot().await;
            self.inject(&kind, target, hold).await?;
            self.respawn_dead()?;
            let pause = ttl.mul_f64(self.rng.random_range(0.5..2.0));
            tokio::time::sleep(pause).await;
        }
        tokio::time::sleep_until(end).await;
        self.stop().await;
        Ok(RunOutcome {
            started: self.started,
        })
    }

    async fn inject(
        &mut self,
        kind: &str,
        target: Option<usize>,
        hold: Duration,
    ) -> Result<(), String> {
        let t = now_ns();
        let target_name = target.map(|i| self.slots[i].inst()).unwrap_or_default();
        let until = t + hold.as_nanos() as u64;
        let record = |log: &mut EventLog, until: u64| {
            log.record(&Event::Fault {
                kind: kind.to_string(),
                target: target_name.clone(),
                t,
                until,
            });
        };
        match (kind, target) {
            ("kill", Some(i)) => {
                record(&mut self.log, t);
                self.signal_slot(i, Signal::SIGKILL);
                self.reap(i, "killed");
            }
            ("graceful", Some(i)) => {
                record(&mut self.log, t);
                if let Some(pid) = self.slots[i].pid() {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                self.wait_exit(i, Duration::from_secs(10), "exit").await;
            }
            ("pause", Some(i)) => {
                record(&mut self.log, until);
                self.signal_slot(i, Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                self.signal_slot(i, Signal::SIGCONT);
            }
            // tenure stopped while its guardian and command run on: the
            // guardian must kill the command at the deadline by itself.
            ("pause-tenure-only", Some(i)) if self.config.cli.is_some() => {
                record(&mut self.log, until);
                if let Some(pid) = self.slots[i].pid() {
                    let _ = kill(pid, Signal::SIGSTOP);
                    tokio::time::sleep(hold).await;
                    let _ = kill(pid, Signal::SIGCONT);
                }
            }
            // The guardian dies; tenure must kill the command before it
            // resigns (and then exits; the harness starts it again).
            ("kill-guardian", Some(i)) if self.config.cli.is_some() => {
                record(&mut self.log, t);
                if let Some(pid) = self.slots[i].pid() {
                    for guardian in child_groups(pid.as_raw()) {
                        let _ = kill(Pid::from_raw(guardian), Signal::SIGKILL);
                    }
                }
                self.wait_exit(i, Duration::from_secs(10), "guardian-killed")
                    .await;
            }
            ("cut" | "drop" | "delay", Some(i)) => {
                record(&mut self.log, until);
                let mode = match kind {
                    "cut" => Mode::Blackhole,
                    "drop" => Mode::Drop,
                    // A slow link (each chunk ttl/20 late each way) that
                    // leases must survive.
                    _ => Mode::Delay(self.config.ttl / 20),
                };
                self.slots[i].proxy.set(mode);
                tokio::time::sleep(hold).await;
                self.slots[i].proxy.set(Mode::Pass);
            }
            ("restart", _) => {
                record(&mut self.log, t);
                self.restart_redis(false)?;
            }
            ("churn", Some(i)) => {
                record(&mut self.log, t);
                if let Some(pid) = self.slots[i].pid() {
                    let _ = kill(pid, Signal::SIGUSR1);
                }
            }
            ("rollback", Some(i)) => {
                // The snapshot holds the leader's lease; it hands over; a
                // moment later Redis comes back from the snapshot, with that
                // lease and an older token counter. The lease must still be
                // live then, so the restart follows within a tenth of a ttl.
                self.election_redis
                    .command(&["SAVE"])
                    .map_err(|e| e.to_string())?;
                if let Some(pid) = self.slots[i].pid() {
                    let _ = kill(pid, Signal::SIGUSR2);
                }
                let after = self.config.ttl.mul_f64(self.rng.random_range(0.03..0.1));
                tokio::time::sleep(after).await;
                self.restart_redis(true)?;
                record(&mut self.log, now_ns());
            }
            ("mixed-ttl", Some(i)) => {
                record(&mut self.log, until);
                self.slots[i].proxy.set(Mode::Blackhole);
                self.restart_redis(false)?;
                tokio::time::sleep(hold).await;
                self.slots[i].proxy.set(Mode::Pass);
            }
            ("dup-id", Some(i)) => {
                record(&mut self.log, until);
                self.twins += 1;
                let twin = format!("dup#{}", self.twins);
                let (id, ttl) = (self.slots[i].inst(), self.slots[i].ttl);
                let port = self.twin_proxy.port;
                let mut child = self.launch(&twin, Some(&id), ttl, port)?;
                tokio::time::sleep(hold).await;
                let how = stop_child(&mut child, Duration::from_secs(10)).await;
                self.log.record(&Event::Exit {
                    inst: twin,
                    t: now_ns(),
                    how,
                });
            }
            ("forged", Some(i)) => {
                record(&mut self.log, until);
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
            }
            ("stall", _) => {
                let ms = hold.as_millis().to_string();
                record(&mut self.log, until);
                // CLIENT PAUSE answers at once; the blocking call is brief.
                self.election_redis
                    .command(&["CLIENT", "PAUSE", &ms, "ALL"])
                    .map_err(|e| e.to_string())?;
                tokio::time::sleep(hold).await;
            }
            // No leader to aim at right now: nothing to do this round.
            _ => {}
        }
        Ok(())
    }

    /// Kill the election's Redis and start it again: from the snapshot
    /// `SAVE` wrote when `from_snapshot`, else empty (the snapshot, if any,
    /// is removed first). No snapshot is left behind either way.
    fn restart_redis(&mut self, from_snapshot: bool) -> Result<(), String> {
        if !from_snapshot {
            self.remove_snapshot()?;
        }
        self.election_redis.restart().map_err(|e| e.to_string())?;
        self.remove_snapshot()
    }

    fn remove_snapshot(&self) -> Result<(), String> {
        match std::fs::remove_file(&self.snapshot) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("cannot remove {}: {err}", self.snapshot.display()))
            }
            _ => Ok(()),
        }
    }

    /// Publish on the election's events channel, straight to Redis.
    async fn publish(&self, messages: &[String]) -> Result<(), String> {
        let channel = format!("{}:{{{ELECTION}}}:events", tenure::DEFAULT_PREFIX);
        let client = redis::Client::open(self.election_redis.url()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let mut pipe = redis::pipe();
        for message in messages {
            pipe.cmd("PUBLISH").arg(&channel).arg(message).ignore();
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

    async fn stop(&mut self) {
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
            .unwrap_or_default();
        let _ = std::fs::write(self.config.out.join("resource.txt"), accepted);
    }
}

pub struct RunOutcome {
    /// Every instance PID started, for the leak check.
    pub started: Vec<i32>,
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
