//! The one clock every process on a host reads the same way.
//!
//! A lease in the file expires on `CLOCK_BOOTTIME` (milliseconds since
//! boot, counting suspend), tagged with the boot it was written in: every
//! process on the host reads the same clock, so there is no skew to allow
//! for, and a lease of an earlier boot is dead, since every process of that
//! boot is. Tokens and the last-run marker, which must outlive a reboot,
//! use the wall clock instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::time::{clock_gettime, ClockId};

use crate::{Error, Result};

/// One reading of the host's clocks, taken inside a transaction.
#[derive(Debug, Clone)]
pub(super) struct Now {
    /// This boot's id (`/proc/sys/kernel/random/boot_id`).
    pub boot: String,
    /// `CLOCK_BOOTTIME`, in milliseconds.
    pub ms: i64,
    /// The wall clock, in milliseconds since the Unix epoch.
    pub wall_ms: i64,
}

/// This boot's id.
pub(super) fn boot_id() -> Result<String> {
    let path = "/proc/sys/kernel/random/boot_id";
    let id = std::fs::read_to_string(path)
        .map_err(|err| Error::Config(format!("sqlite:// needs {path} (Linux): {err}")))?;
    Ok(id.trim().to_string())
}

impl Now {
    pub fn read(boot: &str) -> Result<Now> {
        let boottime = clock_gettime(ClockId::CLOCK_BOOTTIME)
            .map_err(|err| Error::internal(format!("CLOCK_BOOTTIME: {err}")))?;
        let since_boot = Duration::from(boottime);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Ok(Now {
            boot: boot.to_string(),
            ms: millis(since_boot),
            wall_ms: millis(wall),
        })
    }

    /// `ms` milliseconds from now, on the boot clock.
    pub fn plus(&self, ms: u64) -> i64 {
        self.ms
            .saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
    }

    /// Whether an instant `expires` of boot `boot` is still to come.
    pub fn before(&self, boot: &str, expires: i64) -> bool {
        boot == self.boot && expires > self.ms
    }

    /// How long until `expires` (of this boot).
    pub fn until(&self, expires: i64) -> Duration {
        Duration::from_millis(u64::try_from(expires.saturating_sub(self.ms)).unwrap_or(0))
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
