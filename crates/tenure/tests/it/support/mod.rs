//! Shared helpers for tenure's integration tests: private Redis servers and
//! elections wired to them.
#![allow(dead_code)]

use std::time::Duration;

pub use redis_process::RedisServer;

pub mod topo;
use tenure::{
    Election, ElectionBuilder, Leadership, MemoryStore, PartitionSet, PartitionSetBuilder,
    Semaphore, Store,
};
use tenure_test_support::overlap::{self, Among};
pub use tenure_test_support::Crashable;

/// Generous bound for anything that should happen "soon", only to turn a
/// hang into a failure; never a speed assertion.
pub const HANG: Duration = Duration::from_secs(30);

/// Log to the test output when RUST_LOG is set.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A fresh private redis-server on a free loopback port.
pub fn redis() -> RedisServer {
    init_logs();
    match RedisServer::start() {
        Ok(server) => server,
        Err(err) => panic!("cannot start redis-server for the tests: {err}"),
    }
}

/// An election on `url` with the given ttl and id.
pub async fn election(url: &str, name: &str, id: &str, ttl: Duration) -> Election {
    Target::from(url).election(name, id, ttl).await
}

/// Where a test's elections keep their leases: a store URL (Redis or etcd)
/// or an in-memory store, so that one test can run on every kind.
#[derive(Debug, Clone)]
pub enum Target {
    /// Redis or etcd: every election and partition set connects on its own.
    Url(String),
    /// Every election and partition set on its own [`MemoryStore::view`],
    /// as each has its own connection to a server.
    Memory(MemoryStore),
}

impl Target {
    /// Whether it is a SQLite file (where a crash is seen at once).
    pub fn is_sqlite(&self) -> bool {
        matches!(self, Target::Url(url) if url.starts_with("sqlite:"))
    }

    /// An election's builder on it with the given ttl and id.
    fn builder(&self, name: &str, id: &str, ttl: Duration) -> ElectionBuilder {
        let builder = Election::builder(name);
        let builder = match self {
            Target::Url(url) => builder.redis(url),
            Target::Memory(memory) => builder.memory(&memory.view()),
        };
        builder.ttl(ttl).id(id)
    }

    /// An election on it with the given ttl and id.
    pub async fn election(&self, name: &str, id: &str, ttl: Duration) -> Election {
        self.builder(name, id, ttl)
            .build()
            .await
            .unwrap_or_else(|err| panic!("building election {name} for {id}: {err}"))
    }

    /// A semaphore of `permits` on it with the given ttl and id.
    pub async fn semaphore(
        &self,
        name: &str,
        id: &str,
        ttl: Duration,
        permits: usize,
    ) -> Semaphore {
        self.builder(name, id, ttl)
            .semaphore(permits)
            .await
            .unwrap_or_else(|err| panic!("building semaphore {name} for {id}: {err}"))
    }

    /// A partition set's builder on it.
    pub fn partition_set(&self, group: &str, partitions: Vec<String>) -> PartitionSetBuilder {
        let builder = PartitionSet::builder(group, partitions);
        match self {
            Target::Url(url) => builder.redis(url),
            Target::Memory(memory) => builder.memory(&memory.view()),
        }
    }

    /// A store of its own on it.
    pub async fn store(&self) -> Store {
        match self {
            Target::Url(url) => Store::open(url)
                .connect()
                .await
                .unwrap_or_else(|err| panic!("connecting to {url}: {err}")),
            Target::Memory(memory) => Store::memory(memory),
        }
    }
}

impl From<&str> for Target {
    fn from(url: &str) -> Target {
        Target::Url(url.to_string())
    }
}

impl From<&String> for Target {
    fn from(url: &String) -> Target {
        Target::Url(url.clone())
    }
}

impl From<&Target> for Target {
    fn from(target: &Target) -> Target {
        target.clone()
    }
}

/// Campaign, failing the test on error or hang.
pub async fn campaign(election: &Election) -> Leadership {
    match tokio::time::timeout(HANG, election.campaign()).await {
        Ok(Ok(term)) => term,
        Ok(Err(err)) => panic!("{} could not campaign: {err}", election.id()),
        Err(_) => panic!("{} did not become leader within {HANG:?}", election.id()),
    }
}

/// One of the library's Lua scripts, as the library sends it (with the
/// shared prelude), for tests that call a script directly.
pub fn lua(file: &str) -> redis::Script {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend/redis/scripts/");
    let read = |name: &str| {
        std::fs::read_to_string(format!("{dir}{name}"))
            .unwrap_or_else(|err| panic!("cannot read script {name}: {err}"))
    };
    // The acquiring scripts are built on acquire_one.lua's function, as
    // the library builds them.
    let shared = if file.starts_with("acquire") {
        read("acquire_one.lua")
    } else {
        String::new()
    };
    redis::Script::new(&(read("prelude.lua") + &shared + &read(file)))
}

