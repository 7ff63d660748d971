//! The checks a Redis store passes once, when an election or a partition
//! set is built on it: permissions for every command tenure's scripts run,
//! and an eviction policy that cannot delete a lease.

use redis::Script;

use super::connection::Connection;
use super::keys::Keys;
use super::scripts::CHECK;
use super::target::{is_read_only, RedisTarget};
use crate::{Error, Result};

/// What [`check_store`] looks at besides the election's commands.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StoreChecks {
    /// Also check the commands of partition sets (sorted sets).
    pub partitions: bool,
    /// Accept a server whose eviction policy may delete leases.
    pub allow_eviction: bool,
}

/// Check, once when connecting, that this Redis can keep leases: the user
/// may run every command tenure's scripts run (a missing permission is
/// reported by name now, not half-way through a lease operation later), and
/// no eviction policy may delete a lease under a leader that still believes
/// it leads.
pub(crate) async fn check_store(
    conn: &mut Connection,
    target: &RedisTarget,
    keys: &Keys,
    checks: StoreChecks,
    sharded: bool,
) -> Result<()> {
    let (maxmemory, policy): (u64, String) = Script::new(&for_topology(CHECK, sharded))
        .key(&keys.probe)
        .arg(&keys.events)
        .arg(if checks.partitions { "1" } else { "0" })
        .invoke_async(conn)
        .await
        .map_err(|e| {
            if is_read_only(&e) {
                Error::Unsafe {
                    url: target.redacted(),
                    detail: "it is a read-only replica; point tenure at the primary".into(),
                }
            } else {
                target.classify(e)
            }
        })?;
    if maxmemory > 0 && policy != "noeviction" && !checks.allow_eviction {
        return Err(Error::Unsafe {
            url: target.redacted(),
            detail: format!(
                "maxmemory is {maxmemory} bytes with maxmemory-policy {policy}, so Redis may \
                 evict a lease while its leader still leads, and another instance would be \
                 elected at once; set maxmemory-policy noeviction (or maxmemory 0) on the Redis \
                 that holds tenure's keys, or allow eviction explicitly (allow_eviction, \
                 --allow-eviction) if fencing tokens protect every write"
            ),
        });
    }
    if maxmemory > 0 && policy != "noeviction" {
        tracing::warn!(url = %target.redacted(), %policy, "eviction allowed: an evicted lease lets a second leader in while the first still believes it leads");
    }
    Ok(())
}

/// A script as the store runs it: on a cluster (`sharded`), announcements
/// use sharded pub/sub (`SPUBLISH`), so they stay on the election's shard
/// (see [`sharded`]).
pub(crate) fn for_topology(code: &str, sharded: bool) -> String {
    if sharded {
        code.replace("call('PUBLISH',", "call('SPUBLISH',")
    } else {
        code.to_string()
    }
}
