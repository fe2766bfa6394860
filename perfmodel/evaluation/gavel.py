"""Gavel's measured K80 and P100 throughputs (`../shared/datasets/gavel/`, Gavel's own file) against perfmodel:
isolated steps/s, the P100/K80 speed-up a heterogeneity-aware policy lives on, the n-GPU scaling, and co-located
pairs (the co-location model's own error, from the measured isolated steps, held out by GPU and by job family).

Job types map to the zoo's Gavel models (`GAVEL_JOBS`); each is predicted through the prediction engine as a
scheduler would ask (data parallel, each worker at the job type's batch, 10 Gb/s between servers as Gavel's
unconsolidated LM runs imply, and servers without GPU peer-to-peer: `GAVEL_INTRA_LINK`). A job whose measured step
is more than `HOST_BOUND_RATIO` times the predicted device time on both GPUs is named host-bound likely: its input
pipeline or environment, which no graph shows, sets its pace.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfmodel.calibration.sharing import SHARING_PRIOR_OBSERVATIONS, sharing_factor
from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.colocation import ColocationParams, SharingJob, share, shared_interval, split_step
from perfmodel.placement.spec import IntraNodeLink
from perfmodel.predictor.predict import HOST_BOUND_RATIO

if TYPE_CHECKING:
    from perfmodel.engine.engine import PredictionEngine

GAVEL_FILE = "physical_cluster_throughputs.k80_p100.json"
WORKERS = {"k80": "k80", "p100": "p100-pcie-16gb"}
UNMEASURED_WORKER = ("v100", "v100-sxm2-16gb")  # Gavel's third worker type: none of its runs are here
INTER_NODE_GBIT_S = 10.0
# Gavel's servers were cloud VMs (P100s on GCP; PROVENANCE.md), where GPUs behind PCIe passthrough usually have no
# peer-to-peer: its consolidated runs scale as host-staged transfers do (at 8 P100s, LM 1.5-3.8x and Transformer
# 3.0-5.4x measured, where P2P links would give 6-7x). Not recorded in the data: chosen by looking at these runs
# (`bench/gavel.py` prints the scaling with the catalog's P2P links too).
GAVEL_INTRA_LINK: IntraNodeLink = "host"
# job type prefix -> zoo model (its sequence length and optimizer: the zoo's, as Gavel's workloads train)
GAVEL_JOBS: dict[str, str] = {
    "ResNet-18": "gavel-resnet18",
    "ResNet-50": "gavel-resnet50",
    "Transformer": "gavel-transformer",
    "LM": "gavel-lm",
    "Recommendation": "gavel-recommendation",
    "CycleGAN": "gavel-cyclegan",
    "A3C": "gavel-a3c",
}
_BATCH = re.compile(r"^(.*) \(batch size (\d+)\)$")


def family(job_type: str) -> str:
    match = _BATCH.match(job_type)
    return match.group(1) if match else job_type


def spec_of(job_type: str) -> JobSpec:
    """The zoo job of a Gavel job type ("ResNet-50 (batch size 64)" -> gavel-resnet50 at batch 64)."""
    match = _BATCH.match(job_type)
    name, batch = (match.group(1), int(match.group(2))) if match else (job_type, 1)
    return JobSpec.from_options(zoo=GAVEL_JOBS[name], batch_size=batch)


def read_gavel(path: str | Path) -> dict[str, dict[tuple[str, int], dict[Any, Any]]]:
    """Gavel's file as Gavel's reader parses it (keys evaluated as tuples)."""
    raw = json.loads(Path(path).read_text())
    return {worker: {ast.literal_eval(key): {("null" if other == "null" else ast.literal_eval(other)): value
                                             for other, value in entries.items()}
                     for key, entries in table.items()}
            for worker, table in raw.items()}


@dataclass(frozen=True)
class Predicted:
    """The engine's answer for one job type on one worker type and scale factor."""

    steps_per_s: float
    device_ms: float  # the predicted device time of one step (forward, backward, optimizer, communication)
    host_ms: float
    interval_steps_per_s: tuple[float, float] = (0.0, 0.0)  # [p10, p90]
    conv_share: float = 0.0  # the share of the step's FLOPs in convolutions, as the service attaches to observations


