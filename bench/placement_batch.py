"""How fast the placement model answers a batch of (job, placement) pairs once each job's compute is cached.

Run: .venv/bin/python bench/placement_batch.py [--jobs 20] [--placements 500] [--repeats 20]

Builds `--jobs` jobs (zoo models x batch sizes) and `--placements` placements (2 accelerators, 1-4 nodes of 1-8
devices, data / tensor / pipeline splits, micro-batches, ZeRO, checkpointing) sharing one micro-batch size per job,
warms the compute cache (one device-model prediction per job x accelerator: the slow part, printed), then times
`PlacementPredictor.matrix_arrays` over all jobs x placements. Target: 10,000 pairs in <= 100 ms. `--record [RUN]`
records the timings for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

from _figures import add_record_option, record_if_asked

from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import Parallelism, PlacementSpec
from perfmodel.predictor.placed import PlacementPredictor

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "vgg11", "bert-small", "gpt2", "vit_tiny_patch16_224",
          "efficientnet_b0", "mlp-recommender", "opt-125m")
ACCELERATORS = ("a100-sxm4-80gb", "t4")
MICRO = 4


def placements(count: int) -> list[PlacementSpec]:
    layouts = []
    for accelerator, nodes, per_node, tp, pp, micro_batches, zero, ckpt in itertools.product(
            ACCELERATORS, (1, 2, 4), (1, 2, 4, 8), (1, 2), (1, 2), (1, 4), (0, 1, 3), (False, True)):
        devices = nodes * per_node
        if per_node % tp or devices % (tp * pp):
            continue
        data = devices // (tp * pp)
        layouts.append(PlacementSpec(
            accelerator=accelerator, devices_per_node=(per_node,) * nodes, global_batch_size=MICRO * micro_batches
            * data, parallelism=Parallelism(data=data, tensor=tp, pipeline=pp, micro_batches=micro_batches,
                                            zero_stage=zero, activation_checkpointing=ckpt)))
    return list(itertools.islice(itertools.cycle(layouts), count))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--placements", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    add_record_option(parser)
    args = parser.parse_args()
    specs = [JobSpec.from_options(zoo=name, batch_size=MICRO * k, seq_len=128)
             for k, name in zip(itertools.cycle((1, 2)), itertools.islice(itertools.cycle(MODELS), args.jobs))]
    pls = placements(args.placements)
    predictor = PlacementPredictor.load()
    started = time.perf_counter()
    predictor.matrix_arrays(specs, pls)  # fills the compute cache
    warm_s = time.perf_counter() - started
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = predictor.matrix_arrays(specs, pls)
        times.append((time.perf_counter() - t0) * 1e3)
    pairs = len(specs) * len(pls)
    print(f"jobs {len(specs)} x placements {len(pls)} = {pairs} pairs; compute cache warm-up {warm_s:.1f} s "
          f"({len({(s.name, s.batch_size) for s in specs})} distinct jobs x {len(ACCELERATORS)} accelerators)")
    print(f"batch of {pairs} pairs: median {statistics.median(times):.1f} ms, min {min(times):.1f} ms, "
          f"max {max(times):.1f} ms over {args.repeats} runs (target <= 100 ms for 10,000)")
    print(f"throughput range {out['throughput_samples_per_s'].min():.1f}-{out['throughput_samples_per_s'].max():.1f}"
          f" samples/s")
    record_if_asked(args, "placement_batch", {
        "pairs": pairs, "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
        "warmup_s": warm_s, "distinct_jobs": len({(s.name, s.batch_size) for s in specs}),
        "accelerators": len(ACCELERATORS)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
