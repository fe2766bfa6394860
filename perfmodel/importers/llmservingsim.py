"""LLMServingSim (casys-kaist/LLMServingSim, MIT): per-layer LLM inference latencies as rows of the op schema.

Read (paths relative to the dataset root, see its PROVENANCE.md), every file of one model on one GPU at one
tensor-parallel degree `tp<N>`:

- section 1, `profiler/perf/<HW>/<org>/<model>/bf16/tp<N>/` (vLLM 0.19 layer hooks, bf16, eager, one-layer model,
  mean of 3 forwards, MICROSECONDS): `dense.csv` `layer,tokens,time_us` and `per_sequence.csv`
  `layer,sequences,time_us`; `moe.csv` and `attention.csv` are read only to count their rows as skipped.
- section 2, `profiler/v0/perf_models/<HW>/<org>/<model>/tp<N>/` (the legacy profiler: Hugging Face Transformers
  modules with timers, fp16, prefill of 1..2048 tokens, median of 30, NANOSECONDS): `layers.csv`
  `layer_name,input,kv_cache,tp_size,latency(ns)`; `attention.csv` is read only to count its rows as skipped.

Not read: `skew.csv` / `skew_fit.csv` (decode attention with mixed KV lengths, and a fit of it), the serving runs
under `bench/`.

TP>1 is emulated on ONE GPU in both sections: the per-rank shapes of a `tp`-way shard are run (heads, KV heads,
intermediate size and vocabulary divided by `tp`), no collective is timed. Section 1's layers its catalog marks
TP-stable are measured at TP=1 and copied into `tp2/` (at this commit: `layernorm`, `final_layernorm`, `sampler`
and Qwen3's `qk_norm`, whose work does shrink with TP): a layer of a `tp<N>` file whose every (count, time) equals
the `tp1` file's is such a copy, skipped and counted (the tp1 record is the measurement; the copy's time is not
that of the TP-N shape). The model dimensions come from `MODELS` (the HF configs);
section 1's `meta.yaml` `engine_effective.hf_overrides` (the shard of the last TP degree run) is checked against
them, and a model whose table disagrees is skipped, not guessed.

Mapping, with T = tokens (section 2: `input`, a prefill of one sequence), S = sequences, h = hidden, d = head
dim, q = heads·d / tp, kv = kv_heads·d / tp, f = intermediate / tp, V = vocab / tp (records: `op_class`, `op_name`,
shape; the upstream layer name is `extra["layer"]`):

| layer (section 1 / section 2) | record |
|---|---|
| qkv_proj / q_proj, k_proj, v_proj | `linear` m = T, k = h, n = q + 2 kv / q / kv / kv |
| o_proj | `linear` m = T, k = q, n = h |
| gate_up_proj / gate_proj, up_proj | `linear` m = T, k = h, n = 2 f / f / f |
| down_proj | `linear` m = T, k = f, n = h |
| lm_head | `linear` m = S (vLLM's LogitsProcessor: the sampled positions) / m = T (HF: every position), k = h, n = V |
| layernorm / input_layernorm, post_layernorm | `layernorm` batch = T, hidden = h (RMSNorm; Phi-MoE: LayerNorm). vLLM's `layernorm` is the per-call mean of the input norm and the post-attention norm (fused residual add + RMSNorm) |
| final_layernorm | `layernorm` batch = T, hidden = h |
| qk_norm (Qwen3) | `layernorm` batch = T·(q + kv) / d, hidden = d: q_norm and k_norm, two kernels summed |
| act_fn | `elementwise mul` batch = T, hidden = f (Phi-MoE: its one expert's f_e): SiLU(gate) × up reads 2 f and writes f per token |
| rotary_emb / rope | `elementwise mulu` batch = T, hidden = q + kv: q and k rotated (vLLM: one in-place kernel; HF: eager apply_rotary_pos_emb, several kernels) |
| embedding | `elementwise addu` batch = T, hidden = h: a row gather (reads and writes T × h) |
| expert.w1, expert.w3 / expert.w2 (Phi-MoE) | `linear` m = T, k = h, n = f_e / m = T, k = f_e, n = h: the profiler runs ONE expert over all T tokens (unsharded f_e) |
| sampler, attention, attn, moe, gate (Phi-MoE router + top-2 selection) | skipped, counted: no op class of the schema |

dtype: bf16 (section 1), fp16 (section 2); phase forward. Every record's `extra` holds the model, the TP degree
(also in `tensor_parallel`), the HW folder and the layer; `num_tokens` is T (S for the per-sequence layers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.units import ns_to_ms, us_to_ms
from perfmodel.importers.common import (
    DatasetImporter,
    DeviceResolver,
    ImportStats,
    Mapped,
    compact,
    integer,
    number,
    read_csv,
    relative,
    rows,
)
from perfmodel.profilers.external import DType, OpClass, OpMeasurement

SOURCE: Final = "llmservingsim"

# the HW folders -> the driver's device name (section 1's meta.yaml `gpu` is tried too)
DEVICES: dict[str, tuple[str, ...]] = {
    "RTX4090": ("NVIDIA GeForce RTX 4090",),
    "RTXPRO6000": ("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
    "A6000": ("NVIDIA RTX A6000",),
    "RTX3090": ("NVIDIA GeForce RTX 3090",),
}


@dataclass(frozen=True)
class ModelDims:
    """The HF config numbers the layer shapes need (unsharded)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the dense MLP's (Qwen3-30B-A3B: the config's, unused by its MoE layers)
    vocab: int
    norm: str = "rmsnorm"  # the decoder's norm kind (Phi-MoE: layernorm)
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0


