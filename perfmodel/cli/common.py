"""What every command module of the CLI shares: the consoles, `user_errors` (bad input -> one line on stderr, exit
code 2), the job options and the JobSpec they build, JSON output and progress lines on stderr."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from perfmodel.core.errors import PerfmodelError, validation_message

# Piped output (scripts, CI logs) gets a wide console rather than rich's 80-column default.
out = Console(soft_wrap=True, width=shutil.get_terminal_size((160, 24)).columns)
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn bad input into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PerfmodelError as exc:
            message = str(exc)
        except ValidationError as exc:
            message = validation_message(exc)
        typer.echo("error: " + " ".join(message.split()), err=True)
        raise typer.Exit(2)

    return wrapper  # type: ignore[return-value]


# --- job options, shared by every command that takes a job ----------------------------------------------------
ModelArg = Annotated[Optional[str], typer.Argument(help="zoo model name (see `perfmodel zoo list`)")]
HFConfigOpt = Annotated[Optional[Path], typer.Option("--hf-config", help="HF config.json (or its folder)")]
TaskOpt = Annotated[Optional[str], typer.Option(help="HF head: base, causal-lm, masked-lm, seq2seq-lm, "
                                                     "sequence-classification, question-answering")]
ModuleOpt = Annotated[Optional[str], typer.Option("--module", help="path/to/file.py:NAME")]
OnnxOpt = Annotated[Optional[Path], typer.Option("--onnx", help="an .onnx file")]
BatchOpt = Annotated[int, typer.Option("--batch-size", "-b", help="batch size")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq-len", help="sequence length of token models \\[a zoo model's "
                                                                  "own (`zoo show NAME`), else 128]")]
PrecisionOpt = Annotated[str, typer.Option(help="fp32 (PyTorch's defaults: TF32 convs on Ampere+), fp32-strict, "
                                                "tf32, amp, amp-bf16, fp16, bf16, fp16-master or bf16-master "
                                                "(a half model, fp32 master weights: apex O2; bf16-master "
                                                "accumulates fp32 gradients, as Megatron-LM)")]
OptimizerOpt = Annotated[Optional[str], typer.Option(
    help="sgd (momentum 0.9), adam or adamw \\[a zoo model's reference optimizer (`zoo show NAME`), adamw for "
         "--hf-config, else sgd]")]
ModeOpt = Annotated[str, typer.Option(help="train or inference")]
ChannelsLastOpt = Annotated[bool, typer.Option(
    "--channels-last", help="the model runs in channels-last memory format: its half-precision convolutions "
                            "pay no NCHW <-> NHWC transposes")]
FusedOptimizerOpt = Annotated[bool, typer.Option(
    "--fused-optimizer", help="the optimizer steps in one fused kernel (torch's fused=True, apex's FusedAdam, "
                              "DeepSpeed's): each tensor read and written once, no temporaries \\[torch's default, "
                              "foreach]")]
PytorchOpt = Annotated[Optional[str], typer.Option(
    "--pytorch-version", help="the PyTorch (major.minor, e.g. 1.4) the job trains with: an older one is answered as "
                              "much slower as it ran on the public runs \\[a zoo model's reference implementation's "
                              "(`zoo show NAME`; Gavel's jobs: 1.4), else the newest]")]
StepsVaryOpt = Annotated[Optional[bool], typer.Option(
    "--steps-vary/--steady-steps",
    help="its steps vary in time (variable-length batches, inputs decoded on the CPU each step: data-parallel "
         "replicas wait for the slowest), or do not (fixed shapes, input ready on the device) \\[a zoo model's "
         "reference implementation's, else not known]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
StoreOpt = Annotated[Optional[str], typer.Option("--store", help="store URL \\[env PERFMODEL_STORE_URL, "
                                                                   "default SQLite under PERFMODEL_HOME]")]


# the JobSpec fields the job options set
JOB_OPTIONS = {"batch_size": "-b/--batch-size", "seq_len": "--seq-len", "precision": "--precision",
               "optimizer": "--optimizer", "mode": "--mode", "task": "--task", "source.task": "--task",
               "channels_last": "--channels-last", "fused_optimizer": "--fused-optimizer",
               "pytorch_version": "--pytorch-version",
               "steps_vary": "--steps-vary/--steady-steps"}


def job_spec(model: str | None, hf_config: Path | None, task: str | None, module: str | None,
             onnx: Path | None, batch_size: int, seq_len: int | None, precision: str, optimizer: str | None,
             mode: str, *, channels_last: bool = False, fused_optimizer: bool = False,
             pytorch_version: str | None = None,
             steps_vary: bool | None = None, options: Mapping[str, str] | None = JOB_OPTIONS) -> Any:
    """The JobSpec the job options describe; a value pydantic refuses is a PerfmodelError naming its option in
    `options` (None: the ValidationError itself, for a caller that names the values its own way)."""
    from perfmodel.jobs.spec import JobSpec

    if onnx is not None and not onnx.is_file():
        raise PerfmodelError(f"ONNX file not found: {onnx}")
    if model is not None:
        from perfmodel.jobs.zoo import get_entry

        get_entry(model)  # an unknown name is refused (with its close matches) before any job is captured
    try:
        return JobSpec.from_options(zoo=model, hf_config=hf_config, task=task, module=module,
                                    onnx=str(onnx) if onnx else None, batch_size=batch_size, seq_len=seq_len,
                                    precision=precision, optimizer=optimizer, mode=mode, channels_last=channels_last,
                                    fused_optimizer=fused_optimizer, pytorch_version=pytorch_version,
                                    steps_vary=steps_vary)
    except ValidationError as exc:
        if options is None:
            raise
        raise PerfmodelError(validation_message(exc, options)) from None


def writable_folder(path: Path) -> Path:
    """`path`, refused (exit 2) before any work when its folder does not exist: the CLI never creates folders."""
    if not path.parent.is_dir():
        raise PerfmodelError(f"cannot write {path}: no such folder {path.parent}")
    return path


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def say(message: str) -> None:
    """A progress line on stderr (stdout stays machine-readable)."""
    err.print(f"[dim]{message}[/]", highlight=False)
