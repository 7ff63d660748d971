//! Campaign attempts: the names that let a retry adopt only the lease its
//! own attempt wrote, so that every new term gets a new token.

use std::sync::Mutex;

/// The campaign attempts of one [`Election`] value.
///
/// An attempt names one campaign in the lease it writes. Only a retry of the
/// same attempt adopts a lease found under this instance's id (its first
/// reply was lost); every other lease under the id (an earlier term still
/// being released, a lease restored by a rollback, another process using
/// the same id) is held by someone else, so a new term always gets a new
/// token and can never be ended by an older term's release.
pub(super) struct Attempts {
    /// Every attempt name starts with it: `NONCE.` with a random nonce, so
    /// two processes (or two `Election` values) with one id never share
    /// attempts.
    prefix: String,
    state: Mutex<AttemptState>,
}

#[derive(Default)]
struct AttemptState {
    next: u64,
    /// An attempt whose campaign was abandoned (cancelled or failed) after
    /// it may have written a lease: the next campaign reuses it, and so
    /// adopts that lease instead of waiting for it to lapse.
    unfinished: Option<u64>,
    /// The attempt that began the latest term: its lease is its keeper's
    /// to renew and release, never [`Election::release_if_held`]'s.
    began: Option<u64>,
    /// Attempts whose campaign is still running (its reply may be on its
    /// way): their leases are not [`Election::release_if_held`]'s either.
    running: Vec<u64>,
}

impl Attempts {
    pub fn new() -> Self {
        Attempts {
            prefix: format!("{:016x}.", rand::random::<u64>()),
            state: Mutex::new(AttemptState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attempt for a new campaign. Never the attempt of a term that
    /// began, and never one another running campaign holds.
    pub fn begin(&self) -> Attempt<'_> {
        let mut state = self.lock();
        let number = state.unfinished.take().unwrap_or_else(|| {
            state.next += 1;
            state.next
        });
        state.running.push(number);
        Attempt {
            attempts: self,
            number,
            name: format!("{}{number}", self.prefix),
            won: false,
        }
    }

    /// Whether an attempt name is one of ours.
    pub fn is_ours(&self, attempt: &str) -> bool {
        attempt.starts_with(&self.prefix)
    }

    /// Whether an attempt name is the one that began the latest term, or
    /// one whose campaign is still running: a lease that is not for
    /// [`Election::release_if_held`] to release.
    pub fn is_kept(&self, attempt: &str) -> bool {
        let Some(number) = attempt
            .strip_prefix(&self.prefix)
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return false;
        };
        let state = self.lock();
        state.began == Some(number) || state.running.contains(&number)
    }
}

/// One campaign's attempt; handed back for reuse unless a term began.
pub(super) struct Attempt<'a> {
    attempts: &'a Attempts,
    number: u64,
    pub name: String,
    won: bool,
}

impl Attempt<'_> {
    /// This attempt won: a term begins, kept by its own keeper.
    pub fn won(&mut self) {
        self.won = true;
        self.attempts.lock().began = Some(self.number);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let mut state = self.attempts.lock();
        state.running.retain(|number| *number != self.number);
        if !self.won && state.unfinished.is_none() {
            state.unfinished = Some(self.number);
        }
    }
}
