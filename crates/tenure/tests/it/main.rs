//! The integration tests of `tenure`, in one test binary: each module
//! below was a binary of its own, and every binary links the whole
//! dependency tree again (on a 2-core machine, minutes and gigabytes).
//!
//! `tests/metrics.rs` stays a binary of its own: it sets process-wide state.

mod cluster;
#[cfg(feature = "etcd")]
mod contract;
mod cron_memory;
mod election_redis;
mod errors;
#[cfg(feature = "etcd")]
mod etcd;
mod partitions;
mod partitions_memory;
#[cfg(feature = "postgres")]
mod postgres;
mod safety;
mod schedule;
mod semaphore_memory;
mod sentinel;
#[cfg(feature = "sqlite")]
mod sqlite;
mod state_machine;
mod support;
#[cfg(feature = "zookeeper")]
mod zookeeper;
