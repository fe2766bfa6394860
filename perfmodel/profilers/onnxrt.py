"""Per-node profile of an ONNX model under ONNX Runtime, with graph optimisation disabled and enabled.

Running (`profile_onnx`) and parsing (`onnx_nodes_from_trace`) are separate. Each of the two sessions runs with
`SessionOptions.enable_profiling`; its JSON trace goes to a temporary directory that is deleted afterwards. A trace
holds one `model_run` event (cat "Session") per `session.run` and one event per node execution (cat "Node", name
`<node>_kernel_time`, args op_name / provider / input_type_shape / output_type_shape, dur in microseconds); node
times are averaged over the timed runs only (node events before the first timed `model_run` are warm-up).

`iter_time_ms_*` is the median wall time of `session.run` (perf_counter) over the timed runs, measured with
profiling on (ORT's per-node timestamps cost microseconds per node) and with numpy feeds, so on GPU it includes the
host-to-device copy of the inputs and the copy back of the outputs.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.opkinds import kind_of_onnx
from perfmodel.core.units import s_to_ms, us_to_ms
from perfmodel.records import OnnxNodeRecord, OnnxProfile
from perfmodel.torch_device import resolve_device

GraphOptimization = Literal["disabled", "enabled"]
# ORT's own log lines (coloured, on stderr) would precede perfmodel's one-line error for a file it cannot load
# ("Could not write a profile because no model was loaded"); every failure reaches perfmodel as an exception
_ORT_LOG_FATAL_ONLY = 4
KERNEL_SUFFIX = "_kernel_time"

_NUMPY_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def execution_provider(device: torch.device) -> tuple[str, dict[str, Any]]:
    """The ORT execution provider (and its options) for a torch device; PerfmodelError if this onnxruntime
    build lacks it."""
    import onnxruntime as ort

    if device.type == "cpu":
        return "CPUExecutionProvider", {}
    name = "ROCMExecutionProvider" if torch.version.hip else "CUDAExecutionProvider"
    available = ort.get_available_providers()
    if name not in available:
        raise PerfmodelError(f"device {device} needs onnxruntime's {name}, which this onnxruntime build lacks "
                             f"(available: {', '.join(available)})")
    return name, {"device_id": device.index or 0}


def profile_onnx(path: str | Path, device: str | torch.device = "cpu", *, batch_size: int, seq_len: int,
                 runs: int = 10, warmup: int = 2, seed: int = 0) -> OnnxProfile:
    """Profile the model at `path` with ORT on `device`: `warmup` + `runs` session.run calls per optimisation
    level, inputs generated from the model's input specs (`input_feeds`)."""
    import onnxruntime as ort

    if runs < 1 or warmup < 0:
        raise PerfmodelError(f"need runs >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    path = Path(path)
    if not path.is_file():
        raise PerfmodelError(f"ONNX model not found: {path}")
    provider, provider_options = execution_provider(resolve_device(device))
    levels: dict[GraphOptimization, Any] = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "enabled": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    times_ms: dict[str, float] = {}
    nodes: list[OnnxNodeRecord] = []
    feeds: dict[str, np.ndarray] | None = None
    with tempfile.TemporaryDirectory(prefix="perfmodel-ort-") as tmp:
        for label, level in levels.items():
            options = ort.SessionOptions()
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(tmp) / f"ort-{label}")
            options.graph_optimization_level = level
            options.log_severity_level = _ORT_LOG_FATAL_ONLY
            session = _open_session(ort, path, options, provider, provider_options)
            if feeds is None:
                feeds = input_feeds(session.get_inputs(), batch_size, seq_len, np.random.default_rng(seed))
            samples_ms = _run(session, feeds, warmup, runs, path)
            trace = json.loads(Path(session.end_profiling()).read_text())
            times_ms[label] = statistics.median(samples_ms)
            nodes += onnx_nodes_from_trace(trace, label, skip_runs=warmup)
    return OnnxProfile(provider=provider, runs=runs, iter_time_ms_disabled=times_ms["disabled"],
                       iter_time_ms_enabled=times_ms["enabled"], nodes=tuple(nodes))


