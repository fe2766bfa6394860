#!/usr/bin/env bash
# How long `make test` takes from a fresh clone (issue 15: at most 5 minutes on the 2-core machine), measured the way
# CI meets it: for each revision, `git clone` into a new folder, then `/usr/bin/time -v make test` (setup included).
#
#   bash bench/fresh_clone_test.sh [REV ...]        (default: HEAD)
#
# Give two revisions to compare them: these machines' speed drifts by a quarter between runs of the same code, so a
# change is judged by revisions run back to back, in alternation (A B A B), never by figures from different hours.
# Prints one line per run (wall, pytest, CPU seconds, result) and keeps each run's log beside the clones. The
# public datasets are found where the tests look for them (PERFMODEL_DATASETS_DIR, else ../shared/datasets of this
# checkout). The clones use the uv cache of earlier setups, as a machine that has run `make setup` before does.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
[ $# -gt 0 ] || set -- HEAD
datasets="${PERFMODEL_DATASETS_DIR:-$(cd .. && pwd)/shared/datasets}"
work="$(mktemp -d "${TMPDIR:-/tmp}/perfmodel-fresh-clone.XXXXXX")"
echo "runs in $work (datasets: $datasets)"
n=0
for rev in "$@"; do
  n=$((n + 1))
  sha="$(git rev-parse --short "$rev")"
  clone="$work/$n-$sha"
  git clone --quiet "$repo" "$clone"
  git -C "$clone" checkout --quiet "$sha"
  log="$work/$n-$sha.log"
  status=0
  (cd "$clone" && PERFMODEL_DATASETS_DIR="$datasets" /usr/bin/time -v make test >"$log" 2>&1) || status=$?
  wall="$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log")"
  cpu="$(awk -F': ' '/User time|System time/ {s += $2} END {printf "%.0f", s}' "$log")"
  result="$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -1 | sed 's/=//g; s/^ *//')"
  echo "run $n  $sha  wall $wall  cpu ${cpu} s  exit $status  $result"
  rm -rf "$clone"
done
