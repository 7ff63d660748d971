//! A cluster of private `etcd` members, and the faults tests inflict on it.
//!
//! Every fault comes with a wait on the exact state that follows it
//! ([`EtcdCluster::wait_for_leader`] after a leader is killed or paused,
//! [`EtcdCluster::restart`] returning once the member serves again), so
//! tests poll a condition instead of sleeping and hoping. Members are
//! started with timers scaled from one setting
//! ([`EtcdBuilder::election_timeout`]) so that a test can make failovers
//! take half a second instead of etcd's usual few.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::member::{create_private_dir, json_u64, Member, Status};
use crate::{find_etcd, free_ports, io_err, Error, START_TIMEOUT};

/// How often a condition is checked while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How long [`EtcdCluster::post`] and [`EtcdCluster::compact_now`] wait for
/// one reply. etcd gives up on a request it cannot commit after about five
/// seconds plus two election timeouts; this is a little longer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The most members a cluster may have: raft gets slower, not safer,
/// beyond seven, and so would the tests.
const MAX_MEMBERS: usize = 7;

/// Distinguishes the clusters one process starts (directory names and
/// cluster tokens).
static CLUSTERS: AtomicU64 = AtomicU64::new(0);

/// Options for an [`EtcdCluster`] before it starts.
#[derive(Debug, Clone)]
pub struct EtcdBuilder {
    members: usize,
    election_timeout: Duration,
    tls: Option<TlsFiles>,
}

/// PEM files for a cluster whose client port speaks TLS only and requires
/// a client certificate signed by `ca` ([`EtcdBuilder::tls`]).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The members' certificate (valid for 127.0.0.1).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// The CA that signed the clients' certificates.
    pub ca: PathBuf,
}

impl Default for EtcdBuilder {
    fn default() -> Self {
        EtcdBuilder {
            members: 3,
            election_timeout: Duration::from_millis(1000),
            tls: None,
        }
    }
}

impl EtcdBuilder {
    /// How many members the cluster has, 1 to 7 (default 3).
    pub fn members(mut self, count: usize) -> Self {
        self.members = count;
        self
    }

    /// etcd's `--election-timeout` (default 1 s, etcd's own default): how
    /// long a follower hears nothing from its leader before it starts an
    /// election. The heartbeat interval is a tenth of it, as etcd
    /// recommends. Half a second makes failovers in tests quick while
    /// staying clear of spurious elections on a loaded machine. At least
    /// 10 ms, at most 50 s (etcd's limit).
    pub fn election_timeout(mut self, timeout: Duration) -> Self {
        self.election_timeout = timeout;
        self
    }

