"""Lambda deeplearning-benchmark (lambdal/deeplearning-benchmark; no license stated: read in place, never copied,
and credit "Lambda, lambdal/deeplearning-benchmark" wherever results built on it are reported): whole-job PyTorch
training throughput of NVIDIA DeepLearningExamples models in NGC containers, one node, 1-16 GPUs data parallel.

Read (relative to the dataset root; its PROVENANCE.md documents every column):

- `runs.csv`: one run log that reported a throughput (status "ok");
- `failed_runs.csv`: one run log without a throughput, status = its `reason` ("out of memory" for a CUDA OOM: the
  batch that did not fit is a memory data point);
- `systems.csv`: what each results folder's `sys_pytorch.txt` recorded; its PyTorch build and CUDA (nvcc) version
  are given to the runs of that folder. Three folders name two builds (`4x3090`, `8x3090`, `p3.16xlarge`: their
  later ResNet-50 re-runs, PROVENANCE.md says): there a run gets the one build whose NGC container had been
  released by the run's date (`NGC_RELEASED`), and None where that is not one build.

Not read: `summary/` (Lambda's own per-folder means of `runs.csv`), `MANIFEST.tsv`.

Mapping, per run (`WholeJobRun`):

- `model`: the zoo name of the upstream task model (`ZOO_MODELS`; the upstream name stays in `source_model`).
- `devices` = `num_gpus`, `nodes` = 1 (every job is single-node data parallel).
- `accelerator`: the hardware-catalog id of the GPU name as written (`gpu_name`), or None where the catalog lacks
  it (`unresolved_gpus` counts those rows); the run is kept either way.
- `precision`: what really ran, as perfmodel's `Precision` (`run_precision`). The task folder's label
  (`source_precision`: FP32, FP16 or AMP) says what was asked for; the log (`amp_in_log`) says whether mixed
  precision was on, and wins where it says so. FP32 -> `tf32` (NGC containers keep TF32 on for matmuls and
  convolutions; on pre-Ampere GPUs tf32 prices as fp32); FP16/AMP -> mixed precision; but a run whose log shows
  mixed precision off -> `tf32` (and one whose log shows it on -> mixed precision, which no FP32 run does). Mixed
  precision is the recipe the reference script ran: apex amp O2, a half model with fp32 master weights
  (`fp16-master`), for GNMT, NCF and both Transformer-XLs in every suite and SSD in v0 (`APEX_O2`); per-op casts
  (`amp`: apex O1 for Mask R-CNN and the 2020 Tacotron 2 and WaveGlow runs, `torch.cuda.amp` for SSD in v1) for the
  others. The FP16 runs with `amp_in_log` false are the 6 NCF runs of the v1 80 GB template that PROVENANCE names,
  and also 82 Tacotron2 and 76 WaveGlow runs (late 2020 on, v0 and v1): those run at about their FP32 speed (median
  FP16/FP32 throughput ratio per folder and GPU count 1.01 Tacotron2, 1.07 WaveGlow, 1.16 NCF at a 1.25x batch;
  1.6-2.0 where the log shows AMP on), so they were not mixed precision either.
- `batch_size`: per GPU, as the data gives it (global / devices: fractional in the 9 runs whose global batch does
  not split evenly, NCF and Transformer-XL large); `global_batch_size`: samples per optimizer step, all GPUs.
- `throughput`, `unit`: whole-job training throughput as the benchmark logged it, per second, in the model's own
  item (tokens, images, samples, mel frames, audio samples: see `UNITS`). Items are NOT converted to samples here:
  items per sample is the model's (the zoo's) to say.
- `gradient_sync` (in `extra`): False for the multi-GPU Transformer-XL runs, which trained one replica per GPU with
  no gradient all-reduce (`NO_GRADIENT_SYNC`); their `global_batch_size` is then the sum of the replicas' batches.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.importers.common import DeviceResolver, check_root
from perfmodel.jobs.spec import Precision

SOURCE: Final = "lambda"
RUNS: Final = "runs.csv"
FAILED_RUNS: Final = "failed_runs.csv"
SYSTEMS: Final = "systems.csv"
OK: Final = "ok"  # the status of a run that reported a throughput

# upstream task model (`PyTorch_<model>_<PREC>`) -> zoo name
ZOO_MODELS: Final[Mapping[str, str]] = {
    "ssd": "ssd300",
    "gnmt": "gnmt",
    "ncf": "ncf",
    "tacotron2": "tacotron2",
    "waveglow": "waveglow",
    "transformerxlbase": "transformer-xl-base",
    "transformerxllarge": "transformer-xl-large",
    "maskrcnn": "maskrcnn",
}

# upstream task model -> the unit its throughput is logged in (PROVENANCE.md, "Models, units and what the
# throughput is"); a run logged in another unit is refused
UNITS: Final[Mapping[str, str]] = {
    "gnmt": "tokens/s",  # source + target tokens
    "maskrcnn": "images/s",
    "ncf": "samples/s",  # user-item pairs (positives and 4 sampled negatives each)
    "ssd": "images/s",
    "tacotron2": "mel frames/s",
    "transformerxlbase": "tokens/s",  # target tokens
    "transformerxllarge": "tokens/s",
    "waveglow": "audio samples/s",
}

# upstream task models whose multi-GPU runs trained without gradient synchronisation: Lambda launches DLE
# Transformer-XL's train.py once per GPU (torch.distributed.launch) without `--multi_gpu ddp`, and that script wraps
# the model in DistributedDataParallel only when asked (`multi_gpu` defaults to None; the runs' logs print
# `multi_gpu : None`). Each rank trains its own replica on its own batches, and the logged throughput is the sum of
# the ranks' own throughputs: n independent one-GPU jobs, not a data-parallel one (no all-reduce to wait for).
NO_GRADIENT_SYNC: Final = frozenset({"transformerxlbase", "transformerxllarge"})

# the task folder's precision label -> what it asks for
LABEL_PRECISION: Final[Mapping[str, Precision]] = {
    "FP32": Precision.tf32,
    "FP16": Precision.amp,
    "AMP": Precision.amp,  # SSD's name for its mixed-precision task
}

# upstream task model -> the suites whose mixed precision (FP16/AMP) is apex amp O2 (`opt_level="O2"`: the model
# cast to fp16, fp32 master weights in the optimizer, no per-op casts: `fp16-master`). From the runs' logs (in
# lambdal/deeplearning-benchmark, pytorch/results/), which print apex's banner "Selected optimization level O2"
# in every container for these models (GNMT `math='fp16'`, NCF `opt_level O2`, Transformer-XL `fp16=True` /
# `amp='apex'`). SSD ran O2 in v0 and `torch.cuda.amp` (autocast) in v1; Mask R-CNN and the 2020 Tacotron 2 and
# WaveGlow runs print apex's O1 banner (per-op casts, as autocast): `amp`.
APEX_O2: Final[Mapping[str, frozenset[str]]] = {
    "ssd": frozenset({"v0"}),
    "gnmt": frozenset({"v0", "v1"}),
    "ncf": frozenset({"v0", "v1"}),
    "transformerxlbase": frozenset({"v0", "v1"}),
    "transformerxllarge": frozenset({"v0", "v1"}),
}


def run_precision(source_model: str, suite: str, source_precision: str, amp_in_log: bool | None) -> Precision:
    """What a run's math really was: the task folder's label (`LABEL_PRECISION`), overridden by its log where the
    log says whether mixed precision was on, and mixed precision as its script's recipe (`APEX_O2`)."""
    precision = LABEL_PRECISION[source_precision]
    if amp_in_log is not None:  # the log says what ran
        precision = Precision.amp if amp_in_log else Precision.tf32
    if precision is Precision.amp and suite in APEX_O2.get(source_model, frozenset()):
        return Precision.fp16_master
    return precision


