"""`perfmodel profiles list|show|export|import|add-graphs|ops-summary`: the profiles (and their jobs' graphs, and
imported op measurements) a store holds."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfmodel.cli.common import JsonOpt, StoreOpt, out, print_json, say, user_errors
from perfmodel.core.errors import PerfmodelError

profiles_app = typer.Typer(no_args_is_help=True, help="Profiles in the store: list, show, export, import, "
                                                      "add-graphs, ops-summary.")


@profiles_app.command("list")
@user_errors
def profiles_list(job: Annotated[Optional[str], typer.Option(help="job name")] = None,
                  device: Annotated[Optional[str], typer.Option(help="device name")] = None,
                  limit: Annotated[Optional[int], typer.Option(min=1)] = None,
                  store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List stored profiles, newest first."""
    from perfmodel.cli.render import render_profile_list
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        rows = profile_store.list(job=job, device=device, limit=limit)
    if as_json:
        print_json([r.model_dump(mode="json") if hasattr(r, "model_dump") else r.__dict__ for r in rows])
    else:
        render_profile_list(out, rows)


@profiles_app.command("show")
@user_errors
def profiles_show(profile_id: Annotated[int, typer.Argument(help="profile id (see `profiles list`)")],
                  top: Annotated[int, typer.Option(help="ops to show")] = 15,
                  store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Show one stored profile: iteration statistics, environment, top ops."""
    from perfmodel.cli.render import render_profile
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        prof = profile_store.get(profile_id)
    if as_json:
        sys.stdout.write(prof.model_dump_json(indent=2) + "\n")
    else:
        render_profile(out, prof, profile_id, top=top)


@profiles_app.command("export")
@user_errors
def profiles_export(directory: Annotated[Path, typer.Argument(
                        help="folder to write the Parquet files and manifest.json to (created when missing, inside "
                             "an existing folder)")],
                    store: StoreOpt = None) -> None:
    """Export every stored profile to Parquet (for shipping under profiles/)."""
    from perfmodel.store import ProfileStore

    created = _export_folder(directory)  # before the store is opened: a bad destination touches nothing
    try:
        with ProfileStore(store) as profile_store:
            counts = profile_store.export_parquet(directory)
    except OSError as exc:  # e.g. the disk filled up, or the folder is read-only to this user
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise PerfmodelError(f"cannot export to {directory}: {exc.strerror or exc}") from None
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    out.print(", ".join(f"{n} {table}" for table, n in counts.items()) + f" -> {directory}")


def _export_folder(directory: Path) -> bool:
    """Check that an export can be written to `directory`, creating it when missing (True: created here). Exit 2
    for an existing file, a missing parent folder (the CLI never creates more than the export's own folder) and a
    place this user cannot write to."""
    if directory.exists() and not directory.is_dir():
        raise PerfmodelError(f"cannot export to {directory}: it is a file; give a folder (the export writes "
                             "Parquet files and manifest.json into it)")
    if directory.is_dir():
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PerfmodelError(f"cannot export to {directory}: the folder is not writable")
        return False
    if directory.parent.exists() and not directory.parent.is_dir():
        raise PerfmodelError(f"cannot export to {directory}: {directory.parent} is a file, not a folder")
    if not directory.parent.is_dir():
        raise PerfmodelError(f"cannot export to {directory}: no such folder {directory.parent}")
    try:
        directory.mkdir()
    except OSError as exc:
        raise PerfmodelError(f"cannot export to {directory}: {exc.strerror or exc}") from None
    return True


@profiles_app.command("import")
@user_errors
def profiles_import(directory: Annotated[Path, typer.Argument(help="folder holding an export")],
                    store: StoreOpt = None) -> None:
    """Import profiles from a Parquet export; profiles the store already has are skipped."""
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        added = profile_store.import_parquet(directory)
    out.print(f"imported {added} new profile(s) from {directory}")


@profiles_app.command("add-graphs")
@user_errors
def profiles_add_graphs(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Capture and store the graph of each profiled job that has none (stores made before graphs were kept)."""
    from perfmodel.store import ProfileStore
    from perfmodel.store.profiling import add_missing_graphs

    with ProfileStore(store) as profile_store:
        fills = add_missing_graphs(profile_store, progress=say)
    if as_json:
        print_json([asdict(fill) for fill in fills])
    else:
        added = sum(fill.added for fill in fills)
        out.print(f"stored {added} graph(s); skipped {len(fills) - added}")


@profiles_app.command("ops-summary")
@user_errors
def profiles_ops_summary(source: Annotated[Optional[str], typer.Option(
                             help="neusight, vidur, deepbench, llmservingsim or phantora")] = None,
                         store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Count the imported op measurements (`perfmodel import`) per source, device, op class and dtype."""
    from perfmodel.cli.render import render_measurement_counts
    from perfmodel.store import ProfileStore

    with ProfileStore(store) as profile_store:
        counts = profile_store.op_measurement_counts(by=("source", "device", "op_class", "dtype"), source=source)
    if as_json:
        print_json([{"source": s, "device": d, "op_class": c, "dtype": t, "records": n} for s, d, c, t, n in counts])
    else:
        render_measurement_counts(out, counts)
