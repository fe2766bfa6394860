"""Limits on what a job may be, checked before any work is spent on it.

A job spec is cheap to write and can be expensive to capture: an inline Hugging Face config with 10^5 layers of
width 10^6 would build (on the meta device) and trace a graph for hours, holding gigabytes. `JobLimits` bounds a
job so that every accepted job is one a real cluster could run (the defaults admit dense and mixture-of-experts
models up to ~2 T parameters: GPT-3 175B, Llama 3 405B, DeepSeek-V3 671B pass):

1. `check_spec(spec, limits)` reads the spec alone (no torch): batch size, sequence length, and for an HF config
   its nesting depth and size, non-finite numbers, the layer and width fields, and a cheap parameter estimate
   (embeddings + layers × (attention + MLP × experts)), within ~20 % of what the model builds (usually above);
2. `check_params(n, limits)` checks the exact parameter count once the model is built on the meta device;
3. `check_graph(graph, limits)` checks a graph (captured, read from ONNX, or sent as IR): node count, tensor sizes,
   and that its costs are finite and non-negative (an IR is client data: negative FLOPs would be predicted as is).

Every refusal is a `JobLimitError` whose message starts with the field (`source.config.n_layer: ...`) and names the
limit (`max_layers = 1024`), so a service can answer 422 naming both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from perfmodel.core.errors import PerfmodelError


class JobLimitError(PerfmodelError):
    """A job is beyond one of the `JobLimits`; the message names the field and the limit."""


class JobLimits(BaseModel):
    """How large a job may be. Defaults admit real models up to ~2 T parameters; a service sets them from its
    settings (`PERFMODEL_JOB_LIMITS__MAX_LAYERS=...`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_layers: int = Field(default=1024, ge=1, description="layers of one stack (HF num_hidden_layers, n_layer, "
                                                            "encoder_layers, ...)")
    max_width: int = Field(default=262_144, ge=1, description="any width of an HF config: hidden size, MLP "
                                                              "(intermediate) size, heads, experts")
    max_vocab: int = Field(default=4_194_304, ge=1, description="vocabulary size")
    max_positions: int = Field(default=4_194_304, ge=1, description="max_position_embeddings / n_positions")
    max_params: int = Field(default=2_000_000_000_000, ge=1, description="parameter elements (estimated from the "
                                                                          "config, then counted on the meta device)")
    max_graph_nodes: int = Field(default=500_000, ge=1, description="op nodes of the job's graph")
    max_tensor_elements: int = Field(default=2**44, ge=1, description="elements of any one tensor of the graph")
    max_config_depth: int = Field(default=32, ge=1, description="nesting depth of an HF config")
    max_config_items: int = Field(default=100_000, ge=1, description="keys and list items of an HF config")
    # batch sizes are bounded loosely: the work a batch implies is bounded by `max_tensor_elements` (checked on the
    # captured graph, and before capture as batch x sequence length), and real recommender jobs run 1-16 million
    # samples per GPU (NCF on MovieLens-20m)
    max_batch_size: int = Field(default=2**31 - 1, ge=1, description="a job's batch size")
    max_seq_len: int = Field(default=4_194_304, ge=1, description="a job's sequence length")
    max_global_batch: int = Field(default=2**40, ge=1, description="a placement's global batch size")
    max_devices: int = Field(default=1_048_576, ge=1, description="devices of a placement (and any parallel "
                                                                  "degree)")
    max_capture_rss_mb: int = Field(default=8192, ge=256, description="memory a graph capture's child process may "
                                                                      "hold (resident set, MiB)")


# HF config keys, by what they bound (any nesting level: text_config, vision_config, encoder, ...)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
              "num_encoder_layers", "num_decoder_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "model_dim")
FFN_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "hidden_dim")
MOE_FFN_KEYS = ("moe_intermediate_size", "expert_intermediate_size")
WIDTH_KEYS = (*HIDDEN_KEYS, *FFN_KEYS, *MOE_FFN_KEYS, "num_attention_heads", "n_head", "num_heads",
              "num_key_value_heads", "encoder_attention_heads", "decoder_attention_heads", "head_dim", "d_kv",
              "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "num_labels",
              "image_size", "patch_size", "num_channels", "num_mel_bins", "max_source_positions",
              "max_target_positions")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
