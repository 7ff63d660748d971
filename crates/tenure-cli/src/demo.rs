//! `tenure demo`: the project's main job on a fresh machine, narrated.
//!
//! Three candidates (each on its own runtime, so one can vanish the way a
//! crashed process does) campaign for one election, by default in a
//! temporary SQLite file (the embedded store: no server to install, so a
//! fresh machine needs only the Rust toolchain), or on the store `--store`
//! names. The demo measures and prints: the first election, the takeover
//! after the leader crashes (at once on SQLite, where the kernel shows the
//! crash; at lease expiry on a network store), the handover after a
//! graceful step-down (milliseconds), and the fencing tokens rising, with a
//! stale write being refused.
//!
//! On a Redis of the user's, the demo deletes the keys of its own election
//! when it ends, however it ends. `PREFIX:epoch` stays: every election
//! under the prefix shares it.

use std::collections::HashMap;
use std::time::Duration;

use tenure::{fence, Election, FencedKey, FencedWrite};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use crate::cli::DemoArgs;
use crate::exit::{self, Failure};
use crate::say;

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

/// What a candidate reports to the narrator.
enum Event {
    Elected {
        id: &'static str,
        token: u64,
        at: Instant,
    },
}

/// A candidate on a runtime of its own.
struct Candidate {
    runtime: Option<tokio::runtime::Runtime>,
    resign: mpsc::UnboundedSender<()>,
}

impl Candidate {
    fn start(
        election: Election,
        id: &'static str,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Self, Failure> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| Failure::new(1, format!("cannot start a runtime: {e}")))?;
        let (resign, mut resign_requests) = mpsc::unbounded_channel::<()>();
        runtime.spawn(async move {
            loop {
                let Ok(term) = election.campaign().await else {
                    return;
                };
                let _ = events.send(Event::Elected {
                    id,
                    token: term.token(),
                    at: Instant::now(),
                });
                tokio::select! {
                    _ = term.lost() => {}
                    Some(()) = resign_requests.recv() => {
                        let _ = term.resign().await;
                        // Step aside long enough for another candidate to win.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        Ok(Candidate {
            runtime: Some(runtime),
            resign,
        })
    }

    /// Vanish like a killed process: every task dropped, nothing resigned.
    fn crash(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.crash();
    }
}

pub async fn demo(args: DemoArgs) -> Result<i32, Failure> {
    let started = Instant::now();
    let etcd = args.url.as_deref().map(Kind::of) == Some(Kind::Etcd);
    if etcd && (args.ttl < Duration::from_secs(1) || args.ttl.subsec_nanos() != 0) {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "the demo's ttl on etcd must be a whole number of seconds, 1s or more \
                 (etcd's leases count seconds), not {}",
                humantime::format_duration(args.ttl)
            ),
        ));
    }
    let kind = args.url.as_deref().map_or(Kind::Sqlite, Kind::of);
    let store = kind.name();
    say!("tenure demo: leader election on {store}, with measured times\n");
    let (url, scratch) = match args.url {
        Some(url) => {
            say!(
                "{}: using {}",
                store.to_lowercase(),
                tenure::redact_url(&url)
            );
            (url, None)
        }
        None => {
            let scratch = Scratch::new()?;
            let url = format!("sqlite://{}", scratch.db().display());
            say!(
                "sqlite: a temporary file, {} (no server: SQLite is built into tenure)",
                scratch.db().display()
            );
            (url, Some(scratch))
        }
    };
    let name = format!("demo-{:08x}", rand_suffix());
    let mut reached = false;
    let outcome = narrate(&url, &name, args.ttl, &mut reached).await;
    let stopped = if scratch.is_some() {
        "; the temporary file was removed"
    } else if etcd || !reached || matches!(kind, Kind::Sqlite | Kind::Postgres) {
        // etcd: the election's key went with its lease; nothing else was
        // written. Unreached: nothing was written at all. A file or a
        // database of the user's keeps its rows, as a record.
        ""
    } else if kind == Kind::Zk {
        forget_zk(&url, &name).await;
        ""
    } else {
        forget(&url, &name).await;
        ""
    };
    drop(scratch);
    outcome?;
    say!("\ndone in {:.1}s{stopped}", started.elapsed().as_secs_f64());
    Ok(exit::OK)
}

