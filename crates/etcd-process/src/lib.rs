//! Private `etcd` clusters for tests, demos and benchmarks.
//!
//! Code that keeps a lease or a leadership in etcd can only be trusted once
//! it has been run against real members losing their leader, crashing,
//! stalling and coming back, so this crate starts the real thing: every
//! member is an `etcd` process of its own, on free ports of 127.0.0.1 (never
//! the shared 2379/2380), with its data in a temporary directory, stopped by
//! its PID (never by name) and cleaned up when the [`EtcdCluster`] is
//! dropped. Several test binaries can therefore run side by side on one
//! machine.
//!
//! ```no_run
//! let mut cluster = etcd_process::EtcdCluster::start()?; // 3 members
//! println!("etcd at {}", cluster.url()); // etcd://127.0.0.1:P1,127.0.0.1:P2,...
//! let old = cluster.leader()?;
//! cluster.kill(old); // SIGKILL by PID, data kept
//! let new = cluster.wait_for_leader(std::time::Duration::from_secs(10))?;
//! assert_ne!(old, new);
//! cluster.restart(old)?; // same ports, same data
//! # Ok::<(), etcd_process::Error>(())
//! ```
//!
//! The crate talks to etcd only over plain HTTP on the client port
//! (`/health` and the JSON gRPC gateway under `/v3/`), with a client of its
//! own a few dozen lines long: it needs neither `etcdctl` nor an async
//! runtime, so synchronous tests can use it from any thread.
//!
//! Faults between a client and etcd, rather than inside etcd, come from
//! [`Proxy`]: a TCP forwarder that can cut every connection, stop
//! forwarding without closing anything, or delay every chunk (the
//! workspace's one fault proxy, from `tenure-test-support`).
//!
//! ```no_run
//! let cluster = etcd_process::EtcdCluster::start()?;
//! let proxy = etcd_process::Proxy::start(cluster.client_port(0))?;
//! // Point the client at 127.0.0.1:{proxy.port()}, then:
//! proxy.blackhole(); // connections stay open, nothing gets through
//! proxy.cut(); // every connection is closed, new ones are dropped
//! proxy.heal(); // new connections work again
//! let other = etcd_process::EtcdCluster::start()?;
//! proxy.retarget(other.client_port(0)); // the address now reaches another server
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

mod cluster;
mod http;
mod member;

pub use cluster::{Backup, EtcdBuilder, EtcdCluster, TlsFiles};
pub use tenure_test_support::proxy::{Mode as ProxyMode, Proxy};

/// How long starting or restarting members may take before it counts as a
/// failure. A cluster is usually serving in one to two seconds; the margin
/// is for loaded machines.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What can go wrong while starting, faulting or asking a private cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `etcd` binary is not installed.
    #[error(
        "etcd was not found on PATH (set ETCD_BIN to its path, or install it: \
         `apt-get install etcd-server` on Debian/Ubuntu, `brew install etcd` on macOS)"
    )]
    NotInstalled,
    /// A member exited, or did not report itself healthy in time, while
    /// starting or restarting.
    #[error("etcd member m{member} (client port {port}) did not start: {detail}")]
    DidNotStart {
        /// The member's index in its cluster.
        member: usize,
        /// Its client port.
        port: u16,
        /// What was observed (exit status or last check), and the last lines
        /// of its log.
        detail: String,
    },
    /// etcd answered an HTTP request with an error, or with something that
    /// was not the JSON expected.
    #[error("{0}")]
    Http(String),
    /// A wait on the cluster's state passed its deadline.
    #[error("timed out after {waited:?} waiting until {what}; last seen: {last}")]
    Timeout {
        /// The condition that was awaited.
        what: String,
        /// How long it was awaited.
        waited: Duration,
        /// Why the last check failed.
        last: String,
    },
    /// The cluster is not in the state an operation needs (no leader, a
    /// member that is not running, ...).
    #[error("{0}")]
    Topology(String),
    /// A builder setting etcd cannot run with.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Operating-system error (spawning, sockets, files).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

/// Find `etcd`: `$ETCD_BIN`, then each directory of `$PATH`, then
/// `/usr/bin` and `/usr/local/bin`.
pub fn find_etcd() -> Result<PathBuf, Error> {
    tenure_test_support::find_binary("ETCD_BIN", "etcd").ok_or(Error::NotInstalled)
}

/// A TCP port on 127.0.0.1 that was free a moment ago (never etcd's
/// default 2379 or 2380).
pub fn free_port() -> Result<u16, Error> {
    Ok(free_ports(1)?[0])
}

/// etcd's well-known ports, which a shared etcd may be using: never handed
/// out, even if the system's ephemeral range contains them.
const RESERVED: [u16; 2] = [2379, 2380];

/// `count` distinct ports of 127.0.0.1 that were free a moment ago, none of
/// them [`RESERVED`], none handed out twice.
pub(crate) fn free_ports(count: usize) -> Result<Vec<u16>, Error> {
    tenure_test_support::ports::free_ports(count, &RESERVED).map_err(io_err("finding a free port"))
}