# Hugging Face configs (config.json of each checkpoint). Phi-mini-MoE's head split is Phi-3.5-MoE's (32 heads,
# 8 KV heads of 128); only the widths enter the shapes (q = h, kv = h / 4), and the measured k_proj / q_proj time
# ratio (0.26 at 2048 tokens) agrees with them.
MODELS: dict[str, ModelDims] = {
    "meta-llama/Llama-3.1-8B": ModelDims(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                                         vocab=128256),
    "Qwen/Qwen3-32B": ModelDims(hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": ModelDims(hidden=2048, heads=32, kv_heads=4, head_dim=128, intermediate=6144,
                                                  vocab=151936, experts=128, top_k=8, expert_intermediate=768),
    "microsoft/Phi-mini-MoE-instruct": ModelDims(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=960,
                                                 vocab=32064, norm="layernorm", experts=16, top_k=2,
                                                 expert_intermediate=960),
}


@dataclass(frozen=True)
class Shard:
    """One model at one TP degree: the per-rank widths."""

    dims: ModelDims
    tp: int

    @property
    def h(self) -> int:
        return self.dims.hidden

    @property
    def d(self) -> int:
        return self.dims.head_dim

    @property
    def q(self) -> int:
        return self.dims.heads * self.dims.head_dim // self.tp

    @property
    def kv(self) -> int:
        return self.dims.kv_heads * self.dims.head_dim // self.tp

    @property
    def f(self) -> int:
        return self.dims.intermediate // self.tp

    @property
    def vocab(self) -> int:
        return self.dims.vocab // self.tp

    @property
    def expert_f(self) -> int:
        return self.dims.expert_intermediate


Rule = Callable[[Shard, int], Mapped]  # (shard, T or S) -> record


def _linear(m: Callable[[Shard, int], int], k: Callable[[Shard], int], n: Callable[[Shard], int],
            **detail: Any) -> Rule:
    return lambda s, t: Mapped("linear", "linear", {"batch": 1, "m": m(s, t), "k": k(s), "n": n(s)}, dict(detail))


def _tokens(s: Shard, t: int) -> int:
    return t


def _vector(op_class: OpClass, op_name: str, batch: Callable[[Shard, int], int], hidden: Callable[[Shard], int],
            detail: Callable[[Shard], dict[str, Any]] = lambda s: {}) -> Rule:
    return lambda s, t: Mapped(op_class, op_name, {"batch": batch(s, t), "hidden": hidden(s)}, detail(s))


def _norm(**facts: Any) -> Rule:
    return _vector("layernorm", "layernorm", _tokens, lambda s: s.h, lambda s: {"norm": s.dims.norm, **facts})


_EMBEDDING = _vector("elementwise", "addu", _tokens, lambda s: s.h,
                     lambda s: {"kernel": "embedding row gather", "vocab_rows": s.vocab})
_SILU_AND_MUL = _vector("elementwise", "mul", _tokens, lambda s: s.f,
                        lambda s: {"activation": "silu_and_mul", "input_width": 2 * s.f})

