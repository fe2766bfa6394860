"""The bytes autograd really keeps for backward in one training forward, measured on the meta device.

`saved_activation_bytes(module, args, kwargs)` runs the module's forward once (on meta tensors: shapes only, no
compute, no memory) inside `torch.autograd.graph.saved_tensors_hooks` and sums the bytes of the distinct storages
the forward saves for backward, plus the storages of the forward's outputs and of its inputs (alive during the whole
step). Storages are deduplicated (by StorageImpl: a tensor saved by two ops, or a view of a saved tensor, counts
once, with the whole storage it keeps alive), and the module's parameters and buffers are left out (the memory
model counts them as weights). This is the physics the graph's "every node's output" rule bounds from above: in-place
ops (ResNet's `relu_` on BatchNorm's output) add no storage, views add none, and outputs no backward reads (an add's,
a linear's whose consumer saves only its own result) are not counted.

What the measurement models, as a CUDA training step runs it:

- `autocast=True` emulates `torch.autocast("cuda", torch.float16)` (the meta device has no autocast dispatch key,
  and CPU autocast has other op lists): a `TorchFunctionMode` casts the floating inputs of the ops CUDA autocast
  runs in float16 (matmuls, linear, convolutions, RNNs, einsum) to float16 and those of the ops it runs in float32
  (softmax, log_softmax, layer_norm, group_norm, losses, exp/log/pow, sums, norms) to float32, so what is saved is
  what autocast saves: the half copies of an op's inputs next to the float32 tensors other ops save. A parameter
  is cast once (autocast's weight cache) and its half copy counts: matmuls and convolutions save it for backward
  (2 bytes/param on top of the fp32 weights, gradients and optimizer state). CUDA autocast is switched on in the
  thread's state meanwhile (as model code checks it; no tensor here is a CUDA tensor, so none of its kernels run).
- `scaled_dot_product_attention` runs as the memory-efficient kernel CUDA picks (it saves the query, key, value,
  output and log-sum-exp, never the seq x seq probabilities); on the meta device and on the CPU torch would pick the
  math fallback, which saves them (`kernels="cpu"` follows the CPU's choice, to compare with a CPU step).
- Dropout in training runs as CUDA's fused kernel (`aten.native_dropout`), whose backward keeps a one-byte boolean
  mask; on the meta device and the CPU torch multiplies by a mask in the input's dtype instead (4 bytes an element
  in float32: the attention-probability dropout of a BERT layer at 384 tokens alone was then counted at 9.4 MB a
  sample where CUDA keeps 2.4). `kernels="cpu"` keeps the CPU's.
- A training batch norm and a layer norm on meta tensors save what `aten.native_batch_norm` and
  `aten.native_layer_norm` save (input, weight, running statistics, and the per-channel or per-row mean and inverse
  standard deviation in float32 for half inputs) without running torch's meta kernels for them, Python
  decompositions that took a quarter of a CNN's capture (`_SHAPES_ONLY`).
- RNNs (`nn.LSTM`, `nn.GRU`) run decomposed on meta (per-step gates saved); cuDNN's reserve space holds its own
  per-step buffers instead (and the CPU's oneDNN kernel its workspace: 1.5x the decomposed figure for lstm-lm).

Checked on the CPU: with the CPU's kernels, the meta figure equals what a real CPU forward saves (hooks on real
tensors) to the byte for resnet18, resnet50, vit_small, bert-small, bert-base and gpt2 (`bench/memory_fit.py
--cpu-check`). Not in the figure: gradients, backward's temporaries, allocator fragmentation, workspaces (the
memory model adds what it models of them), and tensors a custom autograd.Function stores on `ctx` as attributes
instead of `save_for_backward`. Cost: one forward of shape functions per figure, a fraction of an export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

Kernels = Literal["cuda", "cpu"]  # whose SDPA kernel choice the forward follows

# The op names CUDA autocast runs in float16 (torch.amp docs, "CUDA Ops that can autocast to float16"), plus the
# composite ops (einsum, the RNNs) whose matmuls autocast reaches inside C++ where a function mode does not
AUTOCAST_FP16 = frozenset({
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "addr",
    "mv", "chain_matmul", "multi_dot", "prelu", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "conv_tbc", "convolution", "_convolution", "einsum", "lstm", "gru",
    "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
})
# ... and in float32 ("CUDA Ops that can autocast to float32")
AUTOCAST_FP32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits", "cosh",
    "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv",
    "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log_softmax",
    "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss", "multi_margin_loss",
    "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh",
    "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan",
    "triplet_margin_loss", "huber_loss", "logsumexp",
})


class _Storages:
    """Distinct storages and their bytes, keyed by the StorageImpl (`_cdata`). The tensors are kept referenced until
    the count is done, so no storage is freed and its key reused by a later one."""

    def __init__(self, excluded: set[int]) -> None:
        self.excluded = excluded
        self.nbytes: dict[int, int] = {}
        self._keep: list[torch.Tensor] = []

    def add(self, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            return
        try:
            storage = value.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
        except Exception:  # a tensor without a plain storage (sparse, nested): its own elements
            key, nbytes = id(value), value.numel() * value.element_size()
        if key in self.excluded or key in self.nbytes:
            return
        self.nbytes[key] = int(nbytes)
        self._keep.append(value)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.add(tensor)
        return tensor

    @property
    def total(self) -> int:
        return sum(self.nbytes.values())


def _storage_key(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor.untyped_storage()._cdata)
    except Exception:
        return None


class _CudaStepMode(TorchFunctionMode):
    """Runs a forward as a CUDA training step would: SDPA as the memory-efficient kernel, dropout as the fused one,
    and (`autocast`) the CUDA autocast float16 / float32 op lists."""

    def __init__(self, autocast: bool, kernels: Kernels = "cuda") -> None:
        super().__init__()
        self.autocast = autocast
        self.kernels = kernels
        self._weight_casts: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is F.scaled_dot_product_attention:
            return self._attention(func, args, kwargs)
        if func is F.dropout and self.kernels == "cuda":
            out = _fused_dropout(args, kwargs)
            if out is not None:
                return out
        if self.autocast:
            name = getattr(func, "__name__", "")
            if name in AUTOCAST_FP16:
                args, kwargs = self._cast((args, kwargs), torch.float16)
            elif name in AUTOCAST_FP32:
                args, kwargs = self._cast((args, kwargs), torch.float32)
        shapes_only = _SHAPES_ONLY.get(func)
        if shapes_only is not None:
            out = shapes_only(args, kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        def cast(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype in (dtype, torch.float64):
                return x
            if x.is_leaf and x.requires_grad:  # a parameter: cast once, like autocast's weight cache
                key = (id(x), dtype)
                cached = self._weight_casts.get(key)
                if cached is None:
                    cached = self._weight_casts[key] = x.to(dtype)
                return cached
            return x.to(dtype)

        return tree_map(cast, value)

    def _attention(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = {**dict(zip(names, args)), **kwargs}
        q, k, v = bound["query"], bound["key"], bound["value"]
        dropout = float(bound.get("dropout_p") or 0.0)
        if self.kernels == "cpu" and dropout:  # the CPU's flash kernel takes no dropout: the math fallback
            return func(*args, **kwargs)
        if self.autocast:
            q, k, v = self._cast((q, k, v), torch.float16)
        try:
            return _efficient_attention(q, k, v, bound.get("attn_mask"), dropout,
                                        bool(bound.get("is_causal")), bound.get("scale"),
                                        bool(bound.get("enable_gqa")))
        except Exception:  # a shape the efficient kernel does not take: what torch itself would run
            return func(q, k, v, *args[3:], **{n: a for n, a in kwargs.items() if n not in ("query", "key", "value")})


_DROPOUT_ARGS = ("input", "p", "training", "inplace")


def _fused_dropout(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """`F.dropout(*args, **kwargs)` as CUDA runs it in training (`aten.native_dropout`, fused: its backward keeps a
    one-byte boolean mask); None where torch's own op runs as it would on CUDA too (not training, p 0 or 1, no
    elements). On the meta device and the CPU, torch takes the unfused path instead, which keeps a mask in the
    input's dtype: 4 bytes an element in float32, a fifth of a BERT layer's saved bytes at 384 tokens."""
    bound = {**dict(zip(_DROPOUT_ARGS, args)), **kwargs}
    x, p = bound.get("input"), float(bound.get("p", 0.5))
    if not (bound.get("training", True) and isinstance(x, torch.Tensor) and x.is_floating_point()
            and 0.0 < p < 1.0 and x.numel() > 0):
        return None
    out = torch.native_dropout(x, p, True)[0]
    return x.copy_(out) if bound.get("inplace") else out


_BATCH_NORM_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_LAYER_NORM_ARGS = ("input", "normalized_shape", "weight", "bias", "eps")


class _SavedNorm(torch.autograd.Function):
    """A normalization on meta tensors, shapes only, saving for backward exactly what torch's own op saves: its input,
    the first `n_saved` of `params`, and a mean and an inverse standard deviation of `stats_shape` in the op's
    computation dtype (float32 for half inputs); the output is like the input in `layout` (batch norm keeps the
    input's, layer norm's is contiguous: what a layer after it saves of it depends on that). Torch's meta kernels of
    `native_batch_norm` and `native_layer_norm` are their Python decompositions (~2-4 ms a call: a quarter of a
    CNN's capture, a third of a transformer's saved-bytes pass)."""

    @staticmethod
    def forward(ctx: Any, stats_shape: tuple[int, ...], layout: torch.memory_format, n_saved: int,
                input: torch.Tensor, *params: torch.Tensor | None) -> torch.Tensor:
        stats_dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        mean = input.new_empty(stats_shape, dtype=stats_dtype)
        invstd = input.new_empty(stats_shape, dtype=stats_dtype)
        ctx.save_for_backward(input, *params[:n_saved], mean, invstd)
        return torch.empty_like(input, memory_format=layout)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # pragma: no cover - a measurement never runs backward
        raise RuntimeError("the saved-bytes measurement runs no backward")


def _all_meta(*values: Any) -> bool:
    return all(v is None or (isinstance(v, torch.Tensor) and v.device.type == "meta") for v in values)


def _meta_batch_norm(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """`F.batch_norm(*args, **kwargs)` as `_SavedNorm` where it is a training batch norm of meta tensors (saving
    what `aten.native_batch_norm`'s autograd node saves: input, weight, running mean and variance, per-channel
    statistics); None otherwise (the op then runs as torch runs it)."""
    bound = {**dict(zip(_BATCH_NORM_ARGS, args)), **kwargs}
    x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
    mean, var = bound.get("running_mean"), bound.get("running_var")
    if not (bound.get("training") and isinstance(x, torch.Tensor) and x.dim() >= 2 and x.is_floating_point()
            and _all_meta(x, weight, bias, mean, var)):
        return None
    return _SavedNorm.apply((x.size(1),), torch.preserve_format, 3, x, weight, mean, var, bias)


def _meta_layer_norm(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """`F.layer_norm(*args, **kwargs)` as `_SavedNorm` on meta tensors (saving what `aten.native_layer_norm`'s
    autograd node saves: input, weight, bias, one mean and one inverse deviation per normalized row); None
    otherwise."""
    bound = {**dict(zip(_LAYER_NORM_ARGS, args)), **kwargs}
    x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
    shape = bound.get("normalized_shape")
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and _all_meta(x, weight, bias)):
        return None
    k = 1 if isinstance(shape, int) else len(shape or ())
    if not 0 < k <= x.dim():
        return None
    return _SavedNorm.apply((*x.shape[:x.dim() - k], *(1,) * k), torch.contiguous_format, 2, x, weight, bias)


# the ops run as shapes only on meta tensors (each returns None where it does not apply: torch's op runs)
_SHAPES_ONLY: dict[Callable[..., Any], Callable[[tuple[Any, ...], Mapping[str, Any]], torch.Tensor | None]] = {
    F.batch_norm: _meta_batch_norm,
    F.layer_norm: _meta_layer_norm,
}


def _efficient_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                         dropout_p: float, is_causal: bool, scale: float | None, gqa: bool) -> torch.Tensor:
    if q.dim() != 4:
        raise ValueError("the efficient kernel takes (batch, heads, seq, head_dim)")
    if gqa and k.size(-3) != q.size(-3):
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), dim=-3)
    bias = None
    if mask is not None:
        if mask.dtype == torch.bool:  # as torch converts a boolean mask into an additive bias
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        else:
            bias = mask.to(q.dtype)
        bias = bias.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal,
                                                                 scale=scale)
    return out[0]


def _storage_keys(tensors: list[torch.Tensor]) -> set[int]:
    return {key for key in map(_storage_key, tensors) if key is not None}


def saved_activation_bytes(module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None, *,
                           autocast: bool = False, kernels: Kernels = "cuda",
                           context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> int:
    """Bytes of the distinct storages one training forward of `module(*args, **kwargs)` saves for backward, plus its
    outputs and inputs, parameters and buffers excluded (see the module docstring). `context`, if given, is entered
    around the forward (e.g. MoE balanced routing). `kernels="cpu"` runs SDPA as the CPU picks it (its flash kernel
    without dropout, the math fallback with): what a CPU step saves, to check the measurement against one.

    A module and inputs all on the meta device run as they are (the cheapest: shape functions only); if that fails
    (model code reading a value, `.item()` on a mask: what it skips while tracing) or tensors are real, the forward
    runs on fake tensors (`FakeTensorMode`, as torch.export traces it) with the parameters swapped in by
    `torch.func.functional_call`: never computing, never allocating."""
    kwargs = dict(kwargs or {})
    tensors = [*module.parameters(), *module.buffers(), *tree_flatten((args, kwargs))[0]]
    if all(t.device.type == "meta" for t in tensors if isinstance(t, torch.Tensor)):
        try:
            return _forward_bytes(module, args, kwargs, autocast, kernels, context, fake=False)
        except Exception:  # retried on fake tensors just below
            pass
    return _forward_bytes(module, args, kwargs, autocast, kernels, context, fake=True)


def _forward_bytes(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], autocast: bool,
                   kernels: Kernels, context: Callable[[], contextlib.AbstractContextManager[Any]] | None,
                   fake: bool) -> int:
    with contextlib.ExitStack() as stack:
        if fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            mode = FakeTensorMode(allow_non_fake_inputs=True)
            named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
            state: dict[str, torch.Tensor] = {name: mode.from_tensor(t) for name, t in named}
            args, kwargs = tree_map(lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x,
                                    (args, kwargs))
            excluded = _storage_keys(list(state.values()))
            stack.enter_context(mode)

            def forward() -> Any:
                return torch.func.functional_call(module, state, args, kwargs, tie_weights=True, strict=False)
        else:
            excluded = _storage_keys([*module.parameters(), *module.buffers()])

            def forward() -> Any:
                return module(*args, **kwargs)
        storages = _Storages(excluded)
        if context is not None:
            stack.enter_context(context())
        stack.enter_context(torch.enable_grad())
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(storages.pack, _unpack))
        if autocast:
            stack.enter_context(_cuda_autocast_flag())
        stack.enter_context(_CudaStepMode(autocast, kernels))
        output = forward()
    for value in tree_flatten((_as_tree(output), args, kwargs))[0]:
        storages.add(value)
    return storages.total


@contextlib.contextmanager
def _cuda_autocast_flag() -> Iterator[None]:
    """CUDA autocast switched on in this thread's state, as model code sees it (`torch.is_autocast_enabled()`; RNNs
    then accept half inputs with float weights). No tensor here is a CUDA tensor, so no autocast kernel runs: the
    casts are `_CudaStepMode`'s."""
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", dtype)


def measure_saved_bytes(module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None, *,
                        context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
                        ) -> tuple[int | None, int | None]:
    """(`saved_activation_bytes` as the module is, the same under CUDA float16 autocast); None where the forward
    cannot run (the memory model then falls back on the graph's outputs)."""
    results: list[int | None] = []
    for autocast in (False, True):
        try:
            results.append(saved_activation_bytes(module, args, kwargs, autocast=autocast, context=context))
        except Exception:
            results.append(None)
    return results[0], results[1]


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _as_tree(output: Any) -> Any:
    """A model output pytree can flatten (transformers' ModelOutput is a dict-like, flattened as its values)."""
    if isinstance(output, Mapping):
        return list(output.values())
    return output
