"""The hardware catalog: `HardwareSpec`s by name, shipped with perfmodel and overlaid with this host's own.

Two JSON files of the same format (`{"schema_version": 1, "accelerators": [{HardwareSpec fields}, ...],
"ambiguous": {"name": ["id", "id", ...], ...}}`, `ambiguous` optional):

- `perfmodel/hardware/catalog.json`, shipped as package data (datasheet GPUs, and the `cpu` probe of the machine
  the shipped models were trained on: the corpus host, not necessarily the machine perfmodel runs on);
- `$PERFMODEL_HOME/hardware.json`, written by `save_local` (`perfmodel hw probe --save`): an entry there replaces
  the shipped entry of the same name, or adds a new one.

Look-ups (`get_accelerator`) match a name or an alias case-insensitively, with runs of spaces, `_` and `-` treated
alike ("NVIDIA A100-SXM4-40GB", "nvidia a100 sxm4 40gb"). Every `torch.cuda.get_device_name()` string of a
catalogued part is an alias of it. Files are read when asked, never at import.

A name that matches no name or alias that way, and that carries a qualifier - a memory size or a form-factor /
memory-type word (`sxm`, `sxm2` .. `sxm6`, `pcie`, `oam`, `nvl`, `hbm*`), the words people write in either order -
gets a second, looser look-up (`loose_key`): any punctuation separates words, the brand words `nvidia`, `tesla`,
`geforce`, `amd`, `radeon` and `instinct` are dropped, a memory size is one word ("80 GB", "80G" -> `80gb`), and
the qualifiers may come in any order, while the other words keep theirs. So "H100 80GB SXM5" finds the alias
"H100 SXM5 80GB", "V100 32GB SXM2" finds "Tesla V100-SXM2-32GB" and "A100-SXM-80GB" (older drivers' name) finds
"NVIDIA A100-SXM-80GB". A model name without qualifiers gets no loose look-up: bare names are where the defaults
and the ambiguous table below decide, name by name. Leading brand words do not change which part a name means, so
a bare name with them is looked up as the name without them ("NVIDIA H100" as `H100`, "Tesla P100" as the ambiguous
`P100`), exactly, and is unknown otherwise, with its close matches. The loose key applies to the `ambiguous` table first
("40GB A100" is as ambiguous as "A100 40GB"; an ambiguous name that an entry claims exactly is not), then to the
names and aliases: it answers when those it matches all lead to one entry, and raises `AmbiguousNameError` naming
them when they lead to several. A name or alias with the part's own memory size added is one more loose spelling of
it ("RTX 3090 24GB", "L40S 48GB"; `_with_own_memory`), taken only where no name or alias has that loose key; an
ambiguous name with a memory size names those of its candidates that have that much memory: "RTX 6000 48GB" is the
Ada card, "P100 16GB" is still two parts.

Short names that could mean several parts resolve one of two ways:

- a documented default, for names that the public data and most users use for one part (its `source` says
  "Default for the bare name ..."): `A100`, `A100 80GB` -> a100-sxm4-80gb (vidur's a100, DGX A100);
  `V100` -> v100-sxm2-32gb (DGX-1); `H100`, `H100 80GB`, `H100 SXM` -> h100-sxm5; `H200`, `H200 141GB` -> h200
  (SXM; the H200 NVL has 141 GB too); `GH200` -> gh200-96gb (the first part, 96 GB HBM3; the 144 GB HBM3e one is
  `GH200 144GB`); `H800` -> h800-sxm; `RTXPRO6000` (llmservingsim's folder) ->
  rtx-pro-6000-blackwell-server (the card that dataset measured). The SXM board is the default where one exists:
  it is what "H100" means in papers and clouds;
- ambiguous, for names shared by parts of different generations or with no common choice (`RTX 6000` is a
  Turing Quadro, an Ada and a Blackwell card; `A100 40GB` is sold as SXM4 and PCIe, both common): the file's
  `ambiguous` table lists them, and `get_accelerator` raises `AmbiguousNameError` naming the candidates.

An exact name or alias always wins over the ambiguous table (so a local entry can claim an ambiguous name).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from perfmodel.core.atomic import write_text_atomically
from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.settings import get_settings

CATALOG_SCHEMA_VERSION = 1
SHIPPED_FILE = "catalog.json"
LOCAL_FILE = "hardware.json"


def normalize_name(name: str) -> str:
    """The look-up key of a name or alias: lower case, runs of spaces / `_` / `-` as one `-`."""
    return re.sub(r"[\s_\-]+", "-", name.strip().lower())


# words a device name may carry or drop without naming another part ("Tesla V100-SXM2-16GB", "V100 SXM2 16GB")
BRAND_WORDS = frozenset({"nvidia", "tesla", "geforce", "amd", "radeon", "instinct"})
# words that qualify a part (memory size, board form, memory type) and that people write in any order
_QUALIFIER = re.compile(r"\d+gb|sxm\d?|pcie|oam|nvl|hbm\d?e?")


def _unbranded(key: str) -> str:
    """A look-up key (`normalize_name`) without its leading `BRAND_WORDS` ("nvidia-geforce-rtx-4090" ->
    "rtx-4090"); the key itself if nothing would be left."""
    words = key.split("-")
    while len(words) > 1 and words[0] in BRAND_WORDS:
        words = words[1:]
    return "-".join(words)


def loose_key(name: str) -> str:
    """The second-chance look-up key of a name (module docstring): its words (runs of letters and digits), lower
    case, without `BRAND_WORDS`, a memory size as one word (`80 GB`, `80G` -> `80gb`); the other words in their
    order, then `|`, then the qualifiers (memory sizes, `sxm*`, `pcie`, `oam`, `nvl`, `hbm*`) sorted. "" (no
    second look-up) for a name without qualifiers, or with nothing but qualifiers and brand words."""
    model, qualifiers = _loose_words(name)
    return f"{' '.join(model)}|{' '.join(qualifiers)}" if model and qualifiers else ""


def _loose_words(name: str) -> tuple[list[str], list[str]]:
    """(the model words in order, the qualifiers sorted) of `loose_key`."""
    words: list[str] = []
    for word in re.findall(r"[a-z0-9]+", name.lower()):
        if word in BRAND_WORDS:
            continue
        if word in ("gb", "g") and words and words[-1].isdigit():
            words[-1] += "gb"
            continue
        words.append(re.sub(r"^(\d+)g$", r"\1gb", word))
    model = [w for w in words if not _QUALIFIER.fullmatch(w)]
    qualifiers = sorted(w for w in words if _QUALIFIER.fullmatch(w))
    return model, qualifiers


class AmbiguousNameError(UnknownNameError):
    """A name that several catalog entries answer to (`RTX 6000`): the message and `candidates` list them."""

    def __init__(self, what: str, name: str, candidates: Iterable[str]):
        candidates = list(candidates)
        PerfmodelError.__init__(self, f"ambiguous {what} {name!r}: it names {len(candidates)} parts; "
                                      f"use one of: {', '.join(candidates)}")
        self.name = name
        self.candidates = candidates
        self.close_matches = candidates


def parse_catalog(text: str, where: str) -> list[HardwareSpec]:
    """The entries of one catalog file's text; `where` names the file in error messages."""
    return _parse_file(text, where)[0]


