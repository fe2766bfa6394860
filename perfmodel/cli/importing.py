"""`perfmodel import SOURCE PATH`: a public dataset of GPU op measurements (read in place) into the store, per op and
device (perfmodel/importers/)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.cli.common import JsonOpt, StoreOpt, out, print_json, say, user_errors


@user_errors
def import_dataset(
        source: Annotated[str, typer.Argument(help="the dataset: neusight, vidur, deepbench, llmservingsim "
                                                   "or phantora")],
        path: Annotated[Path, typer.Argument(help="its folder, e.g. ../shared/datasets/neusight (read in place)")],
        replace: Annotated[bool, typer.Option(help="first drop what the store holds from the files read "
                                                   "(after a change in how they are mapped)")] = False,
        store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Import a public dataset of GPU op measurements into the store, per op and device.

    Devices are matched to the hardware catalog (`perfmodel hw list`); rows of devices it lacks are skipped and
    counted. Importing a dataset again adds only what the store does not have."""
    import time

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
