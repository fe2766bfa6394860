"""Names perfmodel used before issue 15's renames (one unit and one meaning per name), still accepted on input.

Output always uses today's names. Inputs written before keep working: HTTP bodies and spec sheets (the pydantic
models upgrade keys before validating), custom accelerators and profiles in the store (JSON), IR files, placement
files, `models/promoted.json` (role `default`), and models saved with old feature names (manifests and boosters).
This module is the one place the old names are spelled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# old field / feature name -> today's
RENAMED_FIELDS: dict[str, str] = {
    "memory_bandwidth_gbps": "memory_bandwidth_gb_s",
    "log_hw_bandwidth_gbps": "log_hw_bandwidth_gb_s",
    "graph_log_hw_bandwidth_gbps": "graph_log_hw_bandwidth_gb_s",
    "interconnect_bandwidth_gbps": "interconnect_bidir_gb_s",
    "nominal_gbps": "nominal_per_dir_gb_s",
    "inter_node_bandwidth_gbps": "inter_node_bandwidth_gbit_s",
    "iteration_time_ms": "iter_time_ms",
    "iteration_time_ms_disabled": "iter_time_ms_disabled",
    "iteration_time_ms_enabled": "iter_time_ms_enabled",
    "job_key": "job_id",
    "bandwidth_gbps": "bandwidth_per_dir_gb_s",
}

# old registry role -> today's
RENAMED_ROLES: dict[str, str] = {"default": "cpu-step"}


def upgrade_names(data: Any) -> Any:
    """`data` with old keys under today's names (a mapping; anything else is returned as is). Giving a field under
    both names is an error naming both."""
    if type(data) is dict:  # the common case, checked in C: every HTTP body passes here
        if data.keys().isdisjoint(RENAMED_FIELDS):
            return data
    elif not isinstance(data, Mapping) or not any(key in RENAMED_FIELDS for key in data):
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        new = RENAMED_FIELDS.get(key, key) if isinstance(key, str) else key
        if new != key and new in data:
            raise ValueError(f"{key!r} is the old name of {new!r}: give only {new!r}")
        out[new] = value
    return out


def upgrade_feature_names(names: Iterable[str]) -> tuple[str, ...]:
    """Feature names of a model saved before the renames, as today's code names them."""
    return tuple(RENAMED_FIELDS.get(name, name) for name in names)


def upgrade_roles(promoted: Mapping[str, str]) -> dict[str, str]:
    """promoted.json's role -> model, old role names under today's (today's wins if both are there)."""
    out = {RENAMED_ROLES.get(role, role): ref for role, ref in promoted.items() if role in RENAMED_ROLES}
    out.update({role: ref for role, ref in promoted.items() if role not in RENAMED_ROLES})
    return out
