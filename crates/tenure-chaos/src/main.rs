//! `tenure-chaos`: evidence that tenure keeps at most one instance acting.
//!
//! `tenure-chaos run` starts a real cluster (redis-servers, fault-injecting
//! proxies, K instance processes), injects faults on a seeded schedule,
//! stops everything, and judges the logs with the checker. It exits 1 when
//! the run was unsafe. `tenure-chaos check DIR` judges an existing run.
#![forbid(unsafe_code)]

mod checker;
mod consensus;
mod embedded;
mod harness;
mod instance;
mod log;
mod outage;
mod proxy;
mod sql;
mod timeline;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tenure-chaos",
    about = "Fault injection and checking for tenure"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a cluster under seeded faults, then check it.
    Run(RunArgs),
    /// Check the logs of an earlier run.
    Check {
        #[arg(default_value = "target/chaos")]
        dir: PathBuf,
        /// The run's ttl (2s for an etcd or ZooKeeper run that did not
        /// set one).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        ttl: Duration,
    },
    /// Internal: one instance campaigning through the library.
    #[command(hide = true)]
    Instance {
        #[arg(long)]
        inst: String,
        #[arg(long)]
        redis: String,
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// The id to campaign under (default: the instance name).
        #[arg(long)]
        id: Option<String>,
        #[arg(long, value_parser = humantime::parse_duration)]
        max_ttl: Option<Duration>,
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        unsafe_no_deadline: bool,
        #[arg(long)]
        unsafe_issue_9_bugs: bool,
        #[arg(long = "unsafe-bug")]
        unsafe_bugs: Vec<String>,
    },
    /// Internal: the command `tenure run` supervises in CLI mode.
    #[command(hide = true)]
    Writer {
        #[arg(long)]
        inst: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 5)]
    instances: usize,
    /// The lease ttl (default: 1s on Redis; 2s on etcd, whose leases
    /// count whole seconds, and on ZooKeeper, where it is at least 1s,
    /// ten of the ensemble's 100 ms ticks).
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Where logs, report and timeline go.
    #[arg(long, default_value = "target/chaos")]
    out: PathBuf,
    /// Run instances through `tenure run` (path to the tenure binary).
    #[arg(long)]
    cli: Option<PathBuf>,
    /// CLI mode: CMD starts the writer through `setsid` and a double
    /// fork, out of CMD's process group.
    #[arg(long, requires = "cli")]
    escaping_cmd: bool,
    /// Where the election's data lives: one redis-server behind a proxy
    /// per instance, a Sentinel group (a primary, a replica, three
    /// sentinels; `redis+sentinel://`), a Redis Cluster (three
    /// primaries, three replicas; `redis+cluster://`), an etcd cluster
    /// (three members, three proxies per instance; `etcd://`), or a
    /// ZooKeeper ensemble (three members, three proxies per instance;
    /// `zk://`), or one SQLite file every instance opens (`sqlite://`),
    /// or one PostgreSQL server behind a proxy per instance
    /// (`postgres://`).
    #[arg(long, visible_alias = "store", value_enum, default_value_t = harness::Topology::Single)]
    topology: harness::Topology,
    /// Sentinel: run the group with Redis's defaults (one replica,
    /// `min-replicas-to-write 0`, sentinels announcing every 2 s, so an
    /// old primary is demoted about 8 s after a failover; down after
    /// 1 s) instead of the configuration the book's Topologies page
    /// requires (two replicas, `min-replicas-to-write 1`,
    /// `min-replicas-max-lag 1`, down after 2 s).
    #[arg(long)]
    sentinel_without_min_replicas: bool,
    /// Cluster: run the nodes with Redis's default
    /// `cluster-require-full-coverage yes` instead of `no` (the book's
    /// recommendation). Every node then answers CLUSTERDOWN while any
    /// shard fails over, and `kill-shard-primary` costs the election
    /// its term: the failing case of issue 22.
    #[arg(long)]
    cluster_full_coverage: bool,
    /// Fault kinds to draw from (comma-separated). Default: every kind
    /// of the mode and topology (library mode: all but
    /// `pause-tenure-only` and `kill-guardian`; CLI mode: all but churn,
    /// rollback, mixed-ttl and dup-id; single: all but the sentinel-*,
    /// cluster-* and etcd-* kinds and revoke-lease; sentinel and cluster:
    /// their own kinds and kill, pause, graceful, churn, dup-id, forged,
    /// delete-lease, not the faults of the whole Redis or of the proxies;
    /// etcd: its own kinds and kill, pause, cut, drop, delay, graceful,
    /// churn, dup-id, delete-lease, revoke-lease, and mixed-ttl when half
    /// the ttl is whole seconds, not restart, stall, rollback or forged,
    /// which are faults of Redis; zk: its own kinds, restore-snapshot
    /// and the same faults of instances and links as etcd, not
    /// revoke-lease; sqlite: its own kinds, restore-snapshot,
    /// delete-lease and the faults of instances, none of links; postgres:
    /// its own kinds, restore-snapshot, delete-lease and the faults of
    /// instances and links, not restart, stall, rollback or forged).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// Unsafe: instances ignore their local deadline (the checker must object).
    #[arg(long)]
    unsafe_no_deadline: bool,
    /// Unsafe: the resource accepts stale tokens (the checker must object).
    #[arg(long)]
    unsafe_no_fencing: bool,
    /// Unsafe: instances run with the bugs issue 9 fixed switched back on
    /// (the checker must object under churn, rollback, mixed-ttl, dup-id;
    /// forged announcements cost liveness).
    #[arg(long)]
    unsafe_issue_9_bugs: bool,
    /// Unsafe: `delete-lease` and `revoke-lease` also remove the
    /// lease's witness, as before tenure kept one (the checker must
    /// object: a candidate is elected while the holder still acts).
    #[arg(long)]
    unsafe_lease_by_hand_without_witness: bool,
    /// Unsafe: a fixed bug of one store switched back on in every
    /// instance (library mode; repeatable): `etcd-tokens-without-clock`
    /// (tokens repeat after `restore-snapshot`), `etcd-no-hedges`
    /// (`pause-minority-member` costs terms), `first-sentinel-only`
    /// (instances listen to the first sentinel of their URL only and ask
    /// only it for the primary: with `--sentinel-without-min-replicas`,
    /// `hang-sentinel` gives two leaders), `zk-ignore-witness`
    /// (`delete-lease` on ZooKeeper gives two leaders),
    /// `zk-tokens-without-clock` (tokens repeat after `restore-snapshot`
    /// on ZooKeeper), `sqlite-ignore-rollback` (`restore-snapshot` on
    /// SQLite gives two leaders), `postgres-ignore-epoch`
    /// (`restore-snapshot` on PostgreSQL gives two leaders).
    #[arg(long = "unsafe-bug", value_name = "NAME")]
    unsafe_bugs: Vec<String>,
    /// Exit 1 also when the liveness goal is missed.
    #[arg(long)]
    require_live: bool,
}