    /// Serve clients over TLS only (`https`, `--client-cert-auth`): the
    /// cluster's URL becomes `etcds://…`. Health is still checked over
    /// plain HTTP on a metrics port of its own, but the gateway calls
    /// ([`EtcdCluster::post`], [`EtcdCluster::leader`] and the waits built on
    /// them) are not available.
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Start every member on free ports of 127.0.0.1 and return once each
    /// answers `GET /health` with `"health":"true"`, that is once the
    /// cluster has a leader and commits requests. When a port is taken
    /// between choosing it and binding it (another test won the race), the
    /// cluster is started again on other ports.
    pub fn start(self) -> Result<EtcdCluster, Error> {
        if !(1..=MAX_MEMBERS).contains(&self.members) {
            return Err(Error::Config(format!(
                "an etcd cluster has 1 to {MAX_MEMBERS} members, not {}",
                self.members
            )));
        }
        let election_ms = self.election_timeout.as_millis();
        if !(10..=50_000).contains(&election_ms) {
            return Err(Error::Config(format!(
                "the election timeout must be 10 ms to 50 s, not {:?}",
                self.election_timeout
            )));
        }
        let binary = find_etcd()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut cluster = EtcdCluster::create(&binary, &self)?;
            let all: Vec<usize> = (0..self.members).collect();
            match cluster.start_members(&all, "new") {
                Ok(()) if self.tls.is_some() => return Ok(cluster),
                Ok(()) => {
                    let ids = cluster
                        .members
                        .iter()
                        .map(|m| m.status().map(|s| s.id))
                        .collect::<Result<_, _>>();
                    match ids {
                        Ok(ids) => {
                            cluster.ids = ids;
                            return Ok(cluster);
                        }
                        // A member that lost the race for its metrics port
                        // exits at once, and the process that won it (a
                        // member of another test's cluster) may answer its
                        // `/health`: the member's own client port then
                        // refuses the status request.
                        Err(_) if attempt < 3 && cluster.lost_a_port_race() => {}
                        Err(e) => return Err(cluster.with_logs(e)),
                    }
                }
                // Dropping the cluster kills its members and removes its
                // directory before the retry.
                Err(_) if attempt < 3 && cluster.lost_a_port_race() => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A running cluster of private `etcd` members on free ports of 127.0.0.1.
///
/// Members are numbered from 0; a member's number is the `member` argument
/// of the methods below, which panic when it is not less than
/// [`EtcdCluster::members`]. Member `N` is named `mN`. Its ports and data
/// directory stay the same for the life of the cluster: [`EtcdCluster::kill`]
/// and [`EtcdCluster::restart`] crash and restart the same raft member.
///
/// A copy of a cluster's data taken by [`EtcdCluster::back_up`], kept in
/// the cluster's own directory (removed with it).
#[derive(Debug, Clone)]
pub struct Backup {
    dirs: Vec<PathBuf>,
}

/// Copy the directory tree `from` to `to` (created; files and folders
/// only, as etcd's data directory holds).
fn copy_dir(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to).map_err(io_err(format!("creating {}", to.display())))?;
    let entries = std::fs::read_dir(from).map_err(io_err(format!("reading {}", from.display())))?;
    for entry in entries {
        let entry = entry.map_err(io_err(format!("reading {}", from.display())))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if source.is_dir() {
            copy_dir(&source, &target)?;
        } else {
            std::fs::copy(&source, &target)
                .map_err(io_err(format!("copying {}", source.display())))?;
        }
    }
    Ok(())
}

/// Dropping the cluster kills every member (SIGKILL by PID, then waits for
/// it) and removes its directories.
#[derive(Debug)]
pub struct EtcdCluster {
    binary: PathBuf,
    /// The temporary directory holding every member's data directory.
    root: PathBuf,
    /// Backups taken so far (for their directory names).
    backups: usize,
    /// `--initial-cluster-token`, unique per cluster so that members of
    /// different clusters can never join each other.
    token: String,
    heartbeat_ms: u128,
    election_ms: u128,
    members: Vec<Member>,
    /// Each member's raft ID, by member number (empty with TLS).
    ids: Vec<u64>,
    tls: Option<TlsFiles>,
}

impl EtcdCluster {
    /// Start a three-member cluster with the default timers and wait until
    /// every member is healthy.
    pub fn start() -> Result<Self, Error> {
        EtcdBuilder::default().start()
    }

    /// Options for a cluster of another size or with other timers.
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::default()
    }

    /// Every member's client address, `127.0.0.1:PORT`, in member order,
    /// whether the member is running or not.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// A URL naming every member for clients:
    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    /// How many members the cluster has (running or not).
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The member's client port (plain HTTP and gRPC) on 127.0.0.1.
    pub fn client_port(&self, member: usize) -> u16 {
        self.members[member].client_port
    }

    /// The member's peer (raft) port on 127.0.0.1.
    pub fn peer_port(&self, member: usize) -> u16 {
        self.members[member].peer_port
    }

    /// The member's raft ID, as etcd reports it (`header.member_id`).
    pub fn member_id(&self, member: usize) -> u64 {
        self.ids[member]
    }

    /// The member's process id, or `None` while it is killed (or has
    /// exited on its own).
    pub fn pid(&self, member: usize) -> Option<u32> {
        self.members[member].pid()
    }

    /// Whether the member's process is alive (paused counts as alive).
    pub fn is_running(&self, member: usize) -> bool {
        self.members[member].is_running()
    }

    /// Whether the member is stopped by [`EtcdCluster::pause`].
    pub fn is_paused(&self, member: usize) -> bool {
        self.members[member].is_paused()
    }

    /// The member's data directory (`--data-dir`). Its log, `etcd.log`,
    /// is in there too.
    pub fn dir(&self, member: usize) -> &Path {
        &self.members[member].dir
    }

    /// The last `lines` lines of the member's log (etcd logs errors only).
    pub fn log_tail(&self, member: usize, lines: usize) -> String {
        self.members[member].log_tail(lines)
    }

    /// Kill the member now: SIGKILL by PID (a paused member dies too), then
    /// reap it. Its data directory is kept for [`EtcdCluster::restart`].
    /// Does nothing when it is not running.
    pub fn kill(&mut self, member: usize) {
        self.members[member].kill();
    }

    /// Start the member again, killing it first if it is running, on the
    /// same ports with the same data directory
    /// (`--initial-cluster-state existing`), and wait until it answers
    /// `/health` with `"health":"true"`. That needs a quorum: with a
    /// majority of the cluster killed, restart them together with
    /// [`EtcdCluster::restart_all`]. A member that does not come up in time
    /// is killed again.
    pub fn restart(&mut self, member: usize) -> Result<(), Error> {
        assert!(member < self.members.len(), "no etcd member {member}");
        self.members[member].kill();
        self.start_members(&[member], "existing")
    }

    /// Stop the member with SIGSTOP: it keeps its ports and connections but
    /// does nothing, raft included, until [`EtcdCluster::resume`]. A paused
    /// leader is replaced after an election timeout.
    pub fn pause(&self, member: usize) -> Result<(), Error> {
        self.members[member].pause()
    }

    /// Let a paused member run again (SIGCONT).
    pub fn resume(&self, member: usize) -> Result<(), Error> {
        self.members[member].resume()
    }

    /// Kill every member (SIGKILL by PID), keeping their data.
    pub fn kill_all(&mut self) {
        for member in &self.members {
            member.kill();
        }
    }

    /// Restart the whole cluster: kill the members still running, start
    /// every member again on its ports with its data, and wait until each is
    /// healthy. Keys written before survive, as after a power cut.
    pub fn restart_all(&mut self) -> Result<(), Error> {
        self.kill_all();
        let all: Vec<usize> = (0..self.members.len()).collect();
        self.start_members(&all, "existing")
    }

    /// The member that is raft leader now, as the running, unpaused members
    /// see it: the leader named in the newest raft term any of them is in,
    /// which must itself be running, unpaused and say that it leads. An
    /// error otherwise: no leader yet in that term (an election is under
    /// way), or one the others have not yet noticed is killed or paused.
    /// After a fault, use [`EtcdCluster::wait_for_leader`].
    pub fn leader(&self) -> Result<usize, Error> {
        let answers = self.statuses();
        let newest = answers
            .iter()
            .filter_map(|(_, answer)| answer.as_ref().ok())
            .map(|status| status.term)
            .max();
        let leader_id = answers
            .iter()
            .filter_map(|(_, answer)| answer.as_ref().ok())
            .filter(|status| Some(status.term) == newest && status.leader != 0)
            .map(|status| status.leader)
            .next();
        let Some(leader_id) = leader_id else {
            return Err(Error::Topology(format!(
                "no live etcd member knows a leader in the newest term ({})",
                self.describe(&answers)
            )));
        };
        let leader = self.index_of(leader_id)?;
        let confirmed = answers.iter().any(|(index, answer)| {
            *index == leader && answer.as_ref().is_ok_and(|s| s.leader == leader_id)
        });
        if !confirmed {
            let member = &self.members[leader];
            let state = if !member.is_running() {
                "not running"
            } else if member.is_paused() {
                "paused"
            } else {
                "not leading by its own account"
            };
            return Err(Error::Topology(format!(
                "the members report m{leader} as leader, but it is {state} ({})",
                self.describe(&answers)
            )));
        }
        Ok(leader)
    }

    /// Wait until a quorum (a majority of all members) of the running,
    /// unpaused members follow the same leader, which is itself running,
    /// unpaused and leading, and return that leader. Polls every 20 ms.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, Error> {
        let quorum = self.members.len() / 2 + 1;
        let what = format!("a quorum ({quorum}) of live etcd members agree on a live leader");
        self.poll(timeout, &what, || {
            let answers = self.statuses();
            let agreed = answers.iter().find_map(|(index, answer)| {
                let status = answer.as_ref().ok()?;
                // A member that leads says so itself.
                if status.leader != self.ids[*index] {
                    return None;
                }
                let followers = answers
                    .iter()
                    .filter(|(_, a)| a.as_ref().is_ok_and(|s| s.leader == status.leader))
                    .count();
                (followers >= quorum).then_some(*index)
            });
            agreed.ok_or_else(|| self.describe(&answers))
        })
    }

