//! The cron invariant's ledger: what it excuses after a store lost data,
//! and what it does not.

use tenure_sim::{SlotLedger, SlotRun};

const SLOT: u64 = 1_796_263_203_000;

fn run(owner: &str, token: u64, term_began: u64, kept: bool) -> SlotRun<'_> {
    SlotRun {
        owner,
        token,
        term_began,
        kept,
    }
}

/// Seed 62852's schedule: c0's claim is made, the store rolls back before
/// c0's late reply arrives, c0 runs the slot; c1 later claims and runs the
/// same slot again. The second run is the rollback's doing.
#[test]
fn a_claim_lost_before_its_late_reply_excuses_the_next_run() {
    let mut ledger = SlotLedger::default();
    ledger.lost(3248, 2000);
    assert_eq!(ledger.run(SLOT, run("c0", 27, 3129, false), 3261), Ok(()));
    assert_eq!(ledger.run(SLOT, run("c1", 35, 3732, true), 3732), Ok(()));
}

#[test]
fn a_run_without_a_claim_and_no_loss_in_its_term_is_a_violation() {
    let mut ledger = SlotLedger::default();
    ledger.lost(1000, 0); // before the term began: it cannot explain it
    let verdict = ledger.run(SLOT, run("c0", 27, 3129, false), 3261);
    assert!(
        verdict
            .as_ref()
            .is_err_and(|why| why.contains("no claim of it")),
        "{verdict:?}"
    );
}

#[test]
fn a_slot_run_twice_with_no_loss_between_is_a_violation() {
    let mut ledger = SlotLedger::default();
    ledger.lost(100, 0); // long before either run
    assert_eq!(ledger.run(SLOT, run("c0", 27, 3129, true), 3261), Ok(()));
    let verdict = ledger.run(SLOT, run("c1", 35, 3732, true), 3732);
    assert!(
        verdict
            .as_ref()
            .is_err_and(|why| why.contains("runs twice")),
        "{verdict:?}"
    );
}

#[test]
fn a_rollback_to_after_the_first_run_does_not_excuse_the_second() {
    let mut ledger = SlotLedger::default();
    assert_eq!(ledger.run(SLOT, run("c0", 27, 3129, true), 3261), Ok(()));
    // The snapshot was taken after c0's run: its claim survives.
    ledger.lost(3500, 3300);
    assert!(ledger.run(SLOT, run("c1", 35, 3732, true), 3732).is_err());
}

#[test]
fn a_wipe_after_the_first_run_excuses_the_second() {
    let mut ledger = SlotLedger::default();
    assert_eq!(ledger.run(SLOT, run("c0", 27, 3129, true), 3261), Ok(()));
    ledger.lost(3500, 0);
    assert_eq!(ledger.run(SLOT, run("c1", 35, 3732, true), 3732), Ok(()));
}