_COLUMNS = ("config", "suite", "gpu", "arch", "num_gpus", "host", "variant", "model", "precision", "amp_in_log",
            "batch_per_gpu", "global_batch", "batch_source", "date", "log_path")
RUN_COLUMNS: Final = (*_COLUMNS, "throughput", "unit", "metric")
FAILED_COLUMNS: Final = (*_COLUMNS, "reason")
SYSTEM_COLUMNS: Final = ("config", "pytorch", "cuda")
BUILD_SEPARATOR: Final = " | "  # systems.csv joins a folder's distinct values with it
# PyTorch build -> the month its NGC PyTorch container (the tag, YY.MM) was released: no run used it before.
# The builds and tags of PROVENANCE.md's container table (20.01 and 20.10 named in the repository, 21.03 and 21.07
# inferred there from the build and CUDA version, 22.09 named).
NGC_RELEASED: Final = {
    "1.4.0a0+a5b4d78": datetime(2020, 1, 1),  # 20.01
    "1.7.0a0+7036e91": datetime(2020, 10, 1),  # 20.10
    "1.9.0a0+df837d0": datetime(2021, 3, 1),  # 21.03
    "1.10.0a0+ecc3718": datetime(2021, 7, 1),  # 21.07
    "1.13.0a0+d0d6b1f": datetime(2022, 9, 1),  # 22.09
}
Build = tuple[str | None, str | None]  # (PyTorch build, CUDA version)


