"""Fleet calibration: what is observed of any job on an accelerator corrects the answers of other jobs there, what
is observed on one SKU of a chip corrects its other SKUs (less), and what is observed of a job on other accelerators
corrects its answers here.

Each observation is a point: log(observed step / the serving model's step) for its job on its placement. The model,
in that log space:

    log ratio = log( compute_share · exp(job + job_arch + chip + accelerator + conv_share · accelerator_conv)
                     + communication_share · exp(link) )

- `job`: the job's own error, shared by every GPU (its graph, its input pipeline, kernels the per-op model misprices
  for it); the engine keys a job's CPU points apart, the CPU being priced by another model;
- `job_arch`: the job's error on one GPU generation (TF32 convolutions on Ampere are not FP32 ones on Turing);
- `chip` (per die and precision) and `accelerator` (per SKU and precision, on top of its chip): the device's error
  on every job of that math (a master-weight precision's is its autocast twin's: `device_math`);
- `link`: a factor on the communication part only, per accelerator (its links and network);
- `accelerator_conv`: how much more (or less) a step's convolutions cost on the device than the rest of it, per
  accelerator and precision, times the step's share of convolution FLOPs (`conv_share`): a device's convolution
  library and its matrix library are not equally far from the model (on a 2-core Xeon the shipped CPU model is
  1.3-1.5x too fast on convolutional nets and right on transformers). Only points that carry a share learn it
  (`perfmodel hw bench`'s reference steps); a point or query without one (0) neither learns nor gets it. Its prior
  (0.5, the chip's) was chosen, not measured: the public runs carry no CPU steps, and on them scheduler observations
  with shares helped other models on the same GPU a little and a job observed elsewhere a little less
  (`bench/fleet.py`). A prior narrower than the chip's would let the device factor take what convolutions cost:
  on a 2-core Xeon, `hw bench`'s reference steps then did not beat the model as shipped on held-out steps.

Device counts share the effects through the compute part: an 8-GPU run informs a 1-GPU answer by its compute, and
only multi-device runs inform the communication factor.

Each effect has a normal prior at 0 (factor 1) with the standard deviation of `FleetPriors`, so evidence that is
thin or disagrees moves an answer little; the fit is a penalised robust regression (Huber loss beyond `huber_log`)
solved by backfitting. Every point weighs its recency weight over its job's points on that accelerator, so a job
counts once per accelerator however often it reports. The job effects have heavy-tailed (Huber) priors: a job far
off the model is explained by its own effect, so what one job can pull on other jobs' answers stays bounded however
far off it is (`tests/calibration/test_fleet.py`). Reference points (whole steps `perfmodel hw bench` timed on the
device, of jobs chosen to stand for typical ones) have no job effect: what they show is the device's.

The priors describe the error of the answers the service gives, which is what an observation measures. On the
public whole-run data (`bench/fleet.py`, eight NVIDIA DeepLearningExamples models on 27 GPUs, TF32 and AMP), the
served answers' log error, held out by model family, splits into a model part (standard deviation about 0.12), a
GPU part (0.13; 0.19 with the chip held out) and a job x GPU rest (0.19-0.2: the job x generation prior and the
noise). The job's prior, 0.3, is wider than that model part; the composed step's (0.6) was the prior until the
whole-step stage took most of it out. The chip's prior is wider than the GPU part (0.5): a GPU the model has never
seen may be off on every job by more than the measured ones are, and a tighter prior left most of such an offset in
place however many jobs showed it (with every measured step 1.3x longer than served, four other models observed
removed about half of it at 0.25, nearly all at 0.5). One other job then moves the next about half-way. On the
served answers with no common offset, 0.3 against 0.6 costs up to 1.6 points of MAPE with one other model observed;
with a 1.3x offset it gains 2-4. They were chosen by looking at the same runs the fleet bench scores.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfmodel.hardware.chips import die_of
from perfmodel.jobs.spec import Precision

LEVELS = ("job", "accelerator", "chip", "none")
MAX_LOG_EFFECT = math.log(100.0)  # no effect corrects by more than observations may differ from the model
SWEEPS = 60
TOLERANCE = 1e-7
NOISE_PRIOR_WEIGHT = 2.0  # the prior noise counts as this many jobs when the observed ones disagree


@dataclass(frozen=True)
class FleetPriors:
    """Standard deviations (log) of each effect's prior, and of what no effect explains."""

    job: float = 0.3
    job_arch: float = 0.3
    chip: float = 0.5
    accelerator: float = 0.12
    link: float = 0.5
    conv: float = 0.5
    noise: float = 0.17
    huber_log: float = 0.35