    /// Take a backup of the whole cluster as an operator would before a
    /// risky change: stop every member, copy each one's data (`member/`
    /// of its data directory: the WAL and snapshots), and start them again.
    /// [`EtcdCluster::restore`] puts it back, rolling the cluster back to
    /// this moment: keys, leases and the revision counter alike.
    pub fn back_up(&mut self) -> Result<Backup, Error> {
        self.kill_all();
        let root = self.root.join(format!("backup-{}", self.backups));
        self.backups += 1;
        let mut dirs = Vec::with_capacity(self.members.len());
        for (index, member) in self.members.iter().enumerate() {
            let to = root.join(format!("m{index}"));
            copy_dir(&member.dir.join("member"), &to)?;
            dirs.push(to);
        }
        self.restart_all()?;
        Ok(Backup { dirs })
    }

    /// Stop every member, replace its data with the `backup`'s, and start
    /// the cluster again: a restore from an older snapshot.
    pub fn restore(&mut self, backup: &Backup) -> Result<(), Error> {
        assert_eq!(
            backup.dirs.len(),
            self.members.len(),
            "a backup of this cluster"
        );
        self.kill_all();
        for (member, from) in self.members.iter().zip(&backup.dirs) {
            let data = member.dir.join("member");
            std::fs::remove_dir_all(&data)
                .map_err(io_err(format!("removing {}", data.display())))?;
            copy_dir(from, &data)?;
        }
        self.restart_all()
    }

