"""Does the memory model call Lambda's benchmark runs right? Every run that ran must fit, the out-of-memory ones not.

    .venv/bin/python bench/memory_fit.py [--datasets DIR] [--graph-cache DIR] [--rows OUT.csv]

Ground truth (credit: Lambda, lambdal/deeplearning-benchmark; read in place, never copied into the repository):
`DIR/lambda/runs.csv` holds 1,986 PyTorch training runs of eight NVIDIA DeepLearningExamples models that ran at
their per-GPU batch `batch_per_gpu` (so that batch fits), `DIR/lambda/failed_runs.csv` the runs that logged no
throughput, 42 of them out of memory at their batch (`reason == "out of memory"`; the others are not memory data
points and are left out). PROVENANCE.md there says what each column means.

Each row becomes the JobSpec of one data-parallel rank (data parallelism replicates the model: one rank's memory is
the single-GPU job's at the per-GPU batch, its `num_gpus`-way data parallelism's buckets being the gradients, as in
apex's DDP and the estimate's default: `gradient_bucket_copy` off):
- model: the zoo entry (ssd -> ssd300, gnmt, ncf, tacotron2, waveglow, transformerxlbase -> transformer-xl-base,
  transformerxllarge -> transformer-xl-large, maskrcnn), `seq_len` its `reference_seq_len`;
- batch_size: `batch_per_gpu`, rounded up (a global batch that does not divide by the GPU count leaves some rank
  the larger share);
- precision: as `perfmodel import lambda` stores it (`perfmodel.importers.lambda_runs.run_precision`): FP32 -> tf32
  (PyTorch's default on the containers' Ampere GPUs; the same bytes as fp32 elsewhere), FP16/AMP -> the script's
  recipe, `fp16-master` (apex O2: GNMT, NCF, both Transformer-XLs, SSD in v0) or `amp` (per-op casts), except runs
  whose log shows mixed precision off (`amp_in_log` false: 6 NCF runs of the v1 80 GB template, and the Tacotron 2
  and WaveGlow runs without `amp : True`) -> tf32;
- optimizer: the zoo entry's reference optimizer: Adam for GNMT, NCF, Tacotron 2, WaveGlow and Transformer-XL large
  (DLE's defaults, GNMT's logged run arguments); Transformer-XL base's `jitlamb` keeps Adam's two moments -> adam; SGD
  with momentum for SSD and Mask R-CNN (DLE SSD and maskrcnn_benchmark).
The accelerator is `perfmodel.hardware.catalog.get_accelerator(gpu)`, its capacity
`perfmodel.predictor.memory.usable_memory_bytes`. Rows whose model or GPU does not resolve (yet) are skipped and
counted.

Graphs are captured once per (model, batch) and dtype (float32, or the half model of `fp16-master`: the graph does
not depend on the optimizer, and the float32 capture measures the saved activations both as captured and under
autocast) and kept in `--graph-cache` (default: a
temporary directory; pass one to make re-runs fast; `--remeasure` measures their saved activations again). A
first run captures each model at three batches and makes its other batches from them (batch-affine graphs; Mask
R-CNN, whose proposal counts are not affine in the batch, at every batch); from the cache it is faster.

Result (Nov 2026 zoo and catalog): ran & fits 1986, ran & unfit 0, OOM & unfit 34, OOM & fits 8. The 8 contradict
runs that ran, so no estimate monotone in the batch can call them unfit without calling those unfit: NCF at 12,000
to 240,000 pairs on the 8 GB RTX 2070 Max-Q / 2080 Super Max-Q laptops, where NCF ran at 60,000-480,000 on the
8 GB RTX 3070 (DLE's NCF keeps its dataset on the GPU; a laptop GPU also drives the display); Transformer-XL base
amp at batch 1 on the 8 GB 2080 Super Max-Q (batch 2 ran on the 8 GB RTX 3070); Transformer-XL base tf32 at
batch 8 on a V100 16GB, a configuration that ran 7 other times.

Prints the confusion table (ran & fits, ran & unfit, OOM & unfit, OOM & fits) overall and per model, then every
misclassified run with its estimate, the device's capacity and their ratio.

`--cpu-check` instead validates the saved-activation measurement against reality on the CPU: for a few small zoo
models it runs real fp32 training steps (SGD) and prints what a real forward saves (hooks on real tensors), the
meta-device measurement with the CPU's kernels, the step's allocator high-water above its start (what
`perfmodel.profilers.iteration` measures: activations, gradients, temporaries; weights and optimizer state exist
before the step), the estimate's gradients + activations from that measurement, and from the old outputs rule.

`--record [RUN]` records the confusion table's counts for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _figures import add_record_option, record_if_asked  # noqa: E402

from perfmodel.core.errors import PerfmodelError  # noqa: E402
from perfmodel.core.ir import Graph  # noqa: E402
from perfmodel.hardware.catalog import get_accelerator, load_catalog  # noqa: E402
from perfmodel.importers.lambda_runs import run_precision  # noqa: E402
from perfmodel.jobs.spec import JobSpec, OptimizerName, Precision, ZooSource  # noqa: E402
from perfmodel.jobs.zoo import ZOO  # noqa: E402
from perfmodel.predictor.memory import MemoryEstimate, estimate_memory, usable_memory_bytes  # noqa: E402

DEFAULT_DATASETS = ROOT.parent / "shared" / "datasets"
ZOO_NAMES = {"ssd": "ssd300", "gnmt": "gnmt", "ncf": "ncf", "tacotron2": "tacotron2", "waveglow": "waveglow",
             "transformerxlbase": "transformer-xl-base", "transformerxllarge": "transformer-xl-large",
             "maskrcnn": "maskrcnn"}
OOM_REASON = "out of memory"
OUTCOMES = ("ran & fits", "ran & unfit", "OOM & unfit", "OOM & fits")


@dataclass(frozen=True)
class Row:
    source: str  # runs.csv or failed_runs.csv
    config: str
    gpu: str
    num_gpus: int
    model: str
    suite: str
    precision_label: str
    amp_in_log: str
    batch_per_gpu: float
    ran: bool
    log_path: str


@dataclass(frozen=True)
class Verdict:
    row: Row
    spec: JobSpec
    accelerator: str
    estimate: MemoryEstimate
    capacity: int

    @property
    def fits(self) -> bool:
        return self.estimate.peak_bytes <= self.capacity

    @property
    def outcome(self) -> str:
        if self.row.ran:
            return OUTCOMES[0] if self.fits else OUTCOMES[1]
        return OUTCOMES[3] if self.fits else OUTCOMES[2]

    @property
    def correct(self) -> bool:
        return self.fits == self.row.ran


def read_rows(folder: Path) -> tuple[list[Row], Counter[str]]:
    """Runs that ran, and failed runs that ran out of memory; the other failures are counted, not returned."""
    rows: list[Row] = []
    skipped: Counter[str] = Counter()
    for name, ran in (("runs.csv", True), ("failed_runs.csv", False)):
        with (folder / name).open(newline="", encoding="utf-8") as handle:
            for record in csv.DictReader(handle):
                if not ran and record["reason"] != OOM_REASON:
                    skipped[f"failed, not out of memory ({record['reason'][:40]})"] += 1
                    continue
                rows.append(Row(name, record["config"], record["gpu"], int(record["num_gpus"]), record["model"],
                                record["suite"], record["precision"], record["amp_in_log"],
                                float(record["batch_per_gpu"]), ran, record["log_path"]))
    return rows, skipped


def precision_of(row: Row) -> Precision:
    """What the run's math was, as `perfmodel import lambda` stores it (`lambda_runs.run_precision`)."""
    amp_in_log = {"true": True, "false": False}.get(row.amp_in_log.strip().lower())
    return run_precision(row.model, row.suite, row.precision_label, amp_in_log)


