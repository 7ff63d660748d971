//! What the workspace's test tooling shares.
//!
//! The process crates (`etcd-process`, `redis-process`), the fault
//! injection (`tenure-chaos`) and the library's integration tests each grew
//! their own copy of the same few helpers: a free port of 127.0.0.1, a
//! server binary found through an environment variable or `$PATH`, a TCP
//! proxy that cuts or black-holes connections, a runtime that an instance
//! lives on so that it can vanish like a killed process, and a check that
//! no two terms were held at once. Copies drift: one proxy learnt to
//! retarget, the other to delay; one checker compared neighbours only. This
//! crate holds the one copy of each, so a fix lands once.
//!
//! - [`ports`]: free loopback ports, never handing one out twice.
//! - [`find_binary`]: a server binary, by environment override or `$PATH`.
//! - [`proxy`]: a fault-injecting TCP proxy (pass, black hole, drop,
//!   delay, retarget) on plain threads, usable with or without a runtime.
//! - [`overlap`]: which terms of different (or any) holders overlapped.
//! - `Crashable` (feature `runtime`): a tokio runtime that can be dropped
//!   mid-flight, every task on it gone without running another step.
//!
//! It is not published (`publish = false`), and so only crates that are not
//! published either may depend on it. `redis-process` is published (the
//! `tenure` command's `demo` starts a redis-server with it), so it keeps its
//! own `free_port` and `find_redis_server`, the same code as [`ports`] and
//! [`find_binary`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

#[cfg(feature = "runtime")]
mod crashable;
pub mod overlap;
pub mod ports;
pub mod proxy;

#[cfg(feature = "runtime")]
pub use crashable::Crashable;

/// Find the binary `name`: the path in the environment variable `env`
/// when it is set, else the first `name` in a directory of `$PATH`, then
/// `/usr/bin` and `/usr/local/bin`. `None` when none is found (each caller
/// says how to install it).
pub fn find_binary(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let found = path_dirs
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/usr/bin"), Path::new("/usr/local/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    found
}
