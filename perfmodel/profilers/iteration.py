"""Time the real step of a job: warm-up, then timed repeats, with the device synchronised around each one.

One code path for every device: on `cuda` (CUDA and ROCm builds of torch alike) a repeat is timed with CUDA events
on the device's current stream; elsewhere with `time.perf_counter` after `synchronize`. The queue is drained before
each repeat starts, so a repeat's time is the time of that step alone.

Peak memory is measured on the last warm-up step (so it never perturbs the timing, and costs no extra step; with
`warmup=1` that is the very first step, whose one-time allocations such as optimizer state make it an upper bound;
with `warmup=0` it is not measured):
- GPU: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`: the caching allocator's high-water of
  tensor bytes during the step, weights, gradients and optimizer state included.
- CPU: the high-water, above its level at the start of the step, of the bytes held by torch's CPU allocator,
  replayed from the allocation/free events torch.profiler records (`profile_memory=True`). Weights, inputs and
  optimizer state that exist before the step are not in it; activations, gradients, optimizer temporaries are.
  Memory that libraries allocate outside torch's allocator (oneDNN scratch pads, Python objects) is not.
  Process RSS was tried first and rejected: glibc keeps freed pages, so after warm-up the RSS barely moves
  (resnet18 batch 8 training: 51 MB of RSS growth against 200 MB of tensors actually allocated and freed).

A step that runs out of memory (torch.OutOfMemoryError, a RuntimeError saying "out of memory" / "can't allocate
memory", or MemoryError) is recorded as outcome `oom` with its message, not raised.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.units import MS_PER_S, s_to_ms, samples_per_s
from perfmodel.jobs.build import BuiltJob
from perfmodel.jobs.spec import Mode, OptimizerName
from perfmodel.records import IterationStats, Outcome, Phase
from perfmodel.torch_device import quiet_profiler_logs, synchronize

# record_function labels around the phases of a step; the per-op profiler assigns ops to phases with them.
PHASE_LABELS: dict[Phase, str] = {
    "forward": "perfmodel::forward",
    "backward": "perfmodel::backward",
    "optimizer": "perfmodel::optimizer",
}

# each optimizer over its parameters, fused (`JobSpec.fused_optimizer`: torch's fused=True, one kernel per group of
# tensors on CUDA and the CPU) or torch's default implementation
_OPTIMIZERS: dict[OptimizerName, Callable[[list[torch.nn.Parameter], bool], torch.optim.Optimizer]] = {
    OptimizerName.sgd: lambda params, fused: torch.optim.SGD(params, lr=1e-4, momentum=0.9, fused=fused or None),
    OptimizerName.adam: lambda params, fused: torch.optim.Adam(params, lr=1e-4, fused=fused or None),
    OptimizerName.adamw: lambda params, fused: torch.optim.AdamW(params, lr=1e-4, fused=fused or None),
}

MIN_WARMUP = 2  # warm-up steps kept under a time budget (the first step is never steady: allocations, caches)
MIN_REPEATS = 3  # timed repeats kept under a time budget: a median and a spread
WARMUP_SHARE = 0.3  # of a time budget, for the warm-up

_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


class Stepper(Protocol):
    """What a training step calls after backward: a torch optimizer, or `MasterWeightsOptimizer`."""

    def step(self) -> Any: ...

    def zero_grad(self, set_to_none: bool = ...) -> None: ...


class MasterWeightsOptimizer:
    """The optimizer of a half model with fp32 master weights (`fp16-master`, `bf16-master`: apex AMP O2,
    DeepSpeed, Megatron-LM): it steps the fp32 master copy of the weights with the spec's optimizer and writes it
    back into the model. Its fp32 gradients are copied from the half ones at each step and freed by `zero_grad`, as
    apex's are; or, with `fp32_gradients` (`bf16-master`, as Megatron-LM's `main_grad`), persistent fp32 buffers
    that each half gradient is added into as backward produces it (the half gradient then freed), zeroed by
    `zero_grad`."""

    def __init__(self, name: OptimizerName, params: list[torch.nn.Parameter], fp32_gradients: bool = False,
                 fused: bool = False):
        self.params = params
        self.fp32_gradients = fp32_gradients
        self.master = [torch.nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in params]
        self.inner = _OPTIMIZERS[name](self.master, fused)
        self._hooks = [param.register_post_accumulate_grad_hook(self._accumulate_into(master))
                       for param, master in zip(params, self.master)] if fp32_gradients else []

    @staticmethod
    def _accumulate_into(master: torch.nn.Parameter) -> Callable[[torch.Tensor], None]:
        def accumulate(param: torch.Tensor) -> None:
            if param.grad is None:
                return
            with torch.no_grad():
                if master.grad is None:
                    master.grad = param.grad.to(torch.float32)
                else:
                    master.grad.add_(param.grad)
            param.grad = None

        return accumulate

    @torch.no_grad()
    def step(self) -> None:
        if not self.fp32_gradients:
            for param, master in zip(self.params, self.master):
                if param.grad is not None:
                    master.grad = param.grad.to(torch.float32)
        self.inner.step()
        for param, master in zip(self.params, self.master):
            param.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param, master in zip(self.params, self.master):
            param.grad = None
            if not self.fp32_gradients:
                master.grad = None
            elif master.grad is not None:
                master.grad.zero_()  # the fp32 buffers persist, as Megatron-LM's


def make_optimizer(name: OptimizerName, params: Iterable[torch.nn.Parameter], master_weights: bool = False,
                   fp32_gradients: bool = False, fused: bool = False) -> Stepper | None:
    """The spec's optimizer over the trainable parameters (a small learning rate), over their fp32 master copy
    with `master_weights` (its gradients accumulated in fp32 with `fp32_gradients`), `fused` or torch's default
    implementation; None when nothing trains."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return None
    if master_weights:
        return MasterWeightsOptimizer(name, trainable, fp32_gradients, fused)
    return _OPTIMIZERS[name](trainable, fused)


