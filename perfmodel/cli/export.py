"""`perfmodel export gavel`: predicted throughputs of jobs x accelerator types x scale factors in the layout Gavel's
scheduler reads (perfmodel/placement/gavel.py), predicted by perfmodel/engine/gavel.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer

from perfmodel.cli.common import OptimizerOpt, PrecisionOpt, SeqOpt, job_spec, out, user_errors, writable_folder
from perfmodel.core.errors import PerfmodelError

export_app = typer.Typer(no_args_is_help=True, help="Export predictions for schedulers.")


@export_app.command("gavel")
@user_errors
def export_gavel(
    output: Annotated[Path, typer.Argument(help="JSON file to write: Gavel's throughputs file")],
    job: Annotated[list[str], typer.Option("--job", help="[JOB_TYPE=]ZOO_NAME:BATCH, repeatable, e.g. "
                                                         "'ResNet-50 (batch size 64)=gavel-resnet50:64'; BATCH is "
                                                         "one worker's batch; JOB_TYPE defaults to "
                                                         "'<name> (batch size BATCH)'")],
    worker_type: Annotated[Optional[list[str]], typer.Option(
        "--worker-type", help="WORKER_TYPE=ACCELERATOR, repeatable, e.g. v100=v100-sxm2-16gb")] = None,
    accelerators: Annotated[Optional[str], typer.Option(
        help="comma-separated catalog names used as worker types (instead of --worker-type)")] = None,
    scale_factors: Annotated[str, typer.Option(help="comma-separated device counts")] = "1,2,4,8",
    batch_sizes: Annotated[Optional[str], typer.Option(
        help="comma-separated batch sizes per worker: every job at each, as its own job type (a batch axis)")] = None,
    colocation: Annotated[bool, typer.Option(help="also every pair of jobs sharing each placement's GPUs")] = False,
    sharing: Annotated[str, typer.Option(help="co-location: time-slicing (two processes) or mps")] = "time-slicing",
    seq_len: SeqOpt = None, precision: PrecisionOpt = "fp32", optimizer: OptimizerOpt = "sgd",
    inter_node_gbit_s: Annotated[Optional[float], typer.Option(
        "--inter-node-gbit-s", "--inter-node-gbps",
        help="network of one node over all its NICs, Gb/s [the catalog's node_network_gbit_s, else 100]")] = None,
    intra_link: Annotated[Optional[str], typer.Option(
        help="every server's intra-node link instead of the catalog's: nvlink1..5, infinity-fabric, pcie3..5, or "
             "host (no GPU peer-to-peer: cloud VMs, NCCL_P2P_DISABLE=1)")] = None,
) -> None:
    """Gavel's throughputs file: {worker_type: {"(JOB_TYPE, SCALE_FACTOR)": {"null": steps/s, "(OTHER, SF)":
    [this, other]}}} for every job x worker type x scale factor, data parallel with the job's batch on every worker,
    consolidated (worker type) and one device per server (`<worker type>_unconsolidated`); with --colocation every
    pair of jobs sharing the GPUs. A job (or pair) that does not fit in a device's memory gets 0."""
    from perfmodel.core.atomic import write_text_atomically
    from perfmodel.engine import EngineConfig, PredictionEngine
    from perfmodel.engine.gavel import expand_batches, gavel_throughputs, grid_columns
    from perfmodel.placement.colocation import SHARING_MODES
    from perfmodel.placement.gavel import job_type_names
    from perfmodel.placement.spec import IntraNodeLink

    if sharing not in SHARING_MODES:
        raise PerfmodelError(f"--sharing: expected one of {', '.join(SHARING_MODES)}, got {sharing!r}")
    links = get_args(IntraNodeLink)
    if intra_link is not None and intra_link not in links:
        raise PerfmodelError(f"--intra-link: expected one of {', '.join(links)}, got {intra_link!r}")
    factors = _int_list(scale_factors, "--scale-factors")
    workers = _worker_types(worker_type or [], accelerators)
    names: list[str | None] = []
    specs = []
    for item in job:
        name, has_name, rest = item.rpartition("=")
        model, _, batch = rest.partition(":")
        if not batch.isdigit() or int(batch) < 1 or not model or (has_name and not name.strip()):
            raise PerfmodelError(f"--job: expected [JOB_TYPE=]ZOO_NAME:BATCH like resnet50:32, got {item!r}")
        names.append(name.strip() if has_name else None)
        specs.append(job_spec(model, None, None, None, None, int(batch), seq_len, precision, optimizer, "train"))
    writable_folder(output)
    engine = PredictionEngine.open(EngineConfig(isolate_captures=False))
    entries = [engine.job(spec) for spec in specs]
    defaults = job_type_names([(s.key(), s.name, s.batch_size) for s in specs])
    job_types = [given or default for given, default in zip(names, defaults)]
    if len(set(job_types)) != len(job_types):
        raise PerfmodelError(f"--job: two jobs share a job type name: {job_types}")
    if batch_sizes is not None:
        for entry in entries:
            engine.graphs.prepare_batches(entry.spec, entry.graph)  # every other batch without a capture
        entries, job_types = expand_batches(engine, entries, job_types, _int_list(batch_sizes, "--batch-sizes"))
    columns = grid_columns(engine, workers, factors, inter_node_gbit_s=inter_node_gbit_s,
                           intra_node_link=intra_link)  # type: ignore[arg-type]  # one of `links`, checked above
    throughputs = gavel_throughputs(engine, entries, job_types, columns, colocation=colocation,
                                    sharing=sharing)
    write_text_atomically(output, json.dumps(throughputs, indent=2, sort_keys=True) + "\n", make_parents=False)
    out.print(f"wrote {output}: {len(specs)} job types x worker types {', '.join(throughputs)} x scale factors "
              f"{factors}, steps/s" + (f", pairs sharing the GPUs ({sharing})" if colocation else ""))


def _worker_types(items: list[str], accelerators: str | None) -> dict[str, str]:
    """{worker type: accelerator} from WORKER=ACCELERATOR items, or catalog names used as their own worker type."""
    out: dict[str, str] = {}
    for item in items:
        name, _, accelerator = item.partition("=")
        if not name.strip() or not accelerator.strip():
            raise PerfmodelError(f"--worker-type: expected WORKER_TYPE=ACCELERATOR like v100=v100-sxm2-16gb, "
                                 f"got {item!r}")
        out[name.strip()] = accelerator.strip()
    for name in (accelerators or "").split(","):
        if name.strip():
            out.setdefault(name.strip(), name.strip())
    if not out:
        raise PerfmodelError("give the worker types: --worker-type NAME=ACCELERATOR (or --accelerators a,b)")
    return out


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PerfmodelError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise PerfmodelError(f"{option}: expected integers >= 1, got {text!r}")
    return values
