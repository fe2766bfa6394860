"""`perfmodel zoo list` (the model zoo: architectures built from code, no weights) and `perfmodel graph` (a job's
captured graph, summarised or as IR JSON)."""

from __future__ import annotations

import sys

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
def zoo_list(as_json: JsonOpt = False) -> None:
    """List the zoo's models with their family and library."""
    from rich.table import Table

    from perfmodel.jobs.zoo import ZOO

    rows = [{"name": e.name, "family": e.family, "library": e.library, "inputs": e.inputs.value}
            for e in ZOO.values()]
    if as_json:
        print_json(rows)
        return
    table = Table("name", "family", "library", "inputs", title=f"{len(rows)} zoo models")
    for r in rows:
        table.add_row(*r.values())
    out.print(table)


@user_errors
def graph(model: ModelArg = None, hf_config: HFConfigOpt = None, task: TaskOpt = None, module: ModuleOpt = None,
          onnx: OnnxOpt = None, batch_size: BatchOpt = 1, seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32",
          optimizer: OptimizerOpt = "sgd", mode: ModeOpt = "train", as_json: JsonOpt = False) -> None:
    """Capture a job's graph (no weights allocated) and summarise it; --json prints the IR."""
    from perfmodel.graph import graph_for_job

    spec = job_spec(model, hf_config, task, module, onnx, batch_size, seq_len, precision, optimizer, mode)
    g = graph_for_job(spec)
    if as_json:
        sys.stdout.write(g.to_json() + "\n")
        return
    from perfmodel.cli.render import render_graph_summary

    render_graph_summary(out, g)