def spec_of(row: Row) -> JobSpec | None:
    """The JobSpec of one rank of the run; None if its model is not in the zoo (yet)."""
    name = ZOO_NAMES.get(row.model)
    if name is None or name not in ZOO:
        return None
    # seq_len and optimizer: the zoo entry's reference ones (Transformer-XL base's jitlamb keeps Adam's two moments)
    return JobSpec(source=ZooSource(name=name), batch_size=math.ceil(row.batch_per_gpu), precision=precision_of(row))


class Graphs:
    """One graph per (model, batch, seq_len), kept on disk in `folder` (JSON IR): captured, or made from the model's
    affine model in the batch once three captured batches agree (`perfmodel.engine.graphs.GraphCache`)."""

    def __init__(self, folder: Path, remeasure: bool = False) -> None:
        from perfmodel.engine.graphs import GraphCache

        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.remeasure = remeasure
        self._cache = GraphCache(4096, isolated=False, directory=folder)
        self._graphs: dict[str, Graph] = {}

    def graph(self, spec: JobSpec) -> Graph:
        # a half model's graph is the model cast to half (what it saves is half); the others' is float32's
        precision = spec.precision.graph_precision if spec.precision.half_weights else Precision.tf32
        shape_spec = spec.model_copy(update={"precision": precision, "optimizer": OptimizerName.sgd})
        key = shape_spec.key()
        found = self._graphs.get(key)
        if found is not None:
            return found
        captures, start = self._cache.captures, time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = self._cache.graph(shape_spec)
        if self._cache.captures > captures:
            print(f"  captured {spec.name} batch {spec.batch_size} in {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
        elif self.remeasure:
            graph = remeasured(graph, shape_spec)
        self._graphs[key] = graph
        return graph


def remeasured(graph: Graph, spec: JobSpec) -> Graph:
    """`graph` with its saved-activation figures measured again (a meta forward: seconds, not an export)."""
    from perfmodel.graph.moe import balanced_routing
    from perfmodel.graph.saved import measure_saved_bytes
    from perfmodel.jobs.build import build_job

    job = build_job(spec, "meta")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, amp = measure_saved_bytes(job.module, job.args, job.kwargs,
                                         context=lambda: balanced_routing(job.module))
    totals = graph.totals.model_copy(update={"saved_activation_bytes": plain, "saved_activation_bytes_amp": amp})
    return graph.model_copy(update={"totals": totals})


def evaluate(rows: list[Row], graphs: Graphs) -> tuple[list[Verdict], Counter[str]]:
    catalog = load_catalog()
    verdicts: list[Verdict] = []
    skipped: Counter[str] = Counter()
    for row in rows:
        spec = spec_of(row)
        if spec is None:
            skipped[f"model {row.model} not in the zoo"] += 1
            continue
        try:
            hardware = get_accelerator(row.gpu, catalog)
        except PerfmodelError:
            skipped[f"GPU {row.gpu} not in the catalog"] += 1
            continue
        # one replica of the run's data parallelism, as a placement of num_gpus devices is answered
        estimate = estimate_memory(spec, graphs.graph(spec), data_parallel=row.num_gpus)
        verdicts.append(Verdict(row, spec, hardware.name, estimate, usable_memory_bytes(hardware)))
    return verdicts, skipped


def _table_line(label: str, counts: Counter[str]) -> str:
    ran = counts[OUTCOMES[0]] + counts[OUTCOMES[1]]
    oom = counts[OUTCOMES[2]] + counts[OUTCOMES[3]]
    fit_rate = f"{100 * counts[OUTCOMES[0]] / ran:5.1f} %" if ran else "    -  "
    oom_rate = f"{100 * counts[OUTCOMES[2]] / oom:5.1f} %" if oom else "    -  "
    return (f"{label:22s} " + " ".join(f"{counts[o]:>11d}" for o in OUTCOMES)
            + f"   {fit_rate:>9s} {oom_rate:>11s}")


def report(verdicts: list[Verdict], skipped: Counter[str]) -> None:
    print(f"{'':22s} " + " ".join(f"{o:>11s}" for o in OUTCOMES) + f"   {'ran: fits':>9s} {'OOM: unfit':>11s}")
    print(_table_line("all", Counter(v.outcome for v in verdicts)))
    by_model: dict[str, Counter[str]] = defaultdict(Counter)
    for v in verdicts:
        by_model[v.spec.name][v.outcome] += 1
    for model in sorted(by_model):
        print(_table_line(model, by_model[model]))
    if skipped:
        print("\nskipped: " + ", ".join(f"{count} ({why})" for why, count in sorted(skipped.items())))

    wrong = [v for v in verdicts if not v.correct]
    print(f"\nmisclassified: {len(wrong)}")
    for v in sorted(wrong, key=lambda v: (v.row.ran, v.spec.name, v.row.gpu)):
        print(f"  {'ran' if v.row.ran else 'OOM'}  {v.spec.name:20s} {v.row.precision_label:4s}->"
              f"{v.spec.precision.value:4s} batch {v.spec.batch_size:>8d}  {v.row.gpu:24s} x{v.row.num_gpus:<2d} "
              f"estimate {v.estimate.peak_bytes / 1e9:6.2f} GB / capacity {v.capacity / 1e9:6.2f} GB "
              f"= {v.estimate.peak_bytes / v.capacity:5.2f}  ({v.row.config})")

    print("\nmargins (estimate / capacity) per model and precision: the largest over runs that ran (must stay "
          "<= 1), the smallest over out-of-memory runs (should be > 1)")
    groups: dict[tuple[str, str], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[(v.spec.name, v.spec.precision.value)].append(v)
    for (model, precision), group in sorted(groups.items()):
        ran = [v.estimate.peak_bytes / v.capacity for v in group if v.row.ran]
        oom = [v.estimate.peak_bytes / v.capacity for v in group if not v.row.ran]
        print(f"  {model:22s} {precision:5s} ran max {max(ran) if ran else float('nan'):5.2f} (n={len(ran):3d})"
              + (f"   OOM min {min(oom):5.2f} (n={len(oom)})" if oom else ""))


def figures(verdicts: list[Verdict]) -> dict:
    """The confusion table's first line (`report`), for docs/figures."""
    counts = Counter(v.outcome for v in verdicts)
    ran, oom = counts[OUTCOMES[0]] + counts[OUTCOMES[1]], counts[OUTCOMES[2]] + counts[OUTCOMES[3]]
    return {"ran_fits": counts[OUTCOMES[0]], "ran_unfit": counts[OUTCOMES[1]], "oom_unfit": counts[OUTCOMES[2]],
            "oom_fits": counts[OUTCOMES[3]], "ran": ran, "oom": oom,
            "ran_fits_pct": 100 * counts[OUTCOMES[0]] / ran if ran else None,
            "oom_unfit_pct": 100 * counts[OUTCOMES[2]] / oom if oom else None}


def write_rows(verdicts: list[Verdict], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["source", "config", "gpu", "num_gpus", "model", "precision", "spec_precision", "batch",
                         "accelerator", "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                         "temporaries_bytes", "gradient_buckets_bytes", "workspace_bytes", "peak_bytes",
                         "capacity_bytes", "outcome", "log_path"])
        for v in verdicts:
            e = v.estimate
            writer.writerow([v.row.source, v.row.config, v.row.gpu, v.row.num_gpus, v.spec.name,
                             v.row.precision_label, v.spec.precision.value, v.spec.batch_size, v.accelerator,
                             e.weights_bytes, e.gradients_bytes, e.optimizer_bytes, e.activations_bytes,
                             e.temporaries_bytes, e.gradient_buckets_bytes, e.workspace_bytes, e.peak_bytes,
                             v.capacity, v.outcome,
                             v.row.log_path])


CPU_CHECK = (("resnet18", 16, 128), ("resnet50", 8, 128), ("vit_small_patch16_224", 8, 128), ("bert-small", 8, 128),
             ("bert-base", 4, 256), ("gpt2", 2, 256), ("lstm-lm", 16, 128))


def cpu_check() -> None:
    """Real fp32 training steps on the CPU against the measurement and the estimate (see `--cpu-check`)."""
    import torch

    from perfmodel.graph import graph_for_job
    from perfmodel.graph.saved import saved_activation_bytes
    from perfmodel.jobs.build import build_job
    from perfmodel.profilers.iteration import cpu_allocator_peak_bytes, make_step

    print(f"{'model':22s} {'batch':>5s} {'real saved':>11s} {'meta saved':>11s} {'step peak':>10s} "
          f"{'estimate':>9s} {'error':>7s} {'outputs rule':>12s}   (MB; estimate = gradients + activations)")
    for name, batch, seq_len in CPU_CHECK:
        spec = JobSpec(source=ZooSource(name=name), batch_size=batch, seq_len=seq_len)
        job = build_job(spec, "cpu")
        real = _real_saved_bytes(job)
        meta_job = build_job(spec, "meta")
        meta = saved_activation_bytes(meta_job.module, meta_job.args, meta_job.kwargs, kernels="cpu")
        step = make_step(job)
        step()
        step()
        peak = cpu_allocator_peak_bytes(step) or 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = graph_for_job(spec)
        rule = estimate_memory(spec, graph.model_copy(update={"totals": graph.totals.model_copy(
            update={"saved_activation_bytes": None})}))
        cpu_graph = graph.model_copy(update={"totals": graph.totals.model_copy(
            update={"saved_activation_bytes": meta})})
        estimate = estimate_memory(spec, cpu_graph)
        predicted = estimate.gradients_bytes + estimate.activations_bytes
        print(f"{name:22s} {batch:5d} {real / 1e6:11.1f} {meta / 1e6:11.1f} {peak / 1e6:10.1f} "
              f"{predicted / 1e6:9.1f} {100 * (predicted - peak) / peak:+6.1f}% "
              f"{(rule.gradients_bytes + rule.activations_bytes) / 1e6:12.1f}")
        del job, step
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


def _real_saved_bytes(job: object) -> int:
    """What a real forward of `job` (a BuiltJob on the CPU) saves for backward, plus its outputs and inputs:
    distinct storages by address, parameters and buffers excluded (the measurement's rule, on real tensors)."""
    import torch
    from torch.utils._pytree import tree_flatten

    module, args, kwargs = job.module, job.args, dict(job.kwargs)  # type: ignore[attr-defined]
    excluded = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    seen: dict[int, int] = {}
    keep: list[torch.Tensor] = []

    def add(t: object) -> None:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() not in excluded:
                seen.setdefault(storage.data_ptr(), storage.nbytes())
                keep.append(t)

    def pack(t: torch.Tensor) -> torch.Tensor:
        add(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = module(*args, **kwargs)
    values = list(output.values()) if isinstance(output, dict) else output
    for value in tree_flatten((values, args, kwargs))[0]:
        add(value)
    return sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS,
                        help="the folder holding lambda/runs.csv and lambda/failed_runs.csv")
    parser.add_argument("--graph-cache", type=Path, default=None, help="keep captured graphs here (JSON IR)")
    parser.add_argument("--rows", type=Path, default=None, help="write every row's estimate to this CSV")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure the saved activations of cached graphs again (after changing the measurement)")
    parser.add_argument("--cpu-check", action="store_true",
                        help="instead: run real fp32 training steps of small zoo models on the CPU and compare what "
                             "they save and their allocator peak with the measurement and the estimate")
    add_record_option(parser)
    args = parser.parse_args()
    if args.cpu_check:
        cpu_check()
        return

    rows, skipped = read_rows(args.datasets / "lambda")
    with tempfile.TemporaryDirectory() as tmp:
        graphs = Graphs(args.graph_cache or Path(tmp), remeasure=args.remeasure)
        verdicts, unresolved = evaluate(rows, graphs)
    skipped.update(unresolved)
    report(verdicts, skipped)
    record_if_asked(args, "memory_fit", figures(verdicts))
    if args.rows is not None:
        write_rows(verdicts, args.rows)


if __name__ == "__main__":
    main()