def make_step(job: BuiltJob) -> Callable[[], None]:
    """One iteration of the job as a no-argument callable.

    train: forward and loss (under the job's autocast), backward, optimizer step, zero_grad(set_to_none=True).
    inference: forward under `torch.inference_mode`. Each phase runs inside a `PHASE_LABELS` record_function
    (a no-op costing about a microsecond when no profiler is active).
    """
    if job.spec.mode == Mode.inference:

        def infer() -> None:
            with torch.inference_mode(), job.autocast(), record_function(PHASE_LABELS["forward"]):
                job.forward()

        return infer

    precision = job.spec.precision
    optimizer = make_optimizer(job.spec.optimizer, job.module.parameters(), precision.master_weights,
                               precision.fp32_gradients, job.spec.fused_optimizer)

    def train() -> None:
        with record_function(PHASE_LABELS["forward"]):
            with job.autocast():
                loss = job.loss_fn(job.forward())
        with record_function(PHASE_LABELS["backward"]):
            loss.backward()
        if optimizer is not None:
            with record_function(PHASE_LABELS["optimizer"]):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    return train


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the errors torch and Python raise when an allocation fails, on any device."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc).lower() for text in _OOM_MESSAGES)


def time_step_ms(step: Callable[[], None], device: torch.device) -> float:
    """Wall time of one call of `step` on `device`, from an idle device to an idle device, in milliseconds."""
    synchronize(device)
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        step()
        end.record(stream)
        end.synchronize()
        return float(start.elapsed_time(end))
    start_s = time.perf_counter()
    step()
    synchronize(device)
    return s_to_ms(time.perf_counter() - start_s)


