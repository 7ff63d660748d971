//! The long mode: `tenure-sim --seeds N [--first S] [--steps K] [--threads T]
//! [--bug NAME] [--mixed-member-ttls] [--runner-every]` runs N schedules (or `--budget SECS` of them) and prints
//! what they covered, or the first violation with its seed and trace.

use std::process::ExitCode;
use std::time::Duration;

use tenure_sim::{search, Bug, Config, FAULTS};

fn main() -> ExitCode {
    let mut config = Config::default();
    let (mut first, mut count, mut budget, mut threads) = (0u64, None, None, 2usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--seeds" => count = Some(number(&value())),
            "--first" => first = number(&value()),
            "--steps" => config.steps = number(&value()) as usize,
            "--threads" => threads = number(&value()) as usize,
            "--mixed-member-ttls" => config.mixed_member_ttls = true,
            "--runner-every" => config.runner_every = true,
            "--budget" => budget = Some(Duration::from_secs(number(&value()))),
            "--bug" => {
                let name = value();
                config.bug = Some(
                    Bug::parse(&name).unwrap_or_else(|| usage(&format!("unknown bug {name}"))),
                );
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if count.is_none() && budget.is_none() {
        usage("give --seeds N or --budget SECS");
    }
    let found = search(&config, first, count, budget, threads);
    let stats = &found.stats;
    println!(
        "{} schedules of {} steps ({} steps, {:.0} s simulated) in {:.1} s: {:.0} schedules/s",
        stats.schedules,
        config.steps,
        stats.steps,
        stats.simulated_ms as f64 / 1000.0,
        found.elapsed.as_secs_f64(),
        stats.schedules as f64 / found.elapsed.as_secs_f64()
    );
    println!(
        "terms begun: {}; fenced writes accepted {}, refused {}",
        stats.terms, stats.fenced.0, stats.fenced.1
    );
    for kind in FAULTS {
        println!(
            "fault  {kind}: {}",
            stats.faults.get(kind).copied().unwrap_or(0)
        );
    }
    for (kind, n) in &stats.actions {
        println!("action {kind}: {n}");
    }
    match found.violation {
        None => {
            println!("violations: 0");
            ExitCode::SUCCESS
        }
        Some(violation) => {
            println!("VIOLATION\n{violation}");
            ExitCode::FAILURE
        }
    }
}

fn number(text: &str) -> u64 {
    text.parse()
        .unwrap_or_else(|_| usage(&format!("not a number: {text}")))
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "tenure-sim: {problem}\nusage: tenure-sim (--seeds N | --budget SECS) [--first SEED] [--steps K] [--threads T] [--bug {}] [--mixed-member-ttls] [--runner-every]",
        Bug::ALL.map(Bug::name).join("|")
    );
    std::process::exit(2)
}
