"""Export a job's model to ONNX (inference graph, CPU, random weights) for ONNX Runtime and `graph_from_onnx`.

The exporter is `torch.onnx.export(..., dynamo=True)` (torch.export + onnxscript), with the exporter's default
graph optimisations (constant folding, batch norm folded into the preceding conv, ...). Input shapes are static:
the spec's batch size and sequence length. When the dynamo exporter cannot handle a model we retry once with the
TorchScript exporter (`dynamo=False`); if that fails too, the error names the model in one line.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import JobSpec, Mode, OnnxSource

_EXTERNAL_DATA_BYTES = 1_500_000_000


def export_onnx(spec: JobSpec, path: str | Path, *, optimize: bool = True) -> Path:
    """Build `spec`'s model on the CPU in eval mode and write its ONNX graph to `path` (parents created).
    `optimize=False` keeps batch norms unfolded (the exporter's optimiser folds them into the convolutions): the
    form a training graph is derived from (`graph_from_onnx(..., mode="train")`)."""
    from perfmodel.jobs.build import build_job

    if isinstance(spec.source, OnnxSource):
        raise PerfmodelError("the job is already an ONNX model: nothing to export")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    job = build_job(spec.model_copy(update={"mode": Mode.inference}), "cpu")
    # Protobuf files stop at 2 GB: bigger models keep their weights in a side file next to `path`.
    external_data = sum(p.numel() * p.element_size() for p in job.module.parameters()) > _EXTERNAL_DATA_BYTES
    errors = []
    for dynamo in (True, False):
        try:
            with _quiet(), torch.no_grad():
                torch.onnx.export(job.module, job.args, str(path), kwargs=dict(job.kwargs), dynamo=dynamo,
                                  external_data=external_data, optimize=optimize)
            return path
        except Exception as exc:  # the exporters raise many types: keep one line of each
            errors.append(f"{'dynamo' if dynamo else 'torchscript'}: {type(exc).__name__}: "
                          f"{(str(exc).strip().splitlines() or [''])[0]}")
    raise PerfmodelError(f"cannot export {spec.name} to ONNX ({'; '.join(errors)})")


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's progress prints, warnings and logging."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "torch.export", "torch._export")]
    levels = [logger.level for logger in loggers]
    sink = io.StringIO()
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
