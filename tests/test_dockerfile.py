"""The Dockerfile's promises, checked by reading it (no Docker daemon here): a CPU base by default, the service as
the command, a non-root user, a health check on /healthz, and build inputs that exist and are not .dockerignored."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped and continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends in a continuation line"
    return out


def args_of(keyword: str) -> list[str]:
    return [args for kw, args in instructions() if kw == keyword]


def build_args() -> dict[str, str]:
    found = {}
    for args in args_of("ARG"):
        name, _, default = args.partition("=")
        found[name] = default.strip('"')
    return found


def env() -> dict[str, str]:
    found = {}
    for args in args_of("ENV"):
        for item in shlex.split(args):
            name, _, value = item.partition("=")
            found[name] = value
    return found


def test_the_default_base_is_a_cpu_python_image_and_a_cuda_base_is_only_an_argument():
    assert args_of("FROM") == ["${BASE_IMAGE}"]
    base = build_args()["BASE_IMAGE"]
    assert base.startswith("python:3.") and "slim" in base
    assert not re.search("cuda|nvidia|rocm", base, re.I)
    text = (ROOT / "Dockerfile").read_text()
    assert "--build-arg BASE_IMAGE=nvidia/cuda:" in text  # the CUDA build command is documented


def test_torch_is_pinned_to_the_cpu_wheel_by_default():
    constraints = build_args()["TORCH_CONSTRAINTS"]
    assert "+cpu" in (ROOT / constraints).read_text()
    install = next(run for run in args_of("RUN") if "pip install" in run)
    assert '-c "$TORCH_CONSTRAINTS"' in install
    assert "[dev]" not in install and "-e " not in install  # the package itself, no dev tools, not editable


def test_it_runs_the_service_as_a_non_root_user():
    ordered = instructions()
    keywords = [kw for kw, _ in ordered]
    users = [args for kw, args in ordered if kw == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert keywords.index("USER") < keywords.index("CMD")
    last_user = max(i for i, kw in enumerate(keywords) if kw == "USER")
    creates_user = next(i for i, (kw, args) in enumerate(ordered) if kw == "RUN" and "useradd" in args)
    assert creates_user < last_user < keywords.index("CMD")
    cmd = json.loads(args_of("CMD")[-1])
    assert cmd[:2] == ["perfmodel", "serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    port = cmd[cmd.index("--port") + 1]
    assert args_of("EXPOSE") == [port]
    assert "ENTRYPOINT" not in keywords


def test_the_health_check_asks_the_service_healthz_with_the_python_standard_library():
    (check,) = args_of("HEALTHCHECK")
    options, _, command = check.partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    argv = json.loads(command)
    assert argv[:2] == ["python", "-c"]
    port = json.loads(args_of("CMD")[-1])[-1]
    assert f"http://127.0.0.1:{port}/healthz" in argv[2]
    compile(argv[2], "<healthcheck>", "exec")  # valid Python; urllib needs nothing a slim image lacks


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    return any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern.lstrip("/"))
               for pattern in patterns for i in range(len(parts)))


def test_every_copy_source_exists_and_is_not_dockerignored():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert {".venv", ".git"} <= set(patterns)
    copies = args_of("COPY")
    assert copies
    for copy in copies:
        *sources, _destination = [part for part in copy.split() if not part.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY source {source} is not in the repository"
            assert not _ignored(source, patterns), f"COPY source {source} is excluded by .dockerignore"


@pytest.mark.parametrize("needed", ["perfmodel", "models", "pyproject.toml", "README.md", "constraints-cpu.txt"])
def test_the_image_gets_the_package_and_the_shipped_models(needed):
    copied = {source for copy in args_of("COPY") for source in copy.split()[:-1]}
    assert needed in copied


def test_the_registry_is_pointed_at_the_copied_models():
    (workdir,) = args_of("WORKDIR")
    models_copy = next(copy for copy in args_of("COPY") if copy.split()[0] == "models")
    destination = Path(workdir) / models_copy.split()[-1]
    assert Path(env()["PERFMODEL_MODELS_DIR"]) == destination
    assert (ROOT / "models" / "promoted.json").exists()
