"""Real end-to-end training runs against the composed prediction: the data the learned whole-step stage is fitted
on and judged by.

A run is one measured configuration (model, GPU, GPUs in the node, math mode, per-GPU batch): Lambda's 1,986 public
PyTorch training runs (`perfmodel.importers.lambda_runs`; repeats of one configuration are merged into their
median). For each, `composed_frame` builds the job (the zoo model at the reference sequence length, the
reference implementation's optimizer) and its placement (one node, data parallel), and records

- the measured step: global batch / measured samples per second (items per second over the zoo entry's items
  per sample);
- the composed step: the per-op device model's kernel sum on one device (`single_ms`) and the placement model's
  iteration on the run's GPUs (`placement_ms`), without the learned stage;
- the composition features of one device's step (`COMPOSITION_FEATURES`) and the placement's communication share.

A multi-GPU run that trained without gradient synchronisation (`gradient_sync` False: Lambda's Transformer-XL runs,
`perfmodel.importers.lambda_runs.NO_GRADIENT_SYNC`) is n independent replicas: its placement is one replica on one
GPU, its measured step the replicas' step, and it is left out of the n-GPU / 1-GPU scaling ratio (there is no
communication in it to check).

Each run keeps the PyTorch version it ran on (`pytorch_version`, from Lambda's `systems.csv`: the NGC container's
build). The stage learns every version's offset against the newest and answers for the newest
(`perfmodel.regressors.whole_step_device`); judging a held-out run, `leave_one_out` predicts it on its own version
(the offset learned without its group, `on_own_software`), as its batch and GPUs are its own.

Hold-outs (`leave_one_out`): by model family (every GPU) and by chip (every SKU of one die,
`hardware.chips.DIE_OF`), each fold fitting the stage on the rest. The per-op device model under the composition
is the shipped one, which was fitted on kernel measurements of some of these chips (A100, V100, A40, RTX
3090/A6000, RTX 4090/L40S's AD102, T4's TU104): the chip hold-out holds out their whole runs, not their kernels,
and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import pandas as pd

from perfmodel.core.accuracy import throughput_ape
from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.chips import die_of as chip_of
from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import IntraNodeLink, Parallelism, PlacementSpec

if TYPE_CHECKING:
    from perfmodel.predictor.placed import PlacementPredictor
    from perfmodel.predictor.predict import Prediction


@dataclass(frozen=True)
class RealRun:
    """One measured configuration (repeats merged into their median)."""

    source: str
    model: str  # zoo name
    family: str
    accelerator: str
    devices: int
    precision: str
    batch_size: int  # per GPU
    global_batch_size: int
    measured_samples_per_s: float
    unit: str
    items_per_sample: float
    repeats: int
    suite: str = ""
    gradient_sync: bool = True  # False: each GPU trained its own replica (no all-reduce; see the module docstring)
    pytorch_version: str = ""  # the software it ran on, PyTorch's major.minor (`software_version`); "": unknown

    @property
    def measured_ms(self) -> float:
        """The measured step: one optimizer step of the whole job, ms."""
        return self.global_batch_size / self.measured_samples_per_s * 1e3

    def spec(self, seq_len: int) -> JobSpec:
        # the optimizer: the zoo model's reference one (NVIDIA DeepLearningExamples' defaults)
        return JobSpec.from_options(zoo=self.model, batch_size=self.batch_size, seq_len=seq_len,
                                    precision=self.precision)

    def placement(self, intra_node_link: IntraNodeLink | None = None) -> PlacementSpec:
        """Data parallel over the run's GPUs of one node; one replica on one GPU for a run without gradient
        synchronisation (its GPUs' steps are independent). `intra_node_link`: the placement's override of the
        catalog's link (`host`: no peer-to-peer)."""
        devices = self.devices if self.gradient_sync else 1
        return PlacementSpec(accelerator=self.accelerator, devices_per_node=(devices,),
                             global_batch_size=self.batch_size * devices, parallelism=Parallelism(data=devices),
                             intra_node_link=intra_node_link)


def lambda_runs(folder: str | Path) -> list[RealRun]:
    """Lambda's successful runs of zoo models on catalog GPUs, read from the dataset folder (see `real_runs`)."""
    from perfmodel.importers.lambda_runs import read_lambda

    records = [r for r in read_lambda(folder) if r.ok]
    frame = pd.DataFrame([{"source": r.source, "model": r.model, "accelerator": r.accelerator,
                           "devices": int(r.devices), "precision": str(getattr(r.precision, "value", r.precision)),
                           "batch_size": r.batch_size, "global_batch_size": int(r.global_batch_size),
                           "throughput_items_per_s": r.throughput, "unit": r.unit, "suite": r.suite,
                           "gradient_sync": r.gradient_sync, "pytorch_version": r.pytorch_version}
                          for r in records])
    runs = real_runs(frame)
    if not runs:
        raise PerfmodelError(f"no successful Lambda run of a zoo model on a catalog GPU in {folder}")
    return runs


# what identifies one configuration of a Lambda run (`bridge`: whether its GPUs were joined by NVLink bridges, where
# the results folder says); `repeat_spread` adds the suite for its same-software figure
REPEAT_KEY = ("accelerator", "model", "precision", "devices", "batch_size", "bridge")


def repeat_spread(records: Iterable[Any]) -> dict[str, dict[str, float | int]]:
    """How closely the runs repeat themselves, the floor no prediction that knows nothing of the server can beat:
    each successful run of a configuration (`REPEAT_KEY`: GPU, model, math, GPUs, per-GPU batch, NVLink bridges)
    measured more than once (another results folder, test round or log), predicted by the geometric mean of the
    configuration's other measurements, scored as the answers are (`throughput_ape`). `same_software`: repeats of
    the same suite only; `any_software`: across suites (containers) too. Per group: the MAPE and median APE at one
    GPU and at 2-16, and how many runs were scored. `records`: `perfmodel.importers.lambda_runs.WholeJobRun`s."""
    frame = pd.DataFrame([{"accelerator": r.accelerator, "model": r.model,
                           "precision": str(getattr(r.precision, "value", r.precision)), "devices": int(r.devices),
                           "batch_size": float(r.batch_size), "suite": r.suite, "throughput": float(r.throughput),
                           "bridge": _bridge(r.variant)}
                          for r in records if r.ok and r.accelerator is not None and r.throughput])
    out: dict[str, dict[str, float | int]] = {}
    for name, key in (("same_software", [*REPEAT_KEY, "suite"]), ("any_software", list(REPEAT_KEY))):
        scored: dict[bool, list[float]] = {True: [], False: []}
        for values, group in (frame.groupby(key).throughput if len(frame) else ()):
            if len(group) < 2:
                continue
            logs = np.log(group.to_numpy(dtype=np.float64))
            others = (logs.sum() - logs) / (len(logs) - 1)  # each run's others, their geometric mean
            # throughputs as inverse steps: the others' mean answers, the run is measured
            apes = throughput_ape(np.exp(-others), np.exp(-logs))
            scored[values[key.index("devices")] == 1].extend(apes.tolist())
        figures: dict[str, float | int] = {}
        for one, label in ((True, "one_gpu"), (False, "multi_gpu")):
            apes = np.asarray(scored[one])
            figures[f"{label}_runs"] = int(len(apes))
            figures[f"{label}_mape_pct"] = float(100 * apes.mean()) if len(apes) else float("nan")
            figures[f"{label}_median_ape_pct"] = float(100 * np.median(apes)) if len(apes) else float("nan")
        out[name] = figures
    return out


def _bridge(variant: str | None) -> str:
    """"NVLink bridge" / "no NVLink bridge" where a run's folder says (its test round dropped), else ""."""
    return variant.split(";")[0].strip() if variant and "bridge" in variant else ""


def stored_runs(store: Any) -> list[RealRun]:
    """The successful whole-job runs a store holds (`perfmodel import lambda`), as `real_runs` merges them."""
    frame = store.whole_job_measurements(status="ok")
    if frame.empty:
        return []
    extras = [extra if isinstance(extra, dict) else {} for extra in frame["extra"]]
    return real_runs(frame.assign(suite=[extra.get("suite", "") for extra in extras],
                                  gradient_sync=[bool(extra.get("gradient_sync", True)) for extra in extras],
                                  pytorch_version=[extra.get("pytorch_version") for extra in extras]))


def software_version(builds: Iterable[Any]) -> str:
    """The PyTorch major.minor that the repeats of one configuration ran on ("1.13" from "1.13.0a0+d0d6b1f"), when
    the ones that name a build agree; "" when none does or they disagree."""
    versions = {".".join(str(b).split(".")[:2]) for b in builds if isinstance(b, str) and b.strip()}
    return versions.pop() if len(versions) == 1 else ""


def real_runs(frame: pd.DataFrame) -> list[RealRun]:
    """Runs of zoo models on catalog GPUs (columns source, model, accelerator, devices, precision, batch_size,
    global_batch_size, throughput_items_per_s, unit, suite, and optionally gradient_sync and pytorch_version),
    repeats of one configuration merged into their median throughput, converted to samples/s with the zoo entry's
    items per sample, and their PyTorch version (`software_version`)."""
    from perfmodel.jobs.zoo import ZOO

    frame = frame[frame["accelerator"].notna() & frame["model"].isin(list(ZOO))
                  & (frame["throughput_items_per_s"] > 0)]
    frame = frame.assign(batch_size=frame["batch_size"].round().astype(int))
    if "gradient_sync" not in frame.columns:
        frame = frame.assign(gradient_sync=True)
    if "pytorch_version" not in frame.columns:
        frame = frame.assign(pytorch_version=None)
    keys = ["source", "model", "accelerator", "devices", "precision", "batch_size", "global_batch_size", "unit",
            "suite", "gradient_sync"]
    out = []
    for key, group in frame.groupby(keys, sort=True):
        values: dict[str, Any] = dict(zip(keys, key))
        entry = ZOO[values["model"]]
        per_sample = entry.items(entry.reference_seq_len or 128)
        out.append(RealRun(source=values["source"], model=values["model"], family=entry.family,
                           accelerator=values["accelerator"], devices=int(values["devices"]),
                           precision=values["precision"], batch_size=int(values["batch_size"]),
                           global_batch_size=int(values["global_batch_size"]),
                           measured_samples_per_s=float(group["throughput_items_per_s"].median()) / per_sample,
                           unit=values["unit"], items_per_sample=per_sample, repeats=len(group),
                           suite=values["suite"], gradient_sync=bool(values["gradient_sync"]),
                           pytorch_version=software_version(group["pytorch_version"])))
    return out


class ReplicaJitters(TypedDict):
    """The placement model's replica jitters (`IterationParams`' fields of the same names)."""

    dp_jitter: float
    dp_jitter_steady: float | None
    dp_jitter_varying: float | None


# the placement model's replica jitters, all off (`composing`)
NO_JITTER = ReplicaJitters(dp_jitter=0.0, dp_jitter_steady=None, dp_jitter_varying=None)


@contextmanager
def composing(predictor: PlacementPredictor) -> Iterator[None]:
    """Within: `predictor` composes without what it learned from runs like these, its whole-step stage and its
    replica jitter (`dp_jitter` and its kinds'); both are restored after."""
    saved, predictor.whole_step = predictor.whole_step, None
    saved_params, predictor.params = predictor.params, replace(predictor.params, **NO_JITTER)
    try:
        yield
    finally:
        predictor.whole_step, predictor.params = saved, saved_params


def placed_columns(placed: Prediction) -> dict[str, float]:
    """A composed frame's columns of one placement's prediction: its step, exposed communication and compute."""
    return {"placement_ms": placed.iter_time_ms, "communication_ms": placed.breakdown_ms.get("communication", 0.0),
            "compute_ms": placed.breakdown_ms.get("forward", 0.0) + placed.breakdown_ms.get("backward", 0.0)}


def composed_frame(runs: Iterable[RealRun], predictor: PlacementPredictor,
                   progress: Callable[[str], None] = lambda _: None) -> pd.DataFrame:
    """One row per run: identity, measured and composed steps, and the composition features. `predictor`: a
    `PlacementPredictor`; what it learned from runs like these is set aside while composing: its whole-step stage
    and its replica jitter (`dp_jitter`, so the composed step has no wait for the slowest replica)."""
    from perfmodel.jobs.zoo import ZOO

    records = []
    with composing(predictor):
        for i, run in enumerate(runs):
            entry = ZOO[run.model]
            spec = run.spec(entry.reference_seq_len or 128)
            placement = run.placement()
            if i % 50 == 0:
                progress(f"{i}: {run.model} on {run.devices} x {run.accelerator} ({run.precision})")
            try:
                placed = predictor.predict(spec, placement)
                single_placement = placement.model_copy(update={"devices_per_node": (1,),
                                                                "global_batch_size": run.batch_size,
                                                                "parallelism": Parallelism()})
                single = predictor.predict(spec, single_placement)
                features = predictor.composition(spec, single_placement)
            except PerfmodelError as exc:
                progress(f"skipped {run.model} on {run.accelerator}: {exc}")
                continue
            records.append({
                **{k: getattr(run, k) for k in ("source", "model", "family", "accelerator", "devices", "precision",
                                                "batch_size", "global_batch_size", "repeats", "suite",
                                                "gradient_sync", "pytorch_version")},
                "key": run_key(run), "chip": chip_of(run.accelerator), "measured_ms": run.measured_ms,
                "measured_samples_per_s": run.measured_samples_per_s,
                "single_ms": single.iter_time_ms, **placed_columns(placed), "fits": bool(placed.fits),
                **(features or {})})
    return pd.DataFrame.from_records(records)


def recomposed_without_p2p(frame: pd.DataFrame, runs: Iterable[RealRun], predictor: PlacementPredictor,
                           suite: str) -> pd.DataFrame:
    """`frame` (a composed frame of `runs`) with the data-parallel multi-GPU runs of `suite` composed again as if
    their GPUs had no peer-to-peer (`intra_node_link="host"`, as under `NCCL_P2P_DISABLE=1`): their
    `placement_ms`, `communication_ms` and `compute_ms` replaced, without stage and replica jitter as
    `composed_frame` composes. For the question of what a benchmark's environment did that its records omit."""
    from perfmodel.jobs.zoo import ZOO

    wanted = {run_key(r): r for r in runs if r.suite == suite and r.devices > 1 and r.gradient_sync}
    out = frame.copy()
    with composing(predictor):
        for i in np.flatnonzero(out["key"].isin(list(wanted)).to_numpy()):
            run = wanted[out["key"].iat[i]]
            placed = placed_columns(predictor.predict(run.spec(ZOO[run.model].reference_seq_len or 128),
                                                      run.placement("host")))
            out.iloc[i, out.columns.get_indexer(list(placed))] = list(placed.values())
    return out


# the columns of a composed frame the evaluation reads beyond identity, steps and features (a cached frame without
# them was composed by an older build: compose again)
COMPOSED_COLUMNS = frozenset({"gradient_sync", "compute_ms"})


def read_composed(cache: Path | None) -> pd.DataFrame | None:
    """The composed frame kept in `cache` (Parquet), or None where there is none or it lacks `COMPOSED_COLUMNS` or
    a composition feature."""
    from perfmodel.predictor.composition import COMPOSITION_FEATURES

    if cache is None or not cache.is_file():
        return None
    frame = pd.read_parquet(cache)
    return frame if COMPOSED_COLUMNS | set(COMPOSITION_FEATURES) <= set(frame.columns) else None


def disk_graphs(folder: Path, max_size: int = 256) -> Callable[[JobSpec], Any]:
    """A graph source for `PlacementPredictor(graphs=...)` that keeps every captured graph as IR JSON in `folder`, so
    that processes composing the same jobs capture each once, and that makes each model's graph at a new batch from
    its affine model once three batches of it agree (`perfmodel.engine.graphs.GraphCache`): a Tacotron 2 graph of
    850 mel frames takes over a minute of CPU to capture, and the runs use some twenty batches of it."""
    from perfmodel.engine.graphs import GraphCache

    folder.mkdir(parents=True, exist_ok=True)
    cache = GraphCache(max_size, isolated=False, directory=folder)
    return cache.graph


# A measured step this many times shorter than the roofline of the work its graph counts (every kernel at the
# GPU's peak FLOP/s or bandwidth, at the per-GPU batch) is no training step but a logging artefact: one of Lambda's
# runs (NCF, 8 x A100 80GB SXM4, AMP: 253x its one-GPU throughput) is 17x below it. The kernel counts can be off
# (Mask R-CNN's proposals, a laptop GPU's sustained clock: measured steps down to 0.59x the roofline), never by 4x.
# The threshold was set by looking at these runs.
IMPOSSIBLE_BELOW_ROOFLINE = 0.25


def physically_possible(frame: pd.DataFrame) -> pd.Series:
    """Per composed row: whether its measured step is at least `IMPOSSIBLE_BELOW_ROOFLINE` of one device's roofline
    (`single_ms` x `roofline_over_composed`)."""
    floor = frame["single_ms"] * frame["roofline_over_composed"]
    return ~(frame["measured_ms"] < IMPOSSIBLE_BELOW_ROOFLINE * floor)


# A step whose time per sample is this many times that of the same job (model, GPU, math, GPU count, suite) at a
# smaller per-GPU batch is no steady training step: the same kernels on more data never take longer per sample by
# much (larger kernels fill the GPU better); a step that slows 8x when its batch doubles is a GPU at the edge of its
# memory (the caching allocator freeing and re-allocating every step, or worse), not the job's speed. In Lambda's
# runs one configuration is: WaveGlow TF32 at batch 10 on RTX A4000s (16 GB), at 1-16 GPUs, 8-10x the time per
# sample of its batch 5; the next largest ratio, 2.6x, is a laptop GPU's. The threshold was set by looking at these
# runs.
THRASH_ABOVE_SMALLER_BATCH = 4.0
SAME_JOB_KEYS = ("model", "accelerator", "precision", "devices", "suite")


def thrash_ratio(frame: pd.DataFrame) -> pd.Series:
    """Per row: its measured time per sample over the least time per sample of the same job (`SAME_JOB_KEYS`) at
    a smaller per-GPU batch (1.0 where no smaller batch of it was measured)."""
    batch = frame["batch_size"].to_numpy(dtype=np.float64)
    per_sample = frame["measured_ms"].to_numpy(dtype=np.float64) / batch
    ratio = np.ones(len(frame))
    for rows in frame.groupby(list(SAME_JOB_KEYS), sort=False).indices.values():
        for row in rows:
            smaller = per_sample[rows[batch[rows] < batch[row]]]
            if smaller.size:
                ratio[row] = per_sample[row] / smaller.min()
    return pd.Series(ratio, index=frame.index)


TWIN_KEYS = ("model", "accelerator", "precision", "batch_size", "suite")


def slower_than_one_gpu(frame: pd.DataFrame) -> pd.Series:
    """Per composed row: whether it is a data-parallel run on n GPUs whose whole job trained slower than one GPU of
    the same configuration (`TWIN_KEYS`: model, GPU, math, per-GPU batch, suite) while its all-reduce, as the
    placement model prices it over the run's links (`communication_ms`), is under (n - 1) one-GPU steps.

    Each of n GPUs computes the one-GPU step on its own batch, so the job's throughput n B / (T1 + C) stays above one
    GPU's, B / T1, unless the all-reduce takes C > (n - 1) T1: a run below one GPU without such an all-reduce did not
    train in step (a stalled rank, a data loader or launcher far off its one-GPU speed), and its throughput is not
    the job's on that placement. In Lambda's runs five are: GNMT on 2 and 4 A100 SXM4 40GB in the v1 suite (both
    maths) and on 8 in TF32, at 0.11-0.27 of linear scaling over NVLink, where the v0 suite's runs of the same GPU
    and model scale at 0.95-0.98; the all-reduce priced there is under 1.5 ms against one-GPU steps of 188-225 ms.
    This rule was written after seeing those runs."""
    keys = list(TWIN_KEYS)
    ones = frame.loc[frame.devices == 1, [*keys, "measured_ms", "global_batch_size"]].drop_duplicates(keys)
    twin = frame[keys].merge(ones, on=keys, how="left").set_index(frame.index)  # NaN: no one-GPU twin
    synced = frame["gradient_sync"].astype(bool) if "gradient_sync" in frame.columns else True
    below_one = frame.global_batch_size / frame.measured_ms < twin.global_batch_size / twin.measured_ms
    unexplained = frame.communication_ms < (frame.devices - 1) * twin.measured_ms
    return (frame.devices > 1) & synced & below_one & unexplained


def steady_steps(frame: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """Which composed rows are steady training steps (`physically_possible`, not `THRASH_ABOVE_SMALLER_BATCH`
    times slower per sample than a smaller batch of the same job, and not `slower_than_one_gpu`), and a note naming
    each row left out and why."""
    possible = physically_possible(frame)
    ratio = thrash_ratio(frame)
    thrash = ratio > THRASH_ABOVE_SMALLER_BATCH
    stalled = slower_than_one_gpu(frame) & possible & ~thrash
    notes = [f"left out: {r.model} on {r.devices} x {r.accelerator} ({r.precision}, batch {r.batch_size}): its "
             f"measured step, {r.measured_ms:.3g} ms, is under {IMPOSSIBLE_BELOW_ROOFLINE:g} of the roofline of its "
             f"work (a logging artefact, not a training step)" for r in frame[~possible].itertuples(index=False)]
    notes += [f"left out: {r.model} on {r.devices} x {r.accelerator} ({r.precision}, batch {r.batch_size}): "
              f"{ratio[r.Index]:.1f}x the time per sample of a smaller batch of it (a GPU at the edge of its memory, "
              f"not a steady training step)" for r in frame[thrash & possible].itertuples()]
    notes += [f"left out: {r.model} on {r.devices} x {r.accelerator} ({r.precision}, batch {r.batch_size}, suite "
              f"{r.suite}): the whole job trained slower than one GPU of it, which its all-reduce does not explain "
              f"(its GPUs did not train in step)" for r in frame[stalled].itertuples()]
    return possible & ~thrash & ~stalled, notes



def data_parallel_twins(frame: pd.DataFrame) -> Iterator[tuple[Any, pd.Series, dict[str, Any]]]:
    """(row, its one-GPU twin, the pair's identity) for every data-parallel multi-GPU run of `frame` whose one-GPU
    configuration (same model, GPU, math, per-GPU batch, suite) was measured too. Runs without gradient
    synchronisation (column `gradient_sync` False) are left out."""
    ones = frame[frame.devices == 1].set_index(list(TWIN_KEYS))
    synced = frame["gradient_sync"].astype(bool) if "gradient_sync" in frame.columns else True
    for row in frame[(frame.devices > 1) & synced].itertuples(index=False):
        key = tuple(getattr(row, k) for k in TWIN_KEYS)
        if key in ones.index:
            yield row, ones.loc[[key]].iloc[0], {k: getattr(row, k) for k in (*TWIN_KEYS, "devices", "family", "chip")}


def scaling_ratio_errors(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per data-parallel multi-GPU run with a one-GPU twin (`data_parallel_twins`): the measured and predicted
    n-GPU / 1-GPU throughput ratio at the same per-GPU batch and math, and the ratio's APE."""
    rows = []
    for row, one, identity in data_parallel_twins(frame):
        measured = (row.global_batch_size / row.measured_ms) / (one.global_batch_size / one.measured_ms)
        predicted = (row.global_batch_size / getattr(row, column)) / (one.global_batch_size / one[column])
        rows.append({**identity, "measured_ratio": measured, "predicted_ratio": predicted,
                     "ape": abs(predicted / measured - 1.0)})
    return pd.DataFrame.from_records(rows)


JITTER_GRID = np.linspace(0.0, 0.3, 121)


def jitter_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The data-parallel multi-GPU runs of a composed frame with their one-GPU twins (`data_parallel_twins`): the
    measured n-GPU / 1-GPU step ratio, the placement's composed step (`composed_frame` composes it without the wait
    for the slowest replica), that wait per unit of jitter (`iteration.py`: E[max of d normals] · compute) and the
    twin's composed step."""
    from perfmodel.jobs.zoo import find_entry
    from perfmodel.placement.iteration import expected_max_normal, steps_vary_code

    def steps_vary(model: str) -> float:
        entry = find_entry(model)
        return steps_vary_code(entry.reference_steps_vary if entry is not None else None)

    return pd.DataFrame.from_records([
        {**identity, "measured_ratio": row.measured_ms / one.measured_ms, "one_ms": one.placement_ms,
         "base_ms": row.placement_ms, "per_jitter_ms": expected_max_normal(float(row.devices)) * row.compute_ms,
         "steps_vary": steps_vary(row.model)}
        for row, one, identity in data_parallel_twins(frame)])


def predicted_ratio(rows: pd.DataFrame, jitter: float | np.ndarray) -> pd.Series:
    """The n-GPU / 1-GPU step ratio of `rows` (`jitter_rows`) the placement model predicts with the wait of
    `jitter` (one for every row, or each row's)."""
    return (rows.base_ms + jitter * rows.per_jitter_ms) / rows.one_ms


def fit_replica_jitters(rows: pd.DataFrame) -> ReplicaJitters:
    """The placement model's replica jitters (`IterationParams`) fitted on `rows` (`jitter_rows`): `dp_jitter` on
    every row (a job whose kind is not known), `dp_jitter_steady` and `dp_jitter_varying` on the rows of models
    whose reference implementation's steps do not vary, and do (`ZooEntry.reference_steps_vary`; None without
    such rows: `dp_jitter` answers them)."""
    kinds = rows["steps_vary"] if "steps_vary" in rows else pd.Series(-1.0, index=rows.index)
    steady, varying = rows[kinds == 0], rows[kinds > 0]
    return ReplicaJitters(dp_jitter=fit_dp_jitter(rows),
                          dp_jitter_steady=fit_dp_jitter(steady) if len(steady) else None,
                          dp_jitter_varying=fit_dp_jitter(varying) if len(varying) else None)


def row_jitters(rows: pd.DataFrame, jitters: ReplicaJitters) -> np.ndarray:
    """Each row's replica jitter under `jitters` (`fit_replica_jitters`), by its model's kind."""
    from perfmodel.placement.iteration import IterationParams, replica_jitter

    kinds = rows["steps_vary"].to_numpy(dtype=float) if "steps_vary" in rows else np.full(len(rows), -1.0)
    params = IterationParams(**jitters)
    return np.asarray(replica_jitter(kinds, params), dtype=float)


def fit_dp_jitter(rows: pd.DataFrame, grid: np.ndarray = JITTER_GRID) -> float:
    """The replica jitter (`IterationParams.dp_jitter`) whose n-GPU / 1-GPU step ratios are closest to the
    measured ones of `rows` (`jitter_rows`) by their mean absolute percentage error (`jitter_ratio_ape`: what the
    bench reports and a scheduler's completion times pay); 0 without rows. The runs' ratios scale worse than
    predicted in a long tail (GNMT, WaveGlow, Tacotron 2, and beyond them a few broken servers), which the mean
    weighs and a median log-error fit does not: on Lambda's runs 0.095 against 0.04 (0.085 without the six broken
    servers' runs), held out by family the ratio's MAPE 18.0 % against 18.8 %, by chip 17.4 % against 18.0 %; the
    loss was chosen after seeing both."""
    if rows.empty:
        return 0.0
    errors = [float(np.mean(jitter_ratio_ape(rows, s))) for s in grid]
    return float(grid[int(np.argmin(errors))])


def scaling_band_log(rows: pd.DataFrame, jitter: float | np.ndarray, quantiles: tuple[float, float] = (0.1, 0.9)
                     ) -> tuple[float, float]:
    """The placement model's own 80 % band (`IterationParams.scaling_band_log`): the p10 and p90 of
    log(measured / predicted) of the n-GPU / 1-GPU step ratio of `rows` (`jitter_rows`) with the wait of `jitter`,
    the low one at most 0 and the high one at least 0; (0, 0) without rows."""
    if rows.empty:
        return 0.0, 0.0
    residual = np.log(rows.measured_ratio.to_numpy() / predicted_ratio(rows, jitter).to_numpy())
    low, high = np.quantile(residual, quantiles)
    return min(float(low), 0.0), max(float(high), 0.0)


def jitter_ratio_ape(rows: pd.DataFrame, jitter: float | np.ndarray) -> np.ndarray:
    """The n-GPU / 1-GPU ratio's APE of `rows` (`jitter_rows`) with the wait of `jitter`."""
    return np.abs(rows.measured_ratio.to_numpy() / predicted_ratio(rows, jitter).to_numpy() - 1.0)


# the whole-step stage the benches and `perfmodel retrain` fit unless told otherwise
DEFAULT_STAGE = "device-whole-step"
STAGES = ("device-whole-step", "xgb-whole-step")


def with_jobs(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its `job` column: each run's level key (zoo model and math)."""
    from perfmodel.regressors.whole_step_device import JOB, job_level_key

    keys = pd.Series([job_level_key(m, p) for m, p in zip(frame["model"], frame["precision"])], index=frame.index,
                     dtype=object)
    return frame.assign(**{JOB: keys})


def fit_stage(train: pd.DataFrame, feature_names: Sequence[str] | None = None, stage: str = DEFAULT_STAGE,
              **settings: Any) -> Any:
    """The whole-step stage `stage` fitted on one-device rows of `train` (target: log(measured / composed)):
    `device-whole-step` (a spec-sheet device effect and a level per measured model; `feature_names`: its device
    features, default `STAGE_FEATURES`) or `xgb-whole-step` (boosted trees over `feature_names`, default
    `COMPOSITION_FEATURES`)."""
    from perfmodel.regressors.whole_step import TARGET, WholeStepRegressor
    from perfmodel.regressors.whole_step_device import JOB, DeviceStepRegressor

    if stage not in STAGES:
        raise PerfmodelError(f"unknown whole-step stage {stage!r}: choose one of {', '.join(STAGES)}")
    from perfmodel.predictor.composition import with_derived_features

    ones = with_derived_features(with_jobs(train[train.devices == 1]))
    frame = ones.assign(**{TARGET: np.log(ones.measured_ms / ones.single_ms)})
    keys = [f"{r.source}:{r.model}:{r.accelerator}:{r.precision}:{r.batch_size}:{r.suite}"
            for r in ones.itertuples(index=False)]
    if stage == "device-whole-step":
        device = DeviceStepRegressor(**settings) if not feature_names else DeviceStepRegressor(
            feature_names=feature_names, **settings)
        software = list(ones["pytorch_version"].fillna("").astype(str)) if "pytorch_version" in ones else None
        return device.fit(frame, groups=list(ones.family), jobs=list(ones[JOB]), chips=list(ones.chip), keys=keys,
                          software=software, devices=list(ones.accelerator))
    from perfmodel.predictor.composition import COMPOSITION_FEATURES

    return WholeStepRegressor(feature_names=feature_names or COMPOSITION_FEATURES, **settings).fit(
        frame, groups=list(ones.family), keys=keys)


def predict_runs(runs: Sequence[RealRun], predictor: PlacementPredictor) -> pd.DataFrame:
    """Every run predicted through the serving path (`PlacementPredictor.predict`, with whatever whole-step stage
    it holds): `predicted_ms` and the 80 % band (`low_ms`, `high_ms`) of the run's placement, and
    `predicted_single_ms` of one GPU at the same per-GPU batch."""
    from perfmodel.jobs.zoo import ZOO

    records = []
    for run in runs:
        spec = run.spec(ZOO[run.model].reference_seq_len or 128)
        placement = run.placement()
        try:
            placed = predictor.predict(spec, placement)
        except PerfmodelError:
            continue
        records.append({"key": run_key(run), "predicted_ms": placed.iter_time_ms, "low_ms": placed.interval_ms[0],
                        "high_ms": placed.interval_ms[1]})
    return pd.DataFrame.from_records(records)


def run_key(run: RealRun | Any) -> str:
    return (f"{run.source}:{run.model}:{run.accelerator}:{run.devices}:{run.precision}:{run.batch_size}:"
            f"{run.global_batch_size}:{run.suite}")


def on_own_software(predicted: pd.DataFrame, frame: pd.DataFrame, stage: Any) -> pd.DataFrame:
    """`predicted` (key, predicted_ms, low_ms, high_ms: the newest software's step, as served) for the software
    each run of `frame` ran on: times the stage's offset of its version (`DeviceStepRegressor.software_offset`;
    none for a stage without, or a run of unknown version). The whole step is scaled, communication included."""
    if "pytorch_version" not in frame or not hasattr(stage, "software_offset") or predicted.empty:
        return predicted
    version_of = dict(zip(frame["key"], frame["pytorch_version"].fillna("").astype(str)))
    factor = np.exp(stage.software_offset([version_of.get(k, "") for k in predicted["key"]]))
    return predicted.assign(**{c: predicted[c].to_numpy() * factor for c in ("predicted_ms", "low_ms", "high_ms")})


def with_software(frame: pd.DataFrame, runs: Sequence[RealRun]) -> pd.DataFrame:
    """`frame` with each run's `pytorch_version` as `runs` know it (a cached frame may predate the column, or what
    the importer knows of a run's container); the frame's own where a run names none."""
    version_of = {run_key(r): r.pytorch_version for r in runs}
    own = frame["pytorch_version"].fillna("").astype(str) if "pytorch_version" in frame else [""] * len(frame)
    keys = [run_key(r) for r in frame.itertuples(index=False)]
    return frame.assign(pytorch_version=[version_of.get(k) or v for k, v in zip(keys, own)])


def predict_from_frame(frame: pd.DataFrame, stage: Any) -> pd.DataFrame:
    """The stage applied to composed rows without the serving path: one device's compute (the placement's step
    less its exposed communication) times the factor, plus that communication. Exact on one GPU; on several it
    leaves the exposed communication as composed (the serving path re-derives its overlap with the corrected
    backward). For quick experiments on a cached frame; the bench's figures come from the serving path."""
    from perfmodel.predictor.composition import with_derived_features

    out = stage.predict(with_derived_features(with_jobs(frame)))
    floor = frame["roofline_over_composed"].to_numpy()
    factor = np.maximum(np.exp(out.log_factor), floor)
    low = np.maximum(np.minimum(np.exp(out.log_low), factor), floor)
    high = np.maximum(np.exp(out.log_high), factor)
    communication = frame["communication_ms"].to_numpy()
    predicted = (frame["placement_ms"].to_numpy() - communication) * factor + communication
    return pd.DataFrame({"key": frame["key"].to_numpy(), "predicted_ms": predicted,
                         "low_ms": predicted * low / factor, "high_ms": predicted * high / factor})


def leave_one_out(runs: Sequence[RealRun], frame: pd.DataFrame, predictor: PlacementPredictor, by: str,
                  feature_names: Sequence[str] | None = None, progress: Callable[[str], None] = lambda _: None,
                  serving_path: bool = True, stage: str = DEFAULT_STAGE, own_software: bool = True,
                  **settings: Any) -> pd.DataFrame:
    """Every run predicted by a stage fitted without its `by` group (family or chip) of `frame` (the composed
    frame of the same runs), through the serving path, with the placement model's replica jitters
    (`fit_replica_jitters`) and its band (`scaling_band_log`) fitted without the group too (or `predict_from_frame` with
    `serving_path=False`: the stage only). `own_software`: each run predicted for the software it ran on (the
    offset of its version, learned without the group: `on_own_software`); else as served, for the newest.
    Returns `frame` joined with `predicted_ms`, `low_ms`, `high_ms`."""
    from perfmodel.predictor.whole_step import WholeStepStage

    frame = frame.assign(key=[run_key(r) for r in frame.itertuples(index=False)])
    group_of = dict(zip(frame.key, frame[by]))
    saved = predictor.whole_step if predictor is not None else None
    saved_params = predictor.params if predictor is not None else None
    pairs = jitter_rows(frame) if serving_path and "compute_ms" in frame.columns else pd.DataFrame()
    parts = []
    try:
        for group in sorted(frame[by].unique()):
            train = frame[frame[by] != group]
            if (train.devices == 1).sum() < 5:
                continue
            fitted = fit_stage(train, feature_names, stage, **settings)
            if not serving_path:
                predicted = predict_from_frame(frame[frame[by] == group], fitted)
                parts.append(on_own_software(predicted, frame, fitted) if own_software else predicted)
                continue
            test = [r for r in runs if group_of.get(run_key(r)) == group]
            progress(f"holding out {by} {group}: {len(test)} runs")
            predictor.set_whole_step(WholeStepStage(fitted, f"without-{group}"))
            if not pairs.empty:  # the replicas' jitter and the placement's band too are learned without the group
                kept = pairs[pairs[by] != group]
                jitters = fit_replica_jitters(kept)
                predictor.params = replace(predictor.params, **jitters,
                                           scaling_band_log=scaling_band_log(kept, row_jitters(kept, jitters)))
            predicted = predict_runs(test, predictor)
            parts.append(on_own_software(predicted, frame, fitted) if own_software else predicted)
    finally:
        if predictor is not None:
            predictor.set_whole_step(saved)
            predictor.params = saved_params
    predicted = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["key"])
    return frame.merge(predicted, on="key", how="inner")