def predict_all(engine: PredictionEngine, measured: Mapping[str, Mapping[tuple[str, int], Any]],
                progress: Callable[[str], None] = lambda _m: None, *,
                intra_node_link: IntraNodeLink | None = GAVEL_INTRA_LINK,
                workers: Mapping[str, str] = WORKERS) -> dict[tuple[str, str, int], Predicted]:
    """Every (worker type incl. _unconsolidated, job type, scale factor) of the measured file, predicted on servers
    whose intra-node link is `intra_node_link` (None: the catalog's); `workers` maps each worker type to its
    accelerator."""
    from perfmodel.engine.gavel import GavelColumn
    from perfmodel.predictor.math_modes import conv_flop_share

    out: dict[tuple[str, str, int], Predicted] = {}
    for worker, table in measured.items():
        base = worker.removesuffix("_unconsolidated")
        accelerator = engine.hardware(workers[base]).name
        consolidated = worker == base
        for job_type, scale_factor in table:
            spec = spec_of(job_type)
            entry = engine.job(spec)
            per_node = engine.hardware(accelerator).node_devices or scale_factor
            layout = (tuple([min(per_node, scale_factor)] * (scale_factor // min(per_node, scale_factor)))
                      if consolidated else (1,) * scale_factor)
            column = GavelColumn(base, accelerator, layout, consolidated, INTER_NODE_GBIT_S,
                                 intra_node_link=intra_node_link if scale_factor > 1 else None)
            answer, job = engine.sharing_input(entry, column.placement(spec.batch_size), 0.0)
            steps_per_s = answer["throughput_samples_per_s"] / spec.batch_size if answer["fits"] else 0.0
            low_ms, high_ms = answer["interval_ms"]
            scale = steps_per_s * answer["iter_time_ms"]
            out[(worker, job_type, scale_factor)] = Predicted(steps_per_s, job.device_ms, job.host_ms,
                                                              (scale / high_ms, scale / low_ms),
                                                              conv_flop_share(entry.graph.totals))
        progress(f"predicted {worker}: {len(table)} job types x scale factors")
    return out


def isolated_frame(measured: Mapping[str, Mapping[tuple[str, int], Any]],
                   predicted: Mapping[tuple[str, str, int], Predicted]) -> pd.DataFrame:
    rows = []
    for worker, table in measured.items():
        for (job_type, scale_factor), entries in table.items():
            value = float(entries["null"])
            if value <= 0:
                continue  # did not run there (out of memory)
            p = predicted[(worker, job_type, scale_factor)]
            rows.append({"worker": worker, "job_type": job_type, "family": family(job_type),
                         "scale_factor": scale_factor, "measured": value, "predicted": p.steps_per_s,
                         "device_ms": p.device_ms, "measured_ms": 1e3 / value, "conv_share": p.conv_share})
    frame = pd.DataFrame(rows)
    return frame.assign(ape=(frame.predicted / frame.measured - 1).abs() * 100)


def host_bound(frame: pd.DataFrame) -> list[str]:
    """Job types whose measured one-GPU step is over `HOST_BOUND_RATIO` x the predicted device time on both GPUs."""
    one = frame[(frame.scale_factor == 1) & ~frame.worker.str.endswith("_unconsolidated")]
    ratio = (one.measured_ms / one.device_ms).groupby(one.job_type).min()
    return sorted(ratio[ratio > HOST_BOUND_RATIO].index)


def speedups(frame: pd.DataFrame, fast: str = "p100", slow: str = "k80") -> pd.DataFrame:
    """Per job type, the one-GPU speed-up from `slow` to `fast`, measured and predicted."""
    one = frame[frame.scale_factor == 1].set_index(["worker", "job_type"])
    jobs = sorted(set(one.loc[fast].index) & set(one.loc[slow].index))
    return pd.DataFrame({"measured": [one.loc[(fast, j), "measured"] / one.loc[(slow, j), "measured"] for j in jobs],
                         "predicted": [one.loc[(fast, j), "predicted"] / one.loc[(slow, j), "predicted"]
                                       for j in jobs]}, index=jobs)


def answered_speedups(engine: PredictionEngine, measured: Mapping[str, Mapping[tuple[str, int], Any]],
                      predicted: Mapping[tuple[str, str, int], Predicted], worker: str,
                      accelerator: str) -> pd.DataFrame:
    """Per job type of the measured one-GPU tables, the one-GPU steps/s answered on `accelerator` (Gavel's `worker`
    type, of which no run is here) and its answered speed-up over each measured worker type: what a scheduler
    reads from the table, with no measurement to score it."""
    jobs = sorted({job for table in measured.values() for job, sf in table if sf == 1})
    answers = predict_all(engine, {worker: {(job, 1): None for job in jobs}}, workers={worker: accelerator})
    out = pd.DataFrame({worker: [answers[(worker, job, 1)].steps_per_s for job in jobs]}, index=jobs)
    for base in WORKERS:
        mine = [predicted.get((base, job, 1)) for job in jobs]
        out[f"over_{base}"] = [out.loc[job, worker] / p.steps_per_s if p and p.steps_per_s else np.nan
                               for job, p in zip(jobs, mine)]
    return out


def observed_on_the_gpu(frame: pd.DataFrame, catalog: Mapping[str, Any]) -> pd.DataFrame:
    """One-GPU runs predicted as a scheduler meets them once it has run other jobs there: on each GPU, each job
    family's runs calibrated by the fleet (`perfmodel.calibration.fleet`) from the other families' measured one-GPU
    runs on that GPU posted as observations, never its own, each with its share of convolution FLOPs as the service
    attaches it. `calibrated` (steps/s) and `level` added."""
    from perfmodel.calibration.fleet import FleetPoint, FleetQuery, fit_fleet
    from perfmodel.hardware.chips import die_of

    one = frame[(frame.scale_factor == 1) & ~frame.worker.str.endswith("_unconsolidated")].reset_index(drop=True)
    if "conv_share" not in one:
        one = one.assign(conv_share=0.0)  # not known: no op-mix effect
    accelerator = {w: WORKERS[w] for w in one.worker.unique()}

    def where(worker: str) -> tuple[str, str, str]:
        name = accelerator[worker]
        return name, die_of(name), catalog[name].architecture or name

    calibrated, level = [], []
    for r in one.itertuples():
        points = [FleetPoint(i, o.family, *where(o.worker), "fp32", math.log(o.predicted / o.measured),
                             conv_share=o.conv_share)
                  for i, o in enumerate(one.itertuples())
                  if o.worker == r.worker and o.family != r.family and o.predicted > 0]
        applied = fit_fleet(points).apply(FleetQuery(r.family, *where(r.worker), "fp32", conv_share=r.conv_share))
        calibrated.append(r.predicted * applied.throughput_factor)
        level.append(applied.level)
    return one.assign(calibrated=calibrated, level=level,
                      calibrated_ape=(np.array(calibrated) / one.measured - 1).abs() * 100)


def scaling(frame: pd.DataFrame) -> pd.DataFrame:
    """Per worker type, job type and scale factor > 1: the n-GPU / 1-GPU steps/s ratio, measured and predicted."""
    one = frame[frame.scale_factor == 1].set_index(["worker", "job_type"])
    rows = []
    for r in frame[frame.scale_factor > 1].itertuples():
        base = r.worker.removesuffix("_unconsolidated")
        if (base, r.job_type) not in one.index:
            continue
        ref = one.loc[(base, r.job_type)]
        rows.append({"worker": r.worker, "job_type": r.job_type, "scale_factor": r.scale_factor,
                     "measured": r.measured / ref.measured, "predicted": r.predicted / ref.predicted})
    return pd.DataFrame(rows)


# --- co-location -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    worker: str
    a: str
    b: str
    measured: tuple[float, float]  # steps/s of a, b while sharing
    isolated: tuple[float, float]  # measured alone
    device_ms: tuple[float, float]  # predicted device time of a step
    host_ms: tuple[float, float] = (0.0, 0.0)  # predicted host time of a step
    predicted: tuple[float, float] = (0.0, 0.0)  # predicted isolated steps/s
    predicted_interval: tuple[tuple[float, float], tuple[float, float]] = ((0.0, 0.0), (0.0, 0.0))


def served_slowdowns(pair: Pair, params: ColocationParams) -> tuple[float, float]:
    """Each job's step while sharing over its step alone, as the service answers the pair: from the predicted device
    and host time alone (time-slicing)."""
    jobs = [SharingJob(pair.device_ms[i], pair.host_ms[i]) for i in (0, 1)]
    shared = share(jobs[0], jobs[1], "time-slicing", params)
    return shared.step_ms[0] / jobs[0].step_ms, shared.step_ms[1] / jobs[1].step_ms


def kept_as_served(pairs: Sequence[Pair], params: ColocationParams = ColocationParams()) -> float:
    """MAPE % of the share of its isolated throughput each job keeps while sharing, as the service answers it
    (from the predicted device and host time alone, no measurement), against Gavel's measured share."""
    errors = [abs(1 / slowdown / (p.measured[i] / p.isolated[i]) - 1)
              for p in pairs for i, slowdown in enumerate(served_slowdowns(p, params))]
    return float(np.mean(errors) * 100) if errors else float("nan")


def served_coverage(pairs: Sequence[Pair], params: ColocationParams) -> tuple[float, float]:
    """As the service answers a co-located pair (predicted isolated steps, device and host time; `params` and its
    band): (MAPE %, share of jobs whose measured co-located steps/s fall in the answer's [p10, p90] interval)."""
    errors, inside = [], []
    for p in pairs:
        if min(p.predicted) <= 0:
            continue
        for i, slowdown in enumerate(served_slowdowns(p, params)):
            answer = p.predicted[i] / slowdown
            low, high = shared_interval(answer, p.predicted_interval[i], slowdown, params.kept_band_log)
            errors.append(abs(answer / p.measured[i] - 1))
            inside.append(low <= p.measured[i] <= high)
    if not errors:
        return float("nan"), float("nan")
    return float(np.mean(errors) * 100), float(np.mean(inside))


# two copies of one job sharing a GPU together keep 0.8-1.6 of what one keeps alone, for every job type of Gavel's
# file against its own isolated figure but one (time-slicing shares the device; it does not lose most of it)
SAME_JOB_COMBINED = (0.75, 1.75)


def pair_isolated(measured: Mapping[str, Mapping[tuple[str, int], Any]], worker: str) -> dict[str, tuple[float, str]]:
    """{job type: (the one-GPU isolated steps/s its pairs on `worker` are measured against, the table it is from)}.

    Gavel's file holds two one-GPU isolated figures of each job: `worker`'s and `<worker>_unconsolidated`'s (one
    device per server: the same placement at one GPU), and one set of pairs (the same in both tables). The two agree
    within 20 % for every job type but Recommendation (1.5-1.8x on the K80, 2.4-3.7x on the P100: Gavel re-measured
    it alone, PROVENANCE.md). A job's isolated figure is `worker`'s unless its same-job pair (two copies sharing the
    GPU) keeps, against it, a combined share outside `SAME_JOB_COMBINED` while the other table's figure puts it
    inside: then its pairs were measured with the job the other figure is of."""
    table, other = measured[worker], measured.get(f"{worker}_unconsolidated", {})
    out = {}
    for (job, scale_factor), entries in table.items():
        if scale_factor != 1:
            continue
        own = float(entries["null"])
        out[job] = (own, worker)
        same = entries.get((job, 1))
        alternative = float(other.get((job, 1), {}).get("null", 0.0))
        if not same or min(same) <= 0 or own <= 0 or alternative <= 0:
            continue
        low, high = SAME_JOB_COMBINED
        if not low <= sum(same) / own <= high and low <= sum(same) / alternative <= high:
            out[job] = (alternative, f"{worker}_unconsolidated")
    return out


def pairs_of(measured: Mapping[str, Mapping[tuple[str, int], Any]],
             predicted: Mapping[tuple[str, str, int], Predicted]) -> list[Pair]:
    """Gavel's one-GPU co-located pairs (each unordered pair once), with each job's measured isolated steps
    (`pair_isolated`)."""
    out = []
    for worker in ("k80", "p100"):
        table = measured[worker]
        isolated = pair_isolated(measured, worker)
        for (a, sf), entries in table.items():
            if sf != 1:
                continue
            for other, value in entries.items():
                if other == "null" or other[1] != 1 or other[0] < a:
                    continue
                b = other[0]
                alone = (isolated[a][0], isolated[b][0])
                if min(alone) <= 0 or min(value) <= 0:
                    continue
                pa, pb = predicted[(worker, a, 1)], predicted[(worker, b, 1)]
                out.append(Pair(worker, a, b, (float(value[0]), float(value[1])), alone,
                                (pa.device_ms, pb.device_ms),
                                (pa.host_ms, pb.host_ms), (pa.steps_per_s, pb.steps_per_s),
                                (pa.interval_steps_per_s, pb.interval_steps_per_s)))
    return out


def sharing_job(isolated_steps_per_s: float, device_ms: float, params: ColocationParams) -> SharingJob:
    """A job's measured isolated step against the predicted device time (`colocation.split_step`)."""
    return split_step(1e3 / isolated_steps_per_s, device_ms, 0.0, params.host_share_of_gap)


def predict_pairs(pairs: Iterable[Pair], params: ColocationParams) -> np.ndarray:
    """(pairs, 2) predicted steps/s of each job while sharing, from the measured isolated steps."""
    out = []
    for p in pairs:
        jobs = [sharing_job(p.isolated[i], p.device_ms[i], params) for i in (0, 1)]
        shared = share(jobs[0], jobs[1], "time-slicing", params)
        out.append([p.isolated[i] * jobs[i].step_ms / shared.step_ms[i] for i in (0, 1)])
    return np.array(out).reshape(-1, 2)


def log_residuals(pairs: Sequence[Pair], params: ColocationParams) -> np.ndarray:
    """log(measured / predicted) co-located steps/s of each job of each pair (from the measured isolated steps)."""
    if not pairs:
        return np.zeros(0)
    return np.log(np.array([p.measured for p in pairs]) / predict_pairs(pairs, params)).ravel()


def error_band(residuals: np.ndarray) -> tuple[float, float]:
    """The 10th and 90th percentiles of log residuals (`ColocationParams.kept_band_log`)."""
    low, high = np.quantile(residuals, [0.1, 0.9])
    return float(low), float(high)


def in_band(residuals: np.ndarray, band: tuple[float, float]) -> float:
    """Share of residuals inside the band."""
    return float(np.mean((residuals >= band[0]) & (residuals <= band[1]))) if len(residuals) else float("nan")


def pair_mape(pairs: Sequence[Pair], params: ColocationParams) -> float:
    if not pairs:
        return float("nan")
    predicted = predict_pairs(pairs, params)
    measured = np.array([p.measured for p in pairs])
    return float(np.mean(np.abs(predicted / measured - 1)) * 100)


GRID_HOST = np.linspace(0.0, 1.0, 11)
GRID_SWITCH = np.linspace(0.0, 1.5, 7)
GRID_WAIT_MS = (0.0, 10.0, 20.0, 40.0, 60.0, 80.0)


def fit_params(pairs: Sequence[Pair], source: str) -> ColocationParams:
    """The (host share of the gap, switch overhead, wait per step for the other's time slice) minimising
    co-located MAPE on `pairs` (a grid search)."""
    best = min(itertools.product(GRID_HOST, GRID_SWITCH, GRID_WAIT_MS),
               key=lambda hsw: pair_mape(pairs, ColocationParams(float(hsw[1]), float(hsw[0]), float(hsw[2]))))
    return ColocationParams(switch_overhead=round(float(best[1]), 6), host_share_of_gap=round(float(best[0]), 6),
                            sync_wait_ms=float(best[2]), source=source)  # grid points as written: 0.7, not 0.70..01


def partner_ranking(pairs: Sequence[Pair], params: ColocationParams) -> float:
    """Mean Spearman correlation, over jobs with 3+ partners on a GPU, of each job's co-located steps/s across its
    partners, predicted against measured (which partner packs best with it)."""
    predicted = predict_pairs(pairs, params)
    by_job: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for p, pred in zip(pairs, predicted):
        by_job.setdefault((p.worker, p.a), []).append((p.measured[0], pred[0]))
        by_job.setdefault((p.worker, p.b), []).append((p.measured[1], pred[1]))
    scores = []
    for values in by_job.values():
        if len(values) >= 3:
            m, q = zip(*values)
            rho = pd.Series(m).rank().corr(pd.Series(q).rank())
            if not math.isnan(rho):
                scores.append(rho)
    return float(np.mean(scores)) if scores else float("nan")


def _answers_by_job(pairs: Sequence[Pair], params_of: Callable[[str, str], ColocationParams], served: bool
                    ) -> dict[tuple[str, str], np.ndarray]:
    """{(GPU, job type): (pairs, 3) of measured co-located steps/s, the answer, the job's isolated steps/s}."""
    by_job: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for p in pairs:
        for i, job in enumerate((p.a, p.b)):
            params = params_of(family(job), p.worker)
            if served:
                predicted, cap = p.predicted[i] / served_slowdowns(p, params)[i], p.predicted[i]
            else:
                predicted, cap = float(predict_pairs([p], params)[0][i]), p.isolated[i]
            if predicted > 0:
                by_job.setdefault((p.worker, job), []).append((p.measured[i], predicted, cap))
    return {key: np.array(rows) for key, rows in by_job.items()}


def reported_residuals(pairs: Sequence[Pair], params_of: Callable[[str, str], ColocationParams], k: int, *,
                       served: bool = False, prior: float = SHARING_PRIOR_OBSERVATIONS, draws: int = 10,
                       seed: int = 0) -> dict[str, np.ndarray]:
    """{job family: log(measured / answered) co-located steps/s} of each job's pairs it did not report, once k of its
    pairs on that GPU (drawn at random, `draws` times; once for k = 0) were reported and calibrate its answers while
    sharing (`calibration.sharing.sharing_factor`, shrunk by `prior` observations' worth); jobs with k pairs or
    fewer are left out. `params_of(family, worker)`: the co-location constants fitted without that job family, for
    that GPU. From the measured isolated steps, or (`served`) as the service answers: the predicted isolated steps,
    where the reports also correct the isolated answer's error."""
    return _residuals_after(_answers_by_job(pairs, params_of, served), k, prior, draws, seed)


def _residuals_after(by_job: Mapping[tuple[str, str], np.ndarray], k: int, prior: float, draws: int, seed: int
                     ) -> dict[str, np.ndarray]:
    """`reported_residuals` of answers already gathered (`_answers_by_job`)."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {}
    for (_, job), values in by_job.items():
        if len(values) <= k:
            continue
        for _ in range(draws if k else 1):
            order = rng.permutation(len(values))
            seen, rest = values[order[:k]], values[order[k:]]
            factor = sharing_factor(list(np.log(seen[:, 0] / seen[:, 1])), prior_observations=prior).factor
            answer = np.minimum(rest[:, 1] * factor, rest[:, 2])
            out.setdefault(family(job), []).append(np.log(rest[:, 0] / answer))
    return {name: np.concatenate(parts) for name, parts in out.items()}


def after_reports(pairs: Sequence[Pair], params_of: Callable[[str, str], ColocationParams], *, served: bool = False,
                  ks: Sequence[int] = (0, 1, 2, 4), priors: Sequence[float] = (0.0, SHARING_PRIOR_OBSERVATIONS, 0.5),
                  draws: int = 10, seed: int = 0) -> dict[tuple[int, float], float]:
    """{(k, prior weight): MAPE %} (k = 0: weight 0 only) of each job's co-located steps/s on the pairs it did not
    report (`reported_residuals`)."""
    by_job = _answers_by_job(pairs, params_of, served)
    out = {}
    for k in ks:
        for prior in priors if k else (0.0,):  # nothing reported: no prior to weigh
            residuals = np.concatenate(list(_residuals_after(by_job, k, prior, draws, seed).values()))
            out[(k, prior)] = float(np.mean(np.abs(np.exp(-residuals) - 1)) * 100)
    return out
