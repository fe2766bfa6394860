"""ONNX training jobs against torch-captured ones: the same zoo model, predicted for training from its ONNX export
(`graph_from_onnx(..., mode="train")`: forward graph + derived backward + optimizer) and from its torch.export
capture, on catalog GPUs with the promoted per-op device model. Prints one line per model and accelerator and the
worst relative difference of the iteration time.

    .venv/bin/python bench/onnx_train.py [--batch-size 8] [--accelerators a100-sxm4-80gb,h100-sxm5]

Models are exported the way the README's training example says: `torch.onnx.export(model, args, path,
dynamo=True, optimize=False)` (`optimize=True`, the default, folds batch norms into the convolutions, which a
training step does not), in eval mode (the exporter's usual form: no dropout). `--record [RUN]` records every
difference for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _figures import add_record_option, figure_key, record_if_asked  # noqa: E402

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "vgg11", "bert-small", "gpt2")
ACCELERATORS = ("a100-sxm4-80gb", "h100-sxm5", "rtx-4090")


def export_for_training(zoo_name: str, batch_size: int, seq_len: int, folder: Path) -> Path:
    """`zoo_name`'s model exported to ONNX as the README shows for training jobs (eval mode, optimize=False)."""
    from perfmodel.jobs.onnx_export import export_onnx
    from perfmodel.jobs.spec import JobSpec, Mode, ZooSource

    spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=batch_size, seq_len=seq_len, mode=Mode.inference)
    return export_onnx(spec, folder / f"{zoo_name}.onnx", optimize=False)


def compare(zoo_name: str, batch_size: int, seq_len: int, accelerators: list[str], folder: Path,
            predictor: object) -> list[dict[str, object]]:
    """Training predictions of the torch capture and of the ONNX export of one zoo model, per accelerator."""
    from perfmodel.graph import graph_for_job
    from perfmodel.jobs.spec import JobSpec, OnnxSource, ZooSource

    path = export_for_training(zoo_name, batch_size, seq_len, folder)
    torch_spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=batch_size, seq_len=seq_len)
    onnx_spec = JobSpec(source=OnnxSource(path=str(path)), batch_size=batch_size, seq_len=seq_len)
    torch_graph, onnx_graph = graph_for_job(torch_spec), graph_for_job(onnx_spec)
    out = []
    for accelerator in accelerators:
        a = predictor.predict(torch_spec, accelerator, graph=torch_graph)  # type: ignore[attr-defined]
        b = predictor.predict(onnx_spec, accelerator, graph=onnx_graph)  # type: ignore[attr-defined]
        out.append({"model": zoo_name, "accelerator": accelerator, "torch_ms": a.iter_time_ms,
                    "onnx_ms": b.iter_time_ms, "diff_pct": 100 * (b.iter_time_ms / a.iter_time_ms - 1),
                    "torch": a.breakdown_ms, "onnx": b.breakdown_ms})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--accelerators", default=",".join(ACCELERATORS))
    add_record_option(parser)
    args = parser.parse_args()

    from perfmodel.predictor.gpu_iteration import DevicePredictor

    predictor = DevicePredictor.load()
    worst = 0.0
    rows = []
    print(f"{'model':14} {'accelerator':16} {'torch ms':>10} {'onnx ms':>10} {'diff':>7}   fwd/bwd/opt torch | onnx")
    with tempfile.TemporaryDirectory(prefix="perfmodel-onnx-train-") as folder:
        for name in args.models.split(","):
            started = time.perf_counter()
            for row in compare(name, args.batch_size, args.seq_len, args.accelerators.split(","), Path(folder),
                               predictor):
                t, o = row["torch"], row["onnx"]
                worst = max(worst, abs(row["diff_pct"]))
                rows.append(row)
                print(f"{row['model']:14} {row['accelerator']:16} {row['torch_ms']:10.3f} {row['onnx_ms']:10.3f} "
                      f"{row['diff_pct']:+6.2f}%   {t['forward']:.2f}/{t['backward']:.2f}/{t['optimizer']:.2f} | "
                      f"{o['forward']:.2f}/{o['backward']:.2f}/{o['optimizer']:.2f}", flush=True)
            print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    print(f"worst |difference|: {worst:.2f} %")
    diff_pct: dict = {}
    for row in rows:
        diff_pct.setdefault(figure_key(row["model"]), {})[figure_key(row["accelerator"])] = row["diff_pct"]
    largest = max(rows, key=lambda row: abs(row["diff_pct"]))
    record_if_asked(args, "onnx_train", {
        "diff_pct": diff_pct, "worst_abs_diff_pct": worst,
        "worst": {"model": largest["model"], "accelerator": largest["accelerator"], "diff_pct": largest["diff_pct"]}})


if __name__ == "__main__":
    main()
