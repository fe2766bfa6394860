#!/usr/bin/env bash
# Static checks, run by CI (.ci/run) before the tests: ruff (style and likely bugs), mypy (types: strict on the core,
# placement, calibration and the service; see [tool.mypy] in pyproject.toml) and import-linter (the layering
# contracts of [tool.importlinter]). Every tool runs even when one before it failed; the script fails if any did.
set -uo pipefail
cd "$(dirname "$0")/.."
venv="${PERFMODEL_VENV:-.venv}"
status=0
run() {
  echo "== $*"
  "$@" || status=1
}
run "$venv/bin/ruff" check .
run "$venv/bin/mypy"
run "$venv/bin/lint-imports"
if [ "$status" -ne 0 ]; then
  echo "lint: failed (see above)" >&2
fi
exit "$status"
