#!/usr/bin/env bash
# The Python package (crates/tenure-py): install it the way a user does,
# `pip install ./crates/tenure-py`, in a fresh virtualenv, then run its
# pytest suite against private redis-server and etcd processes.
#
# The wheel is built in cargo's dev profile, on the workspace's target
# directory, so that CI compiles the library once more at most (users get
# the release profile, pip's default). maturin itself comes from the
# package index as the package's build requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r crates/tenure-py/requirements-test.txt
MATURIN_PEP517_ARGS="--profile dev" \
  "$venv/bin/pip" install --quiet --disable-pip-version-check ./crates/tenure-py
cd crates/tenure-py
"../../$venv/bin/python" -m pytest -q
