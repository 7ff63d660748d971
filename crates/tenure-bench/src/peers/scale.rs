//! The peers' scale round: one process holding many locks (elections) at
//! once, each peer the way its docs show for one lock, that many times
//! over (tenure: one partition set of as many partitions, the library's
//! way to hold many). Counted the same way for all, from outside the
//! process: its CPU and peak RSS from `/proc` and the store's server
//! processes' CPU over one window, then the store's requests as the idle
//! rows count them over a second.
//!
//! A peer that cannot hold them all within the limit is measured with
//! what it holds by then: the row says how many, rather than leaving the
//! peer out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{requests, ChildArgs, Drivers, Event, Group, Result};
use crate::peers::mono_ns;
use crate::scale::{cpu_seconds_of, peak_rss_mb_of, store_cpu_seconds};

/// What a scale round measured.
#[derive(Debug, Clone)]
pub(super) struct Scaled {
    /// Locks asked for.
    pub(super) asked: usize,
    /// Locks held when the window began.
    pub(super) held: usize,
    /// The process's CPU over the window, % of one core.
    pub(super) cpu_percent: f64,
    /// The process's peak RSS, MB.
    pub(super) peak_rss_mb: f64,
    /// The store's requests per renew interval (ttl/3), counted as the
    /// idle rows count them.
    pub(super) requests_per_interval: f64,
    /// The store's server processes' CPU over the window, % of one core.
    pub(super) store_cpu_percent: f64,
    /// Why the round could not be measured (the process failed), if it
    /// could not: then every figure is NaN.
    pub(super) failure: Option<String>,
}

impl Scaled {
    /// A round that could not be measured, and why.
    pub(super) fn failed(asked: usize, why: String) -> Scaled {
        Scaled {
            asked,
            held: 0,
            cpu_percent: f64::NAN,
            peak_rss_mb: f64::NAN,
            requests_per_interval: f64::NAN,
            store_cpu_percent: f64::NAN,
            failure: Some(why),
        }
    }
}

/// How long a scale round's process may take to hold every lock.
pub(super) fn hold_limit(n: usize) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(n as u64 * 6)
}

/// One process of `group`'s peer holding `n` locks; measured over
/// `window` (whole renew intervals) once all are held, or once the limit
/// passed with fewer.
pub(super) async fn measure(
    drivers: &Drivers,
    mut group: Group,
    n: usize,
    window: Duration,
) -> Result<Scaled> {
    group.job.scale = Some(n);
    let id = group.spawn(drivers).await?;
    let pid = group
        .members
        .get(&id)
        .and_then(|m| u32::try_from(m.pid).ok())
        .ok_or("no pid")?;
    let mut held = n;
    if let Err(err) = group.held(id, hold_limit(n)).await {
        if err.contains("exited") {
            return Err(err);
        }
        // Fewer than all: the count it last said.
        held = group
            .pending
            .iter()
            .rev()
            .find_map(|(i, e)| match e {
                Event::Holding(k) if *i == id => Some(*k),
                _ => None,
            })
            .unwrap_or(0);
    }
    // Let the first renewals of the last locks taken pass.
    tokio::time::sleep(group.job.ttl / 2).await;
    let store = group.job.store.clone();
    // CPU first, in a window of its own: counting a Redis store's requests
    // is MONITOR, which costs redis-server a copy of every command (more
    // for the long argument lists of renewals in bulk).
    let (cpu, store_cpu) = (cpu_seconds_of(pid), store_cpu_seconds(store.pids()));
    let began = tokio::time::Instant::now();
    tokio::time::sleep(window).await;
    let wall = began.elapsed().as_secs_f64();
    let (cpu, store_cpu) = (
        cpu_seconds_of(pid) - cpu,
        store_cpu_seconds(store.pids()) - store_cpu,
    );
    let began = tokio::time::Instant::now();
    let counted = requests(&store, window).await?;
    let counted_over = began.elapsed().as_secs_f64();
    let peak_rss_mb = peak_rss_mb_of(&pid.to_string());
    let ttl = group.job.ttl;
    group.end().await;
    let intervals = counted_over / (ttl.as_secs_f64() / 3.0);
    Ok(Scaled {
        asked: n,
        held,
        cpu_percent: cpu / wall * 100.0,
        peak_rss_mb,
        requests_per_interval: counted / intervals,
        store_cpu_percent: store_cpu / wall * 100.0,
        failure: None,
    })
}