/// The candidates, by id, and the events they report.
type Candidates = HashMap<&'static str, Candidate>;
type Events = mpsc::UnboundedReceiver<Event>;

/// Tell the story; `reached` says whether the store was reached (and so
/// may hold the demo's keys).
async fn narrate(url: &str, name: &str, ttl: Duration, reached: &mut bool) -> Result<(), Failure> {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (mut candidates, first, token1) =
        first_leader(url, name, ttl, reached, &events_tx, &mut events).await?;
    let wait = ttl * 5;
    let kind = Kind::of(url);
    if kind == Kind::Etcd {
        say!("      (the token counts up from the clock in ms, so it rises even across a restore");
        say!("       of an older etcd snapshot, which rolls etcd's own revision back)");
    } else if kind == Kind::Zk {
        say!("      (the token counts up from the clock in ms, so it rises even across a restore");
        say!("       of an older copy of ZooKeeper's data, which rolls its zxids back)");
    } else if kind == Kind::Sqlite {
        say!("      (a new file grants no lease for one ttl: it may have replaced one whose");
        say!("       leaders still act)");
    } else if kind == Kind::Postgres {
        say!("      (a PostgreSQL server process new to the election grants no lease for one ttl:");
        say!("       a leader from before a restart, restore or failover might still lead)");
    } else {
        say!("      (a Redis new to the election grants no lease for one ttl: a leader from");
        say!("       before a restart or failover might still believe it leads)");
    }
    let (second, token2) =
        crash_the_leader(url, name, kind, first, &mut candidates, &mut events, wait).await?;
    let (third, token3) = resign_the_leader(second, &candidates, &mut events, wait).await?;
    say!("\n4. Fencing tokens rose with every term: {token1} < {token2} < {token3}");
    refuse_a_late_write(
        url,
        name,
        kind != Kind::Redis,
        (first, token1),
        (third, token3),
    )
    .await?;
    drop(candidates);
    Ok(())
}

/// Step 1: three candidates campaign, reporting to `events_tx`; the
/// candidates, the first leader and its token.
async fn first_leader(
    url: &str,
    name: &str,
    ttl: Duration,
    reached: &mut bool,
    events_tx: &mpsc::UnboundedSender<Event>,
    events: &mut Events,
) -> Result<(Candidates, &'static str, u64), Failure> {
    let mut candidates = HashMap::new();
    let mut renew_every = Duration::ZERO;
    let campaign_started = Instant::now();
    for id in NAMES {
        let election = Election::builder(name)
            .redis(url)
            .ttl(ttl)
            .id(id)
            .build()
            .await?;
        *reached = true;
        renew_every = election.renew_every();
        candidates.insert(id, Candidate::start(election, id, events_tx.clone())?);
    }
    say!(
        "\n1. Three candidates ({}) campaign for election {name:?} (ttl {}, renew every {})",
        NAMES.join(", "),
        humantime::format_duration(ttl),
        humantime::format_duration(Duration::from_millis(renew_every.as_millis() as u64)),
    );
    let wait = ttl * 5;
    let (first, token1, at) = next_elected(events, wait).await?;
    say!(
        "   -> {first} leads after {}, fencing token {token1}",
        ms(at - campaign_started)
    );
    Ok((candidates, first, token1))
}

