"""`perfmodel import SOURCE PATH`: a public dataset of GPU op measurements (read in place) into the store, per op and
device, or one of whole training jobs (`lambda`: runs with their throughput, and failed runs) (perfmodel/importers/)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli.common import JsonOpt, StoreOpt, out, print_json, say, user_errors


@user_errors
def import_dataset(
        source: Annotated[str, typer.Argument(help="the dataset: neusight, vidur, deepbench, llmservingsim, "
                                                   "phantora (op measurements) or lambda (whole training jobs)")],
        path: Annotated[Path, typer.Argument(help="its folder, e.g. ../shared/datasets/neusight (read in place)")],
        replace: Annotated[bool, typer.Option(help="first drop what the store holds from the files read "
                                                   "(lambda: every stored run of it) (after a change in how "
                                                   "they are mapped)")] = False,
        store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Import a public dataset of GPU op measurements into the store, per op and device, or of whole training jobs.

    Devices are matched to the hardware catalog (`perfmodel hw list`); op rows of devices it lacks are skipped and
    counted, whole-job runs are kept without an accelerator and the GPU names are listed. Importing a dataset again
    adds only what the store does not have."""
    import time

    from perfmodel.importers import WHOLE_JOB_READERS

    if source.strip().lower() in WHOLE_JOB_READERS:
        _import_whole_jobs(source.strip().lower(), path, replace, store, as_json)
        return

    from perfmodel.cli.render import import_as_json, render_import
    from perfmodel.importers import ImportStats, get_importer
    from perfmodel.store import ProfileStore

    importer = get_importer(source)
    stats = ImportStats()
    started = time.perf_counter()
    records = importer(path, stats=stats)  # checks the folder now: a bad path fails before the store is opened
    if not as_json:
        records = _announce_files(records, stats)
    with ProfileStore(store) as profile_store:
        added = profile_store.add_op_measurements(records, replace=replace)
    summary = import_as_json(source.strip().lower(), str(path), stats, added, time.perf_counter() - started)
    if as_json:
        print_json(summary)
    else:
        render_import(out, summary)


def _import_whole_jobs(source: str, path: Path, replace: bool, store: str | None, as_json: bool) -> None:
    """Read a dataset of whole training jobs (checked before the store is opened) and store its runs."""
    import time
    from collections import Counter

    from perfmodel.importers import WHOLE_JOB_READERS, unresolved_gpus
    from perfmodel.store import ProfileStore

    started = time.perf_counter()
    runs = WHOLE_JOB_READERS[source](path)
    failed = {(run.source, run.source_id) for run in runs if not run.ok}
    with ProfileStore(store) as profile_store:
        written = profile_store.add_whole_job_measurements(runs, replace=replace)

    def split(keys: Iterable[tuple[str, str]]) -> dict[str, int]:
        counts = Counter("failed_runs" if key in failed else "runs" for key in keys)
        return {"runs": counts["runs"], "failed_runs": counts["failed_runs"]}

    unresolved = unresolved_gpus(runs)
    summary: dict[str, Any] = {
        "source": source, "path": str(path), "read": split((run.source, run.source_id) for run in runs),
        "added": split(written.added), "already_present": split(written.present),
        "accelerators_filled": written.accelerators_filled,
        "unresolved_gpus": dict(sorted(unresolved.items())), "seconds": round(time.perf_counter() - started, 2)}
    if as_json:
        print_json(summary)
        return
    read, added, present = summary["read"], summary["added"], summary["already_present"]
    out.print(f"{source}: {read['runs']} runs and {read['failed_runs']} failed runs read from {path}")
    out.print(f"imported {added['runs']} runs and {added['failed_runs']} failed runs; skipped as already present: "
              f"{present['runs']} runs and {present['failed_runs']} failed runs")
    if written.accelerators_filled:
        out.print(f"{written.accelerators_filled} stored runs without an accelerator now have one")
    if unresolved:
        names = ", ".join(f"{name} ({n} runs)" for name, n in sorted(unresolved.items()))
        out.print(f"{len(unresolved)} GPU names not in the hardware catalog (their runs are stored without an "
                  f"accelerator; add them, then import again): {names}")
    else:
        out.print("every GPU name resolved to a hardware-catalog accelerator")
    out.print(f"{summary['seconds']:.1f} s")


def _announce_files(records: Iterable[Any], stats: Any) -> Iterator[Any]:
    """`records`, saying on stderr which file is being read as each is started."""
    announced = 0
    for record in records:
        while announced < len(stats.files):
            say(f"reading {stats.files[announced]}")
            announced += 1
        yield record
    for name in stats.files[announced:]:
        say(f"read {name}")
