"""`perfmodel export gavel`: predicted throughputs of jobs x accelerator types x scale factors in the layout Gavel's
scheduler reads (perfmodel/placement/gavel.py), predicted by perfmodel/engine/gavel.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfmodel.cli.common import OptimizerOpt, PrecisionOpt, SeqOpt, job_spec, out, user_errors, writable_folder
from perfmodel.core.errors import PerfmodelError

export_app = typer.Typer(no_args_is_help=True, help="Export predictions for schedulers.")


@export_app.command("gavel")
@user_errors
def export_gavel(
    output: Annotated[Path, typer.Argument(help="JSON file to write (the consolidated matrix); the spread one "
                                                "goes to <stem>.spread.json beside it")],
    job: Annotated[list[str], typer.Option("--job", help="ZOO_NAME:BATCH, repeatable; BATCH is the job's batch "
                                                         "size: one worker's forward/backward pass (README, \"Batch "
                                                         "size\")")],
    accelerators: Annotated[str, typer.Option(help="comma-separated catalog names (Gavel's worker types)")],
    scale_factors: Annotated[str, typer.Option(help="comma-separated device counts")] = "1,2,4,8",
    seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = "sgd",
    inter_node_gbit_s: Annotated[Optional[float], typer.Option(
        "--inter-node-gbit-s", "--inter-node-gbps",
        help="network of one node over all its NICs, Gb/s [the catalog's node_network_gbit_s, else 100]")] = None,
) -> None:
    """Throughputs (samples/s) of jobs x accelerator types x scale factors in Gavel's layout
    {"('<job> (batch size B)', scale_factor)": {worker_type: throughput}}: data parallel with the job's batch on
    every worker (a global batch of B x scale_factor), consolidated (on one node, or on as few full nodes as the
    catalog's node_devices allow) and spread one device per node. A job that does not fit in a device's memory gets
    throughput 0."""
    from perfmodel.core.atomic import write_text_atomically
    from perfmodel.engine import EngineConfig, PredictionEngine
    from perfmodel.engine.gavel import gavel_throughputs

    factors = _int_list(scale_factors, "--scale-factors")
    names = [a.strip() for a in accelerators.split(",") if a.strip()]
    jobs = []
    for item in job:
        name, _, batch = item.partition(":")
        if not batch.isdigit() or int(batch) < 1:
            raise PerfmodelError(f"--job: expected ZOO_NAME:BATCH like resnet50:32, got {item!r}")
        jobs.append(job_spec(name, None, None, None, None, int(batch), seq_len, precision, optimizer, "train"))
    spread_path = writable_folder(output).with_name(f"{output.stem}.spread.json")
    engine = PredictionEngine.open(EngineConfig(isolate_captures=False))
    matrices = gavel_throughputs(engine, jobs, names, factors, inter_node_gbit_s=inter_node_gbit_s)
    for path, kind in ((output, "consolidated"), (spread_path, "spread")):
        write_text_atomically(path, json.dumps(matrices[kind], indent=2, sort_keys=True) + "\n", make_parents=False)
    out.print(f"wrote {output} and {spread_path}: {len(jobs)} jobs x {len(names)} worker types x scale factors "
              f"{factors}")


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PerfmodelError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise PerfmodelError(f"{option}: expected integers >= 1, got {text!r}")
    return values
