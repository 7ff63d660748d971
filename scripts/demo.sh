#!/usr/bin/env bash
# Build tenure and run `tenure demo`.
#
# With no arguments the demo runs on a temporary SQLite file (SQLite is
# built into tenure): nothing to install but the Rust toolchain, since the
# command is built without its etcd and ZooKeeper support (etcd's client
# needs protoc to build). With arguments, e.g.
# `scripts/demo.sh --store redis://127.0.0.1:6379`, what the tests need is
# installed first (apt-get) and the whole command is built.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
  exec cargo run --quiet --release --locked -p tenure-cli --no-default-features -- demo
fi
scripts/install-deps.sh
exec cargo run --quiet --release --locked -p tenure-cli -- demo "$@"
