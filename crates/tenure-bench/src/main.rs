//! `tenure-bench`: every speed claim of tenure, measured in one run against
//! a floor measured in the same run (raw Redis round trips) and a naive
//! baseline (the design of the seed documents: followers polling every
//! ttl/3, one command per election per tick, no release notification, one
//! task per election).
//!
//! It starts its own private `redis-server` (and, for the topology rows, a
//! private Sentinel group and Redis Cluster; for the etcd rows, a private
//! 3-member etcd cluster; for the ZooKeeper rows, a private 3-member
//! ensemble), prints a table for people and
//! writes JSON for machines. Targets are goals the table reports against;
//! nothing here is a test assertion.
#![forbid(unsafe_code)]

mod cli_handover;
mod etcd;
mod etcd_metrics;
mod fixture;
mod measure;
mod naive;
mod peers;
mod plan;
mod postgres;
mod report;
mod scale;
mod serve_handover;
mod slots_handover;
mod sqlite;
mod stats;
mod svg;
mod topology;
mod zk;
mod zk_metrics;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use plan::Section;

#[derive(Debug, Parser)]
#[command(
    name = "tenure-bench",
    about = "Measure tenure against the Redis floor and a naive baseline"
)]
struct Cli {
    /// Fewer rounds and smaller scales: finishes in under a minute.
    #[arg(long)]
    quick: bool,

    /// Run only these sections, comma-separated (default: all): `single`
    /// (every row on one redis-server), `sentinel` (hand-over and takeover
    /// on a Sentinel group), `cluster` (hand-over, takeover and a 10,000
    /// partition set on a 3-shard Redis Cluster), `etcd` (hand-over,
    /// takeover, idle requests and a 10,000 partition set on a 3-member etcd
    /// cluster, each beside the same figure on a redis-server), `zk` (the
    /// same on a 3-member ZooKeeper ensemble), `sqlite`, `postgres`, `peers`
    /// (tenure beside redis-py's Lock, python-redis-lock and pottery's
    /// Redlock, each candidate a process, on one redis-server).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,

    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,

    /// Also draw the hand-over and takeover latency distributions (CDFs of
    /// the single section: tenure, the naive baseline and the floor) as
    /// `handover.svg` and `takeover.svg` in this directory.
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,

    /// The `tenure` binary for the CLI hand-over row (default: `tenure`
    /// next to this binary; the row is left out if there is none).
    #[arg(long)]
    tenure: Option<PathBuf>,

    #[command(subcommand)]
    internal: Option<Internal>,
}

