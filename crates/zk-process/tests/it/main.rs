//! The integration tests of `zk-process`, in one test binary: every binary
//! links its dependencies again, and every test starts JVMs, so there are
//! few of each.

mod ensemble;
mod standalone;

use std::time::{Duration, Instant};

/// Generous: each failover or restart starts or re-elects JVMs on a
/// loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Check `condition` every 50 ms until it returns `Some` or `DEADLINE`
/// passes; `what` names it in the panic.
pub fn eventually<T>(what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One value of a member's `mntr` answer.
pub fn mntr(zk: &zk_process::ZkEnsemble, member: usize, key: &str) -> Option<String> {
    let pairs = zk.mntr(member).ok()?;
    pairs.into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}