/// Step 2: the leader `first` crashes; the next leader and its token.
async fn crash_the_leader(
    url: &str,
    name: &str,
    kind: Kind,
    first: &str,
    candidates: &mut Candidates,
    events: &mut Events,
    wait: Duration,
) -> Result<(&'static str, u64), Failure> {
    let store = tenure::Store::open(url).connect().await?;
    if kind == Kind::Sqlite {
        say!("\n2. {first} crashes: its process vanishes without resigning");
    } else {
        say!("\n2. {first} crashes: its process vanishes without resigning; the lease stays until it expires");
    }
    let ttl_left = store
        .leader_of(tenure::DEFAULT_PREFIX, name)
        .await?
        .map_or(Duration::ZERO, |l| l.ttl_left);
    let crashed_at = Instant::now();
    if let Some(candidate) = candidates.get_mut(first) {
        candidate.crash();
    }
    let expires_at = crashed_at + ttl_left;
    let (second, token2, at) = next_elected(events, wait).await?;
    if kind == Kind::Sqlite {
        say!(
            "   -> {second} took over {} after the crash, though the lease had {} left: on one",
            ms(at - crashed_at),
            ms(ttl_left),
        );
        say!("      host a crash is seen at once (the kernel let go of {first}'s lock on the election)");
    } else if kind == Kind::Zk {
        // A session's time left is not shown to other clients.
        say!(
            "   -> {second} took over {} after the crash (ZooKeeper expires the crashed session one",
            ms(at - crashed_at)
        );
        say!(
            "      session timeout, the ttl, after its last request, deleting the lease; the watch"
        );
        say!("      wakes the follower)");
    } else if kind == Kind::Etcd {
        // etcd reports a lease's time left in whole seconds (rounded
        // down) and removes expired leases on a 500 ms tick.
        say!(
            "   -> {second} took over {} after the crash (the lease had {} to {} s left; etcd removes",
            ms(at - crashed_at),
            ttl_left.as_secs().saturating_sub(1),
            ttl_left.as_secs(),
        );
        say!("      expired leases every 500 ms, and the watch wakes the follower when it does)");
    } else {
        say!(
            "   -> {second} took over {} after the crash; the lease had {} left, so that is {} after it expired",
            ms(at - crashed_at),
            ms(ttl_left),
            signed_ms(at, expires_at)
        );
    }
    Ok((second, token2))
}

/// Step 3: the leader `second` resigns; the next leader and its token.
async fn resign_the_leader(
    second: &str,
    candidates: &Candidates,
    events: &mut Events,
    wait: Duration,
) -> Result<(&'static str, u64), Failure> {
    say!("\n3. {second} steps down gracefully (resign releases the lease and announces it)");
    let resigned_at = Instant::now();
    if let Some(candidate) = candidates.get(second) {
        let _ = candidate.resign.send(());
    }
    let (third, token3, at) = next_elected(events, wait).await?;
    say!(
        "   -> {third} took over {} after the resignation, without waiting for the ttl",
        ms(at - resigned_at)
    );
    Ok((third, token3))
}

/// Step 4: the resource, written by the last leader, refuses a late write
/// with the first leader's token (on Redis, through a fenced key; on etcd
/// and ZooKeeper, told).
async fn refuse_a_late_write(
    url: &str,
    name: &str,
    told: bool,
    (first, token1): (&str, u64),
    (third, token3): (&str, u64),
) -> Result<(), Failure> {
    if told {
        // A resource that keeps the highest token it has accepted, as the
        // book's Guarantees page asks of every resource a leader writes.
        let highest = token3;
        say!("   -> a resource that {third} wrote with token {token3} refuses a late write by {first}");
        say!("      with its old token {token1} ({token1} < {highest})");
        return Ok(());
    }
    let mut conn = fence::connect(url, None, Duration::from_secs(2)).await?;
    let resource = FencedKey::new(resource_key(name));
    resource
        .set(&mut conn, token3, format!("written by {third}"))
        .await?;
    match resource.set(&mut conn, token1, format!("late write by {first}")).await? {
        FencedWrite::Rejected { highest } => say!(
            "   -> a late write by {first} with its old token {token1} is refused: the resource has seen {highest}"
        ),
        _accepted => {
            return Err(Failure::new(1, "the stale write was accepted: fencing is broken"));
        }
    }
    Ok(())
}

