"""Whole-model evaluation against NeuSight's measured model latencies (`neusight/label/<GPU>/*.json`).

Each label is one model run on one GPU: `<model>-<train|inf>-<seq>-<batch>[-variant].json` holding
`{num_layer, e2e_latency, fw_latency, bwall_latency}` in ms (Hugging Face, fp32, training = forward + backward
without the optimizer step). `load_labels` reads them (variants are skipped: `-fusion` is torch.compile, `-dp4`,
`-tp4`, `-pp4_*` are 4-GPU runs; GPUs the hardware catalog does not know are skipped). `GraphCache` captures each
model's graph from `data/DLmodel_configs/<model>.json` once per (model, batch, seq, mode), on the meta device,
with eager attention (NeuSight timed eager HF models: QKᵀ, scale, mask, softmax, dropout, PV as separate kernels).
`evaluate_models` predicts every label with a per-device predictor (`perfmodel.predictor.device_ops`) and
returns measured and predicted forward / backward / total times and their APE.

Switch-XL (`switchxl4`, a mixture of experts) is captured with balanced top-1 routing (`perfmodel.graph.moe`:
every expert gets the same number of tokens, at most its `expert_capacity` per sequence) and an explicit
all-ones attention mask (`perfmodel.graph.from_torch.EXPORT_INPUTS`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.core.ir import Graph
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.predictor.device_ops import PredictFn, graph_op_rows, predict_graph_ms

LABEL_NAME = re.compile(r"^(?P<model>.+?)-(?P<mode>train|inf)-(?P<seq>\d+)-(?P<batch>\d+)(?:-(?P<variant>.+))?$")
MODES = {"train": "train", "inf": "inference"}
# model types whose graph cannot be captured, and why (added to the capture error)
UNCAPTURABLE: dict[str, str] = {}
# the head NeuSight ran, by (model_type, mode), where it is not the config's `architectures` entry: its one-layer
# tables (`label/<GPU>/bert_large-inf-*.csv`) end in BERT's pooler and a 2-class classifier, not the LM decoder
# (a 1024 x 30522 GEMM over every token) of the config's BertLMHeadModel; its training tables do have the decoder
LABEL_ARCHITECTURES: dict[tuple[str, str], str] = {("bert", "inference"): "BertForSequenceClassification"}
# config keys holding a model's attention-probability dropout (BERT, GPT-2, OPT)
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout")

RESULT_COLUMNS = ("gpu", "device", "model", "mode", "seq_len", "batch_size", "num_layer", "measured_fw_ms",
                  "measured_bw_ms", "measured_total_ms", "predicted_fw_ms", "predicted_bw_ms",
                  "predicted_total_ms", "ape_fw", "ape_bw", "ape_total", "rows", "error", "label")


@dataclass(frozen=True)
class LabelName:
    model: str
    mode: str  # train | inference
    seq_len: int
    batch_size: int
    variant: str | None


def parse_label_name(name: str) -> LabelName | None:
    """`bert_large-train-512-8.json` -> (bert_large, train, 512, 8, None); None when the name does not fit."""
    match = LABEL_NAME.match(Path(name).name.removesuffix(".json"))
    if match is None:
        return None
    return LabelName(match["model"], MODES[match["mode"]], int(match["seq"]), int(match["batch"]),
                     match["variant"] or None)


@dataclass(frozen=True)
class ModelLabel:
    """One measured model run: the GPU folder, its catalog id, the job and the measured times (ms)."""

    path: Path
    gpu: str
    device: str
    model: str
    mode: str
    seq_len: int
    batch_size: int
    num_layer: int  # 0 when the file has none (switchxl4 at seq 2048)
    e2e_ms: float
    fw_ms: float
    bw_ms: float

    @property
    def graph_key(self) -> tuple[str, int, int, str]:
        return self.model, self.batch_size, self.seq_len, self.mode


def neusight_root(datasets: str | Path) -> Path:
    """`datasets/neusight` when `datasets` is the folder of all public datasets, else `datasets` itself."""
    path = Path(datasets)
    return path / "neusight" if (path / "neusight" / "label").is_dir() else path


def label_folder_device(folder: str, catalog, cache: dict[str, str | None]) -> str | None:
    """The catalog id of a label folder's GPU (e.g. "Tesla_V100-PCIE-32GB"), None when the catalog lacks it;
    `cache` remembers each folder's answer."""
    if folder not in cache:
        try:
            cache[folder] = get_accelerator(folder, catalog).name
        except UnknownNameError:
            cache[folder] = None
    return cache[folder]