#[derive(Debug, clap::Args)]
struct Common {
    #[arg(long)]
    resource: String,
    #[arg(long)]
    log: PathBuf,
    #[arg(long)]
    unsafe_no_fencing: bool,
}

fn main() {
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tenure-chaos: {err}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Instance {
                inst,
                redis,
                ttl,
                id,
                max_ttl,
                common,
                unsafe_no_deadline,
                unsafe_issue_9_bugs,
                unsafe_bugs,
            } => {
                let campaign = instance::Campaign {
                    redis_url: redis,
                    id: id.unwrap_or_else(|| inst.clone()),
                    ttl,
                    max_ttl,
                    deadline: !unsafe_no_deadline,
                    issue_9_bugs: unsafe_issue_9_bugs,
                    store_bugs: unsafe_bugs,
                };
                report_err(instance::run_instance(settings(inst, common), campaign).await)
            }
            Command::Writer { inst, common } => {
                report_err(instance::run_writer(settings(inst, common)).await)
            }
            Command::Check { dir, ttl } => check(&dir, ttl, Vec::new(), false),
            Command::Run(args) => run(args).await,
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(500));
    std::process::exit(code);
}

/// `tenure-chaos run`: check the arguments, run the cluster under faults,
/// then judge it (see [`check`]); 2 for arguments that do not fit.
async fn run(args: RunArgs) -> i32 {
    let RunArgs {
        seed,
        duration,
        instances,
        ttl,
        out,
        cli,
        escaping_cmd,
        topology,
        sentinel_without_min_replicas,
        cluster_full_coverage,
        faults,
        unsafe_no_deadline,
        unsafe_no_fencing,
        unsafe_issue_9_bugs,
        unsafe_lease_by_hand_without_witness,
        unsafe_bugs,
        require_live,
    } = args;
    let ttl = ttl.unwrap_or(topology.default_ttl());
    let faults = match fault_kinds(topology, ttl, cli.is_some(), faults, &unsafe_bugs) {
        Ok(faults) => faults,
        Err(why) => {
            eprintln!("tenure-chaos: {why}");
            return 2;
        }
    };
    let config = harness::RunConfig {
        seed,
        duration,
        instances,
        ttl,
        out: out.clone(),
        cli,
        escaping_cmd,
        deadline: !unsafe_no_deadline,
        fencing: !unsafe_no_fencing,
        issue_9_bugs: unsafe_issue_9_bugs,
        witness_too: unsafe_lease_by_hand_without_witness,
        store_bugs: unsafe_bugs,
        faults,
        topology,
        sentinel_min_replicas: !sentinel_without_min_replicas,
        cluster_full_coverage,
    };
    println!(
        "tenure-chaos: seed {seed}, {} topology, {instances} instances, ttl {}, {} -> {}",
        topology.name(),
        humantime::format_duration(ttl),
        humantime::format_duration(duration),
        out.display()
    );
    let outcome = match harness::Harness::start(config).await {
        Ok(harness) => harness.run().await,
        Err(err) => Err(err),
    };
    match outcome {
        Ok(outcome) => check(&out, ttl, leaked(&out, &outcome.started), require_live),
        Err(err) => {
            eprintln!("tenure-chaos: {err}");
            2
        }
    }
}

