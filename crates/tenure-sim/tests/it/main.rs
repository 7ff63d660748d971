//! The integration tests of `tenure-sim`, in one test binary: each module
//! below was a binary of its own, and every binary links the whole
//! dependency tree again (on a 2-core machine, minutes and gigabytes).

mod failing_modes;
mod simulation;
mod slots;
