"""A job's co-located answers calibrated by what it measured while sharing its GPUs with other jobs.

A scheduler that packs jobs measures what each one ran at while sharing (Gavel's own throughput estimator does).
Each report of job J measured while sharing accelerator X with another job (`sharing` mode) is a log ratio
log(observed / answered), where the answer is what the service would say for that pair without this calibration
(the job's isolated answer, calibrated as usual, over the co-location model's slowdown). J's answers while sharing X
in that mode, with any partner, are multiplied by exp(sum of log ratios / (n + prior)): the reports' mean, shrunk
toward 1 by `prior` observations' worth.

A report carries two errors: the isolated answer's (the same in every pair of J on X) and the sharing model's (what
J keeps next to that partner). Where J's isolated answer on X is the model's, the first dominates (on Gavel's K80
and P100 pairs, as served, 45 % MAPE before any report, 17 % after one), and the prior is light
(`SHARING_PRIOR_OBSERVATIONS`): one report moves an answer 91 % of the way, in log, to what it saw. Where J's own
isolated reports already calibrate it on X, what is left is the sharing model's error, which one pair tells less
of (from Gavel's measured isolated steps, one report at that light prior does worse than none, 15.3 against
14.5 %), and the prior is heavier (`SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN`).

The factor never makes a job faster than alone, nor the pair's work per second more than the device does
(`calibrated_steps`). Only J's own answers move: a report of J never changes another job's answer.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from perfmodel.core.accuracy import Z80
from perfmodel.placement.colocation import (
    ColocationParams,
    Shared,
    Sharing,
    SharingJob,
    combined_device_share,
    share,
)

# the prior's weights in observations, chosen on Gavel's K80 and P100 pairs, where bench/gavel.py prints the error
# after k reports of a job for weights 0, 0.1 and 0.5, as served (lowest at 0.1 for k = 1, 2, 4) and from the measured
# isolated steps (lowest at 0.5), so the figures it prints at these weights were looked at to choose them
SHARING_PRIOR_OBSERVATIONS = 0.1  # the job's isolated answer there is the model's (or the fleet's)
SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN = 0.5  # its own isolated reports calibrate it there
MAX_SHARED_POINTS = 32  # the newest reports of a job on an accelerator and mode that calibrate it


@dataclass(frozen=True)
class SharedPoint:
    """One report of a job while sharing: where, in which mode, with whom, against the answer."""

    id: int
    accelerator: str
    sharing: str
    partner: str  # the other job's key
    log_ratio: float  # log(observed / answered throughput while sharing)


@dataclass(frozen=True)
class SharingApplied:
    """What calibrates a job's answers while sharing an accelerator in a mode."""

    factor: float = 1.0
    observations: int = 0
    partners: int = 0
    log_spread: float = 0.0  # the standard deviation of the reports' log ratios (0 with fewer than two)

    @property
    def level(self) -> str:
        return "job" if self.observations else "none"

    def as_dict(self) -> dict[str, object]:
        return {"level": self.level, "factor": self.factor, "observations": self.observations,
                "partners": self.partners}


@dataclass(frozen=True)
class SharingCalibration:
    """A job's reports while sharing, newest last."""

    points: tuple[SharedPoint, ...] = field(default_factory=tuple)

    def report(self, isolated_known: Callable[[str], bool] = lambda _accelerator: False) -> list[dict[str, object]]:
        """For each accelerator and mode the job reported while sharing: its factor, reports and partners
        (`isolated_known(accelerator)`: its own isolated reports calibrate it there)."""
        places = sorted({(p.accelerator, p.sharing) for p in self.points})
        return [{"accelerator": accelerator, "sharing": sharing,
                 **self.applied(accelerator, sharing, isolated_known(accelerator)).as_dict()}
                for accelerator, sharing in places]

    def applied(self, accelerator: str, sharing: str, isolated_known: bool = False) -> SharingApplied:
        """The factor of the job's answers while sharing `accelerator` in `sharing` mode (1 without reports);
        `isolated_known`: the job's own isolated reports calibrate its answer there (the heavier prior)."""
        mine = [p for p in self.points if p.accelerator == accelerator and p.sharing == sharing][-MAX_SHARED_POINTS:]
        prior = SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN if isolated_known else SHARING_PRIOR_OBSERVATIONS
        return sharing_factor([p.log_ratio for p in mine], partners=len({p.partner for p in mine}),
                              prior_observations=prior)


def sharing_factor(log_ratios: Sequence[float], partners: int = 1,
                   prior_observations: float = SHARING_PRIOR_OBSERVATIONS) -> SharingApplied:
    """exp(sum of `log_ratios` / (n + `prior_observations`)): the reports' mean, shrunk toward 1."""
    n = len(log_ratios)
    if not n:
        return SharingApplied()
    spread = statistics.stdev(log_ratios) if n > 1 else 0.0
    return SharingApplied(math.exp(math.fsum(log_ratios) / (n + prior_observations)), n, partners, spread)


def reported_band(band_log: tuple[float, float], applied: SharingApplied) -> tuple[float, float]:
    """The 80 % band of log(measured / answer) of a job's answer while sharing once it reported: `band_log` (what
    such answers missed on Gavel's pairs after that many reports), widened to what its own reports' spread says
    where they disagree more (a new pair is one more draw: the spread times sqrt(1 + 1/n), at the normal's 80 %)."""
    n = applied.observations
    own = Z80 * applied.log_spread * math.sqrt(1 + 1 / n) if n > 1 else 0.0
    return min(band_log[0], -own), max(band_log[1], own)


def calibrate_sharing(points: Iterable[SharedPoint]) -> SharingCalibration:
    return SharingCalibration(tuple(sorted(points, key=lambda p: p.id)))


def share_calibrated(a: SharingJob, b: SharingJob, sharing: Sharing, params: ColocationParams,
                     factors: Sequence[float]) -> tuple[Shared, list[float]]:
    """The co-location model's steady state of the pair (`placement.colocation.share`) and each job's step while
    sharing once its factor applies (`calibrated_steps`)."""
    shared = share(a, b, sharing, params)
    return shared, calibrated_steps((a, b), shared.step_ms, factors, sharing)


def calibrated_steps(jobs: Sequence[SharingJob], shared_steps_ms: Sequence[float],
                     factors: Sequence[float], sharing: Sharing = "time-slicing") -> list[float]:
    """Each job's step while sharing with its throughput multiplied by its factor: never shorter than its step
    alone, and all stretched alike where what the pair holds of the device per second would exceed it
    (`placement.colocation.combined_device_share`)."""
    steps = [max(job.step_ms, step / factor) for job, step, factor in zip(jobs, shared_steps_ms, factors)]
    work = combined_device_share((jobs[0], jobs[1]), steps, sharing)
    return [step * work for step in steps] if work > 1.0 else steps
