"""`perfmodel zoo list` (the model zoo: architectures built from code, no weights) and `perfmodel graph` (a job's
captured graph, summarised or as IR JSON)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from perfmodel.cli.common import (
    BatchOpt,
    HFConfigOpt,
    JsonOpt,
    ModelArg,
    ModeOpt,
    ModuleOpt,
    OnnxOpt,
    OptimizerOpt,
    PrecisionOpt,
    SeqOpt,
    TaskOpt,
    job_spec,
    out,
    print_json,
    user_errors,
)

zoo_app = typer.Typer(no_args_is_help=True, help="The model zoo (architectures built from code, no weights).")


@zoo_app.command("list")
def zoo_list(as_json: JsonOpt = False,
             every: Annotated[bool, typer.Option(
                 "--all", help="also every torchvision and timm image classifier a job may name")] = False) -> None:
    """List the zoo's models with their family and library (--all: with the libraries' image classifiers)."""
    from rich.table import Table

    from perfmodel.jobs.library_models import library_models
    from perfmodel.jobs.zoo import ZOO, get_entry

    more = [name for name in library_models() if name not in ZOO]
    rows = [{"name": e.name, "family": e.family, "library": e.library, "inputs": e.inputs.value, "unit": e.unit}
            for e in map(get_entry, [*ZOO, *(more if every else ())])]
    if as_json:
        print_json(rows)
        return
    caption = None if every else (f"and {len(more)} more image classifiers of torchvision and timm by their library "
                                  f"names (--all lists them)")
    table = Table("name", "family", "library", "inputs", "unit", title=f"{len(rows)} zoo models", caption=caption)
    for r in rows:
        table.add_row(*r.values())
    out.print(table)


@zoo_app.command("show")
@user_errors
def zoo_show(name: Annotated[str, typer.Argument(help="zoo model name (see `perfmodel zoo list`)")],
             seq_len: Annotated[Optional[int], typer.Option(
                 "--seq-len", help="sequence length items_per_sample is given at \\[the model's reference, else 128]")]
             = None,
             as_json: JsonOpt = False) -> None:
    """One zoo model: family, library, inputs, the benchmark unit and items per sample, reference sequence length,
    default head, the optimizer and PyTorch version a job gets when it names none (no version: the newest), what
    its reference implementation does on the host
    that the graph does not show, and description."""
    from perfmodel.core.errors import PerfmodelError
    from perfmodel.jobs.spec import DEFAULT_SEQ_LEN
    from perfmodel.jobs.zoo import InputKind, get_entry

    entry = get_entry(name)
    if seq_len is not None and seq_len <= 0:
        raise PerfmodelError(f"seq_len must be positive, got {seq_len}")
    at = seq_len or entry.reference_seq_len or DEFAULT_SEQ_LEN
    info = {"name": entry.name, "family": entry.family, "library": entry.library, "inputs": entry.inputs.value,
            "unit": entry.unit, "seq_len": at, "items_per_sample": entry.items(at),
            "real_item_share": entry.real_item_share,
            "reference_seq_len": entry.reference_seq_len, "default_task": entry.default_task,
            "optimizer": entry.reference_optimizer or "sgd", "pytorch_version": entry.reference_pytorch,
            "steps_vary": entry.reference_steps_vary, "host_work": entry.host_work,
            **({"image_size": entry.image_size} if entry.inputs is InputKind.image else {}),
            "description": entry.description}
    if as_json:
        print_json(info)
        return
    from rich.table import Table

    table = Table("field", "value", title=entry.name, show_header=False)
    for key, value in info.items():
        table.add_row(key, "–" if value is None or value == "" else f"{value:g}" if isinstance(value, float)
                      else str(value))
    out.print(table)


@user_errors
def graph(model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None, module: ModuleOpt = None,
          onnx: OnnxOpt = None, batch_size: BatchOpt = 1, seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32",
          optimizer: OptimizerOpt = None, mode: ModeOpt = "train", as_json: JsonOpt = False) -> None:
    """Capture a job's graph (no weights allocated) and summarise it; --json prints the IR."""
    from perfmodel.graph import graph_for_job

    spec = job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode)
    g = graph_for_job(spec)
    if as_json:
        sys.stdout.write(g.to_json() + "\n")
        return
    from perfmodel.cli.render import render_graph_summary

    render_graph_summary(out, g)
