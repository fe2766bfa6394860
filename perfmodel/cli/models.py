"""`perfmodel models list|promote`: the trained models of the registry (models/, or PERFMODEL_MODELS_DIR)."""

from __future__ import annotations

from typing import Annotated

import typer

from perfmodel.cli.common import JsonOpt, out, print_json, user_errors

models_app = typer.Typer(no_args_is_help=True, help="Trained models in the registry: list, promote.")


@models_app.command("list")
@user_errors
def models_list(as_json: JsonOpt = False) -> None:
    """List registered models (* marks the promoted default)."""
    from rich.table import Table

    from perfmodel.registry.registry import ModelRegistry

    entries = ModelRegistry().entries()
    rows = [{"model": e.ref, "regressor": e.manifest.regressor, "promoted": e.promoted,
             "samples": e.manifest.training_samples, "created_at": e.manifest.created_at.isoformat(),
             "metrics": e.manifest.metrics} for e in entries]
    if as_json:
        print_json(rows)
        return
    table = Table("model", "regressor", "samples", "created (UTC)", title=f"{len(rows)} models")
    for e in entries:
        table.add_row(("* " if e.promoted else "  ") + e.ref, e.manifest.regressor, str(e.manifest.training_samples),
                      e.manifest.created_at.isoformat()[:16])
    out.print(table)


@models_app.command("promote")
@user_errors
def models_promote(ref: Annotated[str, typer.Argument(help="NAME/VERSION (or NAME: its newest)")]) -> None:
    """Make a model the default; one whose artifact does not load is refused."""
    from perfmodel.registry.registry import ModelRegistry

    entry = ModelRegistry().promote(ref)
    out.print(f"promoted {entry.ref}")