def parse_ambiguous(text: str, where: str) -> dict[str, tuple[str, ...]]:
    """The `ambiguous` table of one catalog file's text: each name as written -> the ids it may mean."""
    return _parse_file(text, where)[1]


def _parse_file(text: str, where: str) -> tuple[list[HardwareSpec], dict[str, tuple[str, ...]]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PerfmodelError(f"hardware catalog {where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") != CATALOG_SCHEMA_VERSION:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise PerfmodelError(f"hardware catalog {where}: schema_version {found!r} is not supported "
                             f"(expected {CATALOG_SCHEMA_VERSION})")
    unknown_keys = set(data) - {"schema_version", "accelerators", "ambiguous"}
    if unknown_keys:
        raise PerfmodelError(f"hardware catalog {where}: unknown top-level keys {sorted(unknown_keys)}")
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
    ambiguous = _check_ambiguous(data.get("ambiguous", {}), specs, where)
    return specs, ambiguous


def dump_catalog(specs: Iterable[HardwareSpec], ambiguous: Mapping[str, Iterable[str]] | None = None) -> str:
    """Catalog file text for `specs` (sorted by name) and an optional `ambiguous` table, the format
    `parse_catalog` reads."""
    entries = [spec.model_dump(mode="json") for spec in sorted(specs, key=lambda s: s.name)]
    data: dict[str, object] = {"schema_version": CATALOG_SCHEMA_VERSION, "accelerators": entries}
    if ambiguous:
        data["ambiguous"] = {name: list(ids) for name, ids in sorted(ambiguous.items())}
    return json.dumps(data, indent=2) + "\n"


def shipped_specs() -> list[HardwareSpec]:
    """The entries shipped with perfmodel."""
    return parse_catalog(_shipped_text(), f"perfmodel/hardware/{SHIPPED_FILE}")


def shipped_ambiguous() -> dict[str, tuple[str, ...]]:
    """The shipped `ambiguous` table: each name as written -> the ids it may mean (read once, then cached)."""
    return dict(_shipped_ambiguous())


@functools.cache
def _shipped_ambiguous() -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(parse_ambiguous(_shipped_text(), f"perfmodel/hardware/{SHIPPED_FILE}").items())


def _shipped_text() -> str:
    return resources.files("perfmodel.hardware").joinpath(SHIPPED_FILE).read_text(encoding="utf-8")


def local_catalog_path() -> Path:
    """`$PERFMODEL_HOME/hardware.json`: this host's entries (may not exist)."""
    return get_settings().home / LOCAL_FILE


def local_specs(path: Path | None = None) -> list[HardwareSpec]:
    """The entries of the local file; none when it does not exist."""
    return _read_local(path)[0]


def _read_local(path: Path | None = None) -> tuple[list[HardwareSpec], dict[str, tuple[str, ...]]]:
    path = path or local_catalog_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], {}
    return _parse_file(text, str(path))