def scan_labels(root: str | Path, catalog: Mapping[str, HardwareSpec] | None = None
                ) -> tuple[list[ModelLabel], list[tuple[Path, str]]]:
    """The single-GPU labels under `root/label` (sorted), and the files skipped with the reason."""
    from perfmodel.hardware.catalog import load_catalog

    root = neusight_root(root)
    label_dir = root / "label"
    if not label_dir.is_dir():
        raise PerfmodelError(f"no NeuSight label folder at {label_dir}")
    catalog = load_catalog() if catalog is None else catalog
    labels: list[ModelLabel] = []
    skipped: list[tuple[Path, str]] = []
    devices: dict[str, str | None] = {}
    for path in sorted(label_dir.glob("*/*.json")):
        name = parse_label_name(path.name)
        if name is None:
            skipped.append((path, "file name is not <model>-<train|inf>-<seq>-<batch>[-variant].json"))
            continue
        if name.variant is not None:
            skipped.append((path, f"variant {name.variant!r} (torch.compile or multi-GPU)"))
            continue
        gpu = path.parent.name
        device = label_folder_device(gpu, catalog, devices)
        if device is None:
            skipped.append((path, f"GPU {gpu!r} is not in the hardware catalog"))
            continue
        data = json.loads(path.read_text())
        labels.append(ModelLabel(path=path, gpu=gpu, device=device, model=name.model, mode=name.mode,
                                 seq_len=name.seq_len, batch_size=name.batch_size,
                                 num_layer=int(data.get("num_layer") or 0), e2e_ms=float(data["e2e_latency"]),
                                 fw_ms=float(data["fw_latency"]), bw_ms=float(data.get("bwall_latency") or 0.0)))
    return labels, skipped


def load_labels(root: str | Path, catalog: Mapping[str, HardwareSpec] | None = None) -> list[ModelLabel]:
    """The single-GPU labels under `root/label` (see `scan_labels` for what is skipped)."""
    return scan_labels(root, catalog)[0]


@dataclass
class GraphCache:
    """Graphs of the NeuSight models by (model, batch, seq, mode), captured once on the meta device. Capture
    times (s) and failures (one-line messages; a failure is not retried) are kept."""

    config_dir: Path
    attn_implementation: str | None = "eager"
    graphs: dict[tuple[str, int, int, str], Graph] = field(default_factory=dict)
    capture_s: dict[tuple[str, int, int, str], float] = field(default_factory=dict)
    failures: dict[tuple[str, int, int, str], str] = field(default_factory=dict)

    @classmethod
    def for_root(cls, root: str | Path, **kwargs: Any) -> GraphCache:
        return cls(config_dir=neusight_root(root) / "data" / "DLmodel_configs", **kwargs)

    def config(self, model: str, mode: str | None = None) -> dict[str, Any]:
        """The model's HF config (eager attention), with the head NeuSight ran in `mode` (`LABEL_ARCHITECTURES`)."""
        from perfmodel.jobs.spec import load_hf_config

        config = dict(load_hf_config(self.config_dir / f"{model}.json"))
        if self.attn_implementation:
            config["attn_implementation"] = self.attn_implementation
        head = LABEL_ARCHITECTURES.get((str(config.get("model_type")), str(mode)))
        if head is not None:
            config["architectures"] = [head]
        return config

    def attention_dropout(self, model: str) -> bool:
        config = self.config(model)
        return any(float(config.get(key) or 0.0) > 0 for key in ATTENTION_DROPOUT_KEYS)

    def get(self, model: str, batch_size: int, seq_len: int, mode: str) -> Graph:
        key = (model, batch_size, seq_len, mode)
        if key in self.graphs:
            return self.graphs[key]
        if key in self.failures:
            raise PerfmodelError(self.failures[key])
        from perfmodel.graph import graph_for_job
        from perfmodel.jobs.spec import JobSpec

        start = time.perf_counter()
        try:
            spec = JobSpec.from_options(hf_config=self.config(model, mode), batch_size=batch_size, seq_len=seq_len,
                                        mode=mode)
            graph = graph_for_job(spec)
        except PerfmodelError as exc:
            why = UNCAPTURABLE.get(str(self.config(model).get("model_type")))
            self.failures[key] = f"{model}: {why} ({exc})" if why else f"{model}: {exc}"
            raise PerfmodelError(self.failures[key]) from None
        finally:
            self.capture_s[key] = time.perf_counter() - start
        self.graphs[key] = graph
        return graph