@dataclass(frozen=True)
class FleetPoint:
    """One observation next to the serving model's prediction of its placement."""

    id: int
    job: str
    accelerator: str
    chip: str
    architecture: str
    precision: str
    log_ratio: float  # log(observed step / predicted step) = log(predicted / observed throughput)
    communication_share: float = 0.0  # communication's share of the predicted step
    weight: float = 1.0  # recency
    reference: bool = False  # a reference job of the device (`perfmodel hw bench`): no job effect of its own
    conv_share: float = 0.0  # the share of the step's FLOPs in convolutions (0: not known, no op-mix effect)


@dataclass(frozen=True)
class FleetQuery:
    """A prediction to correct: its job, device and the communication share of its predicted step."""

    job: str
    accelerator: str
    chip: str
    architecture: str
    precision: str
    communication_share: float = 0.0
    conv_share: float = 0.0  # the share of the step's FLOPs in convolutions


def device_math(precision: str) -> str:
    """The math whose device effects a point or query of `precision` shares (`Precision.device_math`: a half
    model with fp32 master weights runs the device's half kernels as autocast does)."""
    return Precision(precision).device_math.value


def _one(_point: FleetPoint | FleetQuery) -> float:
    return 1.0


@dataclass(frozen=True)
class Effect:
    name: str
    key: Callable[[FleetPoint | FleetQuery], Hashable]
    sigma: Callable[[FleetPriors], float]
    compute: bool = True  # on the compute part (else on communication)
    heavy_tailed: bool = False  # a Huber prior (quadratic within one sigma, linear beyond), else normal
    of_job: bool = False  # the job's own: reference points have none (their key is `REFERENCE`, held at 0)
    covariate: Callable[[FleetPoint | FleetQuery], float] = _one  # what the effect multiplies (in log)


EFFECTS: tuple[Effect, ...] = (
    Effect("job", lambda p: p.job, lambda pr: pr.job, heavy_tailed=True, of_job=True),
    Effect("job_arch", lambda p: (p.job, p.architecture), lambda pr: pr.job_arch, heavy_tailed=True, of_job=True),
    Effect("chip", lambda p: (p.chip, device_math(p.precision)), lambda pr: pr.chip),
    Effect("accelerator", lambda p: (p.accelerator, device_math(p.precision)), lambda pr: pr.accelerator),
    Effect("link", lambda p: p.accelerator, lambda pr: pr.link, compute=False),
    Effect("accelerator_conv", lambda p: (p.accelerator, device_math(p.precision)), lambda pr: pr.conv,
           covariate=lambda p: min(max(p.conv_share, 0.0), 1.0)),
)
_BY_NAME = {effect.name: effect for effect in EFFECTS}
REFERENCE = ("reference",)  # the job-effect key of reference points


def _key(effect: Effect, point: FleetPoint) -> Hashable:
    return REFERENCE if effect.of_job and point.reference else effect.key(point)


@dataclass(frozen=True)
class Applied:
    """What calibrated one answer: the level of the most specific evidence (job, accelerator, chip, none), the
    observations and jobs behind it, the factor on throughput and on the interval's width."""

    level: str = "none"
    throughput_factor: float = 1.0
    observations: int = 0
    jobs: int = 0
    interval_scale: float = 1.0
    log_sigma: float | None = None  # the fleet's predictive standard deviation of the log step (None: none)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "factor": self.throughput_factor, "observations": self.observations,
                "jobs": self.jobs, "interval_scale": self.interval_scale, "sources": self.sources}


NONE = Applied()