@dataclass(frozen=True)
class WholeJobRun:
    """One whole training job as a benchmark ran it: what ran (model, batch, precision), where (GPU, how many),
    how fast (throughput in the source's unit) or why it failed. `extra` is what the store keeps beside its
    columns."""

    source: str  # "lambda"
    source_id: str  # the upstream run log (log_path): unique per run
    suite: str  # v0 (2020-2022) or v1 (Oct 2022 on): different containers, code and batches
    config: str  # the upstream results folder
    host: str | None  # cloud or vendor prefix of the folder; None = Lambda's own machine
    variant: str | None  # NVLink bridge / test round / sonantic, where the folder says
    gpu_name: str  # as written
    arch: str  # Pascal, Volta, Turing, Ampere, Ada
    accelerator: str | None  # hardware-catalog id; None where the catalog lacks gpu_name
    devices: int  # GPUs in the job
    nodes: int  # hosts (1)
    source_model: str  # upstream name: ssd, gnmt, ..., transformerxlbase
    model: str  # zoo name: ssd300, gnmt, ..., transformer-xl-base
    source_precision: str  # the task folder's label: FP32, FP16 or AMP
    amp_in_log: bool | None  # whether the log shows mixed precision on; None: the log does not say
    precision: Precision  # what ran (see the module docstring)
    batch_size: float  # per GPU (global / devices)
    global_batch_size: int  # samples per optimizer step, all GPUs
    batch_source: str  # where the batch was read: log, config_v0 script, benchmark.para
    throughput: float | None  # whole job, per second, in `unit`; None for a failed run
    unit: str | None  # as logged: tokens/s, images/s, samples/s, mel frames/s, audio samples/s
    metric: str | None  # the log line it was read from
    status: str  # "ok", or why the run has no throughput ("out of memory", "exception (...)")
    date: datetime | None  # start of the run, the machine's clock (naive: its zone is unknown)
    pytorch_version: str | None  # the folder's PyTorch build (NGC container), when it names one
    cuda_version: str | None  # the folder's nvcc version, when it names one

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def gradient_sync(self) -> bool:
        """Whether the job's GPUs all-reduced gradients (data parallelism); False for runs of several GPUs that
        each trained a replica of their own (`NO_GRADIENT_SYNC`)."""
        return self.devices == 1 or self.source_model not in NO_GRADIENT_SYNC

    @property
    def extra(self) -> dict[str, Any]:
        """The fields the store has no column for, JSON-ready (None left out)."""
        values = {
            "gradient_sync": self.gradient_sync, "suite": self.suite, "config": self.config, "host": self.host,
            "variant": self.variant,
            "arch": self.arch, "source_model": self.source_model, "amp_in_log": self.amp_in_log,
            "batch_source": self.batch_source, "metric": self.metric,
            "date": self.date.isoformat() if self.date is not None else None,
            "pytorch_version": self.pytorch_version, "cuda_version": self.cuda_version,
        }
        return {key: value for key, value in values.items() if value is not None}


def read_lambda(folder: Path | str, *, catalog: Mapping[str, HardwareSpec] | None = None) -> list[WholeJobRun]:
    """Every run of the dataset at `folder`: those of runs.csv (status "ok") then those of failed_runs.csv, in
    file order. GPUs are looked up in `catalog` (default: the hardware catalog). A folder that is not the dataset,
    or a row that does not parse, is a `PerfmodelError` naming the file and line."""
    root = check_root(folder, SOURCE, (RUNS,), f"expected {RUNS}, {FAILED_RUNS} and {SYSTEMS}")
    for name in (FAILED_RUNS, SYSTEMS):
        if not (root / name).is_file():
            raise PerfmodelError(f"{root} does not look like the {SOURCE} dataset: no {name}")
    builds = _builds(_read(root / SYSTEMS, SYSTEM_COLUMNS))
    resolve = DeviceResolver(catalog)
    runs = [_run(RUNS, line, row, builds, resolve) for line, row in _read(root / RUNS, RUN_COLUMNS)]
    runs += [_run(FAILED_RUNS, line, row, builds, resolve) for line, row in _read(root / FAILED_RUNS, FAILED_COLUMNS)]
    return runs


def unresolved_gpus(runs: Iterable[WholeJobRun]) -> Counter[str]:
    """GPU name as written -> runs whose GPU the hardware catalog lacks (stored with no accelerator)."""
    return Counter(run.gpu_name for run in runs if run.accelerator is None)