/// The fault kinds a run draws from (`faults`, or the default ones of the
/// topology and mode), once the ttl, the kinds and the `--unsafe-bug`s are
/// found to fit the topology and the mode (`cli`); else why not.
fn fault_kinds(
    topology: harness::Topology,
    ttl: Duration,
    cli: bool,
    faults: Vec<String>,
    unsafe_bugs: &[String],
) -> Result<Vec<String>, String> {
    if let Some(why) = topology.refuse_ttl(ttl) {
        return Err(why);
    }
    let faults: Vec<String> = if faults.is_empty() {
        harness::default_kinds(topology, cli, ttl)
    } else {
        faults
    };
    if let Some(bad) = faults
        .iter()
        .find(|f| !harness::FAULT_KINDS.contains(&f.as_str()))
    {
        return Err(format!(
            "unknown fault {bad:?}; known: {}",
            harness::FAULT_KINDS.join(",")
        ));
    }
    if let (true, Some(bad)) = (
        cli,
        faults
            .iter()
            .find(|f| harness::LIBRARY_ONLY.contains(&f.as_str())),
    ) {
        return Err(format!("fault {bad:?} needs library mode (no --cli)"));
    }
    if let Some(bad) = unsafe_bugs
        .iter()
        .find(|b| !instance::STORE_BUGS.contains(&b.as_str()))
    {
        return Err(format!(
            "unknown --unsafe-bug {bad:?}; known: {}",
            instance::STORE_BUGS.join(",")
        ));
    }
    if cli && !unsafe_bugs.is_empty() {
        return Err("--unsafe-bug needs library mode (no --cli)".into());
    }
    if unsafe_bugs.iter().any(|b| b == "first-sentinel-only")
        && topology != harness::Topology::Sentinel
    {
        return Err("--unsafe-bug first-sentinel-only needs --topology sentinel".into());
    }
    if let Some(why) = faults.iter().find_map(|f| topology.refusal(f)) {
        return Err(why);
    }
    if faults.iter().any(|f| f == "mixed-ttl") && !topology.fits_mixed_ttl(ttl) {
        let advice = match topology {
            harness::Topology::Zk => "use a ttl of 2s or more",
            _ => "use a ttl of 2s or more, in even seconds",
        };
        return Err(format!(
            "mixed-ttl runs every second instance at half the ttl, \
             and half of {} does not suit {}: {advice}",
            humantime::format_duration(ttl),
            topology.name()
        ));
    }
    Ok(faults)
}

