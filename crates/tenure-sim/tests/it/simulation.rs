//! The simulation as tests: schedules with every fault and no bug find no
//! violation; one seed replays identically; `SEED=…` replays one schedule.
//!
//! Schedules replay exactly only when built with `--cfg tokio_unstable`
//! (tokio's seeded `select!`); see the book's Simulation page.

use std::time::Duration;

use tenure_sim::{run_schedule, search, Bug, Config};

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn config() -> Config {
    Config {
        steps: env("SIM_STEPS").unwrap_or(200),
        bug: std::env::var("BUG")
            .ok()
            .map(|name| Bug::parse(&name).expect("BUG: unknown bug name")),
        mixed_member_ttls: std::env::var_os("SIM_MIXED_MEMBER_TTLS").is_some(),
        runner_every: std::env::var_os("SIM_RUNNER_EVERY").is_some(),
        ..Config::default()
    }
}

/// `SEED=N [BUG=name] cargo test -p tenure-sim --test it simulation::replay
/// -- --nocapture` runs that one schedule and prints its violation.
#[test]
fn replay() {
    let Some(seed) = env::<u64>("SEED") else {
        return;
    };
    match run_schedule(seed, &config()) {
        Ok(stats) => println!("seed {seed}: no violation ({} terms)", stats.terms),
        Err(violation) => panic!("{violation}"),
    }
}

#[test]
#[cfg_attr(
    not(tokio_unstable),
    ignore = "exact replay needs RUSTFLAGS=\"--cfg tokio_unstable\" (seeded tokio::select!)"
)]
fn a_seed_replays_identically() {
    let config = Config {
        bug: Some(Bug::HoldOffOwnTtl),
        ..config()
    };
    for seed in 0..20 {
        let run = || match run_schedule(seed, &config) {
            Ok(stats) => format!("{stats:?}"),
            Err(violation) => violation.to_string(),
        };
        assert_eq!(run(), run(), "seed {seed} ran differently twice");
    }
}

/// A short budget here (`SIM_BUDGET_SECS`, default 5 s); `scripts/test.sh`
/// runs the full one in release (`tenure-sim --budget`).
#[test]
fn schedules_within_the_budget_find_no_violation() {
    let budget = Duration::from_secs(env("SIM_BUDGET_SECS").unwrap_or(5));
    let first = env("SIM_FIRST_SEED").unwrap_or(0);
    let found = search(&config(), first, None, Some(budget), 2);
    if let Some(violation) = found.violation {
        panic!("{violation}");
    }
    assert!(found.stats.schedules > 0, "no schedule ran");
    println!(
        "{} schedules of {} steps, no violation",
        found.stats.schedules,
        config().steps
    );
}
