"""Are the float32 maths of one job answered in their order? fp32-strict >= fp32 >= tf32 per iteration, over zoo models
on every catalog GPU with TF32, at one device and on multi-GPU placements.

    .venv/bin/python bench/math_order.py [--models a,b] [--record [RUN]]

For each model: the smallest fp32 / tf32 and fp32-strict / fp32 ratio of the answers as served
(`PlacementPredictor.matrix_arrays`: each math's own whole-step correction, a step that comes out faster than a
faster twin raised to it, `math_modes.FASTER_FLOAT32`) over the GPUs, at one device and on 2-16; at one device,
the same ratios of each math's own correction alone (the composed step times the stage's factor: what was served
before the floor) and of the composed kernel sums. A ratio below 1 is an inversion. Also the largest move the
floor makes on a one-device step its own correction already ordered (0 by construction). `--record [RUN]` records
the figures for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _figures import add_record_option, record_if_asked

# (zoo model, batch, seq_len): CNNs, transformers, recurrent and recommender models, measured (DLE) and not
MODELS = (("resnet50", 32, None), ("efficientnet_b0", 32, None), ("vit_base_patch16_224", 16, None),
          ("bert-small", 16, 128), ("gpt2", 4, 256), ("t5-small", 8, 128), ("lstm-lm", 16, 64),
          ("mlp-recommender", 64, None), ("ssd300", 8, None), ("waveglow", 4, None), ("ncf", 4096, None),
          ("transformer-xl-base", 8, None), ("gnmt", 32, None))
LAYOUTS = ((1,), (2,), (8,), (8, 8))  # devices per node: one device, 2 and 8 in one node, 2 nodes of 8


def main(argv: list[str] | None = None) -> int:
    from perfmodel.graph import graph_for_job
    from perfmodel.hardware.catalog import load_catalog
    from perfmodel.jobs.spec import JobSpec, Precision
    from perfmodel.placement.spec import Parallelism, PlacementSpec
    from perfmodel.predictor.math_modes import faster_twins
    from perfmodel.predictor.placed import PlacementPredictor, level_key

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo models (default: 13 of them)")
    add_record_option(parser)
    args = parser.parse_args(argv)
    models = [m for m in MODELS if not args.models or m[0] in args.models.split(",")]
    if not models:
        print(f"--models: none of {args.models!r} is in {', '.join(m[0] for m in MODELS)}", file=sys.stderr)
        return 2
    predictor = PlacementPredictor.load()
    stage = predictor.whole_step
    assert stage is not None and predictor.device is not None
    catalog = load_catalog()
    gpus = [name for name, hw in catalog.items() if hw.kind == "gpu" and faster_twins(Precision.fp32_strict, hw)]
    maths = (Precision.fp32_strict, Precision.fp32, Precision.tf32)
    layouts = ", ".join("+".join(map(str, layout)) for layout in LAYOUTS)
    print(f"{len(gpus)} catalog GPUs with TF32; placements of {layouts} devices\n")
    print(f"{'':<22} {'served, 1 GPU':>21}   {'served, 2-16 GPUs':>21}   {'1 GPU, own correction':>31}   "
          f"{'1 GPU, kernels':>29}")
    print(f"{'model':<22} {'fp32/tf32':>9} {'strict/fp32':>11}   {'fp32/tf32':>9} {'strict/fp32':>11}   "
          f"{'own corr. fp32/tf32':>19} "
          f"{'strict/fp32':>11}   {'kernels fp32/tf32':>17} {'strict/fp32':>11}   {'largest move':>12}")
    figures: dict[str, dict[str, float]] = {}
    for name, batch, seq_len in models:
        base = JobSpec.from_options(zoo=name, batch_size=batch, seq_len=seq_len)
        graph = graph_for_job(base)
        placements = [PlacementSpec(accelerator=gpu, devices_per_node=layout, global_batch_size=batch * sum(layout),
                                    parallelism=Parallelism(data=sum(layout)))
                      for gpu in gpus for layout in LAYOUTS]
        served = {p: predictor.matrix_arrays([base.model_copy(update={"precision": p})], placements,
                                             graphs=[graph])["iter_time_ms"][0] for p in maths}
        items = [(base.model_copy(update={"precision": p}), gpu, graph) for p in maths for gpu in gpus]
        composed = predictor.device.predict_composed_many(items)
        factors, _, _ = stage.factors_many([f for _, f in composed],
                                           [level_key(spec, catalog[gpu], stage.known_levels)
                                            for spec, gpu, _ in items])
        kernels = np.array([step.iter_time_ms for step, _ in composed]).reshape(len(maths), len(gpus))
        own = kernels * factors.reshape(len(maths), len(gpus))
        one = [i for i, p in enumerate(placements) if p.devices == 1]
        alone = {p: served[p][one] for p in maths}
        ordered = (own[0] >= own[1]) & (own[1] >= own[2])
        move = max(float(np.max(alone[p][ordered] / own[i][ordered] - 1)) if ordered.any() else 0.0
                   for i, p in enumerate(maths))
        many = [i for i, p in enumerate(placements) if p.devices > 1]
        row = {"one_gpu_fp32_over_tf32": float(np.min(alone[Precision.fp32] / alone[Precision.tf32])),
               "one_gpu_strict_over_fp32": float(np.min(alone[Precision.fp32_strict] / alone[Precision.fp32])),
               "multi_gpu_fp32_over_tf32": float(np.min(served[Precision.fp32][many]
                                                        / served[Precision.tf32][many])),
               "multi_gpu_strict_over_fp32": float(np.min(served[Precision.fp32_strict][many]
                                                          / served[Precision.fp32][many])),
               "own_fp32_over_tf32": float(np.min(own[1] / own[2])),
               "own_strict_over_fp32": float(np.min(own[0] / own[1])),
               "kernels_fp32_over_tf32": float(np.min(kernels[1] / kernels[2])),
               "kernels_strict_over_fp32": float(np.min(kernels[0] / kernels[1])),
               "largest_move_pct": 100 * move}
        figures[name] = row
        print(f"{name:<22} {row['one_gpu_fp32_over_tf32']:>9.3f} {row['one_gpu_strict_over_fp32']:>11.3f}   "
              f"{row['multi_gpu_fp32_over_tf32']:>9.3f} {row['multi_gpu_strict_over_fp32']:>11.3f}   "
              f"{row['own_fp32_over_tf32']:>19.3f} {row['own_strict_over_fp32']:>11.3f}   "
              f"{row['kernels_fp32_over_tf32']:>17.3f} {row['kernels_strict_over_fp32']:>11.3f}   "
              f"{row['largest_move_pct']:>11.1f}%", flush=True)
    for where in ("one_gpu", "multi_gpu"):
        worst = {n: min(r[f"{where}_fp32_over_tf32"], r[f"{where}_strict_over_fp32"]) for n, r in figures.items()}
        inverted = sorted(n for n, ratio in worst.items() if ratio < 1 - 1e-9)
        print(f"served, {where.replace('_', ' ')}: {len(inverted)} of {len(figures)} models answered out of order"
              + (f", at worst {100 * (1 - min(worst.values())):.1f} % ({', '.join(inverted)})" if inverted else ""))
    record_if_asked(args, "math_order", {"gpus": len(gpus), "models": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