# section 1: vLLM 0.19 layers (profiler/models/*.yaml catalogs)
VLLM_RULES: dict[str, Rule] = {
    "embedding": _EMBEDDING,
    "layernorm": _norm(calls="mean of the input norm (rms_norm) and the post-attention norm "
                             "(fused_add_rms_norm)"),
    "final_layernorm": _norm(fused_residual_add=True),
    "qkv_proj": _linear(_tokens, lambda s: s.h, lambda s: s.q + 2 * s.kv),
    "qk_norm": _vector("layernorm", "layernorm", lambda s, t: t * (s.q + s.kv) // s.d, lambda s: s.d,
                       lambda s: {"norm": "rmsnorm", "kernels": 2, "calls": "q_norm + k_norm, summed"}),
    "rotary_emb": _vector("elementwise", "mulu", _tokens, lambda s: s.q + s.kv,
                          lambda s: {"kernel": "rotary_embedding, in place on q and k", "head_dim": s.d}),
    "o_proj": _linear(_tokens, lambda s: s.q, lambda s: s.h),
    "gate_up_proj": _linear(_tokens, lambda s: s.h, lambda s: 2 * s.f),
    "act_fn": _SILU_AND_MUL,
    "down_proj": _linear(_tokens, lambda s: s.f, lambda s: s.h),
    "lm_head": _linear(_tokens, lambda s: s.h, lambda s: s.vocab, layer_class="LogitsProcessor"),
}
# section 2: the legacy Hugging Face profiler (llm_profile/models/{llama,phimoe}.py)
V0_RULES: dict[str, Rule] = {
    "embedding": _EMBEDDING,
    "q_proj": _linear(_tokens, lambda s: s.h, lambda s: s.q),
    "k_proj": _linear(_tokens, lambda s: s.h, lambda s: s.kv),
    "v_proj": _linear(_tokens, lambda s: s.h, lambda s: s.kv),
    "o_proj": _linear(_tokens, lambda s: s.q, lambda s: s.h),
    "gate_proj": _linear(_tokens, lambda s: s.h, lambda s: s.f),
    "up_proj": _linear(_tokens, lambda s: s.h, lambda s: s.f),
    # dense MLP: SiLU(gate) x up of this rank; Phi-MoE's act_fn is its one expert's, unsharded
    "act_fn": lambda s, t: (_SILU_AND_MUL(s, t) if not s.dims.experts else Mapped(
        "elementwise", "mul", {"batch": t, "hidden": s.expert_f},
        {"activation": "silu_and_mul", "input_width": 2 * s.expert_f, "expert": True})),
    "down_proj": _linear(_tokens, lambda s: s.f, lambda s: s.h),
    "lm_head": _linear(_tokens, lambda s: s.h, lambda s: s.vocab, positions="every input position"),
    "expert.w1": _linear(_tokens, lambda s: s.h, lambda s: s.expert_f, expert="one expert over all tokens"),
    "expert.w3": _linear(_tokens, lambda s: s.h, lambda s: s.expert_f, expert="one expert over all tokens"),
    "expert.w2": _linear(_tokens, lambda s: s.expert_f, lambda s: s.h, expert="one expert over all tokens"),
}
# section 1's variant folders -> the storage dtype (an fp8 bundle would need its own mapping: skipped)
VARIANT_DTYPES: dict[str, DType] = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
# layers with no op class of the schema -> why
SKIPPED_LAYERS: dict[str, str] = {
    "sampler": "sampler (top-k/top-p sampling kernels)",
    "attn": "attention (FlashAttention / SDPA: no op class)",
    "gate": "MoE router (gate linear + sparsemixer top-2 kernels, timed together)",
    # the legacy profiler times Hugging Face's eager modules: its RMSNorm (to fp32, pow, mean, add, rsqrt, mul,
    # to fp16, mul) and rotary embedding (slices, neg, cat, mul, add) are 5-8 kernels timed as one, which no one
    # op row describes (imported as one layer norm, they taught the model layer norms 2-5x too slow)
    "input_layernorm": "eager Hugging Face RMSNorm/LayerNorm: several kernels timed as one",
    "post_layernorm": "eager Hugging Face RMSNorm/LayerNorm: several kernels timed as one",
    "final_layernorm": "eager Hugging Face RMSNorm/LayerNorm: several kernels timed as one",
    "rope": "eager Hugging Face rotary embedding: several kernels timed as one",
}

SECTION1 = "profiler/perf"
SECTION2 = "profiler/v0/perf_models"
FILE_PATTERNS = (
    f"{SECTION1}/*/*/*/*/tp*/dense",
    f"{SECTION1}/*/*/*/*/tp*/per_sequence",
    f"{SECTION1}/*/*/*/*/tp*/moe",
    f"{SECTION1}/*/*/*/*/tp*/attention",
    f"{SECTION2}/*/*/*/tp*/layers",
    f"{SECTION2}/*/*/*/tp*/attention",
)
MARKERS = (SECTION1, SECTION2)


