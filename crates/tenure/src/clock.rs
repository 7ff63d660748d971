//! Time the monotonic clock does not see: the host being suspended.
//!
//! Deadlines are tokio [`Instant`](tokio::time::Instant)s, which read
//! `CLOCK_MONOTONIC`. On Linux that clock stops while the host is suspended
//! (a laptop lid, a VM snapshot-and-resume), but the lease on the server
//! keeps expiring. A leader that slept through its deadline would wake up
//! believing it still leads. `CLOCK_BOOTTIME` keeps counting during suspend,
//! so the difference between the two clocks grows by exactly the time spent
//! suspended: [`suspended`] reads it, and a deadline set when it read `s`
//! is moved earlier by `suspended() - s`.
//!
//! Both clocks are real, never tokio's paused clock, so tests that pause
//! time see no suspend at all.

use std::time::Duration;

/// Total time the host has spent suspended, from an arbitrary origin: only
/// differences between two readings mean anything.
/// The monotonic clock and the suspend time read together, once, for code
/// that checks many deadlines at the same instant (a keeper of 100,000
/// terms would otherwise read the clocks several times per term).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub now: tokio::time::Instant,
    pub slept: Duration,
}

impl Reading {
    pub fn take() -> Reading {
        Reading {
            now: tokio::time::Instant::now(),
            slept: suspended(),
        }
    }
}

pub(crate) fn suspended() -> Duration {
    let offset = boot_minus_monotonic();
    #[cfg(test)]
    let offset = offset + tests::SIMULATED.with(std::cell::Cell::get);
    offset
}

#[cfg(target_os = "linux")]
fn boot_minus_monotonic() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    let read = |clock| clock_gettime(clock).ok().map(Duration::from);
    match (
        read(ClockId::CLOCK_BOOTTIME),
        read(ClockId::CLOCK_MONOTONIC),
    ) {
        (Some(boot), Some(monotonic)) => boot.saturating_sub(monotonic),
        // Neither can fail on Linux; without them, suspend goes unseen.
        _ => Duration::ZERO,
    }
}

#[cfg(not(target_os = "linux"))]
fn boot_minus_monotonic() -> Duration {
    // Elsewhere the monotonic clock's behaviour during suspend varies by
    // platform; suspend is not corrected for (see the crate docs).
    Duration::ZERO
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        /// Extra suspend time for unit tests, per thread: a test that
        /// simulates a suspend (on its own thread, as every test runs) does
        /// not suspend the tests running beside it.
        pub(crate) static SIMULATED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    /// Simulate the host sleeping for `time`, as this thread's clocks see
    /// it.
    pub(crate) fn simulate_suspend(time: Duration) {
        SIMULATED.with(|simulated| simulated.set(simulated.get() + time));
    }

    #[test]
    fn suspend_time_does_not_go_backwards() {
        let first = super::suspended();
        let second = super::suspended();
        // The two clocks are read one after the other, so the difference
        // may wobble by the time between the two reads, never by more.
        assert!(second + std::time::Duration::from_millis(1) >= first);
    }
}
