"""`perfmodel models list|promote`: the trained models of the registry (models/, or PERFMODEL_MODELS_DIR).

What is promoted is what a service on the same store serves: each role's newest `promoted` event of the store, else
the registry's promoted.json (`perfmodel.engine.models`). `models promote` (and `train --promote`, `train-ops
--promote`) record the promotion in the store and promoted.json, as `POST /v1/models/{NAME/VERSION}/promote` does."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from perfmodel.cli.common import JsonOpt, StoreOpt, out, print_json, user_errors

models_app = typer.Typer(no_args_is_help=True, help="Trained models in the registry: list, promote.")


def promote_recorded(ref: str, store_url: str | None, *, command: str, role: str | None = None) -> Any:
    """Promote `ref` (for `role`, by default its regressor's) as the service does: loaded first (PromotionRefused
    if it does not), then a `promoted` event in the store naming who asked, then promoted.json. Returns the
    registry entry."""
    from perfmodel.engine.models import promoted_by_store
    from perfmodel.registry.registry import ModelRegistry, actor, role_of
    from perfmodel.store.jobs import JobStore

    registry = ModelRegistry()
    entry = registry.get(ref)
    role = role or role_of(entry.manifest.regressor)
    with JobStore(store_url) as store:
        previous = promoted_by_store(registry, store).get(role)
        try:
            return registry.promote(entry.ref, role, store=store, by=actor(command), previous=previous)
        except OSError as exc:  # a read-only registry: the store says it, every service and predict follow it
            typer.echo(f"warning: promoted {entry.ref} in the store; the registry's promoted.json is not updated: "
                       f"{exc}", err=True)
            return entry


@models_app.command("list")
@user_errors
def models_list(as_json: JsonOpt = False, store: StoreOpt = None) -> None:
    """List registered models (* marks the promoted one of each role: the store's promotion, else promoted.json)."""
    from rich.table import Table

    from perfmodel.engine.models import promoted_by_store
    from perfmodel.registry.registry import ModelRegistry
    from perfmodel.store.jobs import JobStore

    registry = ModelRegistry()
    entries = registry.entries()
    with JobStore(store) as job_store:
        promoted = set(promoted_by_store(registry, job_store).values())
    rows = [{"model": e.ref, "regressor": e.manifest.regressor, "promoted": e.ref in promoted,
             "samples": e.manifest.training_samples, "created_at": e.manifest.created_at.isoformat(),
             "metrics": e.manifest.metrics} for e in entries]
    if as_json:
        print_json(rows)
        return
    table = Table("model", "regressor", "samples", "created (UTC)", title=f"{len(rows)} models")
    for e in entries:
        table.add_row(("* " if e.ref in promoted else "  ") + e.ref, e.manifest.regressor,
                      str(e.manifest.training_samples), e.manifest.created_at.isoformat()[:16])
    out.print(table)


@models_app.command("promote")
@user_errors
def models_promote(ref: Annotated[str, typer.Argument(help="NAME/VERSION (or NAME: its newest)")],
                   store: StoreOpt = None) -> None:
    """Make a model the promoted one of its role, as `POST /v1/models/NAME/VERSION/promote` does: it is loaded
    first, then the promotion is recorded in the store (a running service and `perfmodel predict` on that store
    follow it) and in the registry's promoted.json. One whose artifact does not load is refused (exit 2) and the
    old model stays promoted."""
    entry = promote_recorded(ref, store, command="models promote")
    out.print(f"promoted {entry.ref}")
