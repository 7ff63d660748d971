#!/usr/bin/env bash
# Run every test of the workspace: unit, state-machine, real-Redis
# integration, end-to-end CLI tests and doc examples. Each test starts its
# own redis-server processes on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo test --workspace --locked
