"""Fit and validate the placement model, leave-one-model-out, on adaptdl (Pollux, T4 nodes) and vtrain (A100 node).

Run: .venv/bin/python bench/placement_fit.py [--datasets ../shared/datasets] [--write]

Data (credit: petuum/adaptdl osdi21-artifact, Apache-2.0; VIA-Research/vTrain MICRO'24, MIT); see
`perfmodel.evaluation.placement` for what is fitted on what. Prints the step-time MAPE of every held-out model
and of each data set, and the parameters fitted on all models. `--write` stores them in
perfmodel/placement/iteration_params.json: `adaptdl-t4` and `vtrain-a100` as fitted, and `default` (what
`PlacementPredictor` uses): the DDP overlap and distributed overhead of adaptdl (PyTorch DDP, as most jobs a
scheduler sees) and the tensor-parallel sync of vtrain; no compute calibration and no per-block host cost (both
describe Megatron on the A100 as the device model predicts it; left out, a one-device placement predicts exactly
what the single-device predictor does).
vtrain's compute needs the per-op device model's predictions of 32 (configuration, micro-batch) pairs: ~45 s.
`--record [RUN]` records the held-out errors and vtrain's fitted constants for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.core.accuracy import mape_pct
from perfmodel.evaluation.placement import (
    ADAPTDL_MODELS,
    adaptdl_params,
    adaptdl_rows,
    evaluate_adaptdl,
    evaluate_vtrain,
    fit_adaptdl,
    fit_vtrain,
    vtrain_arrays,
    vtrain_computes,
    vtrain_params,
    vtrain_rows,
)
from perfmodel.placement.comm import load_links
from perfmodel.placement.iteration import IterationParams, dump_params, load_params, params_path
from perfmodel.settings import get_settings

DEFAULT_DATASETS = get_settings().datasets_dir
VTRAIN_LINK = "nvswitch-a100-dgx"


def report(name: str, results: list, frame) -> dict:
    """Print the held-out errors; return them (for docs/figures)."""
    print(f"\n{name}: leave-one-model-out step-time error")
    print(f"  {'held-out model':<16} {'rows':>5} {'MAPE %':>7} {'median %':>8}")
    for r in results:
        print(f"  {r.held_out:<16} {r.rows:>5} {r.mape_pct:>7.1f} {r.median_ape_pct:>8.1f}")
    total = mape_pct(frame.predicted_ms.to_numpy(), frame.step_ms.to_numpy())
    median = np.median(np.abs(frame.predicted_ms - frame.step_ms) / frame.step_ms) * 100
    print(f"  {'all':<16} {len(frame):>5} {total:>7.1f} {median:>8.1f}")
    return {"rows": len(frame), "mape_pct": total, "median_ape_pct": median,
            "model": {figure_key(r.held_out): {"rows": r.rows, "mape_pct": r.mape_pct,
                                               "median_ape_pct": r.median_ape_pct} for r in results}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--write", action="store_true", help="store the fitted parameters (iteration_params.json)")
    add_record_option(parser)
    args = parser.parse_args()
    if not (args.datasets / "adaptdl").is_dir() or not (args.datasets / "vtrain").is_dir():
        print(f"no adaptdl/vtrain data under {args.datasets}", file=sys.stderr)
        return 2

    started = time.perf_counter()
    adaptdl = adaptdl_rows(args.datasets / "adaptdl")
    results, frame = evaluate_adaptdl(adaptdl)
    adaptdl_figures = report("adaptdl (Pollux: 4 nodes x 4 T4, DDP; compute = the job's measured 1-GPU step)",
                          results, frame)
    for kind, part in frame.groupby(frame.nodes > 1):
        print(f"  {'spread' if kind else 'one node':<16} {len(part):>5} "
              f"{mape_pct(part.predicted_ms.to_numpy(), part.step_ms.to_numpy()):>7.1f}")
    theta_a = fit_adaptdl(adaptdl)
    fitted_a = adaptdl_params(theta_a, "adaptdl placements.csv, all apps")
    print(f"  fit on all apps: PCIe alpha {10 ** theta_a[0] * 1e3:.1f} us, {1e-6 / 10 ** theta_a[1]:.2f} GB/s; "
          f"network alpha {10 ** theta_a[2] * 1e3:.1f} us, {1e-6 / 10 ** theta_a[3]:.2f} GB/s; "
          f"dp_overlap {fitted_a.dp_overlap:.2f}, distributed overhead {fitted_a.multi_device_overhead_ms:.2f} ms")
    print("  gradient volume per app: " + "; ".join(f"{k} {v[0] / 1e6:.1f} M params" for k, v in
                                                   ADAPTDL_MODELS.items()))

    from perfmodel.predictor.placed import PlacementPredictor

    predictor = PlacementPredictor.load()
    vtrain = vtrain_rows(args.datasets / "vtrain")
    computes = vtrain_computes(vtrain, predictor)
    c, p = vtrain_arrays(vtrain, computes, load_links()[VTRAIN_LINK])
    results, frame = evaluate_vtrain(vtrain, c, p)
    vtrain_figures = report(f"vtrain (Megatron GPT, 2/4/8 A100, every TP/DP/PP split; compute = "
                         f"{predictor.model_versions.get('device-ops')})", results, frame)
    for column in ("tp", "pp", "dp", "micro_batch"):
        groups = frame.groupby(column)
        vtrain_figures[column] = {figure_key(k): {"mape_pct": mape_pct(g.predicted_ms.to_numpy(), g.step_ms.to_numpy())}
                                  for k, g in groups}
        print(f"  by {column:<11} " + ", ".join(f"{k}: {v['mape_pct']:.1f}" for k, v in
                                                vtrain_figures[column].items()))
    theta_v = fit_vtrain(c, p, vtrain.step_ms.to_numpy(float))
    fitted_v = vtrain_params(theta_v, "vtrain ground_truth_single.csv, all configurations")
    print(f"  fit on all: compute_scale {fitted_v.compute_scale:.3f}, tp_penalty {fitted_v.tp_penalty:.3f}, "
          f"tp_sync {fitted_v.tp_sync_ms * 1e3:.0f} us, dp_overlap {fitted_v.dp_overlap:.2f}, "
          f"overhead {fitted_v.overhead_ms:.1f} ms, per-block host cost {fitted_v.layer_overhead_ms:.2f} ms")

    vtrain_figures["fit"] = {"compute_scale": fitted_v.compute_scale, "tp_penalty": fitted_v.tp_penalty,
                             "tp_sync_us": fitted_v.tp_sync_ms * 1e3, "dp_overlap": fitted_v.dp_overlap,
                             "overhead_ms": fitted_v.overhead_ms, "layer_overhead_ms": fitted_v.layer_overhead_ms}
    print(f"\nsummary: adaptdl {adaptdl_figures['mape_pct']:.1f} % (target <= 8), vtrain "
          f"{vtrain_figures['mape_pct']:.1f} % (target <= 10); {time.perf_counter() - started:.0f} s")
    record_if_asked(args, "placement_fit", {"adaptdl": adaptdl_figures, "vtrain": vtrain_figures})
    if args.write:
        # the replica jitters and the n-GPU band are fitted on Lambda's runs (bench/real_runs.py --write-jitter): kept
        kept = load_params()
        default = IterationParams(dp_overlap=fitted_a.dp_overlap,
                                  multi_device_overhead_ms=fitted_a.multi_device_overhead_ms,
                                  tp_sync_ms=fitted_v.tp_sync_ms, dp_jitter=kept.dp_jitter,
                                  dp_jitter_steady=kept.dp_jitter_steady, dp_jitter_varying=kept.dp_jitter_varying,
                                  scaling_band_log=kept.scaling_band_log,
                                  source="adaptdl DDP overlap/overhead + vtrain TP sync + Lambda replica jitters "
                                         "and band")
        table = {"default": default, "adaptdl-t4": fitted_a, "vtrain-a100": fitted_v}
        params_path().write_text(dump_params(table))
        print(f"wrote {params_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
