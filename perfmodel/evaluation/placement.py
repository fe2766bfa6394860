"""Fit and validate the placement model (`perfmodel.placement.iteration`) on measured multi-GPU step times.

Two public data sets (read in place from `../shared/datasets`):

- **adaptdl** (Pollux, OSDI'21; petuum/adaptdl, Apache-2.0): `simulator/traces/<app>/placements.csv`, step and
  all-reduce time per placement (GPUs per node, up to 4 nodes of 4 T4s: AWS g4dn.12xlarge, PCIe gen3, 50 Gb/s
  network) and per-GPU batch, PyTorch DDP, fp32. The compute of a (app, per-GPU batch) is its measured
  single-GPU step time at that batch (`placement == "1"`, interpolated in log-log over the batch where missing):
  the model predicts multi-GPU step times from a job's one-GPU time, as a scheduler does for a job it has seen on
  one GPU. Gradient volume is the model's parameter count (`ADAPTDL_MODELS`, from the architectures Pollux ran).
  Fitted on the other apps: the PCIe link (α, β), the network link (α, β), `dp_overlap` and
  `multi_device_overhead_ms`.
- **vtrain** (MICRO'24; VIA-Research/vTrain, MIT): `data/ground_truth_single.csv`, 1,440 Megatron-DeepSpeed
  iteration times of 8 GPT configurations on 2/4/8 A100s of one node, every tensor/data/pipeline split, with
  activation recomputation, fp16. Compute comes from the per-op device model (`xgb-device-ops`) on the A100 for
  each (configuration, micro-batch); the NVSwitch link is the one fitted to vidur's DGX all-reduce
  (`links.json`). Fitted on the other configurations: `compute_scale`, `tp_penalty`, `dp_overlap`, `overhead_ms`.

Validation is leave-one-model-out: every app (configuration) is held out in turn, the parameters are fitted on
the rest, and the held-out rows are predicted. `bench/placement_fit.py` prints the figures and writes the
parameters fitted on everything to `perfmodel/placement/iteration_params.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from perfmodel.placement.iteration import (
    ComputeArrays,
    IterationParams,
    PlacementArrays,
    ShardCompute,
    iteration_breakdown,
)

FP32_BYTES = 4

# app → (parameters, what was run); the gradient volume of one all-reduce is parameters × 4 bytes (fp32 DDP)
ADAPTDL_MODELS: dict[str, tuple[int, str]] = {
    "cifar10": (11_173_962, "ResNet-18, CIFAR-10 head (torchvision resnet18, num_classes=10)"),
    "imagenet": (25_557_032, "ResNet-50 (torchvision resnet50)"),
    "bert": (108_893_186, "BERT-base + SQuAD span head (transformers BertForQuestionAnswering)"),
    "deepspeech2": (87_000_000, "DeepSpeech2, 5 bidirectional LSTM layers of 1024 (deepspeech.pytorch), ~87 M"),
    "yolov3": (61_949_149, "YOLOv3-416, Darknet-53 backbone"),
    "ncf": (1_602_657, "NeuMF on MovieLens-1M, factor 32, 3 MLP layers (adaptdl examples/NCF)"),
}
FORWARD_SHARE = 1 / 3  # of a measured single-GPU step: forward ≈ 1/3, backward ≈ 2/3 (backward = 2× forward FLOPs)


# --- adaptdl ---------------------------------------------------------------------------------------------------------

def adaptdl_rows(root: str | Path) -> pd.DataFrame:
    """Every placement row of every app with a known model: step/sync ms, layout, and the one-GPU step at that
    per-GPU batch (`single_ms`)."""
    traces = Path(root) / "simulator" / "traces"
    if not traces.is_dir():
        raise FileNotFoundError(f"no adaptdl traces at {traces}")
    frames = []
    for app in ADAPTDL_MODELS:
        df = pd.read_csv(traces / app / "placements.csv", dtype={"placement": str})
        df["app"] = app
        one = df[df.placement == "1"].groupby("local_bsz").step_time.median()
        x, y = np.log(one.index.to_numpy(float)), np.log(one.to_numpy(float))
        df["single_ms"] = np.exp(np.interp(np.log(df.local_bsz.to_numpy(float)), x, y)) * 1e3
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    digits = df.placement.map(lambda s: [int(ch) for ch in s])
    df["devices"] = digits.map(sum)
    df["nodes"] = digits.map(len)
    df["step_ms"] = df.step_time * 1e3
    df["sync_ms"] = df.sync_time * 1e3
    return df[df.devices > 0].reset_index(drop=True)


def adaptdl_compute(df: pd.DataFrame) -> ComputeArrays:
    params = df.app.map(lambda a: ADAPTDL_MODELS[a][0]).to_numpy(float)
    single = df.single_ms.to_numpy(float)
    n = len(df)
    return ComputeArrays(forward_ms=single * FORWARD_SHARE, backward_ms=single * (1 - FORWARD_SHARE),
                         optimizer_ms=np.zeros(n), overhead_ms=np.zeros(n), params=params,
                         gradient_bytes_per_param=np.full(n, FP32_BYTES), layers=np.ones(n),
                         layer_activation_bytes=np.zeros(n))


# θ for adaptdl: log10 of α_intra (ms), β_intra (ms/B), α_inter, β_inter; dp_overlap; multi-device overhead (ms)
ADAPTDL_START = np.array([-2.0, np.log10(1e-6 / 10), -1.0, np.log10(1e-6 / 3), 0.5, 1.0])
ADAPTDL_BOUNDS = ([-5, -9, -5, -9, 0.0, 0.0], [1, -4, 2, -4, 1.0, 200.0])


def adaptdl_placements(df: pd.DataFrame, theta: np.ndarray) -> PlacementArrays:
    n = len(df)
    ones = np.ones(n)
    devices = df.devices.to_numpy(float)
    return PlacementArrays(tensor=ones, pipeline=ones, data=devices, micro_batches=ones, zero_stage=np.zeros(n),
                           checkpointing=np.zeros(n), nodes=df.nodes.to_numpy(float),
                           intra_alpha_ms=ones * 10 ** theta[0], intra_beta_ms_per_byte=ones * 10 ** theta[1],
                           inter_alpha_ms=ones * 10 ** theta[2], inter_beta_ms_per_byte=ones * 10 ** theta[3])


def adaptdl_params(theta: np.ndarray, source: str) -> IterationParams:
    return IterationParams(dp_overlap=float(theta[4]), multi_device_overhead_ms=float(theta[5]), source=source)


def adaptdl_predict(df: pd.DataFrame, theta: np.ndarray) -> np.ndarray:
    out = iteration_breakdown(adaptdl_compute(df), adaptdl_placements(df, theta), adaptdl_params(theta, "fit"))
    return out["iter_time_ms"]


def fit_adaptdl(df: pd.DataFrame) -> np.ndarray:
    multi = df[df.devices > 1]
    measured = multi.step_ms.to_numpy(float)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(adaptdl_predict(multi, theta) / measured)

    return least_squares(residuals, ADAPTDL_START, bounds=ADAPTDL_BOUNDS, loss="soft_l1", f_scale=0.1).x


# --- vtrain ----------------------------------------------------------------------------------------------------------

VTRAIN_COLUMNS = {"# GPUs": "devices", "global batch": "global_batch", "micro batch": "micro_batch",
                  "hidden size": "hidden", "attention heads": "heads", "# layers": "layers",
                  "sequence length": "seq_len", "tensor parallelism": "tp", "data parallelism": "dp",
                  "pipeline parallelism": "pp", "iteration time (ms)": "step_ms"}
VTRAIN_ACCELERATOR = "a100-sxm4-40gb"  # DGX A100 (the data does not say 40 or 80 GB)
# Megatron-DeepSpeed's fp16 recipe, as vTrain's runs train: the half model stepping fp32 master weights through
# DeepSpeed's fused Adam
VTRAIN_RECIPE: dict[str, Any] = {"precision": "fp16-master", "optimizer": "adam", "fused_optimizer": True}


def vtrain_rows(root: str | Path) -> pd.DataFrame:
    path = Path(root) / "data" / "ground_truth_single.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no vtrain ground truth at {path}")
    df = pd.read_csv(path, encoding="utf-8-sig").rename(columns=VTRAIN_COLUMNS)
    df["model"] = "gpt-h" + df.hidden.astype(str) + "-l" + df.layers.astype(str)
    df["micro_batches"] = df.global_batch // (df.micro_batch * df.dp)
    return df


def gpt_config(hidden: int, heads: int, layers: int, seq_len: int) -> dict[str, Any]:
    """The HF GPT-2 config of a Megatron GPT of these sizes (vocabulary of GPT-2, learned positions). Megatron's
    MLP activation is one fused bias-GELU kernel: `gelu` (one kernel) describes it, GPT-2's default `gelu_new`
    (the tanh formula, six element-wise kernels) does not. Its attention is eager (Megatron's default then: the
    scores through memory, scaled, masked and soft-maxed in one fused kernel; FlashAttention only on request, and
    vTrain does not record it)."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": hidden, "n_head": heads,
            "n_layer": layers, "n_positions": seq_len, "vocab_size": 50257, "activation_function": "gelu",
            "attn_implementation": "eager"}


