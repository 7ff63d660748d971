#!/usr/bin/env bash
# Install what building and testing tenure needs on a fresh Debian/Ubuntu
# machine, skipping whatever is already there. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v jq >/dev/null 2>&1 || need_apt+=(jq)  # scripts/msrv-check.sh
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)   # the etcd tests' clusters
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
# The zk-process tests' ensembles: ZooKeeper's jars (it pulls in the Java
# runtime). Not zookeeperd, which would start a shared server on port 2181
# that the tests never use.
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)  # etcd-client's build
[ -f /usr/include/google/protobuf/descriptor.proto ] || need_apt+=(libprotobuf-dev)  # its well-known types
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)  # the sidecar example (examples/sidecar) runs in the tests
# The Python package's tests (scripts/python-tests.sh) run in a virtualenv.
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# The PostgreSQL tests' private servers (pg-process runs initdb and
# postgres from /usr/lib/postgresql/<version>/bin, as `nobody` when root).
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need_apt+=(postgresql)
# A pooler in transaction mode in front of them (the contract suite).
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)  # the book's curl one-liners (docs/src/serve.md), checked by the tests

if [ "${#need_apt[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${need_apt[*]} (install them with your package manager)" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "installing: ${need_apt[*]}"
  # Debian's postgresql would create and start a shared cluster on port
  # 5432; the tests start their own, so none is created.
  if [[ " ${need_apt[*]} " == *" postgresql "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    $sudo mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${need_apt[@]}" >/dev/null
fi

# The book (docs/, built by scripts/test.sh): Debian has no mdbook package,
# so it comes from crates.io, at a pinned version.
mdbook_version=0.5.4
if ! mdbook --version 2>/dev/null | grep -qx "mdbook v$mdbook_version"; then
  echo "installing: mdbook $mdbook_version"
  cargo install mdbook --locked --version "$mdbook_version"
fi

# Debian starts the packaged services on install; tenure's tests start their
# own private servers on free ports and never use the shared ones.
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$component"
  fi
done

# tenure-bench's Python peers (its peers section, and the smoke test of
# their drivers in the test suite): a virtualenv of their own, target/peers,
# with the versions pinned in crates/tenure-bench/peers/requirements.txt.
# Made again only when that file changes.
peers_requirements=crates/tenure-bench/peers/requirements.txt
peers_venv=target/peers
if ! cmp -s "$peers_requirements" "$peers_venv/requirements.txt" 2>/dev/null; then
  echo "installing: the bench's Python peers into $peers_venv"
  rm -rf "$peers_venv"
  python3 -m venv "$peers_venv"
  "$peers_venv/bin/pip" install --quiet --disable-pip-version-check -r "$peers_requirements"
  cp "$peers_requirements" "$peers_venv/requirements.txt"
fi
