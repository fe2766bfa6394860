"""Two jobs sharing the same GPU(s): what each one's step becomes (Gavel's space sharing, Gandiva's packing).

Each job's isolated step is split into the time its kernels keep the device busy (`device_ms`: forward, backward,
optimizer, communication) and the time the device waits for the host (`host_ms`: exposed launch overhead, the
pipeline bubble, and input pipelines the graph does not show). While one job waits for its host, the other runs
alone; while both have work on the device, they share it:

- `time-slicing` (the default: two processes, no MPS): the device runs one context at a time, so two busy jobs
  each progress at half speed, and every switch costs a little more (`switch_overhead`). Besides, a job waits its
  turn each time it hands the device back to its host (the input copy, the loss read back, the optimizer): per
  step, `sync_wait_ms` times the share of time the other job holds the device. So a job with short steps loses more
  of its speed next to one with long steps than the long-step job does next to it;
- `mps` (CUDA MPS): kernels of both jobs run at once, each on the compute units it holds. A kernel holds SMs
  by its launch shape, not by the share of the peak FLOP/s it reaches (one that reaches half the peak still holds
  every SM it has blocks on); a job's `sm_fill` is the share of the SMs its kernels hold while the device runs
  them (`perfmodel.predictor.composition.kernel_sm_fill`, weighted by time), its `bandwidth_share` the share of
  the memory bandwidth they draw. Where the two jobs' fills, and their bandwidth shares, each add up to at most the
  device, work that overlaps runs at full speed; beyond it, the resource that runs out is shared in proportion,
  each at 1 / (the larger sum): two jobs whose kernels fill the device get at most the device together, each at
  half speed, and two small ones (a recurrent step at a small batch, a CIFAR-sized network) barely slow each other.
  What MPS also removes is the context switch and the wait for the other's time slice (`switch_overhead`,
  `sync_wait_ms`). No co-located MPS measurement was at hand to check it against.

The steady state is a fixed point (processor sharing): job a's step is host_a + device_a · (1 + g_b · (s - 1))
(+ g_b · sync_wait_ms when time-slicing), where g_b is the share of time job b has work on the device and s the
slowdown of work that overlaps (`overlap_slowdown`). Physically possible by construction: no job is faster than
alone, and what the pair holds of the device per second never exceeds it (`combined_device_share` <= 1: under
time-slicing the device time of both, under MPS of the SMs and of the bandwidth, each job's time weighted by its
`sm_fill` or its `bandwidth_share`, whichever the pair uses more of; the steps are stretched where the approximation
would exceed it).

What the graph cannot see (an input pipeline on the host, the Atari environment of A3C) is the gap between a measured
isolated step and the predicted device time; `host_share_of_gap` says how much of such a gap is host time. The
three constants are fitted on Gavel's measured K80 and P100 pairs (`bench/gavel.py --write`, held out by GPU and
by job family there), and so is the model's own error band (`kept_band_log`: what it missed on job families left
out of the fit), which `shared_interval` adds to a job's isolated interval. They are fitted apart for the two ways GPUs
preempt compute (`THREAD_BLOCK_PREEMPTION`): on the K80's pairs for Kepler and Maxwell, on the P100's for Pascal and
later.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Sharing = Literal["time-slicing", "mps"]
Preemption = Literal["instruction", "thread-block"]
# Pascal and later GPUs preempt compute at instruction granularity: a time slice can end mid-kernel. Kepler and
# Maxwell switch contexts only between thread blocks, so a job waits for the other's running blocks to drain (NVIDIA's
# Pascal architecture whitepaper, "Compute Preemption"). Time-slicing behaves differently enough on the two that the
# co-location constants are fitted apart: on Gavel's K80 (Kepler) and P100 (Pascal) pairs, constants fitted on one
# GPU miss the other's by 24-27 %, where constants fitted on the same GPU miss a held-out job family by 15.6 %.
THREAD_BLOCK_PREEMPTION = frozenset({"kepler", "maxwell"})
SHARING_MODES: tuple[Sharing, ...] = ("time-slicing", "mps")
ITERATIONS = 200
TOLERANCE = 1e-10


@dataclass(frozen=True)
class ColocationParams:
    """The fitted constants of the co-location model."""

    switch_overhead: float = 0.0  # time-slicing: extra slowdown of overlapping work per switch (0: ideal halving)
    host_share_of_gap: float = 0.5  # of (measured step - predicted device time), the share that is host time
    sync_wait_ms: float = 0.0  # time-slicing: per step, what a job waits for the other's time slice while it is busy
    # the 10th and 90th percentiles of log(measured / predicted) throughput while sharing, on job families held out
    # of the fit: the sharing model's own error (0, 0: none known)
    kept_band_log: tuple[float, float] = (0.0, 0.0)
    # (k, p10, p90) rows: the same percentiles as served once the job reported k of its pairs while sharing
    # (`calibration.sharing`), on the pairs it did not report; each job family scored by constants fitted without it
    reported_band_log: tuple[tuple[int, float, float], ...] = ()
    source: str = "default"

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ColocationParams:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        band = fields.get("kept_band_log")
        if isinstance(band, (list, tuple)):
            fields["kept_band_log"] = (float(band[0]), float(band[1]))
        rows = fields.get("reported_band_log")
        if isinstance(rows, (list, tuple)):
            fields["reported_band_log"] = tuple((int(k), float(low), float(high)) for k, low, high in rows)
        return cls(**fields)  # type: ignore[arg-type]

    def reported_band(self, reports: int) -> tuple[float, float] | None:
        """The error band of a job's answer while sharing once it reported `reports` pairs: the row of the most
        reports at most that many (None: no row applies)."""
        rows = [row for row in self.reported_band_log if row[0] <= reports]
        if not reports or not rows:
            return None
        _, low, high = max(rows)
        return low, high


@dataclass(frozen=True)
class SharingJob:
    """One job's isolated step as the co-location model sees it."""

    device_ms: float  # the device has work of this job
    host_ms: float  # the device waits for this job's host
    sm_fill: float = 1.0  # the share of the compute units its kernels hold while they run (MPS)
    bandwidth_share: float = 1.0  # the share of the memory bandwidth its kernels draw while they run (MPS)

    @property
    def step_ms(self) -> float:
        return self.device_ms + self.host_ms