def vtrain_computes(df: pd.DataFrame, predictor: Any, *, say: Callable[[str], None] = lambda _: None
                    ) -> dict[tuple[str, int], ShardCompute]:
    """(model, micro-batch) → the device model's compute of one micro-batch on the A100 (`VTRAIN_RECIPE`)."""
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.jobs.spec import JobSpec

    hardware = get_accelerator(VTRAIN_ACCELERATOR)
    out = {}
    keys = df[["model", "hidden", "heads", "layers", "seq_len", "micro_batch"]].drop_duplicates()
    for i, row in enumerate(keys.itertuples(index=False)):
        spec = JobSpec.from_options(hf_config=gpt_config(row.hidden, row.heads, row.layers, row.seq_len),
                                    batch_size=int(row.micro_batch), seq_len=int(row.seq_len), **VTRAIN_RECIPE)
        out[(row.model, int(row.micro_batch))] = predictor.compute(spec, hardware, int(row.micro_batch))[0]
        say(f"compute {i + 1}/{len(keys)}: {row.model} micro-batch {row.micro_batch}")
    return out


def vtrain_arrays(df: pd.DataFrame, computes: dict[tuple[str, int], ShardCompute], intra: Any
                  ) -> tuple[ComputeArrays, PlacementArrays]:
    c = ComputeArrays.stack([computes[(m, int(b))] for m, b in zip(df.model, df.micro_batch)])
    n = len(df)
    ones = np.ones(n)
    p = PlacementArrays(tensor=df.tp.to_numpy(float), pipeline=df.pp.to_numpy(float), data=df.dp.to_numpy(float),
                        micro_batches=df.micro_batches.to_numpy(float), zero_stage=np.zeros(n), checkpointing=ones,
                        nodes=ones, intra_alpha_ms=ones * intra.alpha_ms,
                        intra_beta_ms_per_byte=ones * intra.beta_ms_per_byte, inter_alpha_ms=ones * intra.alpha_ms,
                        inter_beta_ms_per_byte=ones * intra.beta_ms_per_byte)
    return c, p