#[derive(Debug, Subcommand)]
enum Internal {
    /// Internal: hold N elections in this process and report CPU, RSS and
    /// round trips (run as a child so that its RSS is its own).
    #[command(hide = true)]
    ScaleChild {
        #[arg(long)]
        redis: String,
        #[arg(long)]
        design: String,
        #[arg(long)]
        elections: usize,
        #[arg(long)]
        seconds: u64,
        /// The store's server processes, whose CPU (with their children's)
        /// the window counts beside the child's own.
        #[arg(long, value_delimiter = ',')]
        store_pids: Vec<u32>,
    },
    /// Internal: one candidate of a peer built in (tenure on Redis, etcd
    /// or ZooKeeper, rslock, etcd-client's election), on the peer drivers' line protocol
    /// (crates/tenure-bench/peers/driver.py).
    #[command(hide = true)]
    PeerChild {
        #[arg(long)]
        peer: String,
        #[arg(long)]
        redis: String,
        /// The store, when it is not `--redis`: `etcd://...` or `zk://...`
        /// (the acts still go to `--redis`).
        #[arg(long)]
        store: Option<String>,
        #[arg(long)]
        name: String,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        id: String,
        #[arg(long)]
        act_ms: Option<u64>,
        #[arg(long, default_value = "bench:acts")]
        act_log: String,
        /// Hold this many locks (elections) at once instead of one, named
        /// `NAME-0` and on (tenure: one partition set of as many
        /// partitions); `held` once all are.
        #[arg(long)]
        scale: Option<usize>,
    },
    /// Internal: one round of each peers measurement with every peer
    /// driver, for the test suite (tests/peers.rs).
    #[command(hide = true)]
    PeerSmoke,
}

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tenure-bench: {err}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async move {
        match cli.internal {
            Some(Internal::ScaleChild {
                redis,
                design,
                elections,
                seconds,
                store_pids,
            }) => match scale_child(&redis, &design, elections, seconds, store_pids).await {
                Ok(figures) => {
                    println!("{}", serde_json::to_string(&figures).unwrap_or_default());
                    0
                }
                Err(err) => {
                    eprintln!("tenure-bench scale-child: {err}");
                    1
                }
            },
            Some(Internal::PeerChild {
                peer,
                redis,
                store,
                name,
                ttl_ms,
                id,
                act_ms,
                act_log,
                scale,
            }) => {
                let args = peers::ChildArgs {
                    scale,
                    redis,
                    store,
                    name,
                    ttl: std::time::Duration::from_millis(ttl_ms),
                    id,
                    act: act_ms.map(|ms| (std::time::Duration::from_millis(ms), act_log)),
                };
                match peers::child(&peer, args).await {
                    Ok(()) => 0,
                    Err(err) => {
                        eprintln!("tenure-bench peer-child: {err}");
                        1
                    }
                }
            }
            Some(Internal::PeerSmoke) => match peers::smoke().await {
                Ok(()) => 0,
                Err(err) => {
                    eprintln!("tenure-bench peer-smoke: {err}");
                    1
                }
            },
            None => match measure::all(cli.quick, cli.tenure, &cli.only).await {
                Ok(report) => {
                    print!("{}", report.table());
                    if let Some(path) = cli.json {
                        match serde_json::to_string_pretty(&report) {
                            Ok(json) => {
                                if let Err(err) = std::fs::write(&path, json) {
                                    eprintln!(
                                        "tenure-bench: cannot write {}: {err}",
                                        path.display()
                                    );
                                    return 1;
                                }
                            }
                            Err(err) => {
                                eprintln!("tenure-bench: {err}");
                                return 1;
                            }
                        }
                    }
                    if let Some(dir) = cli.svg {
                        if let Err(err) = write_charts(&dir, &report.charts) {
                            eprintln!("tenure-bench: {err}");
                            return 1;
                        }
                    }
                    if report.failures.is_empty() {
                        0
                    } else {
                        1
                    }
                }
                Err(err) => {
                    eprintln!("tenure-bench: {err}");
                    1
                }
            },
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    std::process::exit(code);
}

/// Write each chart as `DIR/<file>.svg`, creating DIR.
fn write_charts(dir: &std::path::Path, charts: &[svg::Chart]) -> Result<(), String> {
    if charts.is_empty() {
        eprintln!("tenure-bench: no pictures: they come from the single section");
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for chart in charts {
        let path = dir.join(format!("{}.svg", chart.file));
        std::fs::write(&path, chart.svg())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("tenure-bench: wrote {}", path.display());
    }
    Ok(())
}

/// `tenure-bench scale-child`: with `RUST_LOG` set, tenure's logs go to
/// stderr, which the parent shows when the child fails.
async fn scale_child(
    redis: &str,
    design: &str,
    elections: usize,
    seconds: u64,
    store_pids: Vec<u32>,
) -> Result<scale::ScaleFigures, String> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    scale::child(redis, design, elections, seconds, store_pids).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_takes_a_comma_separated_list_of_sections() {
        let cli = Cli::try_parse_from(["tenure-bench", "--only", "sentinel,cluster"])
            .expect("valid sections");
        assert_eq!(cli.only, [Section::Sentinel, Section::Cluster]);
        let cli = Cli::try_parse_from(["tenure-bench", "--only", "etcd"]).expect("etcd alone");
        assert_eq!(cli.only, [Section::Etcd]);
        let cli = Cli::try_parse_from(["tenure-bench", "--only", "zk"]).expect("zk alone");
        assert_eq!(cli.only, [Section::Zk]);
        let cli =
            Cli::try_parse_from(["tenure-bench", "--only", "etcd,single"]).expect("in any order");
        assert_eq!(cli.only, [Section::Etcd, Section::Single]);
        // Every section can be named, by the name the table prints.
        for section in Section::ALL {
            let cli = Cli::try_parse_from(["tenure-bench", "--only", section.name()])
                .unwrap_or_else(|e| panic!("{}: {e}", section.name()));
            assert_eq!(cli.only, [section]);
        }
        let cli = Cli::try_parse_from(["tenure-bench"]).expect("no option");
        assert!(cli.only.is_empty(), "no --only: every section");
        assert!(Cli::try_parse_from(["tenure-bench", "--only", "redis"]).is_err());
    }
}