def split_step(step_ms: float, device_ms: float, host_ms: float, host_share_of_gap: float,
               sm_fill: float = 1.0, bandwidth_share: float = 1.0) -> SharingJob:
    """A job whose step takes `step_ms` (measured, or calibrated) where the model sees `device_ms` of device and
    `host_ms` of host time: a longer step's gap is shared between them by `host_share_of_gap` (what the model
    misses may be an input pipeline or under-priced kernels), a shorter one scales both; what its kernels hold of
    the device as given."""
    gap = step_ms - (device_ms + host_ms)
    if gap >= 0:
        return SharingJob(device_ms + (1 - host_share_of_gap) * gap, host_ms + host_share_of_gap * gap, sm_fill,
                          bandwidth_share)
    scale = step_ms / (device_ms + host_ms)
    return SharingJob(device_ms * scale, host_ms * scale, sm_fill, bandwidth_share)


@dataclass(frozen=True)
class Shared:
    """Each job's step while sharing, and what the pair does to the device."""

    step_ms: tuple[float, float]
    device_share: tuple[float, float]  # share of the time each job has work on the device
    combined_device_share: float  # the device's busy share, at most 1


def overlap_slowdown(sharing: Sharing, params: ColocationParams, a: SharingJob | None = None,
                     b: SharingJob | None = None) -> float:
    """How much slower work runs while both jobs have work on the device: under time-slicing half speed each and
    the switches' cost on top; under MPS 1 / (the larger of fill_a + fill_b and bandwidth_a + bandwidth_b) of full
    speed where the two jobs' kernels want more of the device's compute units or of its memory bandwidth than it
    has (`SharingJob.sm_fill`, `SharingJob.bandwidth_share`; without the jobs, kernels that fill it: half speed)."""
    if sharing != "mps":
        return 2.0 * (1.0 + params.switch_overhead)
    jobs = [job if job is not None else SharingJob(0.0, 0.0) for job in (a, b)]
    wanted = max(jobs[0].sm_fill + jobs[1].sm_fill, jobs[0].bandwidth_share + jobs[1].bandwidth_share)
    return min(2.0, max(1.0, wanted))


def held_shares(job: SharingJob, sharing: Sharing) -> tuple[float, float]:
    """The shares of the device's compute units and of its memory bandwidth a job holds while its kernels run: all
    of both under time-slicing (one context at a time), its `sm_fill` and `bandwidth_share` under MPS."""
    return (job.sm_fill, job.bandwidth_share) if sharing == "mps" else (1.0, 1.0)


