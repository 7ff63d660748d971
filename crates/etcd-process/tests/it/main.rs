//! The integration tests of `etcd-process`, in one test binary: each module
//! below was a binary of its own, and every binary links the whole
//! dependency tree again (on a 2-core machine, minutes and gigabytes).
//!
//! `tests/start_failure.rs` stays a binary of its own: it sets process-wide state.
//! The proxy's own tests are in `tenure-test-support`, where it lives.

mod cluster;
