//! The integration tests of `tenure-chaos`, in one test binary: each module
//! below was a binary of its own, and every binary links the whole
//! dependency tree again (on a 2-core machine, minutes and gigabytes).

mod checker_can_fail;
mod evidence;
mod topologies;
