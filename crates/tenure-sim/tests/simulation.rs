//! The simulation as a test: a budget of schedules with every fault and no
//! bug must find no violation; `SEED=… cargo test … replay` replays one.

use std::time::Duration;

use tenure_sim::{run_schedule, search, Bug, Config};

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn config() -> Config {
    Config {
        steps: env("SIM_STEPS").unwrap_or(200),
        bug: std::env::var("BUG").ok().map(|name| Bug::parse(&name).expect("BUG: unknown bug name")),
        ..Config::default()
    }
}

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
fn a_seed_replays_identically() {
    for seed in 0..3 {
        let a = run_schedule(seed, &config()).map(|s| (s.terms, s.fenced, s.simulated_ms, s.actions));
        let b = run_schedule(seed, &config()).map(|s| (s.terms, s.fenced, s.simulated_ms, s.actions));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}

#[test]
fn schedules_within_the_budget_find_no_violation() {
    let budget = Duration::from_secs(env("SIM_BUDGET_SECS").unwrap_or(10));
    let first = env("SIM_FIRST_SEED").unwrap_or(0);
    let found = search(&config(), first, None, Some(budget), env("SIM_THREADS").unwrap_or(2));
    println!("{found:#?}");
    if let Some(violation) = found.violation {
        panic!("{violation}");
    }
}
