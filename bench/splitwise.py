"""Prefill (prompt) time of multi-GPU tensor-parallel LLM inference: the placement model against Splitwise's
measured DGX-A100 runs (Mutinifni/splitwise-sim, ISCA'24, MIT; Llama-2-70B at TP 2/4/8, BLOOM-176B at TP 8).

Run: .venv/bin/python bench/splitwise.py [--datasets ../shared/datasets] [--max-shapes N]

Every measured row's prompt time is predicted with the promoted models (`PlacementPredictor.load()`): the model's
HF config as an fp16 inference job of `batch` sequences of `prompt` tokens, on `tp` A100-SXM4-80GB GPUs of one node,
tensor parallel. One graph is captured per distinct (model, batch, prompt) shape (meta device, seconds each; the
rows are sorted cheapest first and `--max-shapes` keeps that many shapes). These rows are a held-out check: nothing
is fitted on them. Prints the time per shape, a table per measured point (mean of its repeats), MAPE per
(model, tp) and overall, and the median APE. `--record [RUN]` records the MAPE and median APE per (model, tp) and
overall for docs/accuracy.md (bench/_figures.py; the doc quotes `--max-shapes 6` and, as `--record all_shapes`, the
full run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.evaluation.splitwise import evaluate_prompt_times, parse_perf_model, shapes, splitwise_file, summarise
from perfmodel.predictor.placed import PlacementPredictor
from perfmodel.settings import get_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=Path, default=get_settings().datasets_dir,
                        help="folder holding splitwise/ (default: PERFMODEL_DATASETS_DIR or ../shared/datasets)")
    parser.add_argument("--max-shapes", type=int, default=None,
                        help="predict only the N cheapest (model, batch, prompt) shapes (default: all 26)")
    parser.add_argument("--models-dir", default=None, help="model registry (default: the repo's models/)")
    add_record_option(parser)
    args = parser.parse_args(argv)

    rows = parse_perf_model(splitwise_file(args.datasets))
    kept = shapes(rows, args.max_shapes)
    print(f"{len(rows)} measured rows, {len(shapes(rows))} distinct (model, batch, prompt) shapes; "
          f"predicting {len(kept)}")
    predictor = PlacementPredictor.load(args.models_dir)
    print(f"models: {predictor.model_versions}")

    def progress(shape: tuple[str, int, int], seconds: float) -> None:
        print(f"   {shape[0]:<11} batch {shape[1]:<3} prompt {shape[2]:<5} {seconds:6.1f} s", flush=True)

    started = time.perf_counter()
    results = evaluate_prompt_times(rows, predictor.predict, max_shapes=args.max_shapes, on_shape=progress)
    print(f"   {time.perf_counter() - started:.0f} s in all")

    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    points = (results.groupby(["model", "tp", "batch_size", "prompt_tokens"], as_index=False)
              .agg(repeats=("ape", "size"), measured_ms=("measured_prompt_ms", "mean"),
                   predicted_ms=("predicted_prompt_ms", "first"), compute_ms=("predicted_compute_ms", "first"),
                   comm_ms=("predicted_communication_ms", "first"), ape=("ape", "mean"), fits=("fits", "first")))
    print("\n== per measured point (ms; APE in %, mean over the point's repeats; compute and comm: the prediction's "
          "parts)")
    print(points.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    print("\n== MAPE and median APE (%) over rows, per (model, tp) and overall")
    table = summarise(results)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    recorded: dict = {"model_tp": {}}
    for r in table.itertuples(index=False):
        values = {"rows": int(r.rows), "mape_pct": r.mape, "median_ape_pct": r.median_ape}
        if r.model == "all":
            recorded["all"] = values
        else:
            recorded["model_tp"].setdefault(figure_key(r.model), {})[f"tp{int(r.tp)}"] = values
    record_if_asked(args, "splitwise", recorded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