/// A plain connection for inspecting Redis directly.
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("test URL is valid");
    client
        .get_multiplexed_async_connection()
        .await
        .expect("test redis is reachable")
}

/// Stop an election's instance as a crash would: its runtime and every task
/// on it vanish, nothing is resigned.
pub struct CrashableInstance {
    runtime: Crashable,
    /// A handle of its term, to act as it before the crash.
    term: Leadership,
}

impl CrashableInstance {
    /// Start an instance on its own runtime that campaigns and then keeps
    /// renewing; returns once it leads, with its token.
    pub fn lead(target: impl Into<Target>, name: &str, id: &str, ttl: Duration) -> (Self, u64) {
        let runtime = Crashable::start();
        let target = target.into();
        let term = runtime.block_on(async {
            let election = target.election(name, id, ttl).await;
            let term = campaign(&election).await;
            let handle = term.clone();
            // Keep the term (and its keeper) alive on this runtime.
            tokio::spawn(async move {
                let _term = term;
                let _election = election;
                std::future::pending::<()>().await;
            });
            handle
        });
        let token = term.token();
        (CrashableInstance { runtime, term }, token)
    }

    /// [`CrashableInstance::lead`], then record a successful run of the
    /// election's work (kept for `keep`), as `Runner::every` does after a
    /// tick.
    pub fn lead_after_a_run(
        target: impl Into<Target>,
        name: &str,
        id: &str,
        ttl: Duration,
        keep: Duration,
    ) -> (Self, u64) {
        let (instance, token) = Self::lead(target, name, id, ttl);
        let recorded = instance.runtime.block_on(instance.term.record_run(keep));
        assert!(recorded.expect("the store answers"), "the run is recorded");
        (instance, token)
    }

    /// The local deadline of its term (frozen once it has crashed).
    pub fn deadline(&self) -> tokio::time::Instant {
        self.term.deadline()
    }

    /// Crash as [`CrashableInstance::crash`] does, keeping the handle of
    /// its term to read its (frozen) deadline.
    pub fn crash_in_place(&mut self) {
        self.runtime.crash();
    }

    /// Crash: drop every task without running any more of them.
    pub fn crash(mut self) {
        self.runtime.crash();
    }
}

/// One term as a contender saw it: when it began (its campaign returned:
/// its holder leads from then, not before), when its acquisition was sent
/// (`first deadline + margin - ttl`, for the messages), and its deadline
/// (when it ended, or the one it has now).
#[derive(Debug, Clone)]
pub struct TermRecord {
    pub id: String,
    pub token: u64,
    pub began: tokio::time::Instant,
    pub sent: tokio::time::Instant,
    pub ended: tokio::time::Instant,
    pub reason: Option<tenure::LostReason>,
}

/// Terms of many contenders, checked for overlap.
#[derive(Debug, Clone, Default)]
pub struct TermLog {
    terms: std::sync::Arc<std::sync::Mutex<Vec<(Began, Leadership)>>>,
}

/// When a term began (its campaign returned) and its acquisition was sent.
#[derive(Debug, Clone, Copy)]
struct Began {
    at: tokio::time::Instant,
    sent: tokio::time::Instant,
}

impl TermLog {
    /// Campaign with `election` again and again until the task is aborted,
    /// recording each term. `ttl` and `margin` must be the election's.
    pub fn contend(
        &self,
        election: Election,
        ttl: Duration,
        margin: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let terms = self.terms.clone();
        tokio::spawn(async move {
            loop {
                let term = match election.campaign().await {
                    Ok(term) => term,
                    Err(err) if err.is_transient() => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(err) => panic!("{} cannot campaign: {err}", election.id()),
                };
                // The term leads from now: its holder cannot act on it
                // before. (Counted from the acquisition's send, an acquire
                // that spent more than the margin in flight, reconnecting
                // to a promoted primary say, showed an overlap that no
                // holder ever saw.) The send time, from the first deadline,
                // is kept for the messages.
                let now = tokio::time::Instant::now();
                let from_deadline = term.deadline() + margin - ttl;
                let sent = if term.lost_reason().is_none() && from_deadline < now {
                    from_deadline
                } else {
                    now
                };
                terms
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((Began { at: now, sent }, term.clone()));
                term.lost().await;
            }
        })
    }

    /// The term that leads now, if any.
    pub fn current(&self) -> Option<Leadership> {
        let terms = self.terms.lock().unwrap_or_else(|p| p.into_inner());
        terms
            .iter()
            .map(|(_, term)| term.clone())
            .find(|t| t.is_leader())
    }

    /// Resign the term that leads now, if any; its token.
    pub async fn resign_current(&self) -> Option<u64> {
        let current = {
            let terms = self.terms.lock().unwrap_or_else(|p| p.into_inner());
            terms
                .iter()
                .map(|(_, term)| term.clone())
                .find(|t| t.is_leader())
        };
        let term = current?;
        let token = term.token();
        let _ = term.resign().await;
        Some(token)
    }