@dataclass(frozen=True)
class FileKind:
    """How a data file reads: its layer, count and time columns, the time unit, the dtype and the rules."""

    layer: str | None  # None: every row is skipped (named by `skip`)
    count: str
    time: str
    to_ms: Callable[[float], float]
    dtype: DType  # section 2's; section 1 takes it from its variant folder
    rules: dict[str, Rule]
    skip: str = ""


FILE_KINDS: dict[tuple[str, str], FileKind] = {  # (section, file stem) -> kind
    (SECTION1, "dense"): FileKind("layer", "tokens", "time_us", us_to_ms, "bf16", VLLM_RULES),
    (SECTION1, "per_sequence"): FileKind("layer", "sequences", "time_us", us_to_ms, "bf16", VLLM_RULES),
    (SECTION1, "moe"): FileKind(None, "", "", us_to_ms, "bf16", {}, "MoE block (fused experts: no op class)"),
    (SECTION1, "attention"): FileKind(None, "", "", us_to_ms, "bf16", {}, SKIPPED_LAYERS["attn"]),
    (SECTION2, "layers"): FileKind("layer_name", "input", "latency(ns)", ns_to_ms, "fp16", V0_RULES),
    (SECTION2, "attention"): FileKind(None, "", "", ns_to_ms, "fp16", {}, SKIPPED_LAYERS["attn"]),
}


@dataclass(frozen=True)
class Bundle:
    """Where a file sits: section, HW folder, model (org/name), TP degree, and the folder holding meta.yaml."""

    section: str
    hardware: str
    model: str
    tp: int
    stem: str
    variant: str | None  # section 1's dtype folder (bf16)
    meta: Path | None


def _bundle(root: Path, path: Path) -> Bundle:
    name = relative(root, path)
    stem = path.name.removesuffix(".gz").removesuffix(".csv")
    section = SECTION1 if name.startswith(SECTION1 + "/") else SECTION2
    parts = name[len(section) + 1:].split("/")  # <HW>/<org>/<model>/[bf16/]tp<N>/<file>
    tp = integer(parts[-2].removeprefix("tp"))
    if tp is None or tp < 1:
        raise PerfmodelError(f"{name}: the folder {parts[-2]!r} does not name a TP degree (tp<N>)")
    if section == SECTION1:
        return Bundle(section, parts[0], "/".join(parts[1:3]), tp, stem, parts[3], path.parent.parent / "meta.yaml")
    return Bundle(section, parts[0], "/".join(parts[1:3]), tp, stem, None, None)


def read_meta(path: Path) -> dict[str, Any]:
    """A bundle's meta.yaml as a dict ({} when there is none)."""
    import yaml

    try:
        return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    except (OSError, yaml.YAMLError) as exc:
        raise PerfmodelError(f"cannot read {path}: {exc}") from None


