"""Held-out check of the placement model on measured multi-GPU tensor-parallel LLM inference: Splitwise
(Mutinifni/splitwise-sim, Patel et al., ISCA'24, MIT), `data/perf_model.csv` rows of DGX-A100 (8 × A100-SXM4-80GB,
NVLink/NVSwitch).

Each row of `perf_model.a100-80gb.csv` (`model,hardware,prompt_size,batch_size,token_size,peak_power,
average_power,prompt_time,token_time,e2e_time,tensor_parallel`) is one measured run of a whole model sharded over
`tensor_parallel` GPUs of one node: `batch_size` requests of `prompt_size` input tokens each, `token_size` output
tokens; `prompt_time` (ms) is the prefill of the batch (≈ time to first token), `token_time` (ms) the mean decode
iteration, `e2e_time` (ms) the whole batch. Power 0.0 means not measured. Coverage: Llama-2-70B at TP 2, 4, 8 and
BLOOM-176B at TP 8, 105 rows each: sweeps of batch, prompt and output around (batch 1, prompt 512, output 128),
five repeats per point. The inference engine and its versions are not recorded (see the dataset's PROVENANCE.md).

`parse_perf_model` reads the file (pure: no prediction). `evaluate_prompt_times` predicts the PROMPT time of every
row: the model's Hugging Face config (`MODELS`) as a fp16 inference job of `batch_size` sequences of `prompt_size`
tokens, on `PlacementSpec(accelerator=<catalog id of the hardware>, devices_per_node=(tp,),
parallelism=Parallelism(tensor=tp), global_batch_size=batch)`; the prediction of one (model, batch, prompt) shape
serves every TP degree and every repeat of it (one graph per shape). `summarise` gives MAPE over rows overall and per
(model, tp), and the median APE. These rows are a held-out check: nothing is fitted on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from perfmodel.core.accuracy import ape_pct
from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import HFConfigSource, JobSpec, Mode, Precision
from perfmodel.placement.spec import Parallelism, PlacementSpec

DATA_FILE = "data/perf_model.a100-80gb.csv"
COLUMNS = ("model", "hardware", "prompt_size", "batch_size", "token_size", "peak_power", "average_power",
           "prompt_time", "token_time", "e2e_time", "tensor_parallel")

# Splitwise's hardware names -> catalog ids (dgx-a100.yaml: 8 x a100-80gb processors, the SXM4 80GB part)
ACCELERATORS: dict[str, str] = {"a100-80gb": "a100-sxm4-80gb"}

# the Hugging Face configs of Splitwise's models (config.json of meta-llama/Llama-2-70b-hf and bigscience/bloom).
# Llama-2's max_position_embeddings is 4096; the sweep's 8192-token prompts need the rotary table that long (the
# shapes do not depend on it).
MODELS: dict[str, dict[str, Any]] = {
    "llama2-70b": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
                   "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                   "intermediate_size": 28672, "vocab_size": 32000, "max_position_embeddings": 8192,
                   "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False},
    "bloom-176b": {"model_type": "bloom", "architectures": ["BloomForCausalLM"], "hidden_size": 14336,
                   "n_layer": 70, "n_head": 112, "vocab_size": 250880, "layer_norm_epsilon": 1e-5},
}


@dataclass(frozen=True)
class SplitwiseRow:
    """One measured run: a batch of requests through prefill and decode on `tp` GPUs."""

    source_row: int  # 0-based data row of the file
    model: str
    hardware: str
    tp: int
    batch_size: int
    prompt_tokens: int
    output_tokens: int
    prompt_time_ms: float
    token_time_ms: float
    e2e_time_ms: float
    peak_power: float | None  # fraction of a rated value; None where the file has 0.0 (not measured)
    average_power: float | None

    @property
    def shape(self) -> tuple[str, int, int]:
        """What one captured graph serves: (model, batch, prompt tokens)."""
        return (self.model, self.batch_size, self.prompt_tokens)


def parse_perf_model(path: Path | str) -> list[SplitwiseRow]:
    """The rows of a Splitwise perf_model CSV, in file order. A missing column or a non-numeric cell is a
    `PerfmodelError` naming the row."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise PerfmodelError(f"cannot read {path}: {exc}") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise PerfmodelError(f"{path}: not a Splitwise perf_model file (no column(s) {', '.join(missing)})")
    out = []
    for index, row in enumerate(frame.to_dict("records")):
        try:
            power = {key: float(row[key]) for key in ("peak_power", "average_power")}
            out.append(SplitwiseRow(
                source_row=index, model=row["model"].strip(), hardware=row["hardware"].strip(),
                tp=_positive_int(row["tensor_parallel"]), batch_size=_positive_int(row["batch_size"]),
                prompt_tokens=_positive_int(row["prompt_size"]), output_tokens=_positive_int(row["token_size"]),
                prompt_time_ms=float(row["prompt_time"]), token_time_ms=float(row["token_time"]),
                e2e_time_ms=float(row["e2e_time"]),
                **{key: value if value > 0 else None for key, value in power.items()}))
        except ValueError as exc:
            raise PerfmodelError(f"{path}: data row {index}: {exc}") from None
    return out


def _positive_int(text: str) -> int:
    value = float(text)
    if value != int(value) or value < 1:
        raise ValueError(f"{text!r} is not a positive integer")
    return int(value)


