"""Is a GPU that is better on every line of its spec sheet ever answered slower? Over zoo models, in fp32 and AMP,
at one device, on catalog GPUs of every generation and vendor.

    .venv/bin/python bench/spec_dominance.py [--gpus a,b,...] [--models a,b] [--record [RUN]]

A GPU *dominates* another, for a precision, when the GEMM peaks of the maths that precision runs its matmuls and
convolutions in there (`math_modes.maths_by_group`: `fp32` is TF32 convolutions on NVIDIA Ampere and later, fp32
on AMD, whose PyTorch does not turn TF32 on), its vector peak, memory bandwidth and memory are at least the other's,
one of them more. Nothing in physics makes the dominant GPU
faster on every job (two vendors' libraries differ; a wider GPU fills less on a small kernel), but a scheduler
reading such an answer would doubt it. For each (model, precision) and each dominant pair, the answer as served
(`PlacementPredictor.matrix_arrays`, the whole-step stage included, uncalibrated) is *inverted* when the dominant
GPU's throughput is below the other's by more than `--slack` (2 %); the same count over the composed kernel sums
alone says how many the whole-step stage adds. Prints the count, the worst inversions and the pairs that invert
most. `--record [RUN]` records the figures for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np
from _figures import add_record_option, figure_key, record_if_asked

# (zoo model, batch): CNNs with and without depthwise convolutions, transformers, recurrent and recommender models
MODELS = (("resnet50", 128), ("resnet18", 128), ("mobilenet_v2", 128), ("efficientnet_b0", 128), ("vgg16", 64),
          ("convnext_tiny", 64), ("vit_base_patch16_224", 64), ("bert-base", 32), ("bert-large", 16), ("gpt2", 8),
          ("ssd300", 32), ("gnmt", 128), ("transformer-xl-base", 16), ("ncf", 65536))
PRECISIONS = ("fp32", "amp")
# one or two GPUs of each generation and vendor, data centre and desktop
GPUS = ("k80", "p100-pcie-16gb", "gtx-1080-ti", "v100-sxm2-16gb", "t4", "rtx-3090", "a10", "a40", "a100-sxm4-80gb",
        "l4", "l40s", "rtx-4090", "rtx-6000-ada", "h100-pcie", "h100-sxm5", "h200", "rtx-5090", "b200", "gb200",
        "mi25", "mi100", "mi210", "mi250x", "mi300x", "mi355x")


def sheet(hw, precision) -> np.ndarray:
    """The spec-sheet lines dominance compares for a job of `precision`: the GEMM peaks of its matmul and convolution
    maths on `hw`, the vector peak, bandwidth, memory."""
    from perfmodel.hardware.math import peak_gflops
    from perfmodel.predictor.math_modes import maths_by_group

    maths = maths_by_group(precision, hw)
    return np.array([peak_gflops(hw, maths["matmul"], True), peak_gflops(hw, maths["conv"], True),
                     peak_gflops(hw, "fp32", False), hw.memory_bandwidth_gb_s, hw.memory_gb])


def dominant_pairs(names: list[str], sheets: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """(better, worse): `better`'s every line at least `worse`'s, one of them more."""
    return [(a, b) for a, b in itertools.permutations(names, 2)
            if np.all(sheets[a] >= sheets[b]) and np.any(sheets[a] > sheets[b])]


def main(argv: list[str] | None = None) -> int:
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import get_accelerator, load_catalog
    from perfmodel.jobs.spec import JobSpec, Precision
    from perfmodel.placement.spec import PlacementSpec
    from perfmodel.predictor.placed import PlacementPredictor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", help=f"comma-separated catalog GPUs (default: {len(GPUS)} of them)")
    parser.add_argument("--models", help=f"comma-separated zoo models (default: {len(MODELS)} of them)")
    parser.add_argument("--slack", type=float, default=0.02, help="inversions smaller than this are ignored")
    add_record_option(parser)
    args = parser.parse_args(argv)
    catalog = load_catalog()
    try:
        gpus = [get_accelerator(g, catalog).name for g in (args.gpus.split(",") if args.gpus else GPUS)]
    except Exception as exc:  # an unknown name: say which, with the close ones
        print(f"--gpus: {exc}", file=sys.stderr)
        return 2
    models = [m for m in MODELS if not args.models or m[0] in args.models.split(",")]
    if not models:
        print(f"--models: none of {args.models!r} is in {', '.join(m[0] for m in MODELS)}", file=sys.stderr)
        return 2
    pairs = {p: dominant_pairs(gpus, {g: sheet(catalog[g], Precision(p)) for g in gpus}) for p in PRECISIONS}
    print(f"{len(gpus)} GPUs, dominant pairs: " + ", ".join(f"{len(pairs[p])} in {p}" for p in PRECISIONS)
          + f"; {len(models)} models, one device each\n")
    predictor = PlacementPredictor.load()
    assert predictor.device is not None
    served: dict[tuple[str, str], dict[str, float]] = {}
    composed: dict[tuple[str, str], dict[str, float]] = {}
    for (name, batch), precision in itertools.product(models, PRECISIONS):
        spec = JobSpec.from_options(zoo=name, batch_size=batch, precision=precision)
        graph = graph_for_job(spec)
        placements = [PlacementSpec(accelerator=g, global_batch_size=batch) for g in gpus]
        steps = predictor.matrix_arrays([spec], placements, graphs=[graph])["iter_time_ms"][0]
        kernels = predictor.device.predict_composed_many([(spec, g, graph) for g in gpus])
        served[name, precision] = {g: batch / float(ms) for g, ms in zip(gpus, steps)}
        composed[name, precision] = {g: batch / step.iter_time_ms for g, (step, _) in zip(gpus, kernels)}

    def inversions(answers: dict[tuple[str, str], dict[str, float]]) -> list[tuple[float, str, str, str, str]]:
        return sorted(((answers[job][worse] / answers[job][better], job[0], job[1], better, worse)
                       for job in answers for better, worse in pairs[job[1]]
                       if answers[job][better] < answers[job][worse] * (1 - args.slack)), reverse=True)

    inverted, inverted_kernels = inversions(served), inversions(composed)
    cases = sum(len(pairs[precision]) for _, precision in served)
    print(f"served: {len(inverted)} of {cases} (job, dominant pair) answers inverted"
          + (f", at worst {inverted[0][0]:.2f}x" if inverted else ""))
    print(f"composed kernel sums alone: {len(inverted_kernels)} inverted"
          + (f", at worst {inverted_kernels[0][0]:.2f}x" if inverted_kernels else ""))
    if inverted:
        print(f"\n{'model':<22} {'precision':<9} {'better on every line':<22} {'answered faster':<18} {'by':>6}")
        for ratio, model, precision, better, worse in inverted[:15]:
            print(f"{model:<22} {precision:<9} {better:<22} {worse:<18} {ratio:>5.2f}x")
        by_pair: dict[tuple[str, str], int] = {}
        for _, _, _, better, worse in inverted:
            by_pair[better, worse] = by_pair.get((better, worse), 0) + 1
        print("\npairs that invert most: " + ", ".join(f"{b} < {w} ({n})" for (b, w), n in
                                                       sorted(by_pair.items(), key=lambda kv: -kv[1])[:8]))
    if inverted_kernels:
        print("\ncomposed kernel sums inverted: " + ", ".join(f"{m} {p} {b} < {w} ({r:.2f}x)"
                                                             for r, m, p, b, w in inverted_kernels[:8]))
    record_if_asked(args, "spec_dominance", {
        "gpus": len(gpus), "dominant_pairs": {p: len(pairs[p]) for p in PRECISIONS}, "cases": cases,
        "inverted": len(inverted),
        "worst_x": inverted[0][0] if inverted else 1.0, "inverted_composed": len(inverted_kernels),
        "worst": [{"model": figure_key(m), "precision": p, "better": b, "worse": w, "x": r}
                  for r, m, p, b, w in inverted[:5]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
