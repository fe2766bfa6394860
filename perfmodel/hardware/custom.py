"""Custom accelerators: hardware a team has but the catalog lacks, described by a spec sheet the user gives.

A spec sheet is YAML or JSON holding `HardwareSpec` fields. Numbers may be given bare (in the field's unit, the one
its name says: `memory_bandwidth_gb_s` in GB/s) or as text with a unit that converts to it ("3.35 TB/s",
"989 TFLOP/s", "80 GB", "1.98 GHz", "700 W", "400 Gb/s"); a unit of another quantity is an error naming the field.
Checks, each naming its field:
- the schema's own (types, > 0, known fields only: an unknown field is named with the known one it is closest to,
  together with any required field missing, so a misspelled field is named even when it leaves one missing);
- plausible ranges (`check_plausible`: no 10^30 GFLOP/s, `MAX_VALUES`; and, for GPUs, no unit slips below any
  real part, `MIN_GPU_VALUES`: `peak_fp32_gflops: 60` meant 60 TFLOP/s);
- what each use needs (`REQUIRED_BY_KIND`: a GPU is predicted by the per-op device model from its fp32 peak,
  memory bandwidth and size and compute units). Custom entries are GPUs: the CPU model knows only the host it
  was trained on, so a CPU spec sheet could not be predicted;
- a name or alias that the shipped catalog (or this host's local file) already answers to is a clash
  (`AcceleratorClash`): a custom entry never shadows a catalogued part.

Custom entries live in the store (`perfmodel.store.accelerators`), so every replica of the service sees them;
`LiveCatalog` is the catalog predictions use: the shipped entries plus the store's. Their `source` starts with
`CUSTOM_SOURCE_PREFIX`, and predictions for them are flagged `extrapolated` with `CUSTOM_REASON`: nobody measured
the part, and fields the sheet leaves out are imputed (`perfmodel.hardware.impute`).
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.renamed import upgrade_names
from perfmodel.hardware.catalog import normalize_name
from perfmodel.hardware.spec import HardwareSpec

CUSTOM_SOURCE_PREFIX = "custom accelerator: "
CUSTOM_REASON = "custom accelerator: spec sheet given by the user, no measurements"
DEFAULT_SOURCE = "spec sheet given by the user"

# fields each kind needs beyond the schema's required ones (those a prediction for it reads)
REQUIRED_BY_KIND: dict[str, tuple[str, ...]] = {
    "gpu": ("peak_fp32_gflops", "memory_bandwidth_gb_s", "memory_gb", "compute_units"),
}
# upper bounds of plausible values, in the field's unit (about 100x today's largest parts)
MAX_VALUES: dict[str, float] = {
    **dict.fromkeys(("peak_fp32_gflops", "peak_fp32_matrix_gflops", "peak_tf32_gflops", "peak_fp16_gflops",
                     "peak_bf16_gflops", "peak_fp8_gflops", "peak_fp64_gflops"), 1e9),  # 1 EFLOP/s
    "memory_bandwidth_gb_s": 1e6, "memory_gb": 1e5, "l2_cache_mb": 1e5, "compute_units": 1e6,
    "fp32_cores_per_cu": 1e4, "threads": 1e6, "boost_clock_mhz": 1e5, "base_clock_mhz": 1e5, "tdp_w": 1e5,
    "interconnect_bidir_gb_s": 1e6, "node_devices": 1024, "node_network_gbit_s": 1e6,
}
# lower bounds of plausible GPU values: (minimum in the field's unit, that unit, the unit 1000x larger). Below them
# is a unit slip (60 GFLOP/s for 60 TFLOP/s); every GPU of the shipped catalog is well above them (fp64 peaks are
# left out: a consumer part's may be 1/64 of its fp32)
MIN_GPU_VALUES: dict[str, tuple[float, str, str]] = {
    **dict.fromkeys(("peak_fp32_gflops", "peak_fp32_matrix_gflops", "peak_tf32_gflops", "peak_fp16_gflops",
                     "peak_bf16_gflops", "peak_fp8_gflops"), (100.0, "GFLOP/s", "TFLOP/s")),
    "memory_bandwidth_gb_s": (10.0, "GB/s", "TB/s"), "memory_gb": (0.5, "GB", "TB"),
}

# field suffix -> {unit as written, lower case: factor to the field's unit}
_UNITS: dict[str, dict[str, float]] = {
    "_gflops": {"gflop/s": 1.0, "gflops": 1.0, "tflop/s": 1e3, "tflops": 1e3, "pflop/s": 1e6, "pflops": 1e6,
                "mflop/s": 1e-3, "mflops": 1e-3},
    "_gb_s": {"gb/s": 1.0, "gbps": 1.0, "tb/s": 1e3, "tbps": 1e3, "mb/s": 1e-3},
    # memory sizes are binary, as spec sheets write them ("80GB" is 80 GiB): GB and GiB are one unit here
    "_gb": {"gb": 1.0, "gib": 1.0, "tb": 1024.0, "tib": 1024.0, "mb": 1 / 1024, "mib": 1 / 1024},
    "_mb": {"mb": 1.0, "kb": 1e-3, "gb": 1e3, "mib": 2**20 / 1e6, "kib": 2**10 / 1e6},
    "_mhz": {"mhz": 1.0, "ghz": 1e3},
    "_w": {"w": 1.0, "kw": 1e3},
    "_gbit_s": {"gb/s": 1.0, "gbit/s": 1.0, "gbps": 1.0, "tb/s": 1e3, "tbit/s": 1e3},
}
_QUANTITY = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]+)?\s*$")


class SpecSheetError(PerfmodelError):
    """A spec sheet that does not describe an accelerator; `loc` names the field (CLI exit 2, HTTP 422)."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        where = ".".join(str(part) for part in loc)
        super().__init__(f"{where}: {message}" if where else message)
        self.loc = loc
        self.detail = message


