"""How long a graph capture takes (`perfmodel.graph.from_torch.graph_of_job`: torch.export on the meta device, the
saved-activation measurement, the IR build), each run in a fresh process, with and without the lazy fx modules
the export is run under (`from_torch._lazy_graph_modules`), the two alternated run by run.

    .venv/bin/python bench/capture_speed.py [--models resnet18,bert-base,...] [--runs 3] [--record [RUN]]

Each run is one new Python process that builds every model on meta (not timed), captures a small model once to load
torch.export's lazily imported machinery (not timed), then captures each model once (timed, summed). A model's
second capture in the same process is faster than its first (torch's caches are warm), so an A/B inside one process
favours whichever goes second: only fresh processes are compared here. Prints each run's total, then the medians
and their ratio. These machines are shared and noisy: the ratio of medians over alternated runs is the figure;
the host's own spread is printed beside it.

`--record` records the medians and their ratio for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _figures import add_record_option, record_if_asked

MODELS = ("resnet18", "resnet50", "resnet152", "densenet121", "bert-base", "bert-large", "gpt2", "t5-small",
          "t5-base", "efficientnet_b0", "mobilenet_v3_large", "vit_base_patch16_224",
          "swin_tiny_patch4_window7_224", "convnext_tiny")

CHILD = """
import contextlib, sys, time, warnings
warnings.simplefilter("ignore")
import perfmodel.graph.from_torch as from_torch
from perfmodel.jobs.build import build_job
from perfmodel.jobs.spec import JobSpec, ZooSource
if sys.argv[1] == "eager":
    from_torch._lazy_graph_modules = contextlib.nullcontext
jobs = [build_job(JobSpec(source=ZooSource(name=name), batch_size=2, seq_len=32), "meta") for name in sys.argv[2:]]
from_torch.graph_of_job(build_job(JobSpec(source=ZooSource(name="alexnet"), batch_size=2), "meta"))
start = time.perf_counter()
for job in jobs:
    from_torch.graph_of_job(job)
print(time.perf_counter() - start)
"""


def one_run(arm: str, models: list[str]) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, arm, *models], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    parser.add_argument("--runs", type=int, default=3, help="runs of each arm, alternated")
    add_record_option(parser)
    args = parser.parse_args()
    models = [name for name in args.models.split(",") if name]
    started = time.perf_counter()
    totals: dict[str, list[float]] = {"eager": [], "lazy": []}
    for run in range(args.runs):
        for arm in ("eager", "lazy") if run % 2 == 0 else ("lazy", "eager"):
            totals[arm].append(one_run(arm, models))
            print(f"run {run + 1} {arm:5}: {totals[arm][-1]:.2f} s for {len(models)} captures", flush=True)
    medians = {arm: statistics.median(values) for arm, values in totals.items()}
    spread = {arm: (min(values), max(values)) for arm, values in totals.items()}
    ratio = medians["lazy"] / medians["eager"]
    print(f"\n{len(models)} zoo captures in a fresh process, median of {args.runs} alternated runs each:")
    for arm in ("eager", "lazy"):
        print(f"  {arm:5} fx modules: {medians[arm]:.2f} s (runs {spread[arm][0]:.2f}-{spread[arm][1]:.2f} s)")
    print(f"  lazy / eager: {ratio:.3f}")
    record_if_asked(args, "capture_speed", {"models": len(models), "runs": args.runs,
                           "eager_median_s": round(medians["eager"], 2), "lazy_median_s": round(medians["lazy"], 2),
                           "lazy_over_eager": round(ratio, 3), "run_s": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