# compute_scale, tp_penalty, dp_overlap, overhead_ms, layer_overhead_ms, tp_sync_ms
VTRAIN_START = np.array([1.0, 0.05, 0.5, 5.0, 0.5, 0.05])
VTRAIN_BOUNDS = ([0.05, 0.0, 0.0, 0.0, 0.0, 0.0], [5.0, 1.0, 1.0, 500.0, 50.0, 10.0])


def vtrain_params(theta: np.ndarray, source: str) -> IterationParams:
    return IterationParams(compute_scale=float(theta[0]), tp_penalty=float(theta[1]), dp_overlap=float(theta[2]),
                           overhead_ms=float(theta[3]), layer_overhead_ms=float(theta[4]), tp_sync_ms=float(theta[5]),
                           source=source)


def fit_vtrain(c: ComputeArrays, p: PlacementArrays, measured: np.ndarray) -> np.ndarray:
    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(iteration_breakdown(c, p, vtrain_params(theta, "fit"))["iter_time_ms"] / measured)

    return least_squares(residuals, VTRAIN_START, bounds=VTRAIN_BOUNDS, loss="soft_l1", f_scale=0.1).x


def _take(arrays: Any, mask: np.ndarray) -> Any:
    return replace(arrays, **{k: v[mask] if np.ndim(v) else v for k, v in vars(arrays).items()})  # scalars broadcast


# --- leave one model out ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FoldResult:
    held_out: str
    rows: int
    mape_pct: float
    median_ape_pct: float
    theta: tuple[float, ...]


def leave_one_model_out(models: Sequence[str], fit: Callable[[np.ndarray], np.ndarray],
                        predict: Callable[[np.ndarray, np.ndarray], np.ndarray], measured: np.ndarray,
                        model_of_row: np.ndarray) -> tuple[list[FoldResult], np.ndarray]:
    """Fit on every model but one, predict that one; returns per-fold results and every row's held-out prediction."""
    predicted = np.full(len(measured), np.nan)
    results = []
    for model in models:
        test = model_of_row == model
        theta = fit(~test)
        predicted[test] = predict(theta, test)
        ape = np.abs(predicted[test] - measured[test]) / measured[test] * 100
        results.append(FoldResult(model, int(test.sum()), float(ape.mean()), float(np.median(ape)),
                                  tuple(float(t) for t in theta)))
    return results, predicted


def evaluate_adaptdl(df: pd.DataFrame) -> tuple[list[FoldResult], pd.DataFrame]:
    multi = df[df.devices > 1].reset_index(drop=True)
    measured = multi.step_ms.to_numpy(float)
    results, predicted = leave_one_model_out(
        list(ADAPTDL_MODELS), lambda train: fit_adaptdl(multi[train]),
        lambda theta, test: adaptdl_predict(multi[test], theta), measured, multi.app.to_numpy())
    return results, multi.assign(predicted_ms=predicted)


def evaluate_vtrain(df: pd.DataFrame, c: ComputeArrays, p: PlacementArrays) -> tuple[list[FoldResult], pd.DataFrame]:
    measured = df.step_ms.to_numpy(float)

    def predict(theta: np.ndarray, test: np.ndarray) -> np.ndarray:
        return iteration_breakdown(_take(c, test), _take(p, test), vtrain_params(theta, "fit"))["iter_time_ms"]

    results, predicted = leave_one_model_out(
        sorted(df.model.unique()), lambda train: fit_vtrain(_take(c, train), _take(p, train), measured[train]),
        predict, measured, df.model.to_numpy())
    return results, df.assign(predicted_ms=predicted)