    /// Compact the key-value history up to the current revision, and wait
    /// until the compaction has reached the disk of the member asked
    /// (`physical`); returns that revision. Asks the first live member that
    /// answers. A revision compacted already counts as success, so calling
    /// this twice without a write in between is fine.
    pub fn compact_now(&self) -> Result<i64, Error> {
        let mut last = Error::Topology("no etcd member is running and unpaused".into());
        for member in self.members.iter().filter(|m| m.is_live()) {
            match compact(member) {
                Ok(revision) => return Ok(revision),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// POST a JSON `body` to the member's gRPC gateway, e.g.
    /// `post(0, "/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#)` (keys and
    /// values in base64), and return the reply's JSON text. A status other
    /// than 200 is an [`Error::Http`] with etcd's error text. Waits up to
    /// ten seconds for the reply.
    pub fn post(&self, member: usize, path: &str, body: &str) -> Result<String, Error> {
        self.members[member].post(path, body, REQUEST_TIMEOUT)
    }

    /// Choose the ports and create the directories of a cluster, starting
    /// nothing yet.
    fn create(binary: &Path, builder: &EtcdBuilder) -> Result<EtcdCluster, Error> {
        let ports = free_ports(3 * builder.members)?;
        let (root, token) = loop {
            let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
            // The port too, in case an earlier process with our PID left a
            // directory behind.
            let token = format!("etcd-process-{}-{n}-{}", std::process::id(), ports[0]);
            let root = std::env::temp_dir().join(&token);
            match create_private_dir(&root) {
                Ok(()) => break (root, token),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(format!("creating {}", root.display()))(e)),
            }
        };
        let mut cluster = EtcdCluster {
            binary: binary.to_path_buf(),
            root,
            backups: 0,
            token,
            heartbeat_ms: builder.election_timeout.as_millis() / 10,
            election_ms: builder.election_timeout.as_millis(),
            members: Vec::with_capacity(builder.members),
            ids: Vec::new(),
            tls: builder.tls.clone(),
        };
        for (index, three) in ports.chunks(3).enumerate() {
            let dir = cluster.root.join(format!("m{index}"));
            // Created now (private, as etcd wants it) so the log can go in.
            create_private_dir(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
            cluster.members.push(Member::new(
                index,
                [three[0], three[1], three[2]],
                builder.tls.is_some(),
                dir,
            ));
        }
        Ok(cluster)
    }

    /// The command line of a member, but for the binary.
    fn args(&self, member: &Member, state: &str) -> Vec<String> {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name(), m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut args: Vec<String> = Vec::new();
        let mut flag = |name: &str, value: String| {
            args.push(format!("--{name}"));
            args.push(value);
        };
        flag("name", member.name());
        flag("data-dir", member.dir.to_string_lossy().into_owned());
        flag("listen-client-urls", member.client_url());
        flag("advertise-client-urls", member.client_url());
        flag("listen-peer-urls", member.peer_url());
        flag("initial-advertise-peer-urls", member.peer_url());
        flag("listen-metrics-urls", member.metrics_url());
        if let Some(tls) = &self.tls {
            let path = |p: &PathBuf| p.to_string_lossy().into_owned();
            flag("cert-file", path(&tls.cert));
            flag("key-file", path(&tls.key));
            flag("trusted-ca-file", path(&tls.ca));
        }
        flag("initial-cluster", initial_cluster);
        flag("initial-cluster-token", self.token.clone());
        flag("initial-cluster-state", state.to_owned());
        flag("heartbeat-interval", self.heartbeat_ms.to_string());
        flag("election-timeout", self.election_ms.to_string());
        // etcd 3.4's default logger (capnslog) ignores --log-level.
        flag("logger", "zap".to_owned());
        flag("log-level", "error".to_owned());
        // History is kept until a test compacts it (compact_now).
        flag("auto-compaction-retention", "0".to_owned());
        if self.tls.is_some() {
            // A boolean flag takes its value after '='.
            args.push("--client-cert-auth=true".to_owned());
        }
        args
    }

    /// Start the `which` members (with `--initial-cluster-state state`) and
    /// wait until each answers `/health` with `"health":"true"`. On failure
    /// the members not yet healthy are killed.
    fn start_members(&self, which: &[usize], state: &str) -> Result<(), Error> {
        let result = self.spawn_and_wait(which, state);
        if result.is_err() {
            for &index in which {
                if self.members[index].health().is_err() {
                    self.members[index].kill();
                }
            }
        }
        result
    }

    fn spawn_and_wait(&self, which: &[usize], state: &str) -> Result<(), Error> {
        for &index in which {
            let member = &self.members[index];
            member.spawn(&self.binary, &self.args(member, state))?;
        }
        let started = Instant::now();
        let mut pending = which.to_vec();
        let mut last = vec![String::from("no answer yet"); self.members.len()];
        loop {
            for &index in &pending {
                if let Some(status) = self.members[index].exited() {
                    return Err(self.did_not_start(index, format!("exited with {status}")));
                }
            }
            let answers = self.ask(&pending, Member::health);
            pending.clear();
            for (index, answer) in answers {
                if let Err(why) = answer {
                    last[index] = why;
                    pending.push(index);
                }
            }
            let Some(&first) = pending.first() else {
                return Ok(());
            };
            if started.elapsed() > START_TIMEOUT {
                return Err(self.did_not_start(
                    first,
                    format!("not healthy after {START_TIMEOUT:?} ({})", last[first]),
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn did_not_start(&self, index: usize, what: String) -> Error {
        let member = &self.members[index];
        Error::DidNotStart {
            member: index,
            port: member.client_port,
            detail: format!("{what}; log: {}", member.log_tail(5).replace('\n', " | ")),
        }
    }

    /// `err`, with whether each member still runs and the last lines of
    /// its log, for a failure that happened after every member was seen
    /// healthy.
    fn with_logs(&self, err: Error) -> Error {
        let members: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let state = m
                    .exited()
                    .map_or("running".to_owned(), |s| format!("exited with {s}"));
                format!("m{i} {state}: {}", m.log_tail(3).replace('\n', " | "))
            })
            .collect();
        Error::Http(format!("{err}; members: {}", members.join("; ")))
    }

    /// Whether a member failed to start because another process took one
    /// of its ports after they were chosen.
    fn lost_a_port_race(&self) -> bool {
        self.members
            .iter()
            .any(|m| m.log_tail(20).contains("address already in use"))
    }

    /// Ask the `which` members at once (one thread each), so that a member
    /// that is slow to answer delays no other; answers in `which`'s order.
    fn ask<T: Send>(
        &self,
        which: &[usize],
        question: impl Fn(&Member) -> T + Sync,
    ) -> Vec<(usize, T)> {
        let question = &question;
        std::thread::scope(|scope| {
            let handles: Vec<_> = which
                .iter()
                .map(|&index| {
                    let member = &self.members[index];
                    (index, scope.spawn(move || question(member)))
                })
                .collect();
            handles
                .into_iter()
                // A question panicked: let the caller's thread panic too.
                .map(|(index, handle)| {
                    let answer = handle
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p));
                    (index, answer)
                })
                .collect()
        })
    }

    /// Every member's status, or why there is none: `Err("killed")` or
    /// `Err("paused")` for members not asked.
    fn statuses(&self) -> Vec<(usize, Result<Status, String>)> {
        let live: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].is_live())
            .collect();
        let mut answers: Vec<(usize, Result<Status, String>)> = self
            .ask(&live, |m| m.status().map_err(|e| e.to_string()))
            .into_iter()
            .collect();
        for (index, member) in self.members.iter().enumerate() {
            if !live.contains(&index) {
                let why = if member.is_paused() {
                    "paused"
                } else {
                    "not running"
                };
                answers.push((index, Err(why.to_owned())));
            }
        }
        answers.sort_by_key(|(index, _)| *index);
        answers
    }

    /// The member with this raft ID.
    fn index_of(&self, id: u64) -> Result<usize, Error> {
        self.ids
            .iter()
            .position(|&known| known == id)
            .ok_or_else(|| Error::Topology(format!("raft ID {id:x} is not a member's")))
    }

    /// What each member said, for error messages: `m0: leader m1 (term 2);
    /// m1: not running; ...`.
    fn describe(&self, answers: &[(usize, Result<Status, String>)]) -> String {
        answers
            .iter()
            .map(|(index, answer)| match answer {
                Ok(status) if status.leader == 0 => {
                    format!("m{index}: no leader (term {})", status.term)
                }
                Ok(status) => match self.index_of(status.leader) {
                    Ok(leader) => format!("m{index}: leader m{leader} (term {})", status.term),
                    Err(_) => format!(
                        "m{index}: leader {:x}, not a member (term {})",
                        status.leader, status.term
                    ),
                },
                Err(why) => format!("m{index}: {why}"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Check `condition` every [`POLL_INTERVAL`] until it holds or `timeout`
    /// has passed; `Err` says why it does not hold yet.
    fn poll<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut condition: impl FnMut() -> Result<T, String>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        loop {
            match condition() {
                Ok(value) => return Ok(value),
                Err(why) if started.elapsed() >= timeout => {
                    return Err(Error::Timeout {
                        what: what.to_owned(),
                        waited: started.elapsed(),
                        last: why,
                    })
                }
                Err(_) => std::thread::sleep(POLL_INTERVAL),
            }
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Read the current revision from `member`, then compact to it.
fn compact(member: &Member) -> Result<i64, Error> {
    // Any key: the header carries the store's revision.
    let range = member.post_json("/v3/kv/range", r#"{"key":"AA=="}"#, REQUEST_TIMEOUT)?;
    let revision = json_u64(&range["header"]["revision"])
        .and_then(|r| i64::try_from(r).ok())
        .ok_or_else(|| {
            Error::Http(format!(
                "etcd member m{} reports no header.revision: {range}",
                member.index
            ))
        })?;
    let body = format!(r#"{{"revision":"{revision}","physical":true}}"#);
    match member.post("/v3/kv/compaction", &body, REQUEST_TIMEOUT) {
        Ok(_) => Ok(revision),
        Err(Error::Http(e)) if e.contains("required revision has been compacted") => Ok(revision),
        Err(e) => Err(e),
    }
}
