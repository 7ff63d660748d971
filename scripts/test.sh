#!/usr/bin/env bash
# Run every test of the project: the Prometheus alert rules' unit tests,
# then unit, state-machine, real-Redis integration, end-to-end CLI and doc
# tests. Each Rust test starts its own redis-server processes on free
# loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
(cd deploy/prometheus && promtool check rules tenure-alerts.yml && promtool test rules tenure-alerts.test.yml)
cargo test --workspace --locked
