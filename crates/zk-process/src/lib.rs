//! Private Apache ZooKeeper ensembles for tests, demos and benchmarks.
//!
//! Code that keeps a session or a leadership in ZooKeeper can only be
//! trusted once it has been run against real servers losing their leader,
//! crashing, stalling and coming back, so this crate starts the real thing:
//! every member is a JVM of its own running ZooKeeper's `QuorumPeerMain`,
//! on free ports of 127.0.0.1 (never the shared 2181, 2888 or 3888), with
//! its configuration and data in a temporary directory, stopped by its PID
//! (never by name) and cleaned up when the [`ZkEnsemble`] is dropped.
//! Several test binaries can therefore run side by side on one machine.
//!
//! ```no_run
//! let mut zk = zk_process::ZkEnsemble::start()?; // 3 members
//! println!("ZooKeeper at {}", zk.connect_string()); // 127.0.0.1:P1,127.0.0.1:P2,...
//! let old = zk.leader()?;
//! zk.kill(old); // SIGKILL by PID, data kept
//! let new = zk.wait_for_leader(std::time::Duration::from_secs(20))?;
//! assert_ne!(old, new);
//! zk.restart(old)?; // same ports, same data
//! # Ok::<(), zk_process::Error>(())
//! ```
//!
//! The crate asks the members about themselves with ZooKeeper's
//! four-letter words (`srvr`, `mntr`, ...) over plain TCP on the client
//! port, every one of them allowed: it needs no ZooKeeper client library
//! and no async runtime, so synchronous tests can use it from any thread.
//! Znodes are read and written with ZooKeeper's own command-line client
//! ([`ZkEnsemble::cli`]), a JVM per call.
//!
//! Members run the jars of Debian's `zookeeper` package (3.8) from
//! `/usr/share/java`, started with `java` directly, so that the PID held is
//! the server's own. Each logs to `zookeeper.log` in its directory
//! ([`ZkEnsemble::log_tail`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::time::Duration;

mod cli;
mod config;
mod ensemble;
mod member;
mod quorum;

pub use ensemble::{Backup, ZkBuilder, ZkEnsemble};

/// How long starting or restarting members may take before it counts as a
/// failure. A three-member ensemble usually serves in two to three seconds;
/// the margin is for JVMs starting on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a condition is checked while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What can go wrong while starting, faulting or asking a private ensemble.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `java` or ZooKeeper's jars are not installed.
    #[error(
        "ZooKeeper not found ({0}): install Debian's zookeeper package \
         (scripts/install-deps.sh does), or set ZOOKEEPER_JAVA and ZOOKEEPER_CLASSPATH"
    )]
    NotInstalled(String),
    /// A member exited, or did not serve in time, while starting or
    /// restarting.
    #[error("ZooKeeper member m{member} (client port {port}) did not start: {detail}")]
    DidNotStart {
        /// The member's index in its ensemble.
        member: usize,
        /// Its client port.
        port: u16,
        /// What was observed (exit status or last answer), and the last
        /// lines of its log.
        detail: String,
    },
    /// A member could not be asked, or answered a four-letter word or a
    /// command of the command-line client with an error or with something
    /// unexpected.
    #[error("{0}")]
    Reply(String),
    /// A wait on the ensemble's state passed its deadline.
    #[error("timed out after {waited:?} waiting until {what}; last seen: {last}")]
    Timeout {
        /// The condition that was awaited.
        what: String,
        /// How long it was awaited.
        waited: Duration,
        /// Why the last check failed.
        last: String,
    },
    /// The ensemble is not in the state an operation needs (no leader, a
    /// member that is not running, ...).
    #[error("{0}")]
    Topology(String),
    /// A builder setting ZooKeeper cannot run with.
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

/// Where ZooKeeper's jars and the `java` that runs them are.
#[derive(Debug, Clone)]
pub struct Installation {
    /// The `java` binary.
    pub java: PathBuf,
    /// The class path holding ZooKeeper and its dependencies.
    pub classpath: String,
}

/// Debian's jars, in `/usr/share/java`. `zookeeper.jar`'s manifest names
/// its other dependencies (netty, jute, slf4j's API, ...) by absolute path;
/// the logging binding is not among them: Debian's ZooKeeper logs through
/// slf4j to log4j 1.2, whose jars come with the package too.
const DEBIAN_JARS: [&str; 3] = [
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-log4j12.jar",
    "/usr/share/java/log4j-1.2.jar",
];

/// Find ZooKeeper: `java` from `$ZOOKEEPER_JAVA`, else the first on
/// `$PATH`, `/usr/bin` or `/usr/local/bin`; the class path from
/// `$ZOOKEEPER_CLASSPATH`, else Debian's jars in `/usr/share/java`.
pub fn find_zookeeper() -> Result<Installation, Error> {
    let java = tenure_test_support::find_binary("ZOOKEEPER_JAVA", "java")
        .ok_or_else(|| Error::NotInstalled("no `java` on PATH".into()))?;
    let classpath = match std::env::var("ZOOKEEPER_CLASSPATH") {
        Ok(classpath) => classpath,
        Err(_) => {
            let [zookeeper, logging @ ..] = DEBIAN_JARS;
            if !Path::new(zookeeper).is_file() {
                return Err(Error::NotInstalled(format!("no {zookeeper}")));
            }
            // Without the binding ZooKeeper still runs, but logs nothing.
            std::iter::once(zookeeper)
                .chain(logging.into_iter().filter(|jar| Path::new(jar).is_file()))
                .collect::<Vec<_>>()
                .join(":")
        }
    };
    Ok(Installation { java, classpath })
}

/// ZooKeeper's well-known ports (client, quorum, election, admin server),
/// which a shared ZooKeeper may be using: never handed out, even if the
/// system's ephemeral range contains them.
const RESERVED: [u16; 4] = [2181, 2888, 3888, 8080];

/// A TCP port on 127.0.0.1 that was free a moment ago (never one of
/// ZooKeeper's default ports).
pub fn free_port() -> Result<u16, Error> {
    Ok(free_ports(1)?[0])
}

/// `count` distinct ports of 127.0.0.1 that were free a moment ago, none of
/// them [`RESERVED`], none handed out twice.
pub(crate) fn free_ports(count: usize) -> Result<Vec<u16>, Error> {
    tenure_test_support::ports::free_ports(count, &RESERVED).map_err(io_err("finding a free port"))
}