def profile_iteration(job: BuiltJob, warmup: int = 3, repeats: int = 10, *, time_budget_s: float | None = None,
                      step: Callable[[], None] | None = None) -> IterationStats:
    """Run up to `warmup` untimed steps (the last one measures peak memory), then up to `repeats` timed ones.

    `time_budget_s` (default: none) is a soft bound on the whole, for models whose steps take seconds: the warm-up
    stops early once it has used `WARMUP_SHARE` of the budget (never before `MIN_WARMUP` steps), the repeats once
    the next one would overrun the budget (never before `MIN_REPEATS`). The stats record the counts actually run.
    `step` defaults to `make_step(job)`; pass one to share its optimizer state with a later per-op profile.
    """
    if warmup < 0 or repeats < 1:
        raise PerfmodelError(f"need warmup >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    batch_size = job.spec.batch_size
    start_s = time.perf_counter()
    try:
        step = step or make_step(job)
        warm_budget_s = None if time_budget_s is None else WARMUP_SHARE * time_budget_s
        warmed, peak_bytes = _warm_up(step, job.device, warmup, warm_budget_s)
        samples_ms: list[float] = []
        while len(samples_ms) < repeats:
            if time_budget_s is not None and len(samples_ms) >= MIN_REPEATS:
                projected_s = time.perf_counter() - start_s + statistics.fmean(samples_ms) / MS_PER_S
                if projected_s > time_budget_s:
                    break
            samples_ms.append(time_step_ms(step, job.device))
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        _release_memory(job)
        return IterationStats(outcome=Outcome.oom, warmup=warmup, repeats=repeats, batch_size=batch_size,
                              error=_one_line(exc))
    return iteration_stats(tuple(samples_ms), warmup=warmed, batch_size=batch_size, peak_memory_bytes=peak_bytes)


def _warm_up(step: Callable[[], None], device: torch.device, warmup: int, budget_s: float | None
             ) -> tuple[int, int | None]:
    """Run up to `warmup` steps, the last one measuring peak memory: (steps run, peak bytes or None)."""
    start_s = time.perf_counter()
    for done in range(warmup):
        elapsed_s = time.perf_counter() - start_s
        next_s = elapsed_s / done if done else 0.0  # the mean warm-up step so far
        out_of_time = budget_s is not None and done + 1 >= MIN_WARMUP and elapsed_s + next_s >= budget_s
        if done == warmup - 1 or out_of_time:
            return done + 1, peak_memory_bytes(step, device)
        step()
        synchronize(device)
    return 0, None


def iteration_stats(samples_ms: tuple[float, ...], *, warmup: int, batch_size: int,
                    peak_memory_bytes: int | None = None) -> IterationStats:
    """Summary statistics of timed repeats (pure)."""
    median = statistics.median(samples_ms)
    mean = statistics.fmean(samples_ms)
    std = statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0
    p10, p90 = (float(v) for v in np.percentile(samples_ms, [10, 90]))
    return IterationStats(
        outcome=Outcome.ok,
        warmup=warmup,
        repeats=len(samples_ms),
        batch_size=batch_size,
        samples_ms=tuple(samples_ms),
        iter_time_ms_median=median,
        iter_time_ms_p10=p10,
        iter_time_ms_p90=p90,
        iter_time_ms_mean=mean,
        iter_time_cv=std / mean if mean > 0 else 0.0,
        throughput_samples_per_s=samples_per_s(batch_size, median),
        peak_memory_bytes=peak_memory_bytes,
    )


def peak_memory_bytes(step: Callable[[], None], device: torch.device) -> int | None:
    """Peak memory of one call of `step` (see the module docstring for what it means on GPU and on CPU)."""
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        step()
        synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    return cpu_allocator_peak_bytes(step)


def cpu_allocator_peak_bytes(step: Callable[[], None]) -> int | None:
    """Peak growth of the bytes held by torch's CPU allocator during one call of `step`, from the allocation
    events torch.profiler records with `profile_memory=True`; None if this torch does not expose them."""
    quiet_profiler_logs()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # the event list is not public API; without it there is no honest number
        return None
    allocations = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() ==
                   DeviceType.CPU]
    return peak_allocated_bytes(allocations)


def peak_allocated_bytes(allocations: Iterable[tuple[int, int]]) -> int:
    """The high-water of the running sum of (time, +allocated / -freed bytes) events, in time order (pure)."""
    held = peak = 0
    for _, nbytes in sorted(allocations):
        held += nbytes
        peak = max(peak, held)
    return peak


def _release_memory(job: BuiltJob) -> None:
    job.module.zero_grad(set_to_none=True)
    if job.device.type == "cuda":
        torch.cuda.empty_cache()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
