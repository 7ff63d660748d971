//! Operator queries: who leads which election, without campaigning.
//!
//! These are what `tenure status` is built on. They use a plain connection
//! of the caller's ([`connect`] makes one with the same URL, TLS and error
//! handling as an election) and never modify a lease.

use std::path::Path;
use std::time::Duration;

use redis::{Script, Value};

pub use crate::backend::connection::Connection;
use crate::backend::redis::{classify, parse_inspect, RedisTarget, INSPECT};
use crate::keys::{validate_name, Keys};
use crate::{LeaderInfo, Result};

/// Connect to Redis the way elections do: `redis://` or `rediss://` URL,
/// optional CA file, every call bounded by `call_timeout`; checked with PING.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> tenure::Result<()> {
/// use std::time::Duration;
/// let mut conn = tenure::admin::connect("redis://127.0.0.1:6379", None, Duration::from_secs(2)).await?;
/// for name in tenure::admin::list_elections(&mut conn, "tenure").await? {
///     println!("{name}: {:?}", tenure::admin::leader_of(&mut conn, "tenure", &name).await?);
/// }
/// # Ok(()) }
/// ```
pub async fn connect(
    url: &str,
    tls_ca: Option<&Path>,
    call_timeout: Duration,
) -> Result<Connection> {
    RedisTarget {
        url: url.to_string(),
        tls_ca: tls_ca.map(Path::to_path_buf),
    }
    .connect(call_timeout)
    .await
}

/// Names of all elections with a live lease under `prefix`, sorted, read
/// with `SCAN` (never `KEYS`).
pub async fn list_elections(conn: &mut Connection, prefix: &str) -> Result<Vec<String>> {
    validate_name("key prefix", prefix)?;
    let pattern = Keys::lease_pattern(prefix);
    let mut names = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(500)
            .query_async(conn)
            .await
            .map_err(|e| classify(e, "redis"))?;
        names.extend(
            batch
                .iter()
                .filter_map(|key| Keys::name_of_lease(prefix, key)),
        );
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// Who leads the election `name` under `prefix` (`None` when nobody does).
pub async fn leader_of(
    conn: &mut Connection,
    prefix: &str,
    name: &str,
) -> Result<Option<LeaderInfo>> {
    validate_name("key prefix", prefix)?;
    validate_name("election name", name)?;
    let keys = Keys::new(prefix, name);
    let reply: Value = Script::new(INSPECT)
        .key(&keys.lease)
        .invoke_async(conn)
        .await
        .map_err(|e| classify(e, "redis"))?;
    Ok(parse_inspect(reply, "redis")?.map(LeaderInfo::from))
}

/// The key of the fenced "last run" marker of an election (used by
/// `tenure run --at-most-every`).
pub fn last_run_key(prefix: &str, name: &str) -> Result<String> {
    validate_name("key prefix", prefix)?;
    validate_name("election name", name)?;
    Ok(Keys::new(prefix, name).last_run)
}

/// The Redis server's clock, in milliseconds since the Unix epoch: one clock
/// for every host, for "when did this last run" questions.
pub async fn server_time_ms(conn: &mut Connection) -> Result<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .map_err(|e| classify(e, "redis"))?;
    Ok(secs * 1000 + micros / 1000)
}