def ambiguous_names(local_path: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Look-up key -> the ids an ambiguous name may mean: the shipped table, overlaid by the local file's."""
    table = {normalize_name(name): ids for name, ids in _shipped_ambiguous()}
    table.update({normalize_name(name): ids for name, ids in _read_local(local_path)[1].items()})
    return table


def load_catalog(local_path: Path | None = None) -> dict[str, HardwareSpec]:
    """Every known accelerator by name: the shipped entries, overlaid by the local file's (same name: local wins)."""
    catalog = {spec.name: spec for spec in shipped_specs()}
    for spec in local_specs(local_path):
        catalog[spec.name] = spec
    return catalog


def get_accelerator(name: str, catalog: Mapping[str, HardwareSpec] | None = None) -> HardwareSpec:
    """The entry whose name or alias is `name` (case-insensitive), else the one its `loose_key` leads to (module
    docstring). A name the catalog declares ambiguous (`RTX 6000`), or a loose key several entries share:
    `AmbiguousNameError` listing the candidates in `catalog`. Unknown: `UnknownNameError` with close matches.
    `catalog` defaults to `load_catalog()`; pass one to avoid re-reading the files in a loop."""
    catalog = load_catalog() if catalog is None else catalog
    exact = catalog.get(name)
    if exact is not None and exact.name == name:  # an entry's own name (names are unique keys): no index needed
        return exact
    index = _index(catalog.values())
    key = normalize_name(name)
    table = ambiguous_names()
    for bare in dict.fromkeys((key, _unbranded(key))):  # the name, then without leading brand words
        if bare in index:
            return index[bare]
        candidates = [entry for entry in table.get(bare, ()) if entry in catalog]
        if candidates:
            raise AmbiguousNameError("accelerator", name.strip(), candidates)
    loose = loose_key(name)
    if loose:  # the second chance, for names with a qualifier: brand words, punctuation, the qualifiers' order
        loose_table: dict[str, list[str]] = {}
        sized_table: dict[str, list[str]] = {}  # an ambiguous name with a candidate's memory size: those of that size
        for ambiguous_key, ids in table.items():
            if ambiguous_key not in index:  # a name an entry claims is not ambiguous, however it is spelled
                merged = loose_table.setdefault(loose_key(ambiguous_key), [])
                merged.extend(i for i in ids if i not in merged)
                for i in ids:
                    sized = _with_own_memory(ambiguous_key, catalog[i]) if i in catalog else ""
                    if sized:
                        sized_table.setdefault(sized, []).append(i)
        candidates = [entry for entry in loose_table.get(loose, ()) if entry in catalog]
        if candidates:  # "40GB A100" is as ambiguous as "A100 40GB"
            raise AmbiguousNameError("accelerator", name.strip(), candidates)
        candidates = list(dict.fromkeys(sized_table.get(loose, ())))
        if len(candidates) == 1:  # "RTX 6000 48GB": the one part of that name with that memory
            return catalog[candidates[0]]
        if candidates:  # "P100 16GB": two of the three P100s
            raise AmbiguousNameError("accelerator", name.strip(), candidates)
        owners = _loose_index(catalog.values(), index).get(loose, {})
        if len(owners) == 1:
            return next(iter(owners.values()))
        if owners:
            raise AmbiguousNameError("accelerator", name.strip(), list(owners))
    known = {*catalog, *(alias for spec in catalog.values() for alias in spec.aliases)}
    error = UnknownNameError("accelerator", name, known)
    close = close_names(name, catalog.values())
    if close:  # case- and separator-blind, so "nvidia h100" finds "NVIDIA H100 PCIe"
        error.close_matches = close
        error.args = (f"unknown accelerator {name!r}; did you mean: {', '.join(close)}?",)
    raise error


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
    specs, ambiguous = _read_local(path)
    kept = [s for s in specs if s.name != spec.name]
    text = dump_catalog([*kept, spec], ambiguous)
    parse_catalog(text, str(path))  # refuse to write a file that would not load (e.g. a clashing alias)
    return write_text_atomically(path, text)


def _index(specs: Iterable[HardwareSpec]) -> dict[str, HardwareSpec]:
    """Look-up key -> entry. Names win over aliases; among aliases, later entries (the local file's) win."""
    specs = list(specs)
    index = {normalize_name(alias): spec for spec in specs for alias in spec.aliases}
    index.update({normalize_name(spec.name): spec for spec in specs})
    return index


def _loose_index(specs: Iterable[HardwareSpec],
                 index: Mapping[str, HardwareSpec]) -> dict[str, dict[str, HardwareSpec]]:
    """Loose key -> the entries (by name) that the names and aliases with that key lead to, each through the exact
    look-up (`index`: names over aliases, the local file's over the shipped), so a local entry that takes over an
    alias takes over its loose spellings too."""
    loose: dict[str, dict[str, HardwareSpec]] = {}
    sized: dict[str, dict[str, HardwareSpec]] = {}  # names given the part's own memory size: where no name leads
    for spec in specs:
        for written in (spec.name, *spec.aliases):
            owner = index[normalize_name(written)]
            key = loose_key(written)
            if key:
                loose.setdefault(key, {})[owner.name] = owner
            with_memory = _with_own_memory(written, owner)
            if with_memory:
                sized.setdefault(with_memory, {})[owner.name] = owner
    return {**sized, **loose}


def _with_own_memory(written: str, spec: HardwareSpec) -> str:
    """The loose key of `written` with its part's memory size added ("RTX 3090" -> the key of "RTX 3090 24GB"), so
    that a name people write with the memory size the part has finds it; "" when `written` already names a memory
    size or the part's size is not a whole number of GB."""
    memory_gb = spec.memory_gb
    _, qualifiers = _loose_words(written)
    if memory_gb is None or memory_gb != int(memory_gb) or any(w.endswith("gb") for w in qualifiers):
        return ""
    return loose_key(f"{written} {int(memory_gb)}GB")


def _check_unique(specs: list[HardwareSpec], where: str) -> None:
    """Within one file, every name and alias must lead to one entry."""
    owner: dict[str, str] = {}
    for spec in specs:
        for key in {normalize_name(spec.name), *(normalize_name(a) for a in spec.aliases)}:
            if owner.setdefault(key, spec.name) != spec.name:
                raise PerfmodelError(f"hardware catalog {where}: {key!r} names both {owner[key]!r} and {spec.name!r}")


def _check_ambiguous(table: object, specs: list[HardwareSpec], where: str) -> dict[str, tuple[str, ...]]:
    """The `ambiguous` table, checked: each name lists two or more distinct ids and is nobody's name or alias in
    this file (a name that is an alias is not ambiguous)."""
    if not isinstance(table, dict):
        raise PerfmodelError(f"hardware catalog {where}: 'ambiguous' must map names to lists of catalog ids")
    owner = {normalize_name(a): spec.name for spec in specs for a in (spec.name, *spec.aliases)}
    seen: dict[str, str] = {}
    checked: dict[str, tuple[str, ...]] = {}
    for name, ids in table.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids) or len(set(ids)) < 2:
            raise PerfmodelError(f"hardware catalog {where}: ambiguous name {name!r} must list two or more "
                                 f"distinct catalog ids")
        key = normalize_name(name)
        if key in owner:
            raise PerfmodelError(f"hardware catalog {where}: ambiguous name {name!r} is also a name or alias of "
                                 f"{owner[key]!r}")
        if seen.setdefault(key, name) != name:
            raise PerfmodelError(f"hardware catalog {where}: ambiguous names {seen[key]!r} and {name!r} are the "
                                 f"same look-up key")
        checked[name] = tuple(dict.fromkeys(ids))
    return checked