def _read(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """(line number, {column: text}) of each data row of a CSV that has `columns`."""
    try:
        with path.open(newline="", encoding="utf-8") as file:
            reader = csv.DictReader(file)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise PerfmodelError(f"{path} is not the {SOURCE} dataset's {path.name}: no column "
                                     f"{', '.join(missing)}")
            return [(reader.line_num, row) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PerfmodelError(f"cannot read {path}: {exc}") from None


def _builds(rows: list[tuple[int, dict[str, str]]]) -> dict[str, list[Build]]:
    """Results folder -> the (PyTorch build, CUDA version) pairs its records name: one, or several where the folder
    joins distinct values (the two columns pair up by position when they name as many; else the CUDA is None)."""
    def values(text: str) -> list[str]:
        return [v.strip() for v in text.split(BUILD_SEPARATOR) if v.strip()]

    builds = {}
    for _, row in rows:
        pytorch: list[str | None] = [*values(row["pytorch"])] or [None]
        cuda: list[str | None] = [v.removeprefix("V") for v in values(row["cuda"])]
        builds[row["config"]] = list(zip(pytorch, cuda if len(cuda) == len(pytorch) else [None] * len(pytorch)))
    return builds


def build_on(builds: list[Build], date: datetime) -> Build:
    """The build a run of `date` ran on: the folder's only one, else the only one whose container had been released
    by then (`NGC_RELEASED`); (None, None) where that is not one build."""
    if len(builds) == 1:
        return builds[0]
    released = [b for b in builds if b[0] in NGC_RELEASED and NGC_RELEASED[b[0]] <= date]
    return released[0] if len(released) == 1 else (None, None)


def _run(name: str, line: int, row: dict[str, str], builds: Mapping[str, list[Build]],
         resolve: DeviceResolver) -> WholeJobRun:
    def fail(column: str, why: str) -> PerfmodelError:
        return PerfmodelError(f"{name} line {line}: {column} {row.get(column)!r} {why}")

    def text(column: str) -> str:
        value = (row.get(column) or "").strip()
        if not value:
            raise fail(column, "is empty")
        return value

    def optional(column: str) -> str | None:
        return (row.get(column) or "").strip() or None

    def number(column: str) -> float:
        try:
            value = float(text(column))
        except ValueError:
            raise fail(column, "is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise fail(column, "is not a positive number")
        return value

    def whole(column: str) -> int:
        value = number(column)
        if value != int(value):
            raise fail(column, "is not a whole number")
        return int(value)

    source_model = text("model")
    if source_model not in ZOO_MODELS:
        raise fail("model", f"is not a model of the dataset ({', '.join(ZOO_MODELS)})")
    source_precision = text("precision")
    if source_precision not in LABEL_PRECISION:
        raise fail("precision", f"is not one of {', '.join(LABEL_PRECISION)}")
    amp_text = optional("amp_in_log")
    if amp_text not in (None, "true", "false"):
        raise fail("amp_in_log", "is not true, false or empty")
    amp_in_log = None if amp_text is None else amp_text == "true"
    suite = text("suite")
    precision = run_precision(source_model, suite, source_precision, amp_in_log)
    devices = whole("num_gpus")
    global_batch = whole("global_batch")
    batch = number("batch_per_gpu")
    if not math.isclose(batch * devices, global_batch, rel_tol=1e-9):
        raise fail("batch_per_gpu", f"times {devices} GPUs is not the global batch {global_batch}")
    try:
        date = datetime.fromisoformat(text("date"))
    except ValueError:
        raise fail("date", "is not an ISO date and time") from None

    if name == RUNS:
        status, throughput, metric = OK, number("throughput"), text("metric")
        unit: str | None = text("unit")
        if unit != UNITS[source_model]:
            raise fail("unit", f"is not the unit of {source_model} ({UNITS[source_model]})")
    else:
        status, throughput, unit, metric = text("reason"), None, None, None
    gpu_name = text("gpu")
    config = text("config")
    pytorch_version, cuda_version = build_on(builds.get(config, [(None, None)]), date)
    return WholeJobRun(
        source=SOURCE, source_id=text("log_path"), suite=suite, config=config, host=optional("host"),
        variant=optional("variant"), gpu_name=gpu_name, arch=text("arch"), accelerator=resolve(gpu_name),
        devices=devices, nodes=1, source_model=source_model, model=ZOO_MODELS[source_model],
        source_precision=source_precision, amp_in_log=amp_in_log, precision=precision, batch_size=batch,
        global_batch_size=global_batch, batch_source=text("batch_source"), throughput=throughput, unit=unit,
        metric=metric, status=status, date=date, pytorch_version=pytorch_version, cuda_version=cuda_version,
    )