class AcceleratorClash(PerfmodelError):
    """A custom accelerator whose name or alias the catalog (or another custom entry) already uses (HTTP 409)."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


def parse_spec_sheet(text: str | bytes, where: str = "spec sheet") -> dict[str, Any]:
    """The fields of a YAML or JSON spec sheet (JSON is YAML); an error naming `where` if it is not a mapping."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecSheetError((), f"{where} is neither YAML nor JSON ({first})") from None
    if not isinstance(data, dict):
        raise SpecSheetError((), f"{where} must be a mapping of HardwareSpec fields (name, kind, peak_fp32_gflops, "
                                 f"...), got {type(data).__name__}")
    return data


def _converted(field: str, value: Any) -> Any:
    """`value` in the field's unit: numbers as given, "3.35 TB/s" converted; an error for a unit of another kind."""
    if not isinstance(value, str):
        return value
    suffix = next((s for s in _UNITS if field.endswith(s)), None)
    if suffix is None:
        return value
    match = _QUANTITY.match(value)
    if match is None:
        raise SpecSheetError((field,), f"{value!r} is not a number with a unit (e.g. 3.35 TB/s, 80 GB)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if not unit:
        return number
    factor = _UNITS[suffix].get(unit)
    if factor is None:
        raise SpecSheetError((field,), f"unit {match.group(2)!r} does not convert to this field's unit; use one of: "
                                       f"{', '.join(_UNITS[suffix])}")
    return number * factor


def validate_spec_sheet(data: Mapping[str, Any], catalog: Mapping[str, HardwareSpec] | None = None) -> HardwareSpec:
    """The `HardwareSpec` a spec sheet describes, checked (module docstring). `catalog` (default: the shipped and
    local entries) is what it must not clash with. Its `source` is marked as custom."""
    if not isinstance(data, Mapping):
        raise SpecSheetError((), "a spec sheet must be a mapping of HardwareSpec fields")
    fields = {str(k): _converted(str(k), v) if str(k) in HardwareSpec.model_fields else v
              for k, v in upgrade_names(dict(data)).items()}  # an unknown field is named below, not its unit
    fields["source"] = CUSTOM_SOURCE_PREFIX + str(fields.get("source") or DEFAULT_SOURCE).removeprefix(
        CUSTOM_SOURCE_PREFIX)
    kind = fields.get("kind")
    if kind == "cpu":
        raise SpecSheetError(("kind",), "custom accelerators are GPUs: the CPU model knows only the host it was "
                                        "trained on (`perfmodel hw probe --save` describes this host)")
    unknown = [f for f in fields if f not in HardwareSpec.model_fields]
    missing = [f for f in REQUIRED_BY_KIND.get(str(kind), ()) if fields.get(f) is None]
    problems = [_unknown_fields(unknown)] if unknown else []
    if missing:
        problems.append(f"a {kind} needs {', '.join(missing)} (missing)")
    if problems:  # the field typed wrong first: a misspelled field is often what leaves a required one missing
        raise SpecSheetError(((unknown or missing)[0],), "; ".join(problems))
    try:
        spec = HardwareSpec.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SpecSheetError(tuple(error["loc"]), f"{error['msg']}{more}") from None
    check_plausible(spec)
    for field in ("name", *(f"aliases.{i}" for i in range(len(spec.aliases)))):
        value = spec.name if field == "name" else spec.aliases[int(field.split(".")[1])]
        if not normalize_name(value).strip("-"):
            raise SpecSheetError(tuple(field.split(".")), "must hold a letter or digit")
    check_no_clash(spec, _default_catalog() if catalog is None else catalog)
    return spec


def _unknown_fields(unknown: list[str]) -> str:
    """What names the unknown fields, each with the known field closest to it: "unknown field memory_bandwidth (did
    you mean memory_bandwidth_gb_s?)"."""
    named = []
    for field in unknown:
        close = difflib.get_close_matches(field, HardwareSpec.model_fields, n=1)
        named.append(f"{field} (did you mean {close[0]}?)" if close else field)
    return f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(named)}"


