//! The integration tests of `tenure-chaos`, in one test binary: each module
//! below was a binary of its own, and every binary links the whole
//! dependency tree again (on a 2-core machine, minutes and gigabytes).

mod checker_can_fail;
mod evidence;
mod topologies;

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// How many chaos runs may go at once, whatever `--test-threads` says.
/// Each run is a store, its fault injector and three to five instances on
/// wall-clock timers; the liveness goals assume a run gets its share of
/// two cores. The rest of the workspace's tests mostly wait, and CI runs
/// them with more threads than cores (scripts/test.sh).
const RUNS_AT_ONCE: usize = 2;

static RUNNING: Mutex<usize> = Mutex::new(0);
static FREED: Condvar = Condvar::new();

/// A place among the [`RUNS_AT_ONCE`] runs, held until dropped.
pub struct RunSlot(());

impl RunSlot {
    /// Wait for a place.
    pub fn take() -> RunSlot {
        let mut running = lock();
        while *running >= RUNS_AT_ONCE {
            running = FREED.wait(running).unwrap_or_else(PoisonError::into_inner);
        }
        *running += 1;
        RunSlot(())
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        *lock() -= 1;
        FREED.notify_one();
    }
}

// A test that panics while holding the lock poisons nothing we rely on:
// the count is updated in one step.
fn lock() -> MutexGuard<'static, usize> {
    RUNNING.lock().unwrap_or_else(PoisonError::into_inner)
}
