"""The hardware catalog: `HardwareSpec`s by name, shipped with perfmodel and overlaid with this host's own.

Two JSON files of the same format (`{"schema_version": 1, "accelerators": [{HardwareSpec fields}, ...]}`):

- `perfmodel/hardware/catalog.json`, shipped as package data (datasheet GPUs, and the `cpu` probe of the machine
  the shipped models were trained on);
- `$PERFMODEL_HOME/hardware.json`, written by `save_local` (`perfmodel hw probe --save`): an entry there replaces
  the shipped entry of the same name, or adds a new one.

Look-ups (`get_accelerator`) match a name or an alias case-insensitively, with runs of spaces, `_` and `-` treated
alike ("NVIDIA A100-SXM4-40GB", "nvidia a100 sxm4 40gb"). Files are read when asked, never at import.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from perfmodel.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.settings import get_settings

CATALOG_SCHEMA_VERSION = 1
SHIPPED_FILE = "catalog.json"
LOCAL_FILE = "hardware.json"


def normalize_name(name: str) -> str:
    """The look-up key of a name or alias: lower case, runs of spaces / `_` / `-` as one `-`."""
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


def parse_catalog(text: str, where: str) -> list[HardwareSpec]:
    """The entries of one catalog file's text; `where` names the file in error messages."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PerfmodelError(f"hardware catalog {where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") != CATALOG_SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise PerfmodelError(f"hardware catalog {where}: schema_version {found!r} is not supported "
                             f"(expected {CATALOG_SCHEMA_VERSION})")
    entries = data.get("accelerators")
    if not isinstance(entries, list):
        raise PerfmodelError(f"hardware catalog {where}: 'accelerators' must be a list of entries")
    specs = []
    for i, entry in enumerate(entries):
        try:
            specs.append(HardwareSpec.model_validate(entry))
        except ValidationError as exc:
            label = entry.get("name", f"#{i}") if isinstance(entry, dict) else f"#{i}"
            raise PerfmodelError(f"hardware catalog {where}: entry {label!r} is invalid: {exc}") from None
    _check_unique(specs, where)
    return specs


def dump_catalog(specs: Iterable[HardwareSpec]) -> str:
    """Catalog file text for `specs` (sorted by name), the format `parse_catalog` reads."""
    entries = [spec.model_dump(mode="json") for spec in sorted(specs, key=lambda s: s.name)]
    return json.dumps({"schema_version": CATALOG_SCHEMA_VERSION, "accelerators": entries}, indent=2) + "\n"


def shipped_specs() -> list[HardwareSpec]:
    """The entries shipped with perfmodel."""
    text = resources.files("perfmodel.hardware").joinpath(SHIPPED_FILE).read_text(encoding="utf-8")
    return parse_catalog(text, f"perfmodel/hardware/{SHIPPED_FILE}")


def local_catalog_path() -> Path:
    """`$PERFMODEL_HOME/hardware.json`: this host's entries (may not exist)."""
    return get_settings().home / LOCAL_FILE


def local_specs(path: Path | None = None) -> list[HardwareSpec]:
    """The entries of the local file; none when it does not exist."""
    path = path or local_catalog_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return parse_catalog(text, str(path))


def load_catalog(local_path: Path | None = None) -> dict[str, HardwareSpec]:
    """Every known accelerator by name: the shipped entries, overlaid by the local file's (same name: local wins)."""
    catalog = {spec.name: spec for spec in shipped_specs()}
    for spec in local_specs(local_path):
        catalog[spec.name] = spec
    return catalog


def get_accelerator(name: str, catalog: Mapping[str, HardwareSpec] | None = None) -> HardwareSpec:
    """The entry whose name or alias is `name` (case-insensitive). Unknown: `UnknownNameError` with close matches.
    `catalog` defaults to `load_catalog()`; pass one to avoid re-reading the files in a loop."""
    catalog = load_catalog() if catalog is None else catalog
    index = _index(catalog.values())
    try:
        return index[normalize_name(name)]
    except KeyError:
        known = {*catalog, *(alias for spec in catalog.values() for alias in spec.aliases)}
        error = UnknownNameError("accelerator", name, known)
        close = close_names(name, catalog.values())
        if close:  # case- and separator-blind, so "nvidia h100" finds "NVIDIA H100 PCIe"
            error.close_matches = close
            error.args = (f"unknown accelerator {name!r}; did you mean: {', '.join(close)}?",)
        raise error from None


def close_names(name: str, specs: Iterable[HardwareSpec], n: int = 5) -> list[str]:
    """Up to `n` names or aliases closest to `name`, one per entry, compared as look-up keys: those containing it
    first (shortest first), then difflib's nearest."""
    specs = list(specs)
    shown: dict[str, tuple[str, str]] = {}  # look-up key -> (name or alias as written, entry)
    for spec in specs:
        shown.setdefault(normalize_name(spec.name), (spec.name, spec.name))
    for spec in specs:
        for alias in spec.aliases:
            shown.setdefault(normalize_name(alias), (alias, spec.name))
    key = normalize_name(name)
    containing = sorted((k for k in shown if key and key in k), key=lambda k: (len(k), k))
    similar = difflib.get_close_matches(key, list(shown), n=4 * n, cutoff=0.6)
    close: dict[str, str] = {}  # entry -> name or alias shown for it
    for k in [*containing, *similar]:
        written, entry = shown[k]
        close.setdefault(entry, entry if key and key in normalize_name(entry) else written)
    return list(close.values())[:n]


def save_local(spec: HardwareSpec, path: Path | None = None) -> Path:
    """Add `spec` to the local file, replacing an entry of the same name; returns the file's path."""
    path = path or local_catalog_path()
    kept = [s for s in local_specs(path) if s.name != spec.name]
    text = dump_catalog([*kept, spec])
    parse_catalog(text, str(path))  # refuse to write a file that would not load (e.g. a clashing alias)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
    return path


def _index(specs: Iterable[HardwareSpec]) -> dict[str, HardwareSpec]:
    """Look-up key -> entry. Names win over aliases; among aliases, later entries (the local file's) win."""
    specs = list(specs)
    index = {normalize_name(alias): spec for spec in specs for alias in spec.aliases}
    index.update({normalize_name(spec.name): spec for spec in specs})
    return index


def _check_unique(specs: list[HardwareSpec], where: str) -> None:
    """Within one file, every name and alias must lead to one entry."""
    owner: dict[str, str] = {}
    for spec in specs:
        for key in {normalize_name(spec.name), *(normalize_name(a) for a in spec.aliases)}:
            if owner.setdefault(key, spec.name) != spec.name:
                raise PerfmodelError(f"hardware catalog {where}: {key!r} names both {owner[key]!r} and {spec.name!r}")
