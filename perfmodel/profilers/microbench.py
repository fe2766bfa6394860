"""`perfmodel hw bench`: time the op classes the per-op device model learns on this machine's device.

A sweep is a list of `BenchShape`s (one op of one class, shape and dtype, in the shape conventions of
`perfmodel.profilers.external` and NeuSight's sweeps: `bmm` is B × (M×K · K×N), `linear` a (B, M, K) input times an
N×K weight, `conv2d` square NCHW, the vector ops a [B, H] tensor). The candidates (`candidate_grid`) span each
class's shapes in every math the device runs (`bench_maths`: fp32 everywhere; on GPUs the tensor maths its catalog
entry has peaks for); `order_candidates` sorts them so a short budget is spent where the shipped model is least
sure: classes interleaved, within a class the widest predicted 80 % interval first, ties spread over the shape space
(farthest first in log FLOPs × log bytes), and shapes whose roofline on the device exceeds `max_op_ms` left out.
The `conv2d`, `layernorm` and `elementwise` candidates also hold the rows of real ops whose rows stand for another
shape (`perfmodel.profilers.lowered_ops`: depthwise convolutions, training batch norms, max pools): each such shape
is a job's row (captured and lowered), and what is timed is the op's own kernel (`BenchShape.real_op`, `part`,
`tensor`).

Running (`time_op`, `run_sweep`) is kept apart from turning timings into rows (`perfmodel.profilers.bench_rows`):
each op is built once (`build_op`), called `warmup` times, then timed `repeats` times with CUDA events on a GPU
(the kernel's own time, launch gaps excluded) and `time.perf_counter` elsewhere (on a CPU the call is the
kernel). The row's latency is the median of CUDA-event timings, the fastest call under `perf_counter`
(`Timing.latency_ms`). The sweep stops starting shapes when its time budget is spent.

Device probe (`probe_device`): on a GPU `torch.cuda.get_device_properties` (name, SMs, memory), matched to the
catalog by name or alias; a GPU the catalog lacks becomes a local entry (`new_gpu_spec`: peak fp32 from a timed
GEMM, bandwidth from a timed copy, both measured here). On a CPU: the catalog's `cpu` entry, whichever CPU this
host is (each row keeps the host's model name): the bench adapts and calibrates what `--accelerator cpu` answers
on this host. Only a catalog without a `cpu` entry gets this host measured (`perfmodel.hardware.probe.probe_host`)
as a new local one.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import DeviceError, PerfmodelError
from perfmodel.core.units import BYTES_PER_GIB, GIGA
from perfmodel.hardware.math import has_tf32
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.lowering.ops import op_roofline_ms, op_work
from perfmodel.profilers.external import DType, OpClass
from perfmodel.profilers.lowered_ops import REAL_OPS, build_kernel, lowered_rows, swept_tensors

# shape fields a BenchShape may set: the kernel-row shape columns (`perfmodel.lowering.ops.SHAPE_COLUMNS`, the
# OpMeasurement names), in the order of the shape keys earlier runs stored (`BenchShape.key`: do not reorder)
BENCH_FIELDS = ("batch", "m", "n", "k", "hidden", "in_channels", "out_channels", "input_size", "kernel_size",
                "stride", "padding")
WARMUP = 3
REPEATS = 10
MIN_REPEATS = 3
MAX_TIMED_S = 0.2  # stop timing an op after MIN_REPEATS calls once its calls took this long
# leave out shapes whose roofline × `ROOFLINE_SAFETY` on the device is longer than this. A CPU is slow, but its
# jobs' largest GEMMs (a language model's vocabulary head: ~10 GFLOP) are 10x the largest shape 50 ms would
# let in, and the adaptation's trend extrapolated there (efficiency falling with size) priced a GRU language
# model's step 1.4x its time; 150 ms times GEMMs and convolutions of up to ~3.5 GFLOP (about 80 s more here)
MAX_OP_MS_CPU = 150.0
MAX_OP_MS_GPU = 50.0
STALL_FACTOR = 200.0  # a CPU op slower than this × its roofline (and STALL_FLOOR_MS) was stalled by the host
STALL_FLOOR_MS = 1.0
STALL_RETRIES = 3
STALL_PAUSE_S = 0.2
ROOFLINE_SAFETY = 3.0  # the roofline is a lower bound: a shape's time is taken as up to this × it when budgeting

# element-wise ops the sweep times (NeuSight's op names; `u`: with a scalar)
ELEMENTWISE_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "addu": lambda a, b: a + 1.5,
    "relu": lambda a, b: a.relu(),
    "gelu": lambda a, b: __import__("torch").nn.functional.gelu(a),
    "tanh": lambda a, b: a.tanh(),
    "silu": lambda a, b: __import__("torch").nn.functional.silu(a),
    "sigmoid": lambda a, b: a.sigmoid(),
}


@dataclass(frozen=True)
class BenchShape:
    """One op to time: its class, upstream name, dtype and shape (unset fields are None)."""

    op_class: OpClass
    op_name: str
    dtype: DType
    batch: int | None = None
    m: int | None = None
    n: int | None = None
    k: int | None = None
    hidden: int | None = None
    in_channels: int | None = None
    out_channels: int | None = None
    input_size: int | None = None
    kernel_size: int | None = None
    stride: int | None = None
    padding: int | None = None
    # a row of a real op (`perfmodel.profilers.lowered_ops`): the op, the row's part and the op's NCHW input; the
    # fields above are then the row's lowered shape, and the op's own kernel is what is timed
    real_op: str | None = None
    part: str | None = None
    tensor: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        """A stable identity of the shape (the same in every run): class, name, dtype and the set fields (and a
        real op's name, part and input)."""
        dims = ",".join(f"{name}={getattr(self, name)}" for name in BENCH_FIELDS if getattr(self, name) is not None)
        key = f"{self.op_class}/{self.op_name}/{self.dtype}/{dims}"
        if self.real_op is not None:
            key += f"/{self.real_op}.{self.part}/{'x'.join(map(str, self.tensor or ()))}"
        return key

    def fields(self) -> dict[str, Any]:
        """The row's columns: class, name, dtype and the shape fields."""
        return {name: value for name, value in asdict(self).items() if name not in ("real_op", "part", "tensor")}

    def dim(self, name: str) -> int:
        """The set size field `name` (an op's builder reads only the fields of its class): unset is an error."""
        value = getattr(self, name)
        if value is None:
            raise PerfmodelError(f"{self.op_class} shape {self.key} has no {name}")
        return int(value)


@dataclass(frozen=True)
class Timing:
    """What one op took: every timed call in ms, and how it was timed."""

    shape: BenchShape
    samples_ms: tuple[float, ...]
    warmup: int
    timer: str  # "cuda-events" or "perf_counter"

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def latency_ms(self) -> float:
        """The op's time: the median of CUDA-event timings; on a CPU the fastest call, since on a shared host
        other processes' threads stall some calls by 100x (seen: a 0.1 ms GEMM with a 50 ms median under load)."""
        return self.median_ms if self.timer == "cuda-events" else float(min(self.samples_ms))


@dataclass(frozen=True)
class SweepResult:
    timings: tuple[Timing, ...]
    skipped_done: int  # shapes already stored (resumed)
    left: int  # shapes the budget did not reach
    elapsed_s: float
    failed: tuple[str, ...] = field(default=())  # shape keys whose op raised (e.g. out of memory), with the reason


# --- the candidate grid ------------------------------------------------------------------------------------------

def bench_maths(spec: HardwareSpec) -> tuple[DType, ...]:
    """The dtypes to sweep on a device: fp32, plus on a GPU each tensor math it has a peak for (fp16, bf16, and
    TF32 as a dtype of its own where PyTorch can turn it on)."""
    if spec.kind != "gpu":
        return ("fp32",)
    maths: list[DType] = ["fp32"]
    if spec.peak_fp16_gflops:
        maths.append("fp16")
    if spec.peak_bf16_gflops:
        maths.append("bf16")
    if has_tf32(spec):
        maths.append("tf32")
    return tuple(maths)


def _gemm_sizes(gpu: bool) -> tuple[int, ...]:
    return (64, 128, 256, 512, 768, 1024, 2048, 4096) if gpu else (16, 64, 128, 256, 384, 512, 768, 1024, 2048)


def _gemm_grid(op_class: OpClass, batches: tuple[int, ...]) -> Callable[[DType, bool], list[BenchShape]]:
    """GEMMs of `op_class` (`bmm`, `linear`): every batch, M of the size ladder, N and K of alternate rungs."""
    def grid(dtype: DType, gpu: bool) -> list[BenchShape]:
        sizes = _gemm_sizes(gpu)
        return [BenchShape(op_class, op_class, dtype, batch=b, m=m, n=n, k=k)
                for b in batches for m in sizes for n in sizes[::2] for k in sizes[1::2]]
    return grid


def _conv2d_grid(dtype: DType, gpu: bool) -> list[BenchShape]:
    """2-D convolutions: channel pairs of CNN stages, square inputs, and the 1 x 1, 3 x 3 (stride 1 and 2) and
    7 x 7 stem kernels."""
    return [BenchShape("conv2d", "conv2d", dtype, batch=b, in_channels=cin, out_channels=cout, input_size=size,
                       kernel_size=kernel, stride=stride, padding=padding)
            for b in ((1, 4, 16, 64) if gpu else (1, 2, 4, 8))
            for cin, cout in ((3, 64), (16, 32), (64, 64), (64, 128), (128, 128), (256, 256), (512, 512))
            for size in (7, 14, 28, 56, 112)
            for kernel, stride, padding in ((1, 1, 0), (3, 1, 1), (3, 2, 1), (7, 2, 3))]


def lowered_shapes(op_class: OpClass, dtype: DType, gpu: bool) -> list[BenchShape]:
    """The rows of class `op_class` of every real op (`perfmodel.profilers.lowered_ops`: depthwise convolutions,
    training batch norms, max pools) on the inputs it is swept on, each with its lowered shape (captured: what a
    job's rows are) and the op's own kernel to time. TF32 changes none of these kernels: none in `tf32`."""
    if dtype == "tf32":
        return []
    out = []
    for name in REAL_OPS:
        for tensor in swept_tensors(name, gpu):
            for row in lowered_rows(name, tensor):
                if row.op_class == op_class:
                    out.append(BenchShape(op_class, row.op_name, dtype, **dict(row.shape), real_op=name,
                                          part=row.part, tensor=tensor))
    return out


def _with_lowered(op_class: OpClass, grid: Callable[[DType, bool], list[BenchShape]]
                  ) -> Callable[[DType, bool], list[BenchShape]]:
    """`grid`, then the real ops' rows of `op_class` (`lowered_shapes`)."""
    def both(dtype: DType, gpu: bool) -> list[BenchShape]:
        return grid(dtype, gpu) + lowered_shapes(op_class, dtype, gpu)
    return both


def _rows_grid(op_class: OpClass, names: tuple[str, ...]) -> Callable[[DType, bool], list[BenchShape]]:
    """Row-wise ops of `op_class`, each of `names`, over rows x hidden widths."""
    def grid(dtype: DType, gpu: bool) -> list[BenchShape]:
        return [BenchShape(op_class, name, dtype, batch=b, hidden=h)
                for b in ((1, 8, 64, 512, 4096, 16384) if gpu else (1, 8, 64, 512, 2048))
                for h in ((64, 256, 768, 1024, 2048, 4096, 8192) if gpu else (64, 256, 768, 1024, 2048, 4096))
                for name in names]
    return grid


# the sweep's candidate shapes of each op class it benchmarks, by dtype and whether the device is a GPU
GRIDS: dict[OpClass, Callable[[DType, bool], list[BenchShape]]] = {
    "bmm": _gemm_grid("bmm", (1, 4, 16, 64)),
    "linear": _gemm_grid("linear", (1, 8, 32)),
    "conv2d": _with_lowered("conv2d", _conv2d_grid),  # + depthwise convolutions
    "elementwise": _with_lowered("elementwise", _rows_grid("elementwise", tuple(ELEMENTWISE_OPS))),  # + max pools
    "softmax": _rows_grid("softmax", ("softmax",)),
    "layernorm": _with_lowered("layernorm", _rows_grid("layernorm", ("ln",))),  # + training batch norms
}


def _grid(op_class: OpClass, dtype: DType, gpu: bool) -> list[BenchShape]:
    grid = GRIDS.get(op_class)
    if grid is None:
        raise PerfmodelError(f"no microbenchmark for op class {op_class!r}")
    return grid(dtype, gpu)


BENCH_CLASSES: tuple[OpClass, ...] = tuple(GRIDS)
TENSOR_ONLY_CLASSES = ("bmm", "linear", "conv2d")  # TF32 is a GEMM / convolution math only


def candidate_grid(spec: HardwareSpec, classes: Sequence[str] = BENCH_CLASSES) -> list[BenchShape]:
    """Every candidate shape of `classes` in every dtype `bench_maths` gives the device."""
    gpu = spec.kind == "gpu"
    out = []
    for dtype in bench_maths(spec):
        for op_class in classes:
            if dtype == "tf32" and op_class not in TENSOR_ONLY_CLASSES:
                continue
            out.extend(_grid(_bench_class(op_class), dtype, gpu))
    return out


def _bench_class(name: str) -> OpClass:
    """`name` (as a user typed it) as one of the op classes the sweep has a grid for, else the error naming it."""
    for op_class in BENCH_CLASSES:
        if op_class == name:
            return op_class
    raise PerfmodelError(f"no microbenchmark for op class {name!r}")


def shapes_frame(shapes: Sequence[BenchShape], device: str) -> pd.DataFrame:
    """The shapes as the device model's input rows (one row each, `device` set)."""
    frame = pd.DataFrame([s.fields() for s in shapes])
    frame["device"] = device
    return frame


def order_candidates(shapes: Sequence[BenchShape], spec: HardwareSpec, catalog: Mapping[str, HardwareSpec],
                     model: Any | None = None, max_op_ms: float | None = None) -> list[BenchShape]:
    """`shapes` in the order to time them: op classes (and dtypes) interleaved round-robin; within a class, the
    widest interval of `model` first (its p90 / p10 on this device; all equal without a model), ties broken
    farthest-point first over (log2 FLOPs, log2 bytes) so that any prefix spreads over the class's shapes.
    Shapes whose roofline × `ROOFLINE_SAFETY` exceeds `max_op_ms` are dropped."""
    if not shapes:
        return []
    limit = max_op_ms if max_op_ms is not None else (MAX_OP_MS_GPU if spec.kind == "gpu" else MAX_OP_MS_CPU)
    frame = shapes_frame(shapes, spec.name)
    work = op_work(frame)
    roofline_ms = op_roofline_ms(frame, catalog)
    width = np.zeros(len(frame))
    if model is not None:
        known = frame["op_class"].isin(getattr(model, "boosters_", {})).to_numpy()
        if known.any():
            out = model.predict(frame[known], catalog)
            width[known] = np.log(out.p90_ms / out.p10_ms)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(shapes):
        if roofline_ms[i] * ROOFLINE_SAFETY <= limit:
            groups.setdefault((s.op_class, s.dtype), []).append(i)
    points = np.column_stack([np.log2(1 + work.flops), np.log2(1 + work.bytes_read + work.bytes_written)])
    queues = [_farthest_first(idx, points, width) for idx in groups.values()]
    ordered: list[BenchShape] = []
    for rank in range(max((len(q) for q in queues), default=0)):
        ordered.extend(shapes[q[rank]] for q in queues if rank < len(q))
    return ordered


def roofline_by_key(shapes: Sequence[BenchShape], spec: HardwareSpec, catalog: Mapping[str, HardwareSpec]
                    ) -> dict[str, float]:
    """max(FLOPs / peak, bytes / bandwidth) of every shape on the device, ms, by shape key."""
    if not shapes:
        return {}
    return dict(zip((s.key for s in shapes), op_roofline_ms(shapes_frame(shapes, spec.name), catalog).tolist()))


def _farthest_first(indices: list[int], points: np.ndarray, width: np.ndarray) -> list[int]:
    """Greedy: start at the widest interval; then always the shape farthest from those taken (distance scaled up
    by its interval width relative to the class's widest)."""
    idx = np.asarray(indices)
    pts = points[idx]
    scale = np.exp(width[idx] - width[idx].max())  # 1 for the widest, < 1 for narrower intervals
    order = [int(np.argmax(width[idx]))]
    distance = np.linalg.norm(pts - pts[order[0]], axis=1)
    distance[order[0]] = -1.0
    for _ in range(len(idx) - 1):
        nxt = int(np.argmax(distance * scale))
        order.append(nxt)
        distance = np.minimum(distance, np.linalg.norm(pts - pts[nxt], axis=1))
        distance[order] = -1.0
    return [int(idx[i]) for i in order]


# --- running ops on the device -----------------------------------------------------------------------------------

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def build_op(shape: BenchShape, device: str) -> Callable[[], Any]:
    """A zero-argument callable running the op once on `device` (inputs allocated now, outside the timing)."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, _TORCH_DTYPES[shape.dtype])
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*size: int) -> Any:
        return torch.randn(*size, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    if shape.real_op is not None:
        return build_kernel(shape.real_op, str(shape.part), tuple(shape.tensor or ()), dtype, device)
    d = shape.dim
    if shape.op_class == "bmm":
        a, b = rand(d("batch"), d("m"), d("k")), rand(d("batch"), d("k"), d("n"))
        return lambda: torch.bmm(a, b)
    if shape.op_class == "linear":
        x, w = rand(d("batch"), d("m"), d("k")), rand(d("n"), d("k"))
        return lambda: F.linear(x, w)
    if shape.op_class == "conv2d":
        x = rand(d("batch"), d("in_channels"), d("input_size"), d("input_size"))
        w = rand(d("out_channels"), d("in_channels"), d("kernel_size"), d("kernel_size"))
        stride = 1 if shape.stride is None else shape.stride  # torch's defaults when unset
        padding = 0 if shape.padding is None else shape.padding
        return lambda: F.conv2d(x, w, stride=stride, padding=padding)
    x, y = rand(d("batch"), d("hidden")), rand(d("batch"), d("hidden"))
    if shape.op_class == "elementwise":
        fn = ELEMENTWISE_OPS[shape.op_name]
        return lambda: fn(x, y)
    if shape.op_class == "softmax":
        return lambda: torch.softmax(x, dim=-1)
    if shape.op_class == "layernorm":
        hidden = d("hidden")
        weight, bias = rand(hidden), rand(hidden)
        return lambda: F.layer_norm(x, (hidden,), weight, bias)
    raise PerfmodelError(f"no microbenchmark for op class {shape.op_class!r}")


def time_op(run: Callable[[], Any], device: str, warmup: int = WARMUP, repeats: int = REPEATS,
            max_s: float = MAX_TIMED_S) -> tuple[list[float], str]:
    """Up to `repeats` timings (ms) of `run` after up to `warmup` calls: CUDA events on a GPU, `perf_counter`
    elsewhere. A slow op stops early: warm-up ends after a call longer than `max_s` / 4, and timing once
    `MIN_REPEATS` calls took `max_s` in all (a 100 ms CPU convolution is not timed ten times)."""
    import torch

    cuda = device.startswith("cuda")
    for _ in range(max(warmup, 1)):
        started = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize(device)
        if time.perf_counter() - started > max_s / 4:
            break
    samples: list[float] = []
    while len(samples) < repeats and (len(samples) < MIN_REPEATS or sum(samples) < max_s * 1e3):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(float(start.elapsed_time(end)))
        else:
            started = time.perf_counter()
            run()
            samples.append((time.perf_counter() - started) * 1e3)
    return samples, "cuda-events" if cuda else "perf_counter"


class _Tf32:
    """Turn PyTorch's TF32 switches on for `tf32` rows (matmul and cuDNN), restoring them afterwards."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self) -> None:
        import torch

        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = self.on
        torch.backends.cudnn.allow_tf32 = self.on

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def stalled(timing: Timing, roofline_ms: float) -> bool:
    """A CPU timing no run of the op could take unless the host stalled it: slower than `STALL_FACTOR` × its
    roofline and than `STALL_FLOOR_MS` (seen under load: a 64-element GELU at 32 ms, every call)."""
    return timing.timer == "perf_counter" and timing.latency_ms > max(STALL_FACTOR * roofline_ms, STALL_FLOOR_MS)


def run_sweep(shapes: Iterable[BenchShape], device: str, budget_s: float, *, done: Iterable[str] = (),
              warmup: int = WARMUP, repeats: int = REPEATS,
              on_batch: Callable[[list[Timing]], None] | None = None, batch_size: int = 20,
              roofline_ms: Mapping[str, float] | None = None) -> SweepResult:
    """Time `shapes` in order on the torch `device` until `budget_s` is spent, skipping the keys in `done`.
    `on_batch` gets every `batch_size` timings as they are taken (the caller stores them: one transaction each),
    and the last partial batch at the end. An op that raises (out of memory) is recorded in `failed` and skipped.
    `roofline_ms` (by shape key): a `stalled` CPU timing is taken again after a pause, up to `STALL_RETRIES`
    times, keeping every sample (the row's latency is the fastest); one still stalled is left out."""
    import torch

    shapes = list(shapes)
    done = set(done)
    started = time.perf_counter()
    timings: list[Timing] = []
    batch: list[Timing] = []
    failed = []
    skipped = 0
    reached = 0
    for shape in shapes:
        if shape.key in done:
            skipped += 1
            reached += 1
            continue
        if time.perf_counter() - started >= budget_s:
            break
        reached += 1
        try:
            with _Tf32(shape.dtype == "tf32"), torch.no_grad():
                run = build_op(shape, device)
                samples, timer = time_op(run, device, warmup, repeats)
                timing = Timing(shape, tuple(samples), warmup, timer)
                expected = (roofline_ms or {}).get(shape.key)
                for _ in range(STALL_RETRIES if expected is not None else 0):
                    if expected is None or not stalled(timing, expected):
                        break
                    time.sleep(STALL_PAUSE_S)
                    more, _ = time_op(run, device, 1, repeats)
                    timing = Timing(shape, timing.samples_ms + tuple(more), warmup, timer)
        except (RuntimeError, MemoryError) as exc:  # torch's out-of-memory is a RuntimeError subclass
            failed.append(f"{shape.key}: {str(exc).splitlines()[0][:120]}")
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            continue
        if expected is not None and stalled(timing, expected):
            failed.append(f"{shape.key}: stalled by the host ({timing.latency_ms:.1f} ms, roofline {expected:.4f} ms)")
            continue
        timings.append(timing)
        batch.append(timing)
        if on_batch and len(batch) >= batch_size:
            on_batch(batch)
            batch = []
    if on_batch and batch:
        on_batch(batch)
    return SweepResult(tuple(timings), skipped, len(shapes) - reached, time.perf_counter() - started,
                       tuple(failed))


# --- the device ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbedDevice:
    """The device a sweep runs on: torch's device string, its catalog entry, and whether that entry is new (to be
    recorded in the local catalog)."""

    torch_device: str
    spec: HardwareSpec
    new_entry: bool
    properties: dict[str, Any]


def torch_device_of(device: str) -> str:
    """`cpu`, `cuda`, `cuda:N` or `rocm` (ROCm's torch calls its GPUs cuda) as a torch device string."""
    if device == "cpu":
        return "cpu"
    if device == "rocm":
        return "cuda:0"
    if device == "cuda":
        return "cuda:0"
    if re.fullmatch(r"cuda:\d+", device):
        return device
    raise DeviceError(f"unknown device {device!r}; use cpu, cuda, cuda:N or rocm")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def probe_device(device: str, catalog: Mapping[str, HardwareSpec]) -> ProbedDevice:
    """This machine's `device` as a catalog entry (matched, or new: see the module docstring)."""
    import torch

    from perfmodel.hardware.catalog import get_accelerator

    target = torch_device_of(device)
    if target == "cpu":
        from perfmodel.hardware.probe import probe_host, read_cpu_identity

        model = read_cpu_identity().model
        props: dict[str, Any] = {"model": model, "threads": torch.get_num_threads()}
        known = catalog.get("cpu")
        if known is not None:
            # this host is benched as the catalog's `cpu`, whichever CPU it is: what the bench times here is what
            # `--accelerator cpu` is answered with on this host. The entry stays as it is: the CPU step model knows
            # only the host it was measured on (its spec sheet is among the model's features, and another host's
            # would put every answer outside what it learned), so this host's ops adapt it and its whole steps
            # calibrate it; each row keeps this host's model name (`props`)
            return ProbedDevice("cpu", known, False, props)
        probed = probe_host()  # a catalog without a `cpu` entry: this host, measured
        props.update(cores=probed.compute_units, peak_fp32_gflops=probed.peak_fp32_gflops,
                     memory_bandwidth_gb_s=probed.memory_bandwidth_gb_s)
        return ProbedDevice("cpu", probed, True, props)
    if not torch.cuda.is_available():
        raise DeviceError(f"{device}: torch sees no CUDA/ROCm device on this machine")
    index = int(target.split(":")[1])
    if index >= torch.cuda.device_count():
        raise DeviceError(f"{device}: this machine has {torch.cuda.device_count()} GPU(s)")
    p = torch.cuda.get_device_properties(index)
    props = {"name": p.name, "multi_processor_count": p.multi_processor_count, "total_memory": p.total_memory,
             "major": p.major, "minor": p.minor}
    for attr in ("clock_rate", "memory_clock_rate", "l2_cache_size", "gcnArchName"):
        if hasattr(p, attr):
            props[attr] = getattr(p, attr)
    try:
        return ProbedDevice(target, get_accelerator(p.name, catalog), False, props)
    except PerfmodelError:
        return ProbedDevice(target, new_gpu_spec(target, props), True, props)


def new_gpu_spec(target: str, props: Mapping[str, Any]) -> HardwareSpec:
    """A catalog entry for a GPU the catalog lacks: name and SMs from torch, fp32 peak and copy bandwidth timed
    here (a 4096³ GEMM, a 1 GiB copy): measured, not datasheet, figures."""
    import torch

    n = 4096
    a = torch.randn(n, n, device=target)
    samples, _ = time_op(lambda: a @ a, target, 2, 5)
    gflops = 2 * n**3 / (min(samples) / 1e3) / GIGA
    src = torch.ones(2**28, device=target)
    dst = torch.empty_like(src)
    samples, _ = time_op(lambda: dst.copy_(src), target, 2, 5)
    bandwidth = 2 * src.numel() * 4 / (min(samples) / 1e3) / GIGA
    l2 = props.get("l2_cache_size")
    vendor = "AMD" if torch.version.hip else "NVIDIA"
    return HardwareSpec(
        name=slug(str(props["name"])) or "gpu-local", kind="gpu", vendor=vendor, aliases=(str(props["name"]),),
        peak_fp32_gflops=round(gflops, 1), memory_bandwidth_gb_s=round(bandwidth, 1),
        memory_gb=round(props["total_memory"] / BYTES_PER_GIB, 2), compute_units=int(props["multi_processor_count"]),
        l2_cache_mb=round(l2 / 1e6, 2) if l2 else None,
        boost_clock_mhz=props["clock_rate"] / 1e3 if props.get("clock_rate") else None,
        source=f"perfmodel hw bench: torch.cuda.get_device_properties and a timed {n}^3 fp32 GEMM and copy "
               f"(measured, not the datasheet)")


__all__ = ["BENCH_CLASSES", "BenchShape", "ProbedDevice", "SweepResult", "Timing", "bench_maths", "build_op",
           "candidate_grid", "order_candidates", "probe_device", "run_sweep", "time_op",
           "torch_device_of"]
