#!/usr/bin/env bash
# Build tenure and run `tenure demo` on a private redis-server (installed
# with apt-get if missing). Extra arguments go to `tenure demo`, e.g.
# `scripts/demo.sh --redis redis://127.0.0.1:6379`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo run --quiet --release --locked -p tenure-cli -- demo "$@"