@dataclass(frozen=True)
class FleetCalibration:
    """The fitted effects (log) and, per effect key, the evidence behind it."""

    priors: FleetPriors = FleetPriors()
    effects: dict[str, dict[Hashable, float]] = field(default_factory=dict)
    precision: dict[str, dict[Hashable, float]] = field(default_factory=dict)  # Σ weight·slope² per key
    # (points, distinct jobs) behind each key of the job, accelerator and chip effects
    evidence: dict[str, dict[Hashable, tuple[int, int]]] = field(default_factory=dict)
    overlap: dict[tuple[Hashable, Hashable], int] = field(default_factory=dict)  # points of a job on a chip
    noise: dict[str, dict[Hashable, float]] = field(default_factory=dict)  # residual variance per job, accelerator
    # per (chip, precision): how far the jobs observed there sit from the model on their own (the variance of their
    # job effects, the prior's counting as `NOISE_PRIOR_WEIGHT` jobs): what a new job there may be off by
    job_dispersion: dict[Hashable, float] = field(default_factory=dict)

    def __len__(self) -> int:
        """Points fitted (observations and reference steps)."""
        return sum(points for points, _ in self.evidence.get("accelerator", {}).values())

    def log_effects(self, query: FleetQuery) -> tuple[float, float]:
        """(compute, link) log factors on the query's step time."""
        compute = sum(self.effects.get(e.name, {}).get(e.key(query), 0.0) * e.covariate(query)
                      for e in EFFECTS if e.compute)
        link = self.effects.get("link", {}).get(_BY_NAME["link"].key(query), 0.0)
        return _clip(compute), _clip(link)

    def apply(self, query: FleetQuery) -> Applied:
        """The correction of one prediction (`NONE` without evidence)."""
        compute, link = self.log_effects(query)
        share = min(max(query.communication_share, 0.0), 1.0)
        time_factor = (1.0 - share) * math.exp(compute) + share * math.exp(link)
        sources: dict[str, dict[str, int]] = {}
        for name in ("job", "accelerator", "chip"):
            found = self.evidence.get(name, {}).get(_BY_NAME[name].key(query))
            if found:
                sources[name] = {"observations": found[0], "jobs": found[1]}
        if not sources:
            return NONE
        job_key, chip_key = _BY_NAME["job"].key(query), _BY_NAME["chip"].key(query)
        own = sources.get("job", {}).get("observations", 0)
        chip_points, chip_jobs = self.evidence.get("chip", {}).get(chip_key, (0, 0))
        shared = self.overlap.get((job_key, chip_key), 0)  # the job's own points among the chip's
        observations, jobs = chip_points + own - shared, chip_jobs + (1 if own and not shared else 0)
        level = next(name for name in LEVELS if name in sources or name == "none")
        variance, prior = self.variances(query)
        scale = math.sqrt(variance / prior)
        if "job" not in sources:
            # other jobs' evidence moves the answer but does not make it surer: a served answer's error is mostly
            # the job's own (on Lambda's runs, bands narrowed by it covered 65 % of the served answers, not 77 %)
            scale = max(scale, 1.0)
        return Applied(level=level, throughput_factor=1.0 / time_factor, observations=observations, jobs=jobs,
                       interval_scale=scale, log_sigma=math.sqrt(variance), sources=sources)

    def variances(self, query: FleetQuery) -> tuple[float, float]:
        """(posterior, prior) predictive variance of the query's log step: its compute effects' posterior variances
        plus the noise the observed points show for its job and accelerator (the larger), and the same with no
        evidence. The job effect's variance is at least how far the jobs observed on the chip sit apart
        (`job_dispersion`). Their ratio narrows the interval with evidence and widens it when observed jobs
        disagree, among themselves or point by point. An effect
        with a covariate (the op mix) counts only where some point informed it: elsewhere it is not applied."""
        pr = self.priors
        prior, posterior = pr.noise ** 2, 0.0
        dispersion = self.job_dispersion.get(_BY_NAME["chip"].key(query), 0.0)
        for e in EFFECTS:
            if not e.compute:
                continue
            weight = self.precision.get(e.name, {}).get(e.key(query), 0.0)
            if e.covariate is not _one and weight <= 0:
                continue
            scale = e.covariate(query) ** 2
            variance = e.sigma(pr) ** 2
            prior += scale * variance
            if e.name == "job":  # jobs observed on the chip that sit far apart: a new one may too
                variance = max(variance, dispersion)
            posterior += scale / (weight / pr.noise ** 2 + 1.0 / variance)
        posterior += max(self.noise.get(name, {}).get(_BY_NAME[name].key(query), pr.noise ** 2)
                         for name in ("job", "accelerator"))
        return posterior, prior


def reference_points(steps: Iterable[tuple[str, str, float, float, float]], hardware: Any) -> list[FleetPoint]:
    """Whole steps timed on a device (`perfmodel hw bench`) as reference points: (job key, precision, measured ms,
    predicted ms, share of the step's FLOPs in convolutions) each, ids -1, -2, ... (never an observation's)."""
    return [FleetPoint(-(i + 1), job, hardware.name, die_of(hardware.name), hardware.architecture or hardware.name,
                       precision, math.log(measured_ms / predicted_ms), reference=True, conv_share=conv_share)
            for i, (job, precision, measured_ms, predicted_ms, conv_share) in enumerate(steps)]


def _clip(log_factor: float) -> float:
    return min(max(log_factor, -MAX_LOG_EFFECT), MAX_LOG_EFFECT)


def _index(keys: Sequence[Hashable]) -> tuple[np.ndarray, list[Hashable]]:
    order: dict[Hashable, int] = {}
    index = np.fromiter((order.setdefault(k, len(order)) for k in keys), dtype=np.intp, count=len(keys))
    return index, list(order)


