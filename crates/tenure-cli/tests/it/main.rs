//! The integration tests of `tenure-cli`, in one test binary: each module
//! below was a binary of its own, and every binary links the whole
//! dependency tree again (on a 2-core machine, minutes and gigabytes).

mod bad_input;
mod cgroup;
mod connect_errors;
mod consensus;
mod conventions;
mod cron;
mod demo;
mod etcd;
mod input;
mod observe;
mod postgres;
mod run;
mod secrets;
mod serve;
mod slots;
mod sqlite;
mod store_checks;
mod support;
mod topologies;
mod zookeeper;