    /// Wait until a term with a token above `token` has begun.
    pub async fn until_term_after(&self, token: u64) -> u64 {
        tokio::time::timeout(HANG, async {
            loop {
                let newest = self.terms().iter().map(|t| t.token).max().unwrap_or(0);
                if newest > token {
                    return newest;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no term after token {token} within {HANG:?}"))
    }

    /// Every term so far, in the order they began.
    pub fn terms(&self) -> Vec<TermRecord> {
        let terms = self.terms.lock().unwrap_or_else(|p| p.into_inner());
        Self::records(&terms)
    }

    /// Every term so far, in the order they began; the log lets go of the
    /// terms' handles (with the contenders stopped, the terms end).
    pub fn finish(&self) -> Vec<TermRecord> {
        let terms = std::mem::take(&mut *self.terms.lock().unwrap_or_else(|p| p.into_inner()));
        Self::records(&terms)
    }

    fn records(terms: &[(Began, Leadership)]) -> Vec<TermRecord> {
        let mut records: Vec<TermRecord> = terms
            .iter()
            .map(|(began, term)| TermRecord {
                id: term.id().to_string(),
                token: term.token(),
                began: began.at,
                sent: began.sent,
                ended: term.deadline(),
                reason: term.lost_reason(),
            })
            .collect();
        records.sort_by_key(|t| t.began);
        records
    }

    /// Panic unless no two of `terms` overlap (each began after every one
    /// before it had ended by its deadline, whoever held them) and tokens
    /// rise with every term.
    pub fn assert_safe(terms: &[TermRecord]) {
        if let Some(both) = overlap::overlaps(terms, Among::Everyone).first() {
            let (a, b) = (&terms[both.first], &terms[both.second]);
            panic!(
                "two leaders: {} (token {}) led until {:?}, {} (token {}) from {:?} \
                 (its acquisition sent at {:?})",
                a.id, a.token, a.ended, b.id, b.token, b.began, b.sent
            );
        }
        for pair in terms.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(b.token > a.token, "tokens fell: {a:?} then {b:?}");
        }
    }
}

/// A term held from when it began until its deadline. With the terms
/// sorted by `began`, the overlaps are what checking neighbours found (a
/// term that began before the one before it ended), as long as no term's
/// deadline comes before the term before it began.
impl overlap::Term for TermRecord {
    type Time = tokio::time::Instant;

    fn holder(&self) -> &str {
        &self.id
    }

    fn span(&self) -> Option<(Self::Time, Self::Time)> {
        Some((self.began, self.ended))
    }
}

/// How many times `PTTL` ran on a node (from scripts too): tenure's
/// acquisition script calls it when it finds the lease held; renewals by
/// the holder, announcements and sentinels do not.
pub fn pttl_calls(node: &redis_process::Node) -> u64 {
    let stats = node
        .command(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_pttl:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// A private 3-member ZooKeeper ensemble with a short tick (100 ms), so
/// that sessions, and leases, may be as short as 200 ms.
#[cfg(feature = "zookeeper")]
pub fn zk() -> zk_process::ZkEnsemble {
    init_logs();
    match zk_process::ZkEnsemble::builder()
        .tick_time(Duration::from_millis(100))
        .start()
    {
        Ok(ensemble) => ensemble,
        Err(err) => panic!("cannot start a ZooKeeper ensemble for the tests: {err}"),
    }
}

/// A private PostgreSQL server, stopped when dropped.
pub fn postgres() -> pg_process::PgServer {
    init_logs();
    match pg_process::PgServer::start() {
        Ok(server) => server,
        Err(err) => panic!("cannot start PostgreSQL for the tests: {err}"),
    }
}

/// A SQLite file in a private temporary directory, removed when dropped.
pub struct SqliteFile {
    dir: std::path::PathBuf,
}

impl SqliteFile {
    /// Its `sqlite://` URL.
    pub fn url(&self) -> String {
        format!("sqlite://{}/tenure.db", self.dir.display())
    }

    /// The directory it lives in.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A new SQLite file's place, in a directory of its own.
pub fn sqlite() -> SqliteFile {
    init_logs();
    let dir = std::env::temp_dir().join(format!(
        "tenure-test-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    if let Err(err) = std::fs::create_dir_all(&dir) {
        panic!("cannot make {}: {err}", dir.display());
    }
    SqliteFile { dir }
}

/// A private 3-member etcd cluster with a short election timeout (500 ms),
/// so that its leases may be as short as one second and a lost etcd
/// leader is replaced quickly.
pub fn etcd() -> etcd_process::EtcdCluster {
    init_logs();
    match etcd_process::EtcdCluster::builder()
        .election_timeout(Duration::from_millis(500))
        .start()
    {
        Ok(cluster) => cluster,
        Err(err) => panic!("cannot start an etcd cluster for the tests: {err}"),
    }
}
