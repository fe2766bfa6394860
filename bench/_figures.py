"""The figures a bench printed, recorded for docs/accuracy.md: `docs/figures/<bench>.json` (or
`<bench>-<run>.json` for one of several runs of a bench the doc quotes), which scripts/render_accuracy.py fills the
doc's template with.

    from _figures import add_record_option, record_if_asked
    add_record_option(parser)                       # --record [RUN]
    ...
    record_if_asked(args, "fleet", {"same_gpu": {...}, ...})

A file holds {"bench": ..., "command": the command line, "date": "YYYY-MM-DD", "figures": {...}}. Names carry their
unit (`one_gpu_mape_pct`, `p99_ms`); a name holds no dot, space, colon or brace (the template's placeholders name a
value by its dotted path). Floats are kept to 4 decimals; numpy scalars become plain numbers.
`PERFMODEL_FIGURES_DIR` records elsewhere than docs/figures (a trial run that should not replace the doc's figures).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FIGURES_DIR = Path(__file__).resolve().parents[1] / "docs" / "figures"
FIGURES_DIR_ENV = "PERFMODEL_FIGURES_DIR"
NAME = re.compile(r"^[A-Za-z0-9_+-]+$")


def figure_key(name: object) -> str:
    """`name` as a figure name: every run of characters a placeholder path cannot hold becomes `_`
    (`"RTX 3090"` -> `"RTX_3090"`, `"opt-1.3b"` -> `"opt-1_3b"`)."""
    return re.sub(r"[^A-Za-z0-9_+-]+", "_", str(name)).strip("_") or "_"


def _plain(value: Any, where: str) -> Any:
    """`value` as JSON: mappings with checked names, lists, strings, booleans, ints, floats to 4 decimals."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or not NAME.match(key):
                raise ValueError(f"figure name {key!r} at {where or 'the top'}: use figure_key() (no dot, space, "
                                 f"colon or brace)")
            out[key] = _plain(item, f"{where}.{key}" if where else key)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}.{i}") for i, item in enumerate(value)]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, 4)
    raise TypeError(f"figure {where}: {type(value).__name__} is not a number, string, list or mapping")


def _without_record(argv: list[str], run: str | None) -> list[str]:
    """`argv` without `--record [RUN]` (the doc quotes the command that printed the figures)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip and arg == run:
            skip = False
            continue
        skip = arg == "--record"
        if not skip and not arg.startswith("--record="):
            out.append(arg)
    return out


def default_directory() -> Path:
    return Path(os.environ.get(FIGURES_DIR_ENV) or FIGURES_DIR)


def record(bench: str, figures: Mapping[str, Any], *, command: str | None = None, directory: Path | None = None,
           run: str | None = None) -> Path:
    """Write `figures` as `directory/<bench>.json` (`<bench>-<run>.json` with `run`) with today's date and
    `command` (default: this process's command line), atomically (a temporary file renamed over the old one).
    `directory` defaults to docs/figures (`PERFMODEL_FIGURES_DIR` overrides it)."""
    if not NAME.match(bench) or "-" in bench:
        raise ValueError(f"bench {bench!r}: the name of a bench/<bench>.py script")
    if run is not None and not NAME.match(run):
        raise ValueError(f"run {run!r}: letters, digits, _ + and - only")
    directory = Path(directory) if directory is not None else default_directory()
    if command is None:
        script = Path(sys.argv[0])
        if script.is_absolute() and script.is_relative_to(FIGURES_DIR.parents[1]):
            script = script.relative_to(FIGURES_DIR.parents[1])
        command = shlex.join([".venv/bin/python", str(script), *_without_record(sys.argv[1:], run)])
    data = {"bench": bench, "command": command, "date": datetime.date.today().isoformat(),
            "figures": _plain(figures, "")}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (f"{bench}-{run}.json" if run else f"{bench}.json")
    handle, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, ensure_ascii=False)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def add_record_option(parser: argparse.ArgumentParser) -> None:
    """`--record [RUN]`: after printing, record the figures for docs/accuracy.md (bench/_figures.py)."""
    parser.add_argument("--record", nargs="?", const="", default=None, metavar="RUN",
                        help="after printing, write the figures to docs/figures/BENCH.json (BENCH-RUN.json with RUN: "
                             "one of several runs the doc quotes); then `make docs` renders docs/accuracy.md")


def record_if_asked(args: argparse.Namespace, bench: str, figures: Mapping[str, Any]) -> Path | None:
    """`record(bench, figures)` when the command line has `--record` (its RUN, if given, names the run)."""
    if getattr(args, "record", None) is None:
        return None
    path = record(bench, figures, run=args.record or None)
    print(f"recorded {path}")
    return path
