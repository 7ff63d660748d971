#!/usr/bin/env bash
# Run every test of the project:
#   1. the Prometheus alert rules' unit tests (promtool);
#   2. the book (docs/, mdBook) builds, and every relative link and anchor
#      in it and in README.md resolves (scripts/check-docs.py); the book's
#      Rust examples run as the library's doctests in step 4;
#   3. the deterministic simulation: seeded fault schedules through the
#      public API on a MemoryStore under tokio's paused clock, for a fixed
#      budget (SIM_BUDGET_SECS, default 60 s), in release, with tokio's
#      seeded select! (--cfg tokio_unstable, in its own target directory)
#      so that any seed it prints replays exactly; fails on any violation;
#      then checks that twenty seeds replay identically;
#   4. unit, state-machine, real-Redis integration, end-to-end CLI and doc
#      tests (cargo test). Each starts its own redis-server processes on free
#      loopback ports;
#   5. the fault-injection smoke run: 5 instances, every fault kind, a fixed
#      seed, about 100 s; fails on any safety violation;
#   6. the library's feature matrix: without any optional feature (`tls`,
#      `metrics`), its unit tests and the integration tests of its errors
#      (what a missing feature says); the rest of the integration suite
#      runs with the defaults in step 5 and does not depend on the features;
#      and a check with all of them;
#   7. the Python package: `pip install ./crates/tenure-py` in a fresh
#      virtualenv, and its pytest suite against real servers
#      (scripts/python-tests.sh);
#   8. the published crates: the MSRV check (every locked dependency's
#      rust-version against ours) and `cargo package`, which builds each
#      packaged crate on its own, the way `cargo install` and crates.io do.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
(cd deploy/prometheus && promtool check rules tenure-alerts.yml && promtool test rules tenure-alerts.test.yml)
mdbook build docs
python3 scripts/check-docs.py
RUSTFLAGS="--cfg tokio_unstable" CARGO_TARGET_DIR=target/sim \
  cargo run --quiet --locked --release -p tenure-sim -- --budget "${SIM_BUDGET_SECS:-60}"
RUSTFLAGS="--cfg tokio_unstable" CARGO_TARGET_DIR=target/sim \
  cargo test --quiet --locked --release -p tenure-sim --test it simulation::a_seed_replays_identically
# The library's integration suite (crates/tenure/tests/it, `test = false`
# in its manifest) three tests at a time: they mostly wait on ttls. Then
# every other test, with the default thread count. One package selection
# for both, so nothing is built twice.
cargo test --workspace --locked --test integration -- --test-threads=3
cargo test --workspace --locked
# The fault-injection smoke run, with the binary those tests just built (a
# `cargo run -p tenure-chaos` would build the tree again for its features).
target/debug/tenure-chaos run --seed 7 --duration 100s --out target/chaos-smoke
cargo test --locked -p tenure --no-default-features --lib
cargo test --locked -p tenure --no-default-features --test integration -- errors::
cargo check --locked -p tenure --all-features --all-targets
scripts/python-tests.sh
scripts/msrv-check.sh
# Packaged together, so tenure-cli resolves its unpublished siblings from the
# packages just made. --allow-dirty only lets a working tree with local
# changes be packaged; CI runs on a clean clone either way.
# cargo verifies each package against its siblings' packaged sources, which
# it unpacks once per checkout path and version under CARGO_HOME and never
# again: a second run from the same path would build against the first
# run's sources. Remove those unpacked copies of our own crates first.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for crate in tenure tenure-procs redis-process tenure-cli; do
  rm -rf "$cargo_home"/registry/src/-*/"$crate"-[0-9]*
done
cargo package --locked --allow-dirty -p tenure -p tenure-procs -p redis-process -p tenure-cli