VOCAB_KEYS = ("vocab_size",)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")

_BOUNDS = (  # (keys, limit field, what)
    (LAYER_KEYS, "max_layers", "layers"),
    (WIDTH_KEYS, "max_width", "width"),
    (VOCAB_KEYS, "max_vocab", "vocabulary size"),
    (POSITION_KEYS, "max_positions", "positions"),
)


def _refuse(field: str, what: str, value: Any, limit_name: str, limit: int | float) -> JobLimitError:
    shown = f"{value:,}" if isinstance(value, int) or (float(value).is_integer() and value < 1e18) else f"{value:.3g}"
    return JobLimitError(f"{field}: {what} {shown.removesuffix('.0')} is over the limit {limit_name} = {limit:,}")


def check_spec(spec: Any, limits: JobLimits) -> None:
    """Refuse a `JobSpec` beyond the limits from the spec alone (cheap: no torch, no model build)."""
    from perfmodel.jobs.spec import HFConfigSource

    if spec.batch_size > limits.max_batch_size:
        raise _refuse("batch_size", "batch size", spec.batch_size, "max_batch_size", limits.max_batch_size)
    if spec.seq_len > limits.max_seq_len:
        raise _refuse("seq_len", "sequence length", spec.seq_len, "max_seq_len", limits.max_seq_len)
    if spec.batch_size * spec.seq_len > limits.max_tensor_elements:
        raise _refuse("batch_size", "batch size x sequence length", spec.batch_size * spec.seq_len,
                      "max_tensor_elements", limits.max_tensor_elements)
    if isinstance(spec.source, HFConfigSource):
        check_hf_config(spec.source.config, limits)


def check_hf_config(config: Mapping[str, Any], limits: JobLimits, where: str = "source.config") -> int:
    """Refuse an HF config beyond the limits: too deep or large, a non-finite number, a layer or width field over
    its bound, or more parameters (estimated) than `max_params`. Returns the estimate."""
    _check_structure(config, limits, where)
    for path, key, value in _numbers(config, where):
        for keys, limit_name, what in _BOUNDS:
            if key in keys and value > getattr(limits, limit_name):
                raise _refuse(f"{path}.{key}", what, value, limit_name, getattr(limits, limit_name))
            if key in keys and value < 0:
                raise JobLimitError(f"{path}.{key}: {what} {value} is negative")
    estimate = estimate_params(config)
    if estimate > limits.max_params:
        raise JobLimitError(f"{where}: about {estimate:.3g} parameters (estimated from the config) is over the "
                            f"limit max_params = {limits.max_params:.3g}")
    return estimate


def _check_structure(config: Any, limits: JobLimits, where: str) -> None:
    """Depth, size and finite numbers of a JSON-like value, without recursion (a 10,000-deep config is refused,
    not a RecursionError)."""
    stack: list[tuple[Any, int, str]] = [(config, 1, where)]
    items = 0
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise JobLimitError(f"{path}: {value} is not a finite number")
        if not isinstance(value, (dict, list, tuple)):
            continue
        if depth > limits.max_config_depth:
            raise JobLimitError(f"{where}: nested deeper than the limit max_config_depth = "
                                f"{limits.max_config_depth} (at {path[:120]}{'...' if len(path) > 120 else ''})")
        items += len(value)
        if items > limits.max_config_items:
            raise JobLimitError(f"{where}: more than max_config_items = {limits.max_config_items:,} keys and items")
        children = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((child, depth + 1, f"{path}.{key}") for key, child in children)


def _numbers(config: Mapping[str, Any], where: str) -> Iterator[tuple[str, str, float]]:
    """(path of the dict, key, value) of every numeric entry of every dict in the config."""
    stack: list[tuple[Any, str]] = [(config, where)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, Mapping):
            for key, child in value.items():
                if isinstance(child, (int, float)) and not isinstance(child, bool):
                    yield path, str(key), child
                elif isinstance(child, (dict, list)):
                    stack.append((child, f"{path}.{key}"))
        elif isinstance(value, list):
            stack.extend((child, f"{path}.{i}") for i, child in enumerate(value))


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> float:
    for key in keys:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return 0.0


