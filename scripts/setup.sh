#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment and install perfmodel with its dev tools.
# On a machine with no NVIDIA/AMD GPU the CPU wheel of torch is pinned through constraints-cpu.txt, so no CUDA
# packages are pulled. Re-running is cheap: the install is skipped while pyproject.toml and the constraints are
# unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PERFMODEL_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"

constraints=()
if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1; then
  constraints=(-c constraints-cpu.txt)
fi
stamp="$venv/.perfmodel-setup"
want="$(cat pyproject.toml constraints-cpu.txt | sha256sum | cut -d' ' -f1) ${constraints[*]:-gpu}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${constraints[@]}" -e ".[dev]"
  echo "$want" > "$stamp"
fi
