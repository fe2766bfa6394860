"""`perfmodel hw add SPEC`: store a custom accelerator from a spec sheet (YAML or JSON of `HardwareSpec` fields,
numbers bare in the field's unit or with a unit: "3.35 TB/s"), so that every process on the store predicts for it.
Bad sheets and names the catalog already uses exit with code 2 and a message naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer


def register(hw_app: typer.Typer, user_errors: Callable) -> None:
    """Add `hw add` to the `hw` group."""

    @hw_app.command("add")
    @user_errors
    def hw_add(
        spec_file: Annotated[Path, typer.Argument(help="spec sheet, YAML or JSON, e.g. {name: acme-x1, kind: gpu, "
                                                     "peak_fp32_gflops: 60 TFLOP/s, memory_bandwidth_gbps: 3 TB/s, "
                                                     "memory_gb: 96, compute_units: 120}")],
        store: Annotated[Optional[str], typer.Option("--store", help="store URL [env PERFMODEL_STORE_URL, "
                                                     "else sqlite in PERFMODEL_HOME]")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    ) -> None:
        """Add a custom accelerator (a spec sheet) to the store; predictions for it are flagged extrapolated."""
        from perfmodel.core.errors import PerfmodelError
        from perfmodel.hardware.custom import catalog_with, parse_spec_sheet, validate_spec_sheet
        from perfmodel.store import ProfileStore
        from perfmodel.store.accelerators import add_accelerator, custom_accelerators

        try:
            text = spec_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PerfmodelError(f"cannot read spec sheet {spec_file}: {exc}") from None
        data = parse_spec_sheet(text, str(spec_file))
        with ProfileStore(store) as profile_store:
            spec = validate_spec_sheet(data, catalog_with(custom_accelerators(profile_store)))
            record, created = add_accelerator(profile_store, spec)
        if as_json:
            typer.echo(json.dumps({"created": created, **record.spec.model_dump(mode="json")}, indent=2))
        else:
            verb = "added" if created else "already stored (same figures)"
            typer.echo(f"{record.spec.name}: {verb} in {profile_store!r}; the service on this store predicts for "
                       f"it (flagged extrapolated: a spec sheet, no measurements)")