def share(a: SharingJob, b: SharingJob, sharing: Sharing = "time-slicing",
          params: ColocationParams = ColocationParams()) -> Shared:
    """The steady state of two jobs on the same device(s) (see the module docstring)."""
    if sharing not in SHARING_MODES:
        raise ValueError(f"sharing must be one of {SHARING_MODES}, got {sharing!r}")
    slow = overlap_slowdown(sharing, params, a, b)
    busy = [1.0 if a.device_ms > 0 else 0.0, 1.0 if b.device_ms > 0 else 0.0]
    steps = [a.step_ms, b.step_ms]
    jobs = (a, b)
    wait = params.sync_wait_ms if sharing == "time-slicing" else 0.0
    for _ in range(ITERATIONS):
        new = [jobs[i].host_ms + jobs[i].device_ms * (1.0 + busy[1 - i] * (slow - 1.0)) + wait * busy[1 - i]
               for i in (0, 1)]
        shares = [jobs[i].device_ms * (1.0 + busy[1 - i] * (slow - 1.0)) / new[i] if new[i] > 0 else 0.0
                  for i in (0, 1)]
        done = max(abs(new[i] - steps[i]) for i in (0, 1)) <= TOLERANCE * max(max(new), 1.0)
        steps, busy = new, shares
        if done:
            break
    # what the device does per second cannot exceed the device, whatever the approximation says: its busy time
    steps = [max(steps[i], jobs[i].step_ms) for i in (0, 1)]  # never faster than alone
    work = combined_device_share(jobs, steps, sharing)
    if work > 1.0:
        steps = [s * work for s in steps]
    return Shared((steps[0], steps[1]), (busy[0], busy[1]), combined_device_share(jobs, steps, sharing))


def shared_interval(throughput: float, isolated_interval: tuple[float, float], slowdown: float,
                    band_log: tuple[float, float]) -> tuple[float, float]:
    """The [p10, p90] interval of a job's throughput while sharing: its isolated interval over the slowdown, widened
    by the sharing model's own error band (`ColocationParams.kept_band_log`). The two errors are taken as independent
    (their log widths add in quadrature), and the top never exceeds the isolated interval's (no job is faster than
    alone)."""
    low_alone, high_alone = isolated_interval
    point = min(throughput, high_alone)
    below = math.log(point * slowdown / low_alone) if low_alone > 0 else 0.0
    above = math.log(high_alone / (point * slowdown)) if point > 0 else 0.0
    down = math.hypot(max(below, 0.0), max(-band_log[0], 0.0))
    up = math.hypot(max(above, 0.0), max(band_log[1], 0.0))
    return point * math.exp(-down), min(point * math.exp(up), high_alone)


def combined_device_share(jobs: tuple[SharingJob, SharingJob], steps_ms: Sequence[float],
                          sharing: Sharing = "time-slicing") -> float:
    """The device's load from both jobs at these steps: each job's device time per second, times the share of the
    device it holds while its kernels run (`held_shares`: all of it under time-slicing; under MPS its SM fill and
    its bandwidth share, the busier of the two resources)."""
    busy = [jobs[i].device_ms / steps_ms[i] if steps_ms[i] > 0 else 0.0 for i in (0, 1)]
    held = [held_shares(jobs[i], sharing) for i in (0, 1)]
    return max(sum(held[i][r] * busy[i] for i in (0, 1)) for r in (0, 1))


# --- fitted constants ------------------------------------------------------------------------------------------------

def params_path() -> Path:
    return Path(__file__).with_name("colocation_params.json")


def preemption_of(architecture: str | None) -> Preemption:
    """How a GPU of `architecture` takes the device from one context for another (`THREAD_BLOCK_PREEMPTION`)."""
    return "thread-block" if (architecture or "").lower() in THREAD_BLOCK_PREEMPTION else "instruction"


def load_colocation_params(path: Path | str | None = None, preemption: Preemption = "instruction") -> ColocationParams:
    """The constants fitted for GPUs that preempt compute at `preemption` granularity (`bench/gavel.py --write`),
    else those of the file's `params`, else the defaults."""
    file = Path(path) if path else params_path()
    if not file.exists():
        return ColocationParams()
    data = json.loads(file.read_text())
    by_preemption = data.get("by_preemption", {})
    return ColocationParams.from_dict(by_preemption.get(preemption, data["params"]))


def dump_colocation_params(by_preemption: dict[Preemption, ColocationParams]) -> str:
    """The file of constants fitted per preemption granularity; `params` (what a file reader without it, or an
    unknown class, gets) is the instruction-level GPUs' (every GPU since Pascal)."""
    fallback = by_preemption.get("instruction") or next(iter(by_preemption.values()))
    return json.dumps({"schema_version": 2, "params": asdict(fallback),
                       "by_preemption": {name: asdict(params) for name, params in by_preemption.items()}},
                      indent=2) + "\n"