def estimate_params(config: Mapping[str, Any]) -> int:
    """Parameter elements of an HF config, estimated (within ~20 % for common transformers): per stack,
    vocab × hidden + positions × hidden + layers × (4 hidden² + 3 hidden × MLP width × max(1, experts)) (the
    experts' own MLP width where the config gives one, plus a dense MLP), summed over the config and its nested
    configs (text_config, vision_config, encoder, ...)."""
    total = 0.0
    stack: list[Any] = [config]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            hidden = _first(value, HIDDEN_KEYS)
            layers = sum(_first(value, (key,)) for key in LAYER_KEYS) if hidden else 0.0
            if hidden:
                ffn = _first(value, FFN_KEYS) or 4 * hidden
                experts = max(1.0, _first(value, EXPERT_KEYS))
                expert_ffn = _first(value, MOE_FFN_KEYS)
                mlp = 3 * hidden * (ffn + expert_ffn * experts) if expert_ffn else 3 * hidden * ffn * experts
                total += (_first(value, VOCAB_KEYS) + _first(value, POSITION_KEYS)) * hidden
                total += layers * (4 * hidden * hidden + mlp)
            stack.extend(v for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, (dict, list)))
    return int(min(total, 2**63 - 1))


def check_params(params: int, limits: JobLimits, where: str = "source") -> None:
    """Refuse a built model with more parameter elements than `max_params`."""
    if params > limits.max_params:
        raise JobLimitError(f"{where}: the model has {params:.3g} parameters, over the limit max_params = "
                            f"{limits.max_params:.3g}")


_NODE_COSTS = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd",
               "bytes_written_bwd", "params")
_TOTAL_COSTS = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd",
                "bytes_written_bwd", "params", "param_bytes", "activation_bytes")


def check_graph_nodes(count: int, limits: JobLimits, where: str = "graph") -> None:
    if count > limits.max_graph_nodes:
        raise _refuse(f"{where}.nodes", "node count", count, "max_graph_nodes", limits.max_graph_nodes)


def check_graph(graph: Any, limits: JobLimits, where: str = "graph") -> None:
    """Refuse a `perfmodel.core.ir.Graph` beyond the limits: too many nodes, a tensor over
    `max_tensor_elements` (an ONNX with [1e6]^3 shapes), or a negative cost (IR sent by a client)."""
    check_graph_nodes(len(graph.nodes), limits, where)
    totals = graph.totals
    for name in _TOTAL_COSTS:
        if getattr(totals, name) < 0:
            raise JobLimitError(f"{where}.totals.{name}: {getattr(totals, name)} is negative")
    if any(v < 0 for v in (*totals.ops_by_kind.values(), *totals.flops_fwd_by_kind.values())):
        raise JobLimitError(f"{where}.totals: a count per kind is negative")
    for tensor in graph.inputs:
        _check_tensor(tensor, limits, f"{where}.inputs")
    for i, node in enumerate(graph.nodes):
        for name in _NODE_COSTS:
            if getattr(node, name) < 0:
                raise JobLimitError(f"{where}.nodes.{i}.{name}: {getattr(node, name)} is negative")
        for tensor in (*node.input_tensors, *node.output_tensors):
            _check_tensor(tensor, limits, f"{where}.nodes.{i}")


def _check_tensor(tensor: Any, limits: JobLimits, where: str) -> None:
    if any(d < 0 for d in tensor.shape):
        raise JobLimitError(f"{where}: tensor shape {list(tensor.shape)} has a negative dimension")
    numel = 1
    for d in tensor.shape:
        numel *= d
    if numel > limits.max_tensor_elements:
        raise JobLimitError(f"{where}: a tensor of shape {list(tensor.shape)} holds {numel:.3g} elements, over the "
                            f"limit max_tensor_elements = {limits.max_tensor_elements:.3g}")
