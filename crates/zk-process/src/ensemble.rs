//! An ensemble of private ZooKeeper members, and the faults tests inflict
//! on it.
//!
//! Every fault comes with a wait on the exact state that follows it
//! ([`ZkEnsemble::wait_for_leader`] after a leader is killed or paused,
//! [`ZkEnsemble::restart`] returning once the member serves again), so
//! tests poll a condition instead of sleeping and hoping. Members run with
//! a short tick ([`ZkBuilder::tick_time`], 200 ms by default) so that a
//! failover takes a second or two, and with session timeouts from 200 ms
//! ([`ZkBuilder::session_timeouts`]) so that a test can let a session
//! expire quickly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::{self, copy_dir, create_private_dir, Settings};
use crate::member::{Member, POLL_REPLY_TIMEOUT};
use crate::{
    cli, find_zookeeper, free_ports, io_err, Error, Installation, POLL_INTERVAL, START_TIMEOUT,
};

/// The most members an ensemble may have: a quorum gets slower, not safer,
/// beyond seven, and each member is a JVM.
const MAX_MEMBERS: usize = 7;

/// Distinguishes the ensembles one process starts (directory names).
static ENSEMBLES: AtomicU64 = AtomicU64::new(0);

/// Options for a [`ZkEnsemble`] before it starts.
#[derive(Debug, Clone)]
pub struct ZkBuilder {
    members: usize,
    settings: Settings,
}

impl Default for ZkBuilder {
    fn default() -> Self {
        ZkBuilder {
            members: 3,
            settings: Settings {
                tick_time: Duration::from_millis(200),
                min_session_timeout: Duration::from_millis(200),
                max_session_timeout: Duration::from_millis(60_000),
                extra: Vec::new(),
            },
        }
    }
}

impl ZkBuilder {
    /// How many members the ensemble has, 1 to 7 (default 3). A single
    /// member runs standalone (`srvr` says `Mode: standalone`); more form a
    /// quorum (`standaloneEnabled=false`).
    pub fn members(mut self, count: usize) -> Self {
        self.members = count;
        self
    }

    /// ZooKeeper's `tickTime` (default 200 ms; ZooKeeper's own is 2 s):
    /// its unit of time. Followers have 10 ticks to sync with a new leader
    /// and are dropped after 5 ticks of silence, so with the default a dead
    /// leader is noticed in about a second. 10 ms to 60 s.
    pub fn tick_time(mut self, tick: Duration) -> Self {
        self.settings.tick_time = tick;
        self
    }

    /// The bounds ZooKeeper holds a client's requested session timeout to
    /// (`minSessionTimeout`, `maxSessionTimeout`; default 200 ms and 60 s,
    /// where ZooKeeper's own are 2 and 20 ticks). Whole milliseconds, the
    /// minimum at least 1 ms and not above the maximum. Sessions expire on
    /// tick boundaries, so an expiry is seen up to a tick late.
    pub fn session_timeouts(mut self, min: Duration, max: Duration) -> Self {
        self.settings.min_session_timeout = min;
        self.settings.max_session_timeout = max;
        self
    }

