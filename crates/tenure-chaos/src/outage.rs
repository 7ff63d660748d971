//! What the faults of a store have in common, for the harness and the
//! member faults of [`crate::consensus`] alike: how long a topology may
//! take to settle, how a blocking call of the test crates runs off the
//! runtime, and the window a fault of the store is recorded for.

use std::time::Duration;

/// How long the harness waits for a Sentinel group, a cluster or a
/// consensus store to reach the state a fault or its repair needs (a
/// promotion, a demotion, a rejoin, a leader).
pub(crate) const TOPOLOGY_WAIT: Duration = Duration::from_secs(60);

/// Run a blocking call of redis-process, etcd-process or zk-process (they
/// poll with sleeps) off the runtime, whose threads also carry the
/// proxies' traffic.
pub(crate) async fn blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    what: &str,
    call: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(format!("{what}: {err}")),
        Err(err) => Err(format!("{what}: {err}")),
    }
}

/// A fault of the store as the harness records it: from `t`
/// until the store could serve the election again (ns), and whether it
/// could not serve meanwhile (etcd: told apart per fault; Redis: `None`,
/// by kind, see the checker).
pub(crate) struct Outage {
    pub t: u64,
    pub until: u64,
    pub store_down: Option<bool>,
}

impl Outage {
    /// The window `(t, until)` with `store_down`.
    pub(crate) fn of((t, until): (u64, u64), store_down: Option<bool>) -> Outage {
        Outage {
            t,
            until,
            store_down,
        }
    }
}
