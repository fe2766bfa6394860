"""Whole-model training steps on GPUs held out of training: every public whole-model training measurement we have,
predicted by a per-op device model fitted without the GPU's chip (leave-one-GPU-out), split by math mode.

Measurements (`StepMeasurement`, one per measured configuration):

| source | what is measured | GPUs | math | what is predicted |
|---|---|---|---|---|
| NeuSight labels (`neusight/label/<GPU>/*-train-*.json`) | forward + backward of HF BERT-Large, GPT2-Large, GPT3-XL, OPT-1.3B (eager attention, PyTorch 2.1, no optimizer) | V100, A100 PCIe, P100, T4, P4, MI100, MI210 | fp32 (no convolutions: fp32 = fp32-strict) | forward + backward |
| adaptdl (Pollux) `placements.csv`, placement `1` | one T4's step (step − all-reduce time) of ResNet-18 CIFAR-10 (SGD), ResNet-50 ImageNet (SGD) and BERT-base SQuAD (seq 384, AdamW), per batch size | T4 | as the artifact's scripts run them (`benchmark/models/<app>/`): ResNet-18 in fp32 (PyTorch 1.5), ResNet-50 in `amp` (its `main.py` wraps model and optimizer in apex's `amp.initialize` at the default opt level, O1: per-op casts), BERT in fp32 (`run_squad.py` without `--fp16`; Turing has no TF32, so fp32 = fp32-strict); ResNet-50 and BERT on NVIDIA's 20.10 container, PyTorch 1.7 | forward + backward + optimizer |
| vTrain `ground_truth_single.csv`, data-parallel rows (tensor = pipeline = 1) | Megatron GPT iteration on 2, 4, 8 A100s (fp16, activation checkpointing) | A100 | fp16 | the placement model (`default` parameters) over the held-out device model's compute |

Leave-one-GPU-out by *chip* (`chip_of`: a100-pcie-40gb and a100-sxm4-80gb are one chip): the device model that
predicts a measurement on chip X is fitted on the op measurements of every other chip, so vidur's A100-80GB rows
never help predict NeuSight's A100-40GB. The placement model's `default` parameters were fitted on adaptdl (DP
overlap, T4) and vTrain (TP sync): the vTrain data-parallel rows use its DP overlap and overhead, not its compute
scale (the default has none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from perfmodel.core.accuracy import ape_pct
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.evaluation.device_ops import chip_of
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import Parallelism, PlacementSpec

if TYPE_CHECKING:
    from perfmodel.placement.iteration import IterationParams
    from perfmodel.predictor.gpu_iteration import DevicePredictor
    from perfmodel.predictor.whole_step import WholeStepStage

# adaptdl's BERT ran Hugging Face transformers of 2020: eager attention (no fused SDPA then)
BERT_BASE = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
             "attn_implementation": "eager"}
# adaptdl apps with a model perfmodel can build as the artifact ran it (`benchmark/models/<app>/` of the
# osdi21-artifact branch): the job options of one GPU's step; the batch is each measurement's. The ImageNet script
# calls apex's `amp.initialize(model, optimizer)` with no opt level, so O1 (per-op casts: `amp`); the BERT job's
# `run_squad.py` arguments have no `--fp16`, so fp32; both images build on NVIDIA's 20.10 container (PyTorch 1.7).
# CIFAR-10 trains kuangliu's ResNet-18 (the zoo's `gavel-resnet18`, as Gavel's copy of it) in fp32 with SGD, cuDNN's
# autotuner on, on NVIDIA's 20.03 container (PyTorch 1.5)
ADAPTDL_JOBS: dict[str, dict[str, Any]] = {
    "cifar10": dict(zoo="gavel-resnet18", optimizer="sgd", precision="fp32", pytorch_version="1.5"),
    "imagenet": dict(zoo="resnet50", optimizer="sgd", precision="amp", pytorch_version="1.7"),
    "bert": dict(hf_config=BERT_BASE, task="question-answering", seq_len=384, optimizer="adamw", precision="fp32",
                 pytorch_version="1.7"),
}
@dataclass(frozen=True)
class StepMeasurement:
    source: str
    name: str  # model as the source names it
    device: str  # catalog id
    spec: JobSpec  # the job as it ran (batch = one device's)
    measured_ms: float
    includes_optimizer: bool
    placement: PlacementSpec | None = None  # multi-device runs (vTrain); None: one device
    graph_key: tuple[Any, ...] = field(default=())  # measurements with equal keys share one graph


def neusight_measurements(root: str | Path, catalog: Mapping[str, HardwareSpec]) -> list[StepMeasurement]:
    from perfmodel.evaluation.neusight_models import GraphCache, load_labels

    graphs = GraphCache.for_root(root)
    out = []
    for label in load_labels(root, catalog):
        if label.mode != "train":
            continue
        config = graphs.config(label.model, label.mode)
        spec = JobSpec.from_options(hf_config=config, batch_size=label.batch_size, seq_len=label.seq_len,
                                    precision="fp32", optimizer="adamw")
        out.append(StepMeasurement("neusight", label.model, label.device, spec, label.fw_ms + label.bw_ms, False,
                                   graph_key=("neusight", label.model, label.batch_size, label.seq_len)))
    return out


def adaptdl_measurements(root: str | Path) -> list[StepMeasurement]:
    traces = Path(root) / "simulator" / "traces"
    if not traces.is_dir():
        raise FileNotFoundError(f"no adaptdl traces at {traces}")
    out = []
    for app, job in ADAPTDL_JOBS.items():
        df = pd.read_csv(traces / app / "placements.csv", dtype={"placement": str})
        one = df[df.placement == "1"].assign(compute_ms=lambda d: (d.step_time - d.sync_time) * 1e3)
        for batch, compute_ms in one.groupby("local_bsz").compute_ms.median().items():
            spec = JobSpec.from_options(batch_size=int(batch), **job)
            out.append(StepMeasurement("adaptdl", app, "t4", spec, float(compute_ms), True,
                                       graph_key=("adaptdl", app, int(batch))))
    return out


def vtrain_measurements(root: str | Path, max_rows: int | None = None) -> list[StepMeasurement]:
    from perfmodel.evaluation.placement import VTRAIN_ACCELERATOR, VTRAIN_RECIPE, gpt_config, vtrain_rows

    df = vtrain_rows(root)
    df = df[(df.tp == 1) & (df.pp == 1)]
    if max_rows is not None:
        df = df.sort_values(["model", "micro_batch", "devices"]).head(max_rows)
    out = []
    for row in df.itertuples(index=False):
        # Megatron pretrains on fixed-length sequences read from a memory-mapped, pre-tokenized data set: its steps
        # do not vary (`steps_vary`), and its replicas wait for the slowest by the steady kind's jitter
        spec = JobSpec.from_options(hf_config=gpt_config(row.hidden, row.heads, row.layers, row.seq_len),
                                    batch_size=int(row.micro_batch), seq_len=int(row.seq_len), **VTRAIN_RECIPE,
                                    steps_vary=False)
        placement = PlacementSpec(
            accelerator=VTRAIN_ACCELERATOR, devices_per_node=(int(row.devices),),
            global_batch_size=int(row.global_batch),
            parallelism=Parallelism(data=int(row.dp), micro_batches=int(row.micro_batches),
                                    activation_checkpointing=True))
        out.append(StepMeasurement("vtrain", row.model, VTRAIN_ACCELERATOR, spec, float(row.step_ms), True,
                                   placement=placement, graph_key=("vtrain", row.model, int(row.micro_batch))))
    return out


def predict_measurements(measurements: Iterable[StepMeasurement],
                         predictor_for_chip: Callable[[str], DevicePredictor], *,
                         params: IterationParams | None = None, progress: Callable[[str], None] = lambda _: None,
                         predictors: dict[str, DevicePredictor] | None = None,
                         host_ms_per_kernel: float | None = None,
                         whole_step: WholeStepStage | None = None) -> pd.DataFrame:
    """One row per measurement with `predicted_ms` and `ape`. `predictor_for_chip(chip)` gives the
    `DevicePredictor` fitted without that chip (called once per chip; `predictors` keeps them between calls).
    `host_ms_per_kernel`, when given, replaces the predictors' host dispatch cost; `whole_step` (a
    `WholeStepStage`), when given, corrects each composed step as the service does."""
    from perfmodel.graph import graph_for_job
    from perfmodel.predictor.batch_sweep import table_key
    from perfmodel.predictor.device_ops import BACKWARD, FORWARD
    from perfmodel.predictor.gpu_iteration import OPTIMIZER, job_rows
    from perfmodel.predictor.placed import PlacementPredictor

    graphs: dict[tuple[Any, ...], Graph] = {}
    job_rows_cache: dict[tuple[Any, ...], pd.DataFrame] = {}
    predictors = {} if predictors is None else predictors
    records = []
    for m in measurements:
        chip = chip_of(m.device)
        record = {"source": m.source, "model": m.name, "device": m.device, "chip": chip,
                  "precision": m.spec.precision.value, "batch_size": m.spec.batch_size, "seq_len": m.spec.seq_len,
                  "devices": m.placement.devices if m.placement else 1, "measured_ms": m.measured_ms,
                  "predicted_ms": np.nan, "error": None}
        try:
            if chip not in predictors:
                progress(f"fitting the device model without {chip}")
                predictors[chip] = predictor_for_chip(chip)
            device = predictors[chip]
            if host_ms_per_kernel is not None:
                device.host_ms_per_kernel = host_ms_per_kernel
            if m.graph_key not in graphs:
                graphs[m.graph_key] = graph_for_job(m.spec)
            graph = graphs[m.graph_key]
            if m.placement is not None:
                placed = PlacementPredictor(None, device, params, whole_step=whole_step)
                placed._graphs.put(m.spec.key(), graph)  # the micro-batch graph, captured above
                record["predicted_ms"] = placed.predict(m.spec, m.placement, graph=graph).iter_time_ms
            else:
                phases = (FORWARD, BACKWARD) + ((OPTIMIZER,) if m.includes_optimizer else ())
                if whole_step is not None:  # the composed step and what it is made of, corrected as served
                    single, features = device.predict_composed(m.spec, m.device, graph=graph, phases=phases)
                    record["predicted_ms"] = whole_step.correct_job(single, features, m.spec,
                                                                    device.catalog[m.device]).iter_time_ms
                else:
                    hardware = device.catalog[m.device]
                    key = (m.graph_key, table_key(m.spec.precision, hardware), m.spec.channels_last,
                           m.spec.optimizer, m.spec.fused_optimizer)
                    if key not in job_rows_cache:
                        job_rows_cache[key] = job_rows(m.spec, graph, hardware)
                    rows, out = device.predict_rows(m.spec, hardware, graph, job_rows_cache[key])
                    record["predicted_ms"] = sum(device.breakdown(rows, out.latency_ms, phases).values())
        except PerfmodelError as exc:
            record["error"] = str(exc)
        records.append(record)
    df = pd.DataFrame.from_records(records)
    df["ape"] = ape_pct(df.predicted_ms, df.measured_ms)
    return df


def summary(results: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    ok = results[results.error.isna()]
    return ok.groupby(by).agg(n=("ape", "size"), mape=("ape", "mean"), median_ape=("ape", "median"),
                              max_ape=("ape", "max"),
                              bias=("predicted_ms", "sum")).assign(
        bias=lambda t: t.bias / ok.groupby(by).measured_ms.sum())

