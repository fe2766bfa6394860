"""Importers of public GPU op measurements: each reads one published dataset in place and yields `OpMeasurement`s
(pure parsing; `ProfileStore.add_op_measurements` stores them). Devices are resolved through the hardware catalog;
rows of devices it lacks are skipped and counted in the `ImportStats` passed in.

    IMPORTERS[name](dataset_folder, stats=..., catalog=..., files=...) -> Iterator[OpMeasurement]

Datasets of whole training jobs are read whole into records of their own, kept apart from storing them
(`ProfileStore.add_whole_job_measurements`): GPUs the catalog lacks leave `accelerator` None, and the runs are kept.

    WHOLE_JOB_READERS[name](dataset_folder, catalog=...) -> list[WholeJobRun]     (lambda)

Credit the sources (see each module, and shared/datasets/README.md) wherever results built on them are reported.
"""

from __future__ import annotations

from collections.abc import Callable

from perfmodel.core.errors import PerfmodelError
from perfmodel.importers.common import DatasetImporter, DeviceResolver, ImportStats
from perfmodel.importers.deepbench import import_deepbench
from perfmodel.importers.lambda_runs import WholeJobRun, read_lambda, unresolved_gpus
from perfmodel.importers.llmservingsim import import_llmservingsim
from perfmodel.importers.neusight import import_neusight
from perfmodel.importers.phantora import import_phantora
from perfmodel.importers.vidur import import_vidur
from perfmodel.profilers.external import OpMeasurement

Importer = DatasetImporter

IMPORTERS: dict[str, DatasetImporter] = {
    "neusight": import_neusight,
    "vidur": import_vidur,
    "deepbench": import_deepbench,
    "llmservingsim": import_llmservingsim,
    "phantora": import_phantora,
}

# datasets of whole training jobs: name -> its reader
WHOLE_JOB_READERS: dict[str, Callable[..., list[WholeJobRun]]] = {
    "lambda": read_lambda,
}

# name -> the data files its importer reads, relative to the dataset folder
DATA_FILES: dict[str, Callable[..., list[str]]] = {name: importer.files_in for name, importer in IMPORTERS.items()}


def get_importer(name: str) -> Importer:
    """The importer of a dataset of op measurements by name (neusight, vidur, deepbench, llmservingsim, phantora);
    unknown: a `PerfmodelError` naming every dataset (whole-job ones too: see `WHOLE_JOB_READERS`)."""
    key = name.strip().lower()
    if key in WHOLE_JOB_READERS:
        raise PerfmodelError(f"{key} holds whole training jobs, not op measurements: read it with "
                             f"WHOLE_JOB_READERS[{key!r}]")
    try:
        return IMPORTERS[key]
    except KeyError:
        raise PerfmodelError(f"unknown dataset {name!r}: choose one of "
                             f"{', '.join([*IMPORTERS, *WHOLE_JOB_READERS])}") from None


__all__ = ["DATA_FILES", "IMPORTERS", "WHOLE_JOB_READERS", "DatasetImporter", "DeviceResolver", "ImportStats",
           "Importer", "OpMeasurement", "WholeJobRun", "get_importer", "import_deepbench", "import_llmservingsim",
           "import_neusight", "import_phantora", "import_vidur", "read_lambda", "unresolved_gpus"]

