"""Mixture-of-experts layers captured with balanced top-k routing.

A sparse MoE block sends each token to the `top_k` experts its router picks. Hugging Face runs the experts on the
tokens `nonzero()` / `where()` find (eager), or sorts the tokens by expert (`grouped_mm`): either way the work each
expert does depends on the router's values, which the meta device does not have, so `torch.export` either fails
(`nonzero` has a data-dependent shape) or records a grouped GEMM whose split it cannot know (and which the FLOP
table does not cost).

At capture time, `balanced_routing(module)` makes every MoE layer do, with static shapes, the work of perfectly
balanced routing:

* the router, as the model runs it (router GEMM `2 * tokens * hidden * E`, softmax, top-k / argmax);
* a dispatch gather: each of the `E` experts receives `per_expert = ceil(tokens * top_k / E)` token rows (fixed
  indices), so the experts' GEMMs do `top_k * tokens` tokens' worth of one expert MLP (exactly when E divides
  tokens * top_k, else up to E - 1 rows of padding);
* the experts on their rows;
* the weighted combine: each row times its routing weight, added back to its token (`index_add`);
* whatever else the block does (Qwen2-MoE's shared expert, DeepSeek's group-limited router, input jitter), as the
  model does it.

Two substitutions, no test on model names:

* experts with transformers' experts interface (`@use_experts_implementation`: `experts(hidden, top_k_index,
  top_k_weights)` over stacked weights `gate_up_proj` / `up_proj`, `down_proj`; Mixtral, Qwen2/3-MoE, OLMoE,
  PhiMoE, DeepSeek, ...): their forward is replaced by the balanced one, and the experts run as one batched GEMM
  per projection (E groups of `per_expert` rows), as transformers' default `grouped_mm` does on a GPU. The block's
  own forward is untouched.
* blocks whose routing the interface cannot express are replaced whole, from the table `MOE_BLOCKS` (HF block
  class name -> replacement forward): Switch Transformers, whose experts are separate modules (called one after
  the other on their rows, as transformers' loop does) and whose router drops the tokens an expert receives beyond
  `expert_capacity` per sequence (its loop never computes them: each expert gets
  `min(ceil(tokens / E), batch * expert_capacity)` rows).

Every expert's weights are parameters of the exported program (all counted in `GraphTotals.params`); the values
the replaced layers compute are not the model's (only shapes and costs matter on the meta device). The layers
found are summarised in `MoEInfo` (`perfmodel.core.ir`), which the capture stores on `Graph.moe`.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import MoEInfo

# A transformers module read by its attribute names (num_experts, has_gate, router, expert_capacity, ...): nn.Module's
# __getattr__ types every such attribute `Tensor | Module`, which these duck-typed reads are not.
HFModule = Any


@dataclass(frozen=True)
class MoELayer:
    """One MoE layer as the capture ran it."""

    experts: int
    top_k: int
    hidden: int
    tokens: int  # tokens entering the layer (batch x seq)
    per_expert: int  # token rows each expert processed
    expert_params: int


class _Recorder:
    """The MoE layers one capture ran, by experts module (a layer traced twice is recorded once)."""

    def __init__(self) -> None:
        self.layers: dict[int, MoELayer] = {}

    def info(self) -> MoEInfo | None:
        if not self.layers:
            return None
        layers = list(self.layers.values())
        shapes = {(layer.experts, layer.top_k, layer.hidden) for layer in layers}
        if len(shapes) > 1:
            raise PerfmodelError(f"MoE layers differ in (experts, top_k, hidden): {sorted(shapes)}; Graph.moe "
                                 "describes one kind of MoE layer")
        experts, top_k, hidden = shapes.pop()
        return MoEInfo(experts=experts, top_k=top_k, layers=len(layers), hidden=hidden,
                       expert_params=sum(layer.expert_params for layer in layers),
                       tokens=max(layer.tokens for layer in layers))


# --- the experts' work on balanced rows: (E, rows, hidden) -> (E, rows, hidden) ----------------------------------


def _expert_linear(experts: HFModule, x: torch.Tensor, name: str) -> torch.Tensor:
    """One stacked projection of every expert at once: weight (E, out, in), or (E, in, out) if `is_transposed`,
    plus `<name>_bias` (E, out) if `has_bias`."""
    weight = getattr(experts, name)
    out = torch.bmm(x, weight if experts.is_transposed else weight.transpose(1, 2))
    if experts.has_bias:
        out = out + getattr(experts, f"{name}_bias").unsqueeze(1)
    return out


def _stacked_experts(experts: HFModule, x: torch.Tensor) -> torch.Tensor:
    """Experts with transformers' experts interface: up (gated: `gate_up_proj` then `_apply_gate`, else `up_proj`
    then the activation), down, and the optional post-expert norm, as `grouped_mm_experts_forward` runs them."""
    if experts.has_gate:
        hidden = experts._apply_gate(_expert_linear(experts, x, "gate_up_proj"))
    else:
        hidden = experts.act_fn(_expert_linear(experts, x, "up_proj"))
    out = _expert_linear(experts, hidden, "down_proj")
    return experts.post_expert_norm(out) if experts.has_post_expert_norm else out


def _module_experts(experts: HFModule, x: torch.Tensor) -> torch.Tensor:
    """Experts that are separate modules (an nn.ModuleDict), each called on its rows."""
    return torch.stack([expert(x[i]) for i, expert in enumerate(experts.values())])


def _balanced(experts: HFModule, record: _Recorder, run: Callable[[torch.Tensor], torch.Tensor],
              hidden: torch.Tensor, weights: torch.Tensor, *, capacity: int | None = None) -> torch.Tensor:
    """Dispatch `hidden` (T, H) evenly over the `experts`, `run` them on (E, rows, H), and combine with `weights`
    (T, top_k): what the experts compute when every expert gets the same number of token rows. `capacity` caps
    the rows of one expert (Switch's dropped tokens)."""
    n_tokens, width = hidden.shape
    top_k = weights.shape[-1]
    n_experts = int(experts.num_experts)
    slots = n_tokens * top_k
    per_expert = math.ceil(slots / n_experts)
    if capacity is not None:
        per_expert = min(per_expert, capacity)
    record.layers[id(experts)] = MoELayer(
        experts=n_experts, top_k=top_k, hidden=width, tokens=n_tokens, per_expert=per_expert,
        expert_params=sum(p.numel() for p in experts.parameters()))
    rows = n_experts * per_expert
    # expert e takes rows [e * per_expert, (e + 1) * per_expert) of the (token, choice) slots in order; padding
    # rows (when E does not divide the slots) wrap around, dropped slots (capacity) are never taken
    slot = torch.arange(rows, device=hidden.device)
    if rows > slots:
        slot = slot % slots
    token = slot // top_k if top_k > 1 else slot
    weights = weights.reshape(-1, 1) if rows == slots else weights.reshape(-1)[slot].unsqueeze(-1)
    out = run(hidden[token].view(n_experts, per_expert, width))
    out = out.reshape(rows, width) * _as_dtype(weights, out.dtype)
    return torch.zeros_like(hidden).index_add(0, token, _as_dtype(out, hidden.dtype))


def _as_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` in `dtype`, without a (no-op) conversion node when it already is."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _interface_forward(experts: nn.Module, record: _Recorder, hidden_states: torch.Tensor,
                       top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The balanced replacement of a transformers experts module's forward (same arguments and result)."""
    return _balanced(experts, record, functools.partial(_stacked_experts, experts), hidden_states, top_k_weights)


def has_experts_interface(module: nn.Module) -> bool:
    """Whether `module` is transformers experts (`@use_experts_implementation` gives the class `_apply_gate`)."""
    return hasattr(type(module), "_apply_gate") and hasattr(module, "num_experts")


# --- blocks replaced whole ---------------------------------------------------------------------------------------


def _switch_router(router: HFModule, hidden_states: torch.Tensor) -> torch.Tensor:
    """SwitchTransformersTop1Router's routing probability (batch, seq, 1): jitter while training, the classifier
    GEMM and softmax in the router's dtype, the top-1 probability. (HF's router casts its classifier module in
    forward, which torch.export cannot trace, and its dispatch mask is not needed here.)"""
    dtype = router.dtype
    x = _as_dtype(hidden_states, dtype)
    if router.training and router.jitter_noise > 0:
        x = x * torch.empty_like(x).uniform_(1.0 - router.jitter_noise, 1.0 + router.jitter_noise)
    classifier = router.classifier
    bias = None if classifier.bias is None else _as_dtype(classifier.bias, dtype)
    logits = nn.functional.linear(x, _as_dtype(classifier.weight, dtype), bias)
    probs = _as_dtype(nn.functional.softmax(logits, dim=-1, dtype=dtype), hidden_states.dtype)
    return torch.max(probs, dim=-1).values.unsqueeze(-1)


def _switch_forward(block: HFModule, record: _Recorder, hidden_states: torch.Tensor) -> torch.Tensor:
    """SwitchTransformersSparseMLP: top-1 router, separate expert modules, a per-sequence expert capacity."""
    batch, seq, width = hidden_states.shape
    routing_weights = _switch_router(block.router, hidden_states)
    experts = block.experts
    out = _balanced(experts, record, experts, hidden_states.reshape(-1, width), routing_weights.reshape(-1, 1),
                    capacity=batch * int(block.router.expert_capacity))
    return out.reshape(batch, seq, width)


@dataclass(frozen=True)
class MoEBlockPlan:
    """How one HF sparse block class is captured: its replacement forward (block, recorder, hidden) and the
    balanced forward of its `experts` child ((E, rows, hidden) -> (E, rows, hidden))."""

    forward: Callable[[nn.Module, _Recorder, torch.Tensor], torch.Tensor]
    experts: Callable[[nn.Module, torch.Tensor], torch.Tensor]


# HF sparse MoE block class name -> its balanced capture (blocks transformers' experts interface does not cover)
MOE_BLOCKS: dict[str, MoEBlockPlan] = {
    "SwitchTransformersSparseMLP": MoEBlockPlan(_switch_forward, _module_experts),
}


def moe_layers(module: nn.Module) -> list[nn.Module]:
    """The experts modules of `module`'s MoE layers that capture makes balanced (in module order)."""
    found: list[nn.Module] = []
    for sub in module.modules():
        if type(sub).__name__ in MOE_BLOCKS:
            found.append(sub.get_submodule("experts"))
        elif has_experts_interface(sub):
            found.append(sub)
    return found


@contextlib.contextmanager
def balanced_routing(module: nn.Module) -> Iterator[_Recorder]:
    """Within the block, every MoE layer of `module` runs its balanced forward; the recorder then holds the layers
    a forward pass ran (`.info()` -> MoEInfo, None for a dense model). The module is left as it was on exit."""
    record = _Recorder()
    patched: list[nn.Module] = []
    try:
        for sub in module.modules():
            plan = MOE_BLOCKS.get(type(sub).__name__)
            if plan is not None:
                experts = sub.get_submodule("experts")
                sub.forward = functools.partial(plan.forward, sub, record)
                experts.forward = functools.partial(plan.experts, experts)
                patched.extend((sub, experts))
            elif has_experts_interface(sub) and sub not in patched:
                sub.forward = functools.partial(_interface_forward, sub, record)
                patched.append(sub)
        yield record
    finally:
        for sub in patched:
            sub.__dict__.pop("forward", None)