/// `peer-child --scale N`: hold `n` locks, say `holding K` each second
/// and `held NS` once all are held, until told to release (or ended):
/// then exit, which lets every lock lapse, as a crash would (the harness
/// kills the process anyway).
pub(super) async fn child(peer: &str, args: ChildArgs, n: usize) -> Result<()> {
    let held = Arc::new(AtomicUsize::new(0));
    println!("ready");
    tokio::spawn(report(held.clone(), n));
    match peer {
        "tenure" => tenure(&args, n, held).await?,
        "rslock" => rslock(&args, n, held),
        "etcd-election" => etcd_election(&args, n, held).await?,
        other => return Err(format!("no scale round for the peer {other}")),
    }
    super::until_release().await;
    println!("releasing {}", mono_ns());
    println!("released");
    Ok(())
}

/// Say `holding K` every second, and `held NS` once `held` reaches `n`.
async fn report(held: Arc<AtomicUsize>, n: usize) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut said = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let k = held.load(Ordering::SeqCst);
        if k >= n {
            println!("held {}", mono_ns());
            return;
        }
        if said.elapsed() >= Duration::from_secs(1) {
            println!("holding {k}");
            said = tokio::time::Instant::now();
        }
    }
}

/// The names of a scale round's locks.
fn names(args: &ChildArgs, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{}-{i}", args.name)).collect()
}

/// tenure: one partition set of `n` partitions, this process its only
/// member; `held` follows the set's observer.
async fn tenure(args: &ChildArgs, n: usize, held: Arc<AtomicUsize>) -> Result<()> {
    let url = args.store.as_deref().unwrap_or(&args.redis);
    let set = tenure::PartitionSet::builder(args.name.as_str(), names(args, n))
        .redis(url)
        .ttl(args.ttl)
        .id(args.id.as_str())
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let observer = set.observer();
    let run = set.run(
        |_partition, term| async move {
            term.lost().await;
        },
        std::future::pending(),
    );
    tokio::spawn(async move {
        let counting = async {
            loop {
                held.store(observer.owned_count(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            _ = run => {}
            () = counting => {}
        }
    });
    Ok(())
}

/// rslock: `n` jobs, each in `LockManager::using` of its own lock, as one
/// job is.
fn rslock(args: &ChildArgs, n: usize, held: Arc<AtomicUsize>) {
    let manager = rslock::LockManager::new(vec![args.redis.clone()]);
    let ttl = args.ttl;
    for name in names(args, n) {
        let (manager, held) = (manager.clone(), held.clone());
        tokio::spawn(async move {
            let job = async || {
                held.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            };
            let _ = manager.using(name.as_bytes(), ttl, job).await;
        });
    }
}

/// etcd's Election API: one lease kept alive every ttl/3 (as etcd's
/// `concurrency.Session` serves all the elections of a process), and a
/// `Campaign` of each election with it.
async fn etcd_election(args: &ChildArgs, n: usize, held: Arc<AtomicUsize>) -> Result<()> {
    let etcd = args
        .store
        .as_deref()
        .ok_or("the etcd-election peer needs --store etcd://...")?;
    let kept = super::KeptLease::grant(etcd, args.ttl).await?;
    // Its keep-alive task runs on until the process ends.
    for name in names(args, n) {
        let (mut elections, held, id) =
            (kept.client.election_client(), held.clone(), args.id.clone());
        let lease = kept.lease;
        tokio::spawn(async move {
            if elections.campaign(name, id, lease).await.is_ok() {
                held.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    Ok(())
}