def override_mismatches(dims: ModelDims, meta: dict[str, Any]) -> list[str]:
    """Where meta.yaml's `hf_overrides` (the shard of the last TP degree run) disagree with `dims`; [] if none."""
    overrides = (meta.get("engine_effective") or {}).get("hf_overrides") or {}
    degrees = meta.get("tp_degrees") or [1]
    tp = max(int(d) for d in degrees)
    expected = {"intermediate_size": dims.intermediate // tp, "num_attention_heads": dims.heads // tp,
                "num_key_value_heads": dims.kv_heads // tp, "vocab_size": dims.vocab // tp}
    return [f"{key} {overrides[key]} (table: {value} at tp{tp})" for key, value in expected.items()
            if key in overrides and integer(overrides[key]) != value]


def _records(root: Path, paths: list[Path], stats: ImportStats, resolve: DeviceResolver) -> Iterator[OpMeasurement]:
    metas: dict[Path, dict[str, Any]] = {}  # each meta.yaml read once per import
    for path in paths:
        name = relative(root, path)
        bundle = _bundle(root, path)
        kind = FILE_KINDS.get((bundle.section, bundle.stem))
        stats.files.append(name)
        frame = read_csv(path)
        if kind is None or kind.layer is None:
            stats.skipped[kind.skip if kind else f"unknown llmservingsim file {bundle.stem}"] += len(frame)
            continue
        meta = {} if bundle.meta is None else metas.setdefault(bundle.meta, read_meta(bundle.meta))
        device_name = DEVICES.get(bundle.hardware, (str(meta.get("gpu") or bundle.hardware),))[0]
        device = resolve(bundle.hardware, *([str(meta["gpu"])] if meta.get("gpu") else []),
                         *DEVICES.get(bundle.hardware, ()))
        if device is None:
            stats.unknown_devices[device_name] += len(frame)
            continue
        dims = MODELS.get(bundle.model)
        if dims is None:
            stats.skipped[f"model {bundle.model} not in the dimension table"] += len(frame)
            continue
        mismatches = override_mismatches(dims, meta)
        if mismatches:
            stats.skipped[f"{bundle.model}: meta.yaml hf_overrides disagree with the table: "
                          f"{'; '.join(mismatches)}"] += len(frame)
            continue
        dtype = VARIANT_DTYPES.get(bundle.variant) if bundle.variant is not None else kind.dtype
        if dtype is None:
            stats.skipped[f"variant {bundle.variant} (no dtype mapping)"] += len(frame)
            continue
        missing = [c for c in (kind.layer, kind.count, kind.time) if c not in frame.columns]
        if missing:
            raise PerfmodelError(f"{name}: no column(s) {', '.join(missing)} (expected {kind.layer}, {kind.count}, "
                                 f"{kind.time})")
        copied: set[str] = set()
        tp1 = path.parent.parent / "tp1" / path.name
        if bundle.section == SECTION1 and bundle.tp > 1 and tp1.is_file():
            copied = copied_layers(frame, read_csv(tp1), kind)
        facts = {"model": bundle.model, "hardware": bundle.hardware, "tp": bundle.tp,
                 "profiler": "vllm-0.19 layer hooks" if bundle.section == SECTION1 else "hf-transformers timers"}
        yield from (stats.count(r) for r in _layer_records(name, frame, kind, bundle, Shard(dims, bundle.tp),
                                                            device, dtype, facts, stats, copied))


def copied_layers(frame: Any, tp1_frame: Any, kind: FileKind) -> set[str]:
    """The layers of a tp<N> file whose (count, time) series equals the tp1 file's: copies, not measurements."""
    def series(f: Any) -> dict[str, list[tuple[Any, Any]]]:
        return {str(layer): sorted(zip(group[kind.count], group[kind.time]))
                for layer, group in f.groupby(kind.layer, sort=False)}

    ours, theirs = series(frame), series(tp1_frame)
    return {layer for layer, values in ours.items() if theirs.get(layer) == values}


def _layer_records(name: str, frame: Any, kind: FileKind, bundle: Bundle, shard: Shard, device: str, dtype: DType,
                   facts: dict[str, Any], stats: ImportStats, copied: set[str]) -> Iterator[OpMeasurement]:
    layer_column = kind.layer
    if layer_column is None:  # a file kind without layers: the caller skips its files whole
        return
    for index, row in rows(frame):
        layer = str(row[layer_column])
        rule = kind.rules.get(layer)
        if rule is None:
            stats.skipped[SKIPPED_LAYERS.get(layer, f"layer {layer!r} (no mapping)")] += 1
            continue
        if layer in copied:
            stats.skipped["TP-stable layer copied from tp1 (the tp1 record is the measurement)"] += 1
            continue
        tp = integer(row.get("tp_size"))
        if tp is not None and tp != bundle.tp:
            stats.skipped[f"tp_size {tp} disagrees with the folder tp{bundle.tp}"] += 1
            continue
        count, time = integer(row.get(kind.count)), number(row.get(kind.time))
        if count is None or count < 1:
            stats.skipped["no token count"] += 1
            continue
        if time is None or time <= 0:
            stats.skipped["no latency"] += 1
            continue
        mapped = rule(shard, count)
        yield OpMeasurement(
            source=SOURCE, source_file=name, source_row=index, device=device, op_class=mapped.op_class,
            op_name=mapped.op_name, dtype=dtype, phase="forward", num_tokens=count, tensor_parallel=shard.tp,
            latency_ms=kind.to_ms(time),
            extra=compact({**facts, "layer": layer, kind.count: count, **mapped.detail}), **mapped.shape)


import_llmservingsim = DatasetImporter(
    SOURCE, MARKERS, FILE_PATTERNS,
    "expected profiler/perf/<HW>/<org>/<model>/bf16/tp<N>/dense.csv or "
    "profiler/v0/perf_models/<HW>/<org>/<model>/tp<N>/layers.csv.gz", _records)
llmservingsim_files = import_llmservingsim.files_in
