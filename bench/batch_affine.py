"""One capture per model serves every batch size: every zoo model's graph from captures at two batches, against a
capture at a third (and the predicted step on a GPU from each, and from the job's lines: no graph at that batch).

    .venv/bin/python bench/batch_affine.py [--models a,b] [--batches 2,4] [--check 8,32] [--accelerator t4]

For each model: captures at the two `--batches` (`perfmodel.graph.batch_affine.affine`), the affine graph at each
`--check` batch against a capture there: the largest relative error over the totals (FLOPs forward and backward,
bytes read and written, activation and saved-activation bytes) and of the predicted one-device step (the shipped
per-op model), of the step a batch sweep serves (`perfmodel.predictor.batch_sweep`: the kernel rows on the line
through the two captures, checked at the first `--check` batch, "no row line" where the check refuses them), and the
time of `BatchAffine.at` against a capture; whether the engine's check (a third capture agreeing within 0.5 %,
`batch_affine.agrees`) would trust the model. Prints one line per model and the worst. `--record [RUN]` records the
worst errors and the models' counts for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from _figures import add_record_option, record_if_asked

TOTALS = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd", "bytes_written_bwd",
          "activation_bytes", "saved_activation_bytes", "saved_activation_bytes_amp")


def rel(a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return 0.0 if a == b else float("inf")
    return abs(a - b) / max(abs(b), 1e-12)


def main(argv: list[str] | None = None) -> int:
    from perfmodel.graph import graph_for_job
    from perfmodel.graph.batch_affine import affine, agrees
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.jobs.spec import JobSpec
    from perfmodel.jobs.zoo import ZOO
    from perfmodel.predictor.batch_sweep import GraphLine, RowLine, Sweep
    from perfmodel.predictor.gpu_iteration import DevicePredictor

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo names [every zoo model]")
    parser.add_argument("--batches", default="2,4")
    parser.add_argument("--check", default="8,32")
    parser.add_argument("--accelerator", default="t4")
    add_record_option(parser)
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(ZOO)
    b1, b2 = (int(x) for x in args.batches.split(","))
    checks = [int(x) for x in args.check.split(",")]
    device = DevicePredictor.load()
    worst_graph = worst_step = worst_sweep = 0.0
    no_rows: list[str] = []
    structural: list[str] = []
    untrusted: list[str] = []
    for name in names:
        entry = ZOO[name]
        seq_len = entry.reference_seq_len or 128
        if name == "tacotron2":
            seq_len = 100  # 550 mel frames take ~50 CPU-s a capture; the graph's shape in frames is the same
        specs = {b: JobSpec.from_options(zoo=name, batch_size=b, seq_len=seq_len) for b in (b1, b2, *checks)}
        started = time.perf_counter()
        first, second = graph_for_job(specs[b1]), graph_for_job(specs[b2])
        model = affine(first, b1, second, b2)
        if model is None:
            structural.append(name)
            print(f"{name:<32} not affine: the two captures differ in structure", flush=True)
            continue
        line = []
        trusted = True
        model_graph = model_step = model_sweep = 0.0
        graphs = GraphLine.of(first, b1, second, b2)
        rows = None if graphs is None else RowLine.of(specs[b1], graphs, get_accelerator(args.accelerator),
                                                      graph_for_job(specs[checks[0]]), checks[0])
        swept = (None if rows is None or graphs is None else device.predict_composed_sweeps(
            [Sweep([specs[b] for b in checks], args.accelerator, rows, graphs)])[0])
        if swept is None:
            no_rows.append(name)
        for i, b in enumerate(checks):
            t0 = time.perf_counter()
            captured = graph_for_job(specs[b])
            capture_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            made = model.at(b)
            at_s = time.perf_counter() - t0
            graph_err = max(rel(getattr(made.totals, k), getattr(captured.totals, k)) for k in TOTALS)
            trusted = trusted and agrees(made, captured)
            step_a = device.predict(specs[b], args.accelerator, graph=made).iter_time_ms
            step_c = device.predict(specs[b], args.accelerator, graph=captured).iter_time_ms
            step_err = rel(step_a, step_c)
            sweep_err = rel(swept[i][0].iter_time_ms, step_c) if swept is not None else 0.0
            model_graph, model_step = max(model_graph, graph_err), max(model_step, step_err)
            model_sweep = max(model_sweep, sweep_err)
            swept_text = f"sweep {100 * sweep_err:.3f} %" if swept is not None else "no row line"
            line.append(f"b={b}: totals {100 * graph_err:.3f} %, step {100 * step_err:.3f} %, {swept_text}, "
                        f"at() {1e3 * at_s:.0f} ms vs capture {capture_s:.1f} s")
        if trusted:
            worst_graph, worst_step = max(worst_graph, model_graph), max(worst_step, model_step)
            worst_sweep = max(worst_sweep, model_sweep)
        else:
            untrusted.append(name)
        verdict = "" if trusted else "  NOT AFFINE: the engine's third-capture check refuses it, captures every batch"
        print(f"{name:<32} {'; '.join(line)}  ({time.perf_counter() - started:.0f} s){verdict}", flush=True)
    trusted_models = len(names) - len(structural) - len(untrusted)
    print(f"\nworst over {trusted_models} models the engine trusts: totals {100 * worst_graph:.3f} %, "
          f"predicted step {100 * worst_step:.3f} %, from the lines {100 * worst_sweep:.3f} % (target 0.5 %); other "
          f"structures: {', '.join(structural) or 'none'}; refused by the third-capture check: "
          f"{', '.join(untrusted) or 'none'}; no row line (composed per batch): {', '.join(no_rows) or 'none'}")
    record_if_asked(args, "batch_affine", {
        "models": len(names), "trusted_models": trusted_models,
        "swept_models": trusted_models - len(set(no_rows) - set(untrusted)),
        "worst_totals_pct": 100 * worst_graph, "worst_step_pct": 100 * worst_step,
        "worst_totals_and_step_pct": 100 * max(worst_graph, worst_step), "worst_sweep_pct": 100 * worst_sweep,
        "other_structures": structural, "refused": untrusted, "no_row_line": no_rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
