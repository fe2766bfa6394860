#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment and install perfmodel with its dev tools.
# On a machine with no NVIDIA/AMD GPU the CPU wheel of torch is pinned through constraints-cpu.txt, so no CUDA
# packages are pulled. Re-running is cheap: the install is skipped while pyproject.toml and the constraints are
# unchanged.
#
# The install goes through uv (`uv pip install`, put into the venv by pip first): from a fresh clone it takes about
# half a minute here where pip takes four (pip resolves and unpacks one package at a time). uv does not read pip's
# configuration, so the indexes, find-links and constraint files pip is configured with (pip.conf, PIP_* variables)
# are handed to it as options. Where uv cannot be installed or fails, pip does the same install.
# PERFMODEL_INSTALLER=pip forces pip.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PERFMODEL_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"

constraints=()
if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1; then
  constraints=(-c constraints-cpu.txt)
fi

# pip's configured sources as uv options, one per line ("--find-links=/opt/wheels", "--constraint=...").
uv_options_from_pip() {
  "$venv/bin/python" -m pip config list 2>/dev/null | "$venv/bin/python" -c '
import shlex, sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
seen = set()
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    flag = flags.get(key.rpartition(".")[2])
    if not flag:
        continue
    for item in shlex.split(value):  # pip quotes values; lists are space-separated
        for part in item.split():
            if (flag, part) not in seen:
                seen.add((flag, part))
                print(f"{flag}={part}")
'
}

install_with_uv() {
  [ "${PERFMODEL_INSTALLER:-uv}" = uv ] || return 1
  if [ ! -x "$venv/bin/uv" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 || return 1
  fi
  local options=() line cert
  while IFS= read -r line; do options+=("$line"); done < <(uv_options_from_pip)
  cert="${PIP_CERT:-$("$venv/bin/python" -m pip config get global.cert 2>/dev/null || true)}"
  if [ -z "${SSL_CERT_FILE:-}" ] && [ -n "$cert" ]; then export SSL_CERT_FILE="$cert"; fi  # pip's CA bundle
  # like pip: every index is searched and the best version wins (uv stops at the first index that has a name).
  # No --compile-bytecode: compiling every installed module is most of a fresh setup (33 s of 42 s here), and a run
  # imports about a third of them; `make` lets Python cache the bytecode of what it imports (see the Makefile).
  "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --index-strategy unsafe-best-match \
    "${options[@]}" "${constraints[@]}" -e ".[dev]"
}

stamp="$venv/.perfmodel-setup"
want="$(cat pyproject.toml constraints-cpu.txt | sha256sum | cut -d' ' -f1) ${constraints[*]:-gpu}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if ! install_with_uv; then
    [ "${PERFMODEL_INSTALLER:-uv}" = uv ] && echo "setup: uv could not install; falling back to pip" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${constraints[@]}" -e ".[dev]"
  fi
  echo "$want" > "$stamp"
fi
