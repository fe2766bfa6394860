"""Check `estimate_memory` against the peak memory measured in the CPU corpus (profiles/cpu-corpus).

    .venv/bin/python bench/memory_check.py [--corpus profiles/cpu-corpus] [--graph-cache DIR] [--per-run]

What the CPU number means (perfmodel/profilers/iteration.py): `peak_memory_bytes` is the high-water, ABOVE its level
at the start of the step, of the bytes held by torch's CPU allocator during the last warm-up step (replayed from
torch.profiler's allocation events). Every corpus run has warmup = 2, so the measured step is the second one: the
weights, the inputs and the optimizer state (SGD momentum buffers, created by the first step) already exist and are
NOT in the number; what is in it is what the step allocates: activations, gradients (the step ends with
zero_grad(set_to_none=True), so every step allocates them anew) and temporaries. Memory outside torch's allocator
(oneDNN scratch pads, allocator fragmentation) is not in it either.

So the comparison is not against `peak_bytes` (which would be off by the weights and optimizer state, 2x-10x
for the big-parameter models) but against the matching part of the estimate:

    training:  estimate = gradients_bytes + activations_bytes
    inference: estimate = activations_bytes

(the workspace term, fragmentation and library workspaces, is left out: the allocator events do not see it).
The estimate's activations are an upper bound by design (every compute output is kept, and the gradients are
counted as all alive at once with all activations), while the allocator frees saved tensors as backward proceeds;
the error is signed (estimate - measured) / measured so the direction is visible. No constant is fitted here.

Prints per run (with --per-run) measured vs estimated, then the MAPE and the fraction within 15 % overall, per
mode and per family. `--record [RUN]` records them for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _figures import add_record_option, figure_key, record_if_asked  # noqa: E402

from perfmodel.features.dataset import cached_graph  # noqa: E402
from perfmodel.jobs.spec import Mode, OnnxSource  # noqa: E402
from perfmodel.predictor.memory import estimate_memory  # noqa: E402
from perfmodel.records import Outcome  # noqa: E402
from perfmodel.store import ProfileStore  # noqa: E402

WITHIN = 0.15


def comparable_bytes(mode: Mode, estimate) -> int:
    """The part of the estimate the CPU measurement sees (see the module docstring)."""
    if mode == Mode.train:
        return estimate.gradients_bytes + estimate.activations_bytes
    return estimate.activations_bytes


def figures(errors: list[float]) -> dict:
    ape = [abs(e) for e in errors]
    return {"runs": len(errors), "mape_pct": 100 * statistics.fmean(ape),
            "median_ape_pct": 100 * statistics.median(ape), "median_signed_pct": 100 * statistics.median(errors),
            "within_15_pct": 100 * sum(a <= WITHIN for a in ape) / len(ape)}


def summary(errors: list[float]) -> str:
    f = figures(errors)
    return (f"n={f['runs']:3d}  MAPE {f['mape_pct']:6.1f} %  median APE {f['median_ape_pct']:6.1f} %  median signed "
            f"{f['median_signed_pct']:+6.1f} %  within 15 % {f['within_15_pct']:5.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT / "profiles" / "cpu-corpus")
    parser.add_argument("--graph-cache", type=Path, default=None, help="default: the perfmodel graph cache")
    parser.add_argument("--per-run", action="store_true", help="print every run")
    add_record_option(parser)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = ProfileStore(f"sqlite:///{tmp}/store.db")
        store.import_parquet(args.corpus)
        for summary_row in sorted(store.list(), key=lambda s: s.id):
            profile = store.get(summary_row.id)
            it = profile.iteration
            if (it is None or it.outcome != Outcome.ok or it.peak_memory_bytes is None or not it.peak_memory_bytes
                    or isinstance(profile.job.source, OnnxSource)):
                continue
            graph = cached_graph(profile.job, args.graph_cache)
            estimate = estimate_memory(profile.job, graph)
            predicted = comparable_bytes(profile.job.mode, estimate)
            measured = it.peak_memory_bytes
            rows.append((profile.family, profile.job.mode.value, profile.job.name, profile.job.batch_size,
                         measured, predicted, (predicted - measured) / measured, it.warmup))
        store.close()

    if args.per_run:
        print(f"{'family':14s} {'mode':9s} {'job':34s} {'batch':>5s} {'measured MB':>12s} {'estimate MB':>12s} "
              f"{'error':>8s}")
        for family, mode, name, batch, measured, predicted, err, _ in rows:
            print(f"{family:14s} {mode:9s} {name:34s} {batch:5d} {measured / 1e6:12.1f} {predicted / 1e6:12.1f} "
                  f"{100 * err:+7.1f}%")
        print()
    print(f"runs compared: {len(rows)} (warm-up steps: {sorted({r[7] for r in rows})})")
    print(f"overall     {summary([r[6] for r in rows])}")
    by_mode: dict[str, list[float]] = defaultdict(list)
    by_family: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_mode[row[1]].append(row[6])
        by_family[row[0]].append(row[6])
    for mode, errors in sorted(by_mode.items()):
        print(f"{mode:11s} {summary(errors)}")
    print("\nper family:")
    for family, errors in sorted(by_family.items(), key=lambda kv: -statistics.fmean(abs(e) for e in kv[1])):
        print(f"  {family:14s} {summary(errors)}")
    record_if_asked(args, "memory_check", {
        "overall": figures([r[6] for r in rows]),
        "mode": {figure_key(mode): figures(errors) for mode, errors in sorted(by_mode.items())},
        "family": {figure_key(family): figures(errors) for family, errors in sorted(by_family.items())}})


if __name__ == "__main__":
    main()