def _open_session(ort: Any, path: Path, options: Any, provider: str, provider_options: dict) -> Any:
    try:
        return ort.InferenceSession(str(path), options, providers=[(provider, provider_options)])
    except Exception as exc:  # ORT raises its own pybind exception types for every kind of bad file
        raise PerfmodelError(f"onnxruntime cannot load {path}: {_first_line(exc)}") from None


def _run(session: Any, feeds: Mapping[str, np.ndarray], warmup: int, runs: int, path: Path) -> list[float]:
    samples_ms = []
    try:
        for _ in range(warmup):
            session.run(None, feeds)
        for _ in range(runs):
            start_s = time.perf_counter()
            session.run(None, feeds)
            samples_ms.append(s_to_ms(time.perf_counter() - start_s))
    except Exception as exc:  # bad model or inputs it rejects: the user's file, reported in one line
        raise PerfmodelError(f"onnxruntime failed running {path} on generated inputs: {_first_line(exc)}") from None
    return samples_ms


def input_feeds(inputs: Iterable[Any], batch_size: int, seq_len: int, rng: np.random.Generator
                ) -> dict[str, np.ndarray]:
    """Random inputs for ORT input specs (`.name`, `.shape`, `.type`): symbolic or unknown dims become
    `batch_size` on the first axis and `seq_len` on the others; floats are standard normal, integers 0 or 1 (valid
    ids for any embedding, valid attention-mask values), booleans True."""
    feeds = {}
    for spec in inputs:
        dtype = _NUMPY_DTYPES.get(spec.type)
        if dtype is None:
            raise PerfmodelError(f"ONNX input {spec.name!r} has type {spec.type}, which perfmodel cannot generate "
                                 f"(supported: {', '.join(_NUMPY_DTYPES)})")
        shape = [d if isinstance(d, int) and d > 0 else (batch_size if axis == 0 else seq_len)
                 for axis, d in enumerate(spec.shape)]
        if np.issubdtype(dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            feeds[spec.name] = np.ones(shape, dtype=np.bool_)
        else:
            feeds[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feeds


def onnx_nodes_from_trace(trace: Sequence[Mapping[str, Any]], graph_optimization: GraphOptimization,
                          skip_runs: int = 0) -> list[OnnxNodeRecord]:
    """An ORT profiling trace -> one record per node, its time averaged over the runs after the first
    `skip_runs` `model_run`s, in first-execution order (pure)."""
    run_starts = sorted(e["ts"] for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run")
    timed_runs = len(run_starts) - skip_runs
    if timed_runs < 1:
        raise PerfmodelError(f"the ORT trace holds {len(run_starts)} model_run event(s), none after the "
                             f"{skip_runs} warm-up run(s)")
    first_timed_us = run_starts[skip_runs]
    total_us: dict[str, float] = {}
    first: dict[str, Mapping[str, Any]] = {}
    for event in trace:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX) or event["ts"] < first_timed_us:
            continue
        node = name[: -len(KERNEL_SUFFIX)]
        first.setdefault(node, event)
        total_us[node] = total_us.get(node, 0.0) + float(event["dur"])
    records = []
    for node, event in first.items():
        args = event.get("args", {})
        op_type = str(args.get("op_name", ""))
        records.append(OnnxNodeRecord(
            graph_optimization=graph_optimization,
            node_name=node,
            op_type=op_type,
            kind=kind_of_onnx(op_type),
            provider=str(args.get("provider", "")),
            time_ms=us_to_ms(total_us[node] / timed_runs),
            input_shapes=_shapes(args.get("input_type_shape", ())),
            output_shapes=_shapes(args.get("output_type_shape", ())),
        ))
    return records


def _shapes(type_shapes: Iterable[Mapping[str, Sequence[int]]]) -> tuple[tuple[int, ...], ...]:
    """ORT's [{"float": [2, 3]}, {"int64": [2]}] -> ((2, 3), (2,))."""
    return tuple(tuple(int(d) for d in dims) for entry in type_shapes for dims in entry.values())


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
