"""`perfmodel export gavel`: predicted throughputs of jobs x accelerator types x scale factors in the layout Gavel's
scheduler reads (perfmodel/placement/gavel.py), predicted by perfmodel/engine/gavel.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, get_args

import typer

from perfmodel.cli.common import StoreOpt, job_spec, out, user_errors, validation_message, writable_folder
from perfmodel.core.errors import PerfmodelError

if TYPE_CHECKING:
    from perfmodel.engine.engine import PredictionEngine
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.placement.colocation import Sharing

# every job's settings, unless its --job gives its own
JobsSeqOpt = Annotated[Optional[int], typer.Option(
    "--seq-len", help="every job's sequence length, unless its --job gives seq_len \\[each zoo model's own (`zoo show "
                      "NAME`), else 128]")]
JobsPrecisionOpt = Annotated[str, typer.Option(
    help="every job's precision, unless its --job gives one: fp32 (PyTorch's defaults: TF32 convs on Ampere+), "
         "fp32-strict, tf32, amp, amp-bf16, fp16, bf16, fp16-master or bf16-master")]
JobsOptimizerOpt = Annotated[Optional[str], typer.Option(
    help="every job's optimizer, unless its --job gives one: sgd (momentum 0.9), adam or adamw \\[each zoo model's "
         "reference optimizer (`zoo show NAME`), else sgd]")]

export_app = typer.Typer(no_args_is_help=True, help="Export predictions for schedulers.")


@export_app.command("gavel")
@user_errors
def export_gavel(
    output: Annotated[Path, typer.Argument(help="JSON file to write: Gavel's throughputs file")],
    job: Annotated[list[str], typer.Option("--job", help="[JOB_TYPE=]ZOO_NAME:BATCH[:KEY=VALUE...], repeatable, "
                                                         "e.g. 'Transformer (batch size 64)=gavel-transformer:64:"
                                                         "optimizer=adam'; BATCH is one worker's batch; JOB_TYPE "
                                                         "defaults to '<name> (batch size BATCH)'; KEY is seq_len, "
                                                         "optimizer, precision, pytorch_version or steps_vary "
                                                         "(true or false): this job's own, over --seq-len, "
                                                         "--optimizer and --precision (and the zoo model's "
                                                         "reference: Gavel's jobs PyTorch 1.4)")],
    worker_type: Annotated[Optional[list[str]], typer.Option(
        "--worker-type", help="WORKER_TYPE=ACCELERATOR, repeatable, e.g. v100=v100-sxm2-16gb")] = None,
    accelerators: Annotated[Optional[str], typer.Option(
        help="comma-separated catalog names used as worker types (instead of --worker-type)")] = None,
    scale_factors: Annotated[str, typer.Option(help="comma-separated device counts")] = "1,2,4,8",
    batch_sizes: Annotated[Optional[str], typer.Option(
        help="comma-separated batch sizes per worker: every job at each, as its own job type (a batch axis)")] = None,
    colocation: Annotated[bool, typer.Option(help="also every pair of jobs sharing each placement's GPUs")] = False,
    sharing: Annotated[str, typer.Option(help="co-location: time-slicing (two processes) or mps")] = "time-slicing",
    seq_len: JobsSeqOpt = None, precision: JobsPrecisionOpt = "fp32", optimizer: JobsOptimizerOpt = None,
    inter_node_gbit_s: Annotated[Optional[float], typer.Option(
        "--inter-node-gbit-s", "--inter-node-gbps",
        help="network of one node over all its NICs, Gb/s \\[the catalog's node_network_gbit_s, else 100]")] = None,
    intra_link: Annotated[Optional[str], typer.Option(
        help="every server's intra-node link instead of the catalog's: nvlink1..5, infinity-fabric, pcie3..5, or "
             "host (no GPU peer-to-peer: cloud VMs, NCCL_P2P_DISABLE=1)")] = None,
    store: StoreOpt = None,
) -> None:
    """Gavel's throughputs file: {worker_type: {"(JOB_TYPE, SCALE_FACTOR)": {"null": steps/s, "(OTHER, SF)":
    \\[this, other]}}} for every job x worker type x scale factor, data parallel with the job's batch on every worker,
    consolidated (worker type) and one device per server (`<worker type>_unconsolidated`); with --colocation every
    pair of jobs sharing the GPUs. A job (or pair) that does not fit in a device's memory gets 0. --seq-len,
    --optimizer and --precision are every job's defaults; a --job's own settings win over them."""
    from perfmodel.engine import EngineConfig, PredictionEngine, fleet_priors_from
    from perfmodel.placement.colocation import SHARING_MODES
    from perfmodel.placement.spec import IntraNodeLink
    from perfmodel.settings import get_settings
    from perfmodel.store.jobs import JobStore

    if sharing not in SHARING_MODES:
        raise PerfmodelError(f"--sharing: expected one of {', '.join(SHARING_MODES)}, got {sharing!r}")
    links = get_args(IntraNodeLink)
    if intra_link is not None and intra_link not in links:
        raise PerfmodelError(f"--intra-link: expected one of {', '.join(links)}, got {intra_link!r}")
    factors = _int_list(scale_factors, "--scale-factors")
    workers = _worker_types(worker_type or [], accelerators)
    defaults = {"seq_len": seq_len, "precision": precision, "optimizer": optimizer}
    names: list[str | None] = []
    specs = []
    for item in job:
        name, spec = _job(item, defaults)
        names.append(name)
        specs.append(spec)
    writable_folder(output)
    # on the store the service uses: its custom accelerators, its promoted models and the fleet's observations
    job_store = JobStore(store)
    try:
        settings = get_settings()
        # captured graphs kept across runs, as `perfmodel predict` keeps them: an export run again captures nothing
        config = EngineConfig(isolate_captures=False, graph_dir=settings.home / "graphs",
                              fleet_priors=fleet_priors_from(settings))
        engine = PredictionEngine.open(config, store=job_store)
        _export(engine, output, specs, names, workers, factors, batch_sizes=batch_sizes, colocation=colocation,
                sharing=sharing, inter_node_gbit_s=inter_node_gbit_s, intra_link=intra_link)
    finally:
        job_store.close()


def _export(engine: PredictionEngine, output: Path, specs: list[JobSpec], names: list[str | None],
            workers: dict[str, str], factors: list[int], *, batch_sizes: str | None, colocation: bool, sharing: Sharing,
            inter_node_gbit_s: float | None, intra_link: str | None) -> None:
    """Predict and write the throughputs file (`export_gavel`, on an open engine)."""
    from perfmodel.core.atomic import write_text_atomically
    from perfmodel.engine.gavel import expand_batches, gavel_throughputs, grid_columns
    from perfmodel.placement.gavel import job_type_names

    # every option checked before the first capture: a misspelt worker type costs no graph
    default_names = job_type_names([(s.key(), s.name, s.batch_size) for s in specs])
    job_types = [given or default for given, default in zip(names, default_names)]
    if len(set(job_types)) != len(job_types):
        raise PerfmodelError(f"--job: two jobs share a job type name: {job_types}")
    batches = None if batch_sizes is None else _int_list(batch_sizes, "--batch-sizes")
    try:
        columns = grid_columns(engine, workers, factors, inter_node_gbit_s=inter_node_gbit_s,
                               intra_node_link=intra_link)  # type: ignore[arg-type]  # one of `links`, checked above
    except PerfmodelError as exc:
        raise PerfmodelError(f"--worker-type: {exc}") from None
    entries = [engine.job(spec) for spec in specs]
    if batches is not None:
        for entry in entries:
            engine.graphs.prepare_batches(entry.spec, entry.graph)  # every other batch without a capture
        entries, job_types = expand_batches(engine, entries, job_types, batches)
    calibrated: dict[str, dict[str, str]] = {}
    throughputs = gavel_throughputs(engine, entries, job_types, columns, colocation=colocation,
                                    sharing=sharing, calibrated=calibrated)
    write_text_atomically(output, json.dumps(throughputs, indent=2, sort_keys=True) + "\n", make_parents=False)
    cells = sum(len(jobs) for jobs in calibrated.values())
    out.print(f"wrote {output}: {len(specs)} job types x worker types {', '.join(throughputs)} x scale factors "
              f"{factors}, steps/s" + (f", pairs sharing the GPUs ({sharing})" if colocation else "")
              + (f"; {cells} cells calibrated by the store's observations" if cells else ""))
    for job_type, entry in zip(job_types, entries):
        why = engine.host_bound(entry, engine.calibration(entry))
        if why is not None:
            out.print(f"  host-bound likely: {job_type}: {why}")


# --job "[JOB_TYPE=]ZOO_NAME:BATCH[:KEY=VALUE...]" (a job type name may hold "=" and ":"; the rest holds neither
# but as written here)
_JOB = re.compile(r"^(?:(?P<name>.*)=)?(?P<model>[^=:]+):(?P<batch>[^=:]*)(?P<settings>(?::[^=:]*=[^=:]*)*)$")
JOB_SETTINGS = ("seq_len", "optimizer", "precision", "pytorch_version", "steps_vary")


def _job(item: str, defaults: dict[str, Any]) -> tuple[str | None, JobSpec]:
    """The job type name (None: the default one) and the JobSpec of one --job; a job's own settings win over
    `defaults` (--seq-len, --optimizer, --precision)."""
    from pydantic import ValidationError

    form = "[JOB_TYPE=]ZOO_NAME:BATCH[:KEY=VALUE...] like resnet50:32 or gavel-lm:20:seq_len=35"
    match = _JOB.match(item)
    if match is None or not match["batch"].isdigit() or int(match["batch"]) < 1 or not match["model"].strip() or (
            match["name"] is not None and not match["name"].strip()):
        raise PerfmodelError(f"--job: expected {form}, got {item!r}")
    own: dict[str, str] = {}
    for setting in match["settings"].split(":")[1:]:
        key, _, value = setting.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if key not in JOB_SETTINGS:
            raise PerfmodelError(f"--job {item!r}: unknown setting {key!r}; a job's settings are "
                                 f"{', '.join(JOB_SETTINGS)} (KEY=VALUE after ZOO_NAME:BATCH)")
        if key in own or not value:
            raise PerfmodelError(f"--job {item!r}: {key} is given twice" if key in own else
                                 f"--job {item!r}: {key} has no value")
        own[key] = value
    if "seq_len" in own and not (own["seq_len"].isdigit() and int(own["seq_len"]) >= 1):
        raise PerfmodelError(f"--job {item!r}: seq_len must be an integer >= 1, got {own['seq_len']!r}")
    run = {**defaults, **own}
    seq_len = int(run["seq_len"]) if run["seq_len"] is not None else None  # None: the zoo model's own
    try:
        spec = job_spec(match["model"].strip(), None, None, None, None, int(match["batch"]), seq_len,
                        run["precision"], run["optimizer"], "train", pytorch_version=run.get("pytorch_version"),
                        steps_vary=run.get("steps_vary"), options=None)
    except ValidationError as exc:
        raise PerfmodelError(f"--job {item!r}: {validation_message(exc)}") from None
    return (match["name"].strip() if match["name"] is not None else None), spec


def _worker_types(items: list[str], accelerators: str | None) -> dict[str, str]:
    """{worker type: accelerator} from WORKER=ACCELERATOR items, or catalog names used as their own worker type."""
    out: dict[str, str] = {}
    for item in items:
        name, _, accelerator = item.partition("=")
        if not name.strip() or not accelerator.strip():
            raise PerfmodelError(f"--worker-type: expected WORKER_TYPE=ACCELERATOR like v100=v100-sxm2-16gb, "
                                 f"got {item!r}")
        if name.strip() in out:
            raise PerfmodelError(f"--worker-type: worker type {name.strip()!r} is given twice")
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
