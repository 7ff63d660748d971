//! The calendar schedule's invariant, "no slot runs twice", as a ledger
//! of runs and store losses, apart from the simulation that feeds it so
//! that its judgement can be tested on its own.
//!
//! A store without consensus forgets what it forgets: a wipe, or a
//! rollback to a snapshot, can lose a slot's claim, and a later leader
//! then runs the slot again. That second run is no fault of tenure's, so
//! the ledger excuses it, and only it:
//!
//! - a run whose claim the store still had when the run started is lost
//!   only by a loss at or after the run that reaches back to before it;
//! - a run whose claim the store no longer had when it started was told
//!   of a claim the store made and then lost (the reply was late, and a
//!   rollback came in between). That needs a loss in the run's own term;
//!   without one, the run had no claim at all, which is a violation.

use std::collections::BTreeMap;

/// Every slot's runs, and every time the store lost data. Times are ms of
/// simulated time; slots, ms since the Unix epoch.
///
/// ```
/// use tenure_sim::SlotLedger;
/// let mut ledger = SlotLedger::default();
/// let run = |owner, token| tenure_sim::SlotRun { owner, token, term_began: 0, kept: true };
/// assert!(ledger.run(60_000, run("a", 1), 10).is_ok());
/// assert!(ledger.run(60_000, run("b", 2), 20).is_err(), "twice, with no loss between");
/// ```
#[derive(Debug, Default, Clone)]
pub struct SlotLedger {
    /// Each slot's runs whose claims may still be in the store: (owner,
    /// token, when).
    runs: BTreeMap<u64, Vec<(String, u64, u64)>>,
    /// When the store lost data, and since when: it lost what was written
    /// at or after the second figure (0 for a wipe, the snapshot's time
    /// for a rollback).
    losses: Vec<(u64, u64)>,
}

/// One run of a slot, as [`SlotLedger::run`] judges it.
#[derive(Debug, Clone, Copy)]
pub struct SlotRun<'a> {
    /// The instance that runs it.
    pub owner: &'a str,
    /// Its term's token.
    pub token: u64,
    /// When its term began (its campaign returned).
    pub term_began: u64,
    /// The store had this slot's claim, or a later slot's, as the run
    /// started.
    pub kept: bool,
}

impl SlotLedger {
    /// The store lost, at `when`, everything written at or after `since`.
    ///
    /// ```
    /// use tenure_sim::{SlotLedger, SlotRun};
    /// let mut ledger = SlotLedger::default();
    /// let run = |owner, token| SlotRun { owner, token, term_began: 0, kept: true };
    /// ledger.run(60_000, run("a", 1), 10).unwrap();
    /// ledger.lost(15, 0); // wiped: a's claim is gone
    /// assert!(ledger.run(60_000, run("b", 2), 20).is_ok());
    /// ```
    pub fn lost(&mut self, when: u64, since: u64) {
        self.losses.push((when, since));
    }

    /// `run` runs `slot` at `at`: `Err` says why that breaks "no slot
    /// twice" or "no run without a claim".
    ///
    /// ```
    /// use tenure_sim::{SlotLedger, SlotRun};
    /// let mut ledger = SlotLedger::default();
    /// let unclaimed = SlotRun { owner: "a", token: 1, term_began: 0, kept: false };
    /// assert!(ledger.run(60_000, unclaimed, 10).is_err(), "no claim, and nothing lost");
    /// ```
    pub fn run(&mut self, slot: u64, run: SlotRun<'_>, at: u64) -> Result<(), String> {
        let SlotRun {
            owner,
            token,
            term_began,
            kept,
        } = run;
        if !kept {
            if !self.losses.iter().any(|(when, _)| *when >= term_began) {
                return Err(format!(
                    "{owner} runs slot {slot} in term {token}, but the store has no claim of it \
                     and lost no data in that term"
                ));
            }
            // Its claim is gone already: a later run of the slot is no
            // repeat that the store could have prevented.
            return Ok(());
        }
        let earlier = self.runs.get(&slot).and_then(|runs| {
            runs.iter().find(|(_, _, ran)| {
                !self
                    .losses
                    .iter()
                    .any(|(when, since)| *when >= *ran && *ran >= *since)
            })
        });
        let verdict = match earlier {
            Some((by, by_token, ran)) => Err(format!(
                "slot {slot} runs twice: {by} (token {by_token}) at {ran} ms, {owner} (token {token}), \
                 with no data lost in between"
            )),
            None => Ok(()),
        };
        self.runs
            .entry(slot)
            .or_default()
            .push((owner.to_string(), token, at));
        verdict
    }
}