def check_plausible(spec: HardwareSpec) -> None:
    """A `SpecSheetError` naming the first field of `spec` outside the plausible range: above any real part
    (`MAX_VALUES`), or, for a GPU, below any (`MIN_GPU_VALUES`: a unit slip, the error says the field's unit)."""
    for field, limit in MAX_VALUES.items():
        value = getattr(spec, field)
        if value is not None and value > limit:
            raise SpecSheetError((field,), f"{value:g} is beyond any real part (at most {limit:g}); check the unit")
    if spec.kind != "gpu":
        return
    for field, (minimum, unit, larger) in MIN_GPU_VALUES.items():
        value = getattr(spec, field)
        if value is not None and value < minimum:
            raise SpecSheetError((field,), f"{value:g} {unit} is below any GPU's (>= {minimum:g}): the field is in "
                                           f"{unit}; write \"{value:g} {larger}\" for {value:g} {larger}")


def _default_catalog() -> dict[str, HardwareSpec]:
    from perfmodel.hardware.catalog import load_catalog

    return load_catalog()


def check_no_clash(spec: HardwareSpec, catalog: Mapping[str, HardwareSpec]) -> None:
    """`AcceleratorClash` if a name or alias of `spec` is a name, alias or ambiguous name of another entry."""
    from perfmodel.hardware.catalog import ambiguous_names

    owners = {normalize_name(n): entry.name for entry in catalog.values() if entry.name != spec.name
              for n in (entry.name, *entry.aliases)}
    shipped = spec.name in catalog and not is_custom(catalog[spec.name])
    for written in (spec.name, *spec.aliases):
        key = normalize_name(written)
        owner = spec.name if shipped and key == normalize_name(spec.name) else owners.get(key)
        if owner is not None:
            raise AcceleratorClash(f"{written!r} is already the catalog's name for {owner!r}: choose another name "
                                   f"(`perfmodel hw show {owner}` shows its figures)", written)
        if key in ambiguous_names():
            raise AcceleratorClash(f"{written!r} is an ambiguous catalog name ({', '.join(ambiguous_names()[key])}): "
                                   f"choose another name", written)


def is_custom(spec: HardwareSpec) -> bool:
    """Whether `spec` is a user's spec sheet (not a datasheet entry of the catalog, nor a probe of this host)."""
    return spec.source.startswith(CUSTOM_SOURCE_PREFIX)


def custom_reasons(spec: HardwareSpec) -> list[str]:
    """The extrapolation reason a prediction for `spec` carries: `CUSTOM_REASON` for a custom entry, else none."""
    return [CUSTOM_REASON] if is_custom(spec) else []


def catalog_with(custom: Iterable[HardwareSpec], base: Mapping[str, HardwareSpec] | None = None
                 ) -> dict[str, HardwareSpec]:
    """`base` (default: shipped + local) plus the custom entries; a base entry of the same name wins."""
    out = dict(_default_catalog() if base is None else base)
    for spec in custom:
        out.setdefault(spec.name, spec)
    return out


class LiveCatalog(Mapping[str, HardwareSpec]):
    """The catalog predictions use: fixed base entries plus custom entries that `refresh` replaces whole (one
    reference swap: readers on other threads see the old or the new entries, never a mix)."""

    def __init__(self, base: Mapping[str, HardwareSpec], custom: Iterable[HardwareSpec] = ()):
        self._base = dict(base)
        self._entries = catalog_with(custom, self._base)
        self._lock = threading.Lock()

    def refresh(self, custom: Iterable[HardwareSpec]) -> bool:
        """Replace the custom entries; whether anything changed."""
        entries = catalog_with(custom, self._base)
        with self._lock:
            changed = entries != self._entries
            self._entries = entries
        return changed

    def add(self, spec: HardwareSpec) -> None:
        """One more custom entry (just stored by this process)."""
        with self._lock:
            self._entries = {**self._entries, spec.name: self._entries.get(spec.name, spec)}

    def custom(self) -> list[HardwareSpec]:
        return [spec for spec in self._entries.values() if is_custom(spec)]

    def __getitem__(self, name: str) -> HardwareSpec:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def spec_sheet_example() -> str:
    """A minimal spec sheet (what `perfmodel hw add --help` shows)."""
    return json.dumps({"name": "acme-x1", "kind": "gpu", "vendor": "ACME", "peak_fp32_gflops": "60 TFLOP/s",
                       "peak_bf16_gflops": "800 TFLOP/s", "memory_bandwidth_gb_s": "3 TB/s", "memory_gb": 96,
                       "compute_units": 120, "source": "ACME X1 datasheet rev 2"})