/// Which store a demo URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis,
    Etcd,
    Zk,
    Sqlite,
    Postgres,
}

impl Kind {
    fn of(url: &str) -> Kind {
        if url.starts_with("etcd://") || url.starts_with("etcds://") {
            Kind::Etcd
        } else if url.starts_with("zk://") {
            Kind::Zk
        } else if url.starts_with("sqlite:") {
            Kind::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Kind::Postgres
        } else {
            Kind::Redis
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Redis => "Redis",
            Kind::Etcd => "etcd",
            Kind::Zk => "ZooKeeper",
            Kind::Sqlite => "SQLite",
            Kind::Postgres => "PostgreSQL",
        }
    }
}

/// The demo's temporary directory (a SQLite file and its locks), removed
/// when dropped.
struct Scratch {
    dir: std::path::PathBuf,
}

impl Scratch {
    fn new() -> Result<Scratch, Failure> {
        let dir = std::env::temp_dir().join(format!(
            "tenure-demo-{}-{:08x}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).map_err(|err| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("cannot make a temporary directory {}: {err}", dir.display()),
            )
        })?;
        Ok(Scratch { dir })
    }

    fn db(&self) -> std::path::PathBuf {
        self.dir.join("demo.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Delete the znodes the demo's election left on a ZooKeeper ensemble.
#[cfg(feature = "zookeeper")]
async fn forget_zk(url: &str, name: &str) {
    crate::zk_cleanup::forget(url, name).await;
}

/// Without ZooKeeper support, no ZooKeeper URL gets this far.
#[cfg(not(feature = "zookeeper"))]
async fn forget_zk(_url: &str, _name: &str) {}

fn resource_key(name: &str) -> String {
    format!("{name}:resource")
}

/// Delete the keys the demo's election `name` and its fenced resource
/// created in a shared Redis (the election's keys are laid out in the
/// `tenure` crate's `keys` module). The candidates are gone by now: none
/// renews or campaigns any more.
async fn forget(url: &str, name: &str) {
    let prefix = tenure::DEFAULT_PREFIX;
    let keys = [
        format!("{prefix}:{{{name}}}:lease"),
        format!("{prefix}:{{{name}}}:witness"),
        format!("{prefix}:{{{name}}}:token"),
        format!("{prefix}:{{{name}}}:epoch"),
        resource_key(name),
    ];
    let deleted = match fence::connect(url, None, Duration::from_secs(2)).await {
        Ok(mut conn) => {
            // One key per DEL: on a Redis Cluster the keys live in two slots.
            let mut result = Ok(());
            for key in &keys {
                result = result.and(
                    redis::cmd("DEL")
                        .arg(key)
                        .query_async::<()>(&mut conn)
                        .await
                        .map_err(|err| err.to_string()),
                );
            }
            result
        }
        Err(err) => Err(err.to_string()),
    };
    if let Err(err) = deleted {
        crate::complain!(
            "tenure: could not delete the demo's keys ({}): {err}",
            keys.join(", ")
        );
    }
}

async fn next_elected(
    events: &mut mpsc::UnboundedReceiver<Event>,
    wait: Duration,
) -> Result<(&'static str, u64, Instant), Failure> {
    match timeout(wait, events.recv()).await {
        Ok(Some(Event::Elected { id, token, at })) => Ok((id, token, at)),
        Ok(None) => Err(Failure::new(1, "every candidate stopped")),
        Err(_) => Err(Failure::new(
            1,
            format!(
                "nobody was elected within {}",
                humantime::format_duration(wait)
            ),
        )),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn signed_ms(at: Instant, reference: Instant) -> String {
    if at >= reference {
        ms(at - reference)
    } else {
        format!("-{}", ms(reference - at))
    }
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (std::process::id() << 8))
        .unwrap_or(0)
}