def splitwise_file(datasets: Path | str) -> Path:
    """The staged A100 file, given the folder of all public datasets or the splitwise folder itself."""
    path = Path(datasets)
    for candidate in (path / "splitwise" / DATA_FILE, path / DATA_FILE, path):
        if candidate.is_file():
            return candidate
    raise PerfmodelError(f"no Splitwise data at {path} (expected splitwise/{DATA_FILE})")


def job_spec(model: str, batch_size: int, prompt_tokens: int,
             configs: dict[str, dict[str, Any]] | None = None) -> JobSpec:
    """The prefill of `batch_size` prompts of `prompt_tokens` tokens: an fp16 inference job of the HF config."""
    configs = MODELS if configs is None else configs
    if model not in configs:
        raise PerfmodelError(f"model {model!r} has no HF config here: known {', '.join(configs)}")
    return JobSpec(source=HFConfigSource(config=configs[model]), batch_size=batch_size, seq_len=prompt_tokens,
                   precision=Precision.fp16, mode=Mode.inference)


def placement(hardware: str, tp: int, batch_size: int) -> PlacementSpec:
    """`tp` GPUs of one node, tensor parallel, the whole batch on each (as the measured runs)."""
    accelerator = ACCELERATORS.get(hardware)
    if accelerator is None:
        raise PerfmodelError(f"hardware {hardware!r} has no catalog id here: known {', '.join(ACCELERATORS)}")
    return PlacementSpec(accelerator=accelerator, devices_per_node=(tp,), parallelism=Parallelism(tensor=tp),
                         global_batch_size=batch_size)


def shapes(rows: Iterable[SplitwiseRow], max_shapes: int | None = None) -> list[tuple[str, int, int]]:
    """The distinct (model, batch, prompt) shapes, cheapest first (batch × prompt tokens, then model, batch);
    at most `max_shapes` of them."""
    distinct = sorted({r.shape for r in rows}, key=lambda s: (s[1] * s[2], s[0], s[1]))
    return distinct if max_shapes is None else distinct[:max(max_shapes, 0)]


PredictFn = Callable[[JobSpec, PlacementSpec], Any]  # -> a perfmodel Prediction (iter_time_ms, breakdown_ms)

RESULT_COLUMNS = ("source_row", "model", "tp", "batch_size", "prompt_tokens", "measured_prompt_ms",
                  "predicted_prompt_ms", "ape", "predicted_compute_ms", "predicted_communication_ms", "fits")


def evaluate_prompt_times(rows: Sequence[SplitwiseRow], predict: PredictFn, *, max_shapes: int | None = None,
                          configs: dict[str, dict[str, Any]] | None = None,
                          on_shape: Callable[[tuple[str, int, int], float], None] | None = None) -> pd.DataFrame:
    """Every row of the first `max_shapes` shapes with its predicted prompt time (`RESULT_COLUMNS`); `predict`
    is called once per (shape, TP degree). `on_shape(shape, seconds)` is told how long each shape took."""
    import time

    kept = shapes(rows, max_shapes)
    by_shape: dict[tuple[str, int, int], list[SplitwiseRow]] = {}
    for r in rows:
        by_shape.setdefault(r.shape, []).append(r)
    records = []
    for shape in kept:
        started = time.perf_counter()
        model, batch, prompt = shape
        spec = job_spec(model, batch, prompt, configs)
        predictions: dict[tuple[str, int], Any] = {}
        for r in by_shape[shape]:
            key = (r.hardware, r.tp)
            if key not in predictions:
                predictions[key] = predict(spec, placement(r.hardware, r.tp, r.batch_size))
            p = predictions[key]
            b = p.breakdown_ms
            records.append({
                "source_row": r.source_row, "model": model, "tp": r.tp, "batch_size": batch, "prompt_tokens": prompt,
                "measured_prompt_ms": r.prompt_time_ms, "predicted_prompt_ms": p.iter_time_ms,
                "ape": ape(p.iter_time_ms, r.prompt_time_ms),
                "predicted_compute_ms": b.get("forward", 0.0) + b.get("backward", 0.0),
                "predicted_communication_ms": b.get("communication", 0.0), "fits": bool(p.fits)})
        if on_shape is not None:
            on_shape(shape, time.perf_counter() - started)
    return pd.DataFrame(records, columns=list(RESULT_COLUMNS)).sort_values("source_row", ignore_index=True)


def ape(predicted: float, measured: float) -> float:
    """|predicted − measured| / measured, in %."""
    return float(ape_pct(predicted, measured)) if measured > 0 else math.nan


def summarise(results: pd.DataFrame) -> pd.DataFrame:
    """MAPE (%) and median APE (%) over rows, per (model, tp) and overall (model "all"), with the row count and
    the mean measured and predicted prompt times."""
    def stats(group: pd.DataFrame) -> dict[str, Any]:
        return {"rows": len(group), "mape": float(np.mean(group["ape"])), "median_ape": float(np.median(group["ape"])),
                "measured_mean_ms": float(group["measured_prompt_ms"].mean()),
                "predicted_mean_ms": float(group["predicted_prompt_ms"].mean())}

    # pandas-stubs type a group key Hashable: here it is the (model, tp) pair
    groups = cast("Iterable[tuple[tuple[str, int], pd.DataFrame]]", results.groupby(["model", "tp"]))
    out = [{"model": model, "tp": int(tp), **stats(group)} for (model, tp), group in groups]
    if len(results):
        out.append({"model": "all", "tp": None, **stats(results)})
    return pd.DataFrame(out, columns=["model", "tp", "rows", "mape", "median_ape", "measured_mean_ms",
                                      "predicted_mean_ms"])