    /// Add the line `key=value` to every member's `zoo.cfg`, after (and so
    /// overriding) the crate's own: `config("snapCount", "100")`. ZooKeeper
    /// turns a key it does not know into the system property
    /// `zookeeper.<key>`.
    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.settings.extra.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Start every member on free ports of 127.0.0.1 and return once each
    /// serves (answers `srvr` with a `Mode:`) and one of them leads: the
    /// quorum has formed. When a port is taken between choosing it and
    /// binding it (another test won the race), the ensemble is started
    /// again on other ports.
    pub fn start(self) -> Result<ZkEnsemble, Error> {
        self.check()?;
        let install = find_zookeeper()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ensemble = ZkEnsemble::create(&install, &self)?;
            let all: Vec<usize> = (0..self.members).collect();
            match ensemble.start_members(&all) {
                Ok(()) => return Ok(ensemble),
                // Dropping the ensemble kills its members and removes its
                // directory before the retry.
                Err(_) if attempt < 3 && ensemble.lost_a_port_race() => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn check(&self) -> Result<(), Error> {
        if !(1..=MAX_MEMBERS).contains(&self.members) {
            return Err(Error::Config(format!(
                "a ZooKeeper ensemble has 1 to {MAX_MEMBERS} members, not {}",
                self.members
            )));
        }
        let Settings {
            tick_time,
            min_session_timeout: min,
            max_session_timeout: max,
            extra,
        } = &self.settings;
        if !(10..=60_000).contains(&tick_time.as_millis()) {
            return Err(Error::Config(format!(
                "the tick time must be 10 ms to 60 s, not {tick_time:?}"
            )));
        }
        if min.as_millis() < 1 || min > max || max.as_millis() > i32::MAX as u128 {
            return Err(Error::Config(format!(
                "the session timeouts must be 1 ms <= min <= max, not {min:?} and {max:?}"
            )));
        }
        for (key, value) in extra {
            let bad = |text: &str| text.contains(['\n', '\r']);
            if key.is_empty() || key.contains('=') || bad(key) || bad(value) {
                return Err(Error::Config(format!(
                    "not a zoo.cfg line: {key:?} = {value:?}"
                )));
            }
        }
        Ok(())
    }
}

/// A copy of an ensemble's data taken by [`ZkEnsemble::back_up`], kept in
/// the ensemble's own directory (removed with it).
#[derive(Debug, Clone)]
pub struct Backup {
    dirs: Vec<PathBuf>,
}

/// A running ensemble of private ZooKeeper members on free ports of
/// 127.0.0.1.
///
/// Members are numbered from 0; a member's number is the `member` argument
/// of the methods below, which panic when it is not less than
/// [`ZkEnsemble::members`]. Member `N` is named `mN` and has server id
/// (`myid`) `N + 1`. Its ports and directory stay the same for the life of
/// the ensemble: [`ZkEnsemble::kill`] and [`ZkEnsemble::restart`] crash and
/// restart the same quorum peer.
///
/// Dropping the ensemble kills every member (SIGKILL by PID, then waits for
/// it) and removes its directories.
#[derive(Debug)]
pub struct ZkEnsemble {
    install: Installation,
    /// The temporary directory holding every member's directory and the
    /// logging configurations.
    root: PathBuf,
    /// Backups taken so far (for their directory names).
    backups: usize,
    members: Vec<Member>,
}

impl ZkEnsemble {
    /// Start a three-member ensemble with the default settings and wait
    /// until it serves.
    pub fn start() -> Result<Self, Error> {
        ZkBuilder::default().start()
    }

    /// Options for an ensemble of another size or with other timers.
    pub fn builder() -> ZkBuilder {
        ZkBuilder::default()
    }

    /// What ZooKeeper clients are given: every member's client address in
    /// member order, `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`, whether the
    /// member is running or not.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The connect string as a URL: `zk://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// How many members the ensemble has (running or not).
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The member's client port on 127.0.0.1 (ZooKeeper's protocol and the
    /// four-letter words).
    pub fn client_port(&self, member: usize) -> u16 {
        self.members[member].client_port
    }

    /// The member's process id (the JVM's own), or `None` while it is
    /// killed (or has exited on its own).
    pub fn pid(&self, member: usize) -> Option<u32> {
        self.members[member].pid()
    }

    /// Whether the member's process is alive (paused counts as alive).
    pub fn is_running(&self, member: usize) -> bool {
        self.members[member].is_running()
    }

    /// Whether the member is stopped by [`ZkEnsemble::pause`].
    pub fn is_paused(&self, member: usize) -> bool {
        self.members[member].is_paused()
    }

    /// The member's directory: its `zoo.cfg`, its log (`zookeeper.log`) and
    /// its data directory, `data/` (`myid`, `version-2/`).
    pub fn dir(&self, member: usize) -> &Path {
        &self.members[member].dir
    }

    /// The last `lines` lines of the member's log (log4j at INFO, and
    /// whatever the JVM printed).
    pub fn log_tail(&self, member: usize, lines: usize) -> String {
        self.members[member].log_tail(lines)
    }

    /// Kill the member now: SIGKILL by PID (a paused member dies too), then
    /// reap it. Its data is kept for [`ZkEnsemble::restart`]. Does nothing
    /// when it is not running.
    pub fn kill(&mut self, member: usize) {
        self.members[member].kill();
    }

    /// Start the member again, killing it first if it is running, on the
    /// same ports with the same data, and wait until it serves. That needs
    /// a quorum: with a majority of the ensemble killed, restart them
    /// together with [`ZkEnsemble::restart_all`]. A member that does not
    /// come up in time is killed again.
    pub fn restart(&mut self, member: usize) -> Result<(), Error> {
        assert!(member < self.members.len(), "no ZooKeeper member {member}");
        self.members[member].kill();
        self.start_members(&[member])
    }

    /// Stop the member with SIGSTOP: it keeps its ports and connections but
    /// does nothing until [`ZkEnsemble::resume`]. A paused leader is
    /// replaced once its followers give up on it (5 ticks).
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

    /// Restart the whole ensemble: kill the members still running, start
    /// every member again on its ports with its data, and wait until the
    /// quorum serves again. Znodes written before survive, as after a power
    /// cut; sessions survive too, unless they expired meanwhile.
    pub fn restart_all(&mut self) -> Result<(), Error> {
        self.kill_all();
        let all: Vec<usize> = (0..self.members.len()).collect();
        self.start_members(&all)
    }

    /// Send a four-letter word (`srvr`, `mntr`, `stat`, `cons`, `dump`,
    /// `conf`, `ruok`, ...) to the member's client port and return the
    /// answer. Every word is allowed. Without a quorum most words are
    /// answered with "This ZooKeeper instance is not currently serving
    /// requests"; `ruok` is answered `imok` regardless.
    pub fn four_letter(&self, member: usize, word: &str) -> Result<String, Error> {
        self.members[member].four_letter(word, POLL_REPLY_TIMEOUT)
    }

    /// The member's `mntr` answer as (key, value) pairs, in ZooKeeper's
    /// order: `zk_server_state`, `zk_znode_count`, `zk_ephemerals_count`,
    /// ... An error when it does not serve.
    pub fn mntr(&self, member: usize) -> Result<Vec<(String, String)>, Error> {
        let reply = self.four_letter(member, "mntr")?;
        let pairs: Vec<(String, String)> = reply
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        if pairs.is_empty() {
            return Err(Error::Reply(format!(
                "ZooKeeper member m{member} answered mntr with: {}",
                reply.trim()
            )));
        }
        Ok(pairs)
    }

    /// Run one command of ZooKeeper's command-line client (`zkCli.sh`'s
    /// `ZooKeeperMain`) against the member: `cli(0, &["create", "/x",
    /// "data"])`, `cli(1, &["get", "/x"])`, `cli(2, &["ls", "/"])`. Returns
    /// the command's output (`Created /x`, `data`, `[x, zookeeper]`); a
    /// failing command (`Node does not exist: /x`) is an [`Error::Reply`].
    /// Each call starts a JVM (half a second or so) and may take up to 30 s.
    /// A follower may answer a read before it has applied a write made
    /// through another member, as ZooKeeper allows.
    pub fn cli(&self, member: usize, command: &[&str]) -> Result<String, Error> {
        cli::run(
            &self.install,
            &self.root,
            self.members[member].client_port,
            command,
        )
    }

    /// Take a backup of the whole ensemble as an operator would before a
    /// risky change: stop every member (a member's data can be copied
    /// consistently only while it is stopped), copy each one's
    /// `data/version-2/` (snapshots, transaction logs, epochs), and start
    /// them again. [`ZkEnsemble::restore`] puts it back, rolling the
    /// ensemble back to this moment: znodes and zxids alike.
    pub fn back_up(&mut self) -> Result<Backup, Error> {
        self.kill_all();
        let root = self.root.join(format!("backup-{}", self.backups));
        self.backups += 1;
        let mut dirs = Vec::with_capacity(self.members.len());
        for (index, member) in self.members.iter().enumerate() {
            let to = root.join(format!("m{index}"));
            copy_dir(&member.data_dir().join("version-2"), &to)?;
            dirs.push(to);
        }
        self.restart_all()?;
        Ok(Backup { dirs })
    }

    /// Stop every member, replace its `data/version-2/` with the
    /// `backup`'s, and start the ensemble again, returning once it serves:
    /// a restore from an older snapshot.
    pub fn restore(&mut self, backup: &Backup) -> Result<(), Error> {
        assert_eq!(
            backup.dirs.len(),
            self.members.len(),
            "a backup of this ensemble"
        );
        self.kill_all();
        for (member, from) in self.members.iter().zip(&backup.dirs) {
            let data = member.data_dir().join("version-2");
            std::fs::remove_dir_all(&data)
                .map_err(io_err(format!("removing {}", data.display())))?;
            copy_dir(from, &data)?;
        }
        self.restart_all()
    }

    /// Choose the ports and write the directories of an ensemble, starting
    /// nothing yet.
    fn create(install: &Installation, builder: &ZkBuilder) -> Result<ZkEnsemble, Error> {
        let ports = free_ports(3 * builder.members)?;
        let root = loop {
            let n = ENSEMBLES.fetch_add(1, Ordering::Relaxed);
            // The port too, in case an earlier process with our PID left a
            // directory behind.
            let name = format!("zk-process-{}-{n}-{}", std::process::id(), ports[0]);
            let root = std::env::temp_dir().join(name);
            match create_private_dir(&root) {
                Ok(()) => break root,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(format!("creating {}", root.display()))(e)),
            }
        };
        // From here on, dropping the ensemble removes the directory.
        let mut ensemble = ZkEnsemble {
            install: install.clone(),
            root,
            backups: 0,
            members: Vec::with_capacity(builder.members),
        };
        config::write_log4j(&ensemble.root)?;
        for (index, three) in ports.chunks(3).enumerate() {
            let dir = ensemble.root.join(format!("m{index}"));
            ensemble
                .members
                .push(Member::new(index, [three[0], three[1], three[2]], dir));
        }
        for member in &ensemble.members {
            write_member(member, &ensemble.members, &builder.settings)?;
        }
        Ok(ensemble)
    }

    /// Start the `which` members and wait until each serves and the
    /// ensemble has a leader. On failure the members of `which` that do
    /// not serve are killed.
    fn start_members(&self, which: &[usize]) -> Result<(), Error> {
        let started = Instant::now();
        let result = self.spawn_and_wait(which).and_then(|()| {
            let left = START_TIMEOUT.saturating_sub(started.elapsed());
            self.wait_for_leader(left).map(|_| ())
        });
        if result.is_err() {
            for &index in which {
                if self.members[index].mode().is_err() {
                    self.members[index].kill();
                }
            }
        }
        result
    }

    fn spawn_and_wait(&self, which: &[usize]) -> Result<(), Error> {
        for &index in which {
            let member = &self.members[index];
            let args = config::server_args(&self.install, &self.root, member);
            member.spawn(&self.install.java, &args)?;
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
            let answers = self.ask(&pending, Member::mode);
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
                    format!("not serving after {START_TIMEOUT:?} ({})", last[first]),
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
            detail: format!(
                "{what}; log: {}",
                member.log_summary(8).replace('\n', " | ")
            ),
        }
    }

    /// Whether a member failed to start because another process took one
    /// of its ports after they were chosen.
    fn lost_a_port_race(&self) -> bool {
        self.members.iter().any(|m| {
            m.log_tail(40)
                .to_ascii_lowercase()
                .contains("address already in use")
        })
    }

    /// Ask the `which` members at once (one thread each), so that a member
    /// that is slow to answer delays no other; answers in `which`'s order.
    pub(crate) fn ask<T: Send>(
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

    /// Every member, for the waits and their error messages.
    pub(crate) fn all_members(&self) -> &[Member] {
        &self.members
    }
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Create `member`'s directory, its `zoo.cfg` and its `data/myid`.
fn write_member(member: &Member, all: &[Member], settings: &Settings) -> Result<(), Error> {
    let data = member.data_dir();
    for dir in [&member.dir, &data] {
        create_private_dir(dir).map_err(io_err(format!("creating {}", dir.display())))?;
    }
    let files = [
        (
            member.dir.join("zoo.cfg"),
            config::zoo_cfg(member, all, settings),
        ),
        (data.join("myid"), format!("{}\n", member.server_id())),
    ];
    for (path, text) in files {
        std::fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
    }
    Ok(())
}