fn settings(inst: String, common: Common) -> instance::Settings {
    instance::Settings {
        inst,
        resource_url: common.resource,
        log: common.log,
        fencing: !common.unsafe_no_fencing,
    }
}

fn report_err(result: Result<(), String>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("tenure-chaos: {err}");
            1
        }
    }
}

/// Judge the run in `dir`; write report.json, report.md and timeline.svg.
/// Exit code 1 when unsafe (or, with `require_live`, not live); 2 when the
/// evidence could not be read or the report written: a verdict from partial
/// evidence could be a false SAFE.
fn check(dir: &Path, ttl: Duration, leaked: Vec<String>, require_live: bool) -> i32 {
    match judge(dir, ttl, leaked) {
        Ok(report) if report.safe && (report.live || !require_live) => 0,
        Ok(_) => 1,
        Err(err) => {
            eprintln!("tenure-chaos: {err}");
            2
        }
    }
}

fn judge(dir: &Path, ttl: Duration, leaked: Vec<String>) -> Result<checker::Report, String> {
    let (events, torn) =
        log::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let accepted = read(&dir.join("resource.txt"))?;
    let report = checker::check(
        &events,
        &accepted,
        ttl.as_millis() as u64,
        crashes(dir, &events)?,
        leaked,
        torn,
    );
    let table = report.table();
    write(&dir.join("report.md"), &table)?;
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    write(&dir.join("report.json"), &json)?;
    let title = format!(
        "tenure-chaos: {} terms, {} faults",
        report.terms,
        report.faults.values().sum::<u32>()
    );
    let svg = timeline::svg(&events, &checker::terms(&events), &title);
    write(&dir.join("timeline.svg"), &svg)?;
    say(&table)?;
    say(&format!(
        "report: {}  timeline: {}",
        dir.join("report.json").display(),
        dir.join("timeline.svg").display()
    ))?;
    Ok(report)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A line on stdout; an error if it could not be written.
fn say(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

/// Instances that ended without being told to (a non-zero exit or a signal
/// the harness did not send), and panics in any stderr.
fn crashes(dir: &Path, events: &[log::Event]) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for event in events {
        if let log::Event::Exit { inst, how, .. } = event {
            if !matches!(how.as_str(), "killed" | "exit:0" | "guardian-killed") {
                // Its last words, so that the report says why.
                let stderr = dir.join(format!("{}.stderr", inst.replace('#', "-")));
                let last = std::fs::read_to_string(&stderr)
                    .ok()
                    .and_then(|text| {
                        text.lines()
                            .rev()
                            .find(|line| !line.trim().is_empty())
                            .map(|line| line.chars().take(300).collect::<String>())
                    })
                    .unwrap_or_default();
                found.push(format!("{inst} {how}: {last}"));
            }
        }
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .path();
        if path.extension().and_then(|e| e.to_str()) == Some("stderr")
            && read(&path)?.contains("panicked")
        {
            found.push(format!("panic in {}", path.display()));
        }
    }
    Ok(found)
}

/// Processes still running that belong to this run: any started PID, or
/// any process whose command line names the run's directory, except this
/// process and its ancestors (a wrapper such as `flock ... cargo run`
/// names the directory too).
fn leaked(dir: &Path, started: &[i32]) -> Vec<String> {
    let marker = dir.display().to_string();
    let all = tenure_procs::all();
    let mut ancestors = vec![std::process::id() as i32];
    while let Some(parent) = all
        .iter()
        .find(|p| Some(&p.pid) == ancestors.last())
        .map(|p| p.ppid)
        .filter(|ppid| *ppid > 1 && !ancestors.contains(ppid))
    {
        ancestors.push(parent);
    }
    all.into_iter()
        .filter(|p| !p.zombie && !ancestors.contains(&p.pid))
        .filter_map(|p| {
            let cmdline = tenure_procs::cmdline(p.pid);
            let ours = started.contains(&p.pid)
                || (cmdline.contains(&marker) && !cmdline.contains("tenure-chaos run"));
            ours.then(|| format!("{} {cmdline}", p.pid))
        })
        .collect()
}