def _ape(predicted: float, measured: float) -> float:
    if not measured or not np.isfinite(predicted):
        return float("nan")
    return abs(predicted - measured) / measured * 100.0


def evaluate_models(predict_fn_for_device: Callable[[str], PredictFn], labels: Iterable[ModelLabel], *,
                    graphs: GraphCache | None = None, root: str | Path | None = None,
                    catalog: Mapping[str, HardwareSpec] | None = None, dtype: str = "fp32") -> pd.DataFrame:
    """One row per label: measured and predicted forward, backward and total ms and their APE (%), `rows` (the
    op rows predicted) and `error` (why a label could not be predicted; missing, `pd.isna`, when it was).
    `predict_fn_for_device(id)` gives the predictor for one device (called once per device); `graphs` (or `root`,
    the NeuSight folder) says where the model configs are. Each graph is mapped to op rows once and predicted on
    every device."""
    labels = list(labels)
    if graphs is None:
        if root is None:
            raise PerfmodelError("give graphs (a GraphCache) or root (the NeuSight dataset folder)")
        graphs = GraphCache.for_root(root)
    predictors: dict[str, PredictFn] = {}
    op_rows: dict[tuple[str, int, int, str], pd.DataFrame] = {}
    records = []
    for label in labels:
        record: dict[str, Any] = {
            "gpu": label.gpu, "device": label.device, "model": label.model, "mode": label.mode,
            "seq_len": label.seq_len, "batch_size": label.batch_size, "num_layer": label.num_layer,
            "measured_fw_ms": label.fw_ms, "measured_bw_ms": label.bw_ms if label.mode == "train" else np.nan,
            "measured_total_ms": label.e2e_ms, "predicted_fw_ms": np.nan, "predicted_bw_ms": np.nan,
            "predicted_total_ms": np.nan, "rows": 0, "error": None, "label": str(label.path),
        }
        try:
            key = label.graph_key
            if key not in op_rows:
                graph = graphs.get(*key)
                op_rows[key] = graph_op_rows(graph, dtype=dtype, mode=label.mode,
                                             attention_dropout=graphs.attention_dropout(label.model))
            if label.device not in predictors:
                predictors[label.device] = predict_fn_for_device(label.device)
            result = predict_graph_ms(graphs.graphs[key], label.device, predictors[label.device], catalog,
                                      dtype=dtype, mode=label.mode, rows=op_rows[key])
        except PerfmodelError as exc:
            record["error"] = str(exc)
        else:
            record.update(predicted_fw_ms=result["forward_ms"], rows=result["rows"],
                          predicted_bw_ms=result["backward_ms"] if label.mode == "train" else np.nan,
                          predicted_total_ms=result["total_ms"])
        record["ape_fw"] = _ape(record["predicted_fw_ms"], record["measured_fw_ms"])
        record["ape_bw"] = _ape(record["predicted_bw_ms"], record["measured_bw_ms"]) if label.mode == "train" \
            else np.nan
        record["ape_total"] = _ape(record["predicted_total_ms"], record["measured_total_ms"])
        records.append(record)
    return pd.DataFrame.from_records(records, columns=list(RESULT_COLUMNS))


def mape_by(results: pd.DataFrame, column: str | None = "device") -> pd.DataFrame:
    """MAPE (%) of forward, backward and total per `column` value (None: overall), over predicted labels."""
    ok = results[results["error"].isna()]
    metrics = {"labels": ("ape_total", "size"), "mape_fw": ("ape_fw", "mean"), "mape_bw": ("ape_bw", "mean"),
               "mape_total": ("ape_total", "mean")}
    if column is None:
        return ok.assign(_all="all").groupby("_all").agg(**metrics).rename_axis(None)
    return ok.groupby(column).agg(**metrics)
