#!/usr/bin/env bash
# MSRV check for the published crates: every locked dependency a published
# crate builds with (normal and build dependencies, followed transitively;
# dev-dependencies are not part of what users build) must declare a
# rust-version no newer than the crate's own `rust-version`.
#
# This machine has a single toolchain, so the check reads the lockfile
# rather than building with the old compiler. What it does not see, clippy
# does: `clippy::incompatible_msrv` flags standard-library items newer than
# the manifest's rust-version in our own code.
set -euo pipefail
cd "$(dirname "$0")/.."

published=(tenure tenure-procs redis-process tenure-cli)
host=$(rustc -vV | sed -n 's/^host: //p')
meta=$(cargo metadata --format-version 1 --locked --filter-platform "$host")

# 1.88 -> 1.88.0, for comparisons with sort -V.
normalize() {
  local major minor patch
  IFS=. read -r major minor patch <<<"$1"
  echo "$major.${minor:-0}.${patch:-0}"
}

status=0
for crate in "${published[@]}"; do
  report=$(jq -r --arg crate "$crate" '
    (.packages | map({key: .id, value: .}) | from_entries) as $pkgs
    | (.resolve.nodes
       | map({key: .id,
              value: [.deps[] | select(any(.dep_kinds[]; .kind != "dev")) | .pkg]})
       | from_entries) as $deps
    | ([.packages[] | select(.name == $crate and .source == null) | .id][0]) as $root
    | def reach($seen; $todo):
        if ($todo | length) == 0 then $seen
        elif $seen[$todo[0]] then reach($seen; $todo[1:])
        else reach($seen + {($todo[0]): true}; $todo[1:] + $deps[$todo[0]])
        end;
      "own \($pkgs[$root].rust_version // "none")",
      (reach({}; [$root]) | keys[] | $pkgs[.]
       | select(.rust_version != null and .source != null)
       | "dep \(.rust_version) \(.name) \(.version)")
  ' <<<"$meta")
  own=$(sed -n 's/^own //p' <<<"$report")
  newest=$(sed -n 's/^dep //p' <<<"$report" | sort -V | tail -1)
  needed=${newest%% *}
  if [ "$own" = none ]; then
    echo "msrv: $crate declares no rust-version" >&2
    status=1
  elif [ -n "$newest" ] && [ "$(printf '%s\n%s\n' "$(normalize "$needed")" "$(normalize "$own")" | sort -V | tail -1)" != "$(normalize "$own")" ]; then
    echo "msrv: $crate declares rust-version $own, but the lockfile's ${newest#* } needs $needed" >&2
    status=1
  else
    echo "msrv: $crate rust-version $own (newest dependency requirement: ${newest:-none})"
  fi
done
exit "$status"
