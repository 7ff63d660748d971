//! The simulation can fail: with each fixed bug switched back on, it finds
//! a violation within a few thousand schedules (far inside the CI budget),
//! and the same seed without the bug runs clean.

use tenure_sim::{run_schedule, search, Bug, Config};

/// Far fewer schedules than the CI budget runs.
const AT_MOST: u64 = 5_000;

fn finds(bug: Bug) {
    let config = Config {
        bug: Some(bug),
        ..Config::default()
    };
    let found = search(&config, 0, Some(AT_MOST), None, 2);
    let violation = found
        .violation
        .unwrap_or_else(|| panic!("{} not found in {AT_MOST} schedules", bug.name()));
    println!(
        "{}: found after {} clean schedules\n{violation}",
        bug.name(),
        found.stats.schedules
    );
    runs_clean_without_the_bug(violation.seed, config);
}

#[test]
fn finds_adoption_of_an_earlier_terms_lease() {
    finds(Bug::AdoptEarlierLease);
}

#[test]
fn finds_a_partition_resign_routed_by_name_only() {
    finds(Bug::ResignByName);
}

#[test]
fn finds_a_late_renewal_reply_moving_the_deadline() {
    finds(Bug::LateRenewalMovesDeadline);
}

#[test]
fn finds_the_hold_off_using_the_candidates_ttl() {
    finds(Bug::HoldOffOwnTtl);
}

#[test]
fn finds_a_lease_deleted_by_hand_letting_a_candidate_in_early() {
    finds(Bug::IgnoreWitness);
}

/// The "at most N" check on its own: one of the semaphore's four
/// instances is given three permits where the others have two. No permit
/// ever has two holders (the per-permit check stays quiet), yet three
/// permits are held at once, which the check finds.
#[test]
fn finds_three_holders_of_two_permits_when_one_instance_counts_three() {
    let config = Config {
        bug: Some(Bug::UnevenPermits),
        instances: 0,
        runners: 0,
        cron_runners: 0,
        members: 0,
        holders: 4,
        permits: 2,
        ..Config::default()
    };
    let found = search(&config, 0, Some(AT_MOST), None, 2);
    let violation = found
        .violation
        .unwrap_or_else(|| panic!("uneven permits not found in {AT_MOST} schedules"));
    println!("{violation}");
    assert!(
        violation
            .what
            .starts_with("3 holders of semaphore sem (2 permits) at once"),
        "{violation}"
    );
    runs_clean_without_the_bug(violation.seed, config);
}

/// The seed a bug was found at runs clean with the bug switched off.
fn runs_clean_without_the_bug(seed: u64, config: Config) {
    let clean = Config {
        bug: None,
        ..config
    };
    if let Err(other) = run_schedule(seed, &clean) {
        panic!("seed {seed} fails without the bug too:\n{other}");
    }
}
