"""Sweep files: many jobs in one YAML or JSON file, expanded as cross products.

    device: cpu            # optional, the CLI's --device wins when given
    jobs:
      - zoo: [resnet18, resnet50]
        batch_size: [8, 16, 32]
        mode: train
      - hf_config: configs/gpt2.json
        batch_size: 4
        seq_len: [128, 256]

Every list-valued field of an entry is expanded; the others are shared. Fields are those of `JobSpec.from_options`:
zoo, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError, validation_message
from perfmodel.jobs.spec import JobSpec

SWEEP_FIELDS = ("zoo", "hf_config", "task", "module", "onnx", "batch_size", "seq_len", "precision", "optimizer",
                "mode")


def load_sweep(path: str | Path) -> tuple[list[JobSpec], dict[str, Any]]:
    """The jobs of a sweep file, in file order, and its top-level settings (e.g. device)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PerfmodelError(f"cannot read sweep file {path}: {exc.strerror}") from None
    data = _parse(text, path)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise PerfmodelError(f"sweep file {path} needs a top-level 'jobs' list")
    specs: list[JobSpec] = []
    for i, entry in enumerate(data["jobs"]):
        if not isinstance(entry, dict):
            raise PerfmodelError(f"sweep file {path}: jobs[{i}] is not a mapping")
        unknown = set(entry) - set(SWEEP_FIELDS)
        if unknown:
            raise PerfmodelError(f"sweep file {path}: jobs[{i}] has unknown fields {sorted(unknown)}")
        specs.extend(_expand(entry, i, path))
    settings = {k: v for k, v in data.items() if k != "jobs"}
    return specs, settings


def _parse(text: str, path: Path) -> Any:
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise PerfmodelError(f"sweep file {path} is not valid JSON: {exc}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PerfmodelError(f"sweep file {path} is not valid YAML: {exc}".splitlines()[0]) from None


def _expand(entry: dict[str, Any], index: int, path: Path) -> list[JobSpec]:
    keys = list(entry)
    values = [v if isinstance(v, list) else [v] for v in entry.values()]
    specs = []
    for combo in itertools.product(*values):
        options = dict(zip(keys, combo))
        # file paths in a sweep are relative to the sweep file
        if isinstance(options.get("hf_config"), str):
            options["hf_config"] = path.parent / options["hf_config"]
        if isinstance(options.get("onnx"), str):
            options["onnx"] = str(path.parent / options["onnx"])
        if isinstance(options.get("module"), str) and ":" in options["module"]:
            file, _, name = options["module"].rpartition(":")
            options["module"] = f"{path.parent / file}:{name}"
        try:
            specs.append(JobSpec.from_options(**options))
        except ValidationError as exc:
            raise PerfmodelError(f"sweep file {path}: jobs[{index}]: {validation_message(exc)}") from None
    return specs