def fit_fleet(points: Iterable[FleetPoint], priors: FleetPriors = FleetPriors()) -> FleetCalibration:
    """The penalised robust fit of every effect to the points (see the module docstring)."""
    points = [p for p in points if math.isfinite(p.log_ratio) and p.weight > 0]
    if not points:
        return FleetCalibration(priors=priors)
    r = np.array([p.log_ratio for p in points])
    comm = np.clip(np.array([p.communication_share for p in points]), 0.0, 1.0)
    cell, cells = _index([(p.job, p.accelerator) for p in points])
    per_cell = np.bincount(cell, minlength=len(cells)).astype(float)
    w = np.array([p.weight for p in points]) / per_cell[cell]
    indices = {e.name: _index([_key(e, p) for p in points]) for e in EFFECTS}
    covariates = {e.name: np.array([e.covariate(p) for p in points]) for e in EFFECTS}
    theta = {e.name: np.zeros(len(indices[e.name][1])) for e in EFFECTS}
    held = {e.name: np.array([k == REFERENCE for k in indices[e.name][1]], dtype=bool) for e in EFFECTS}

    def state() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = sum(theta[e.name][indices[e.name][0]] * covariates[e.name] for e in EFFECTS if e.compute)
        link = theta["link"][indices["link"][0]]
        compute_part = (1.0 - comm) * np.exp(x)
        total = compute_part + comm * np.exp(link)
        return r - np.log(total), compute_part / total, 1.0 - compute_part / total

    for _ in range(SWEEPS):
        largest = 0.0
        for e in EFFECTS:
            z, slope_compute, slope_link = state()
            slope = (slope_compute if e.compute else slope_link) * covariates[e.name]
            huber = w * np.minimum(1.0, priors.huber_log / np.maximum(np.abs(z), 1e-12))
            idx, keys = indices[e.name]
            ridge = np.full(len(keys), priors.noise ** 2 / e.sigma(priors) ** 2)
            if e.heavy_tailed:  # an odd job explains itself by its own effect, not by the device's
                ridge *= np.minimum(1.0, e.sigma(priors) / np.maximum(np.abs(theta[e.name]), 1e-12))
            num = np.bincount(idx, huber * slope * z, minlength=len(keys))
            den = np.bincount(idx, huber * slope ** 2, minlength=len(keys))
            step = np.where(held[e.name], 0.0, (num - ridge * theta[e.name]) / (den + ridge))
            theta[e.name] = np.clip(theta[e.name] + step, -MAX_LOG_EFFECT, MAX_LOG_EFFECT)
            largest = max(largest, float(np.abs(step).max()))
        if largest < TOLERANCE:
            break
    z, slope_compute, slope_link = state()
    effects, precision, evidence = {}, {}, {}
    for e in EFFECTS:
        idx, keys = indices[e.name]
        slope = (slope_compute if e.compute else slope_link) * covariates[e.name]
        weight = np.bincount(idx, w * slope ** 2, minlength=len(keys))
        effects[e.name] = dict(zip(keys, theta[e.name].tolist()))
        precision[e.name] = dict(zip(keys, weight.tolist()))
        if e.name in ("job", "accelerator", "chip"):
            counts = np.bincount(idx, minlength=len(keys))
            jobs = Counter(i for i, _ in set(zip(idx.tolist(), (p.job for p in points))))
            evidence[e.name] = {k: (int(counts[i]), jobs[i]) for i, k in enumerate(keys) if k != REFERENCE}
    overlap: Counter[tuple[Hashable, Hashable]] = Counter((p.job, _BY_NAME["chip"].key(p)) for p in points
                                                          if not p.reference)
    capped = np.minimum(z ** 2, (3 * priors.huber_log) ** 2)
    noise = {}
    for name in ("job", "accelerator"):
        idx, keys = indices[name]
        total = np.bincount(idx, w, minlength=len(keys))
        spread = np.bincount(idx, w * capped, minlength=len(keys))
        noise[name] = {k: float((NOISE_PRIOR_WEIGHT * priors.noise ** 2 + spread[i])
                                / (NOISE_PRIOR_WEIGHT + total[i])) for i, k in enumerate(keys)}
    return FleetCalibration(priors=priors, effects=effects, precision=precision, evidence=evidence,
                            overlap=dict(overlap), noise=noise, job_dispersion=_job_dispersion(points, effects, priors))


def _job_dispersion(points: Sequence[FleetPoint], effects: dict[str, dict[Hashable, float]],
                    priors: FleetPriors) -> dict[Hashable, float]:
    """Per (chip, precision): the variance of the job effects (own and per architecture) of the jobs observed
    there, with the job prior's variance counting as `NOISE_PRIOR_WEIGHT` jobs."""
    own: dict[Hashable, dict[Hashable, float]] = {}
    for p in points:
        if not p.reference:
            own.setdefault(_BY_NAME["chip"].key(p), {})[p.job] = (
                effects["job"].get(p.job, 0.0) + effects["job_arch"].get((p.job, p.architecture), 0.0))
    return {key: (NOISE_PRIOR_WEIGHT * priors.job ** 2 + sum(x * x for x in jobs.values()))
            / (NOISE_PRIOR_WEIGHT + len(jobs)) for key, jobs in own.items()}
