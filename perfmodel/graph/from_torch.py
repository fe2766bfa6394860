"""The graph of a PyTorch module, captured with `torch.export` on the meta device (no real weights, no compute).

`torch.export.export(..., strict=False)` traces the forward pass into ATen ops (the pre-dispatch "training" IR:
`aten.linear`, `aten.conv2d`, `aten.scaled_dot_product_attention`, ...). Every `call_function` fx node becomes one
`Node`: placeholders (inputs, parameters, buffers) and the output are not nodes, `getitem` on a tuple output is a
`view` node. The backward pass is not traced: for a training graph each node's backward cost is derived from its
forward op (see `perfmodel.graph.flops`), for the inputs that need a gradient (parameters, and whatever is computed
from them).

Higher-order ops that wrap a subgraph (`wrap_with_set_grad_enabled`, `wrap_with_autocast`) are inlined: their
subgraph's nodes appear with ids `<wrapper id>.<node name>`. A `cond` would have both branches inlined (an upper
bound); no zoo model has one.

Mixture-of-experts layers (Switch, and experts with transformers' experts interface: Mixtral, Qwen-MoE, OLMoE,
PhiMoE, DeepSeek, gpt-oss, ...) route tokens with data-dependent ops the meta device cannot trace: while
exporting, they run a static equivalent assuming balanced top-k routing (`perfmodel.graph.moe`), and the graph
records them in `Graph.moe`. A dense model is captured as before.

A training graph also carries what autograd saves in one forward (`GraphTotals.saved_activation_bytes`, and its
twin under CUDA autocast `saved_activation_bytes_amp`), measured after the export by running the module's forward
once more on meta (or fake) tensors (`perfmodel.graph.saved`; both figures 0.03 s for resnet50, 0.16 s for
bert-base: +6 % and +30 % of their capture). The memory model uses it instead of every node's output; None where
the forward cannot run.
"""

from __future__ import annotations

import gc
import operator
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.fx.config
from torch import fx, nn

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph, GraphTotals, MoEInfo, Node, TensorMeta
from perfmodel.core.opkinds import OpKind, kind_of
from perfmodel.graph.flops import OpCall, conv_dilation, einsum_equation, is_float, op_cost, sdpa_causal, tensor_bytes
from perfmodel.graph.moe import balanced_routing
from perfmodel.graph.saved import measure_saved_bytes
from perfmodel.jobs.spec import JobSpec

if TYPE_CHECKING:
    from perfmodel.jobs.build import BuiltJob

GraphMode = Literal["train", "inference"]
_GRAPH_MODES: dict[str, GraphMode] = {"train": "train", "inference": "inference"}


def graph_from_module(module: nn.Module, args: tuple, kwargs: Mapping[str, Any] | None = None, *, name: str,
                      mode: str = "train", job_id: str | None = None) -> Graph:
    """Export `module(*args, **kwargs)` and build its graph. Tensors may be real, fake or on the meta device.
    `mode="train"` adds backward costs; `"inference"` leaves them zero."""
    graph_mode = _GRAPH_MODES.get(mode)
    if graph_mode is None:
        raise PerfmodelError(f"graph mode must be 'train' or 'inference', got {mode!r}")
    try:
        with warnings.catch_warnings(), _no_stack_traces(), _lazy_graph_modules(), _gc_paused(), \
                _eager_mask_skips(module), balanced_routing(module) as moe_layers:
            warnings.simplefilter("ignore")
            exported = torch.export.export(module, tuple(args), dict(kwargs or {}), strict=False)
    except PerfmodelError:
        raise
    except Exception as exc:  # a model torch.export cannot trace: report it in one line
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PerfmodelError(f"torch.export could not capture {name}: {type(exc).__name__}: {first_line}") from exc
    saved: tuple[int | None, int | None] = (None, None)
    if graph_mode == "train":  # what autograd saves, on meta/fake tensors (perfmodel.graph.saved): ~0.1-0.3 s
        with warnings.catch_warnings(), _gc_paused():
            warnings.simplefilter("ignore")
            saved = measure_saved_bytes(module, tuple(args), kwargs, context=lambda: balanced_routing(module))
    return graph_from_exported(exported, module, name=name, mode=graph_mode, job_id=job_id,
                               moe=moe_layers.info(), saved=saved)


@contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Export without recording each fx node's Python stack trace (the graph never reads it; it is ~15 % of an
    export's time)."""
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


@contextmanager
def _lazy_graph_modules() -> Iterator[None]:
    """Export without generating the Python code of the intermediate fx GraphModules it builds (5 of the 6 a zoo
    capture writes): the graphs are only read, never run (a lazy module writes its code the first time it is
    called). 14 zoo captures in a fresh process: medians 24.4 -> 22.2 s over 5 alternated runs (`bench/
    capture_speed.py`); the graphs of the 69 zoo models of the day were the same either way. Where this torch has
    no lazy modules, nothing changes."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # a torch without them: export as usual
        yield
        return
    with _use_lazy_graph_module(True):
        yield


@contextmanager
def _eager_mask_skips(module: nn.Module) -> Iterator[None]:
    """Export a Hugging Face model's `sdpa` attention as its eager step runs it on a batch without padding. Outside
    export, transformers' `sdpa` attention builds no mask when no padding mask is given: a causal model calls
    `scaled_dot_product_attention(..., is_causal=True)` (FlashAttention's causal kernel, which skips the keys above
    the diagonal), a bidirectional one no mask at all. Under `torch.export` it always builds the mask tensor
    (`masking_utils._ignore_causal_mask_sdpa`: `is_torchdynamo_exporting()`), a graph no eager run has. Within the
    block, a call without a padding mask takes the eager decision; with one, transformers' own. Nor are the positions
    taken for packed sequences (`find_packed_sequence_indices`, which under export cannot read them and assumes
    packing): a job's inputs are token ids alone, whose positions the model counts from 0. Nothing is patched for a
    model with another attention (an `eager` one keeps the masks export builds, as the older transformers releases
    that public eager measurements ran did) or when transformers is not loaded."""
    inner = module.module if isinstance(module, TrainingStep) else module
    if getattr(getattr(inner, "config", None), "_attn_implementation", None) != "sdpa":
        yield
        return
    masking = sys.modules.get("transformers.masking_utils")
    names = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa", "find_packed_sequence_indices")
    if masking is None or not all(hasattr(masking, name) for name in names):
        yield
        return
    originals = {name: getattr(masking, name) for name in names}
    causal, bidirectional = originals["_ignore_causal_mask_sdpa"], originals["_ignore_bidirectional_mask_sdpa"]

    def no_local_window(kv_length: int, local_attention_size: int | None) -> bool:
        return local_attention_size is None or kv_length < local_attention_size

    def causal_skip(padding_mask: Any, q_length: int, kv_length: int, q_offset: Any, kv_offset: int,
                    local_attention_size: int | None = None) -> bool:
        if padding_mask is None and isinstance(q_offset, int) and no_local_window(kv_length, local_attention_size):
            return q_length == 1 or kv_length == q_length
        return bool(causal(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size))

    def bidirectional_skip(padding_mask: Any, kv_length: int, local_attention_size: int | None = None) -> bool:
        if padding_mask is None:
            return no_local_window(kv_length, local_attention_size)
        return bool(bidirectional(padding_mask, kv_length, local_attention_size))

    def not_packed(position_ids: Any) -> None:
        return None

    for name, function in zip(names, (causal_skip, bidirectional_skip, not_packed)):
        setattr(masking, name, function)
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(masking, name, function)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while exporting. An export allocates millions of short-lived objects, and the
    collections they trigger walk everything the process holds (torch, transformers, the model): 9 % of a capture
    of eight zoo models, 12-18 % of a 175B GPT's (8.3 -> 7.3 s), for 19 MB more peak memory. What the export leaves
    is collected as usual afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _all_ones_attention_mask(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An explicit all-ones `attention_mask` (what the model builds itself when it is None, outside export)."""
    if "input_ids" not in kwargs or "attention_mask" in kwargs:
        return kwargs
    return {**kwargs, "attention_mask": torch.ones_like(kwargs["input_ids"])}


# HF model_type -> the inputs torch.export needs beyond the job's: Switch Transformers builds its encoder mask
# only when not compiling (`is_torchdynamo_compiling()`), and indexes a None mask under export otherwise. Given,
# the mask also reaches the decoder's cross-attention (one more add per score there).
EXPORT_INPUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "switch_transformers": _all_ones_attention_mask,
}


def capture_graph(spec: JobSpec) -> Graph:
    """The graph of a job, built on the meta device (never allocating weights)."""
    from perfmodel.jobs.build import build_job

    return graph_of_job(build_job(spec, "meta"))


class TrainingStep(nn.Module):
    """`loss_fn(module(*args, **kwargs))` as one module: the forward of a training step whose loss is the job's
    own, exported whole so that the loss's ops are graph nodes (with their FLOPs) and backward flows from them."""

    def __init__(self, module: nn.Module, loss_fn: Callable[[Any], torch.Tensor]) -> None:
        super().__init__()
        self.module = module
        self.loss_fn = loss_fn

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.loss_fn(self.module(*args, **kwargs))


_STEP_PREFIX = "module"  # the job's module inside a TrainingStep: its nodes' module paths are given without it


def graph_of_job(job: BuiltJob) -> Graph:
    """The graph of a built job (on the meta device) as its step runs it: the module's forward, and for a training
    job with its own loss (`BuiltJob.own_loss`: a user module's `loss_fn`) that loss too, exactly as
    `perfmodel.profilers.iteration.make_step` computes it. Nodes keep the module paths of the job's module."""
    spec = job.spec
    kwargs = dict(job.kwargs)
    model_type = getattr(getattr(job.module, "config", None), "model_type", None)
    if model_type in EXPORT_INPUTS:
        kwargs = EXPORT_INPUTS[model_type](kwargs)
    if not (job.own_loss and spec.mode.value == "train"):
        graph = graph_from_module(job.module, job.args, kwargs, name=spec.name, mode=spec.mode.value,
                                  job_id=spec.key())
        return graph.model_copy(update={"batch_size": spec.batch_size})
    graph = graph_from_module(TrainingStep(job.module, job.loss_fn), job.args, kwargs, name=spec.name,
                              mode=spec.mode.value, job_id=spec.key())
    nodes = tuple(node.model_copy(update={"module": _unprefixed(node.module)}) for node in graph.nodes)
    return graph.model_copy(update={"nodes": nodes, "batch_size": spec.batch_size})


def _unprefixed(path: str | None) -> str | None:
    if path is None or path == _STEP_PREFIX:  # the step's own ops (the loss), the job's module's root
        return None
    return path.removeprefix(_STEP_PREFIX + ".")


def graph_from_exported(exported: torch.export.ExportedProgram, module: nn.Module | None = None, *, name: str,
                        mode: GraphMode = "train", job_id: str | None = None, moe: MoEInfo | None = None,
                        saved: tuple[int | None, int | None] = (None, None)) -> Graph:
    """Build the graph of an already exported program (`module`, when given, says which parameters are frozen;
    `moe` describes its MoE layers, when it has some; `saved` is what autograd saves in a training forward, as
    captured and under autocast: `GraphTotals.saved_activation_bytes[_amp]`)."""
    builder = _Builder(exported, module, training=mode == "train")
    builder.visit(exported.graph_module, prefix="", grad_enabled=True)
    nodes = builder.nodes
    activation_bytes = sum(sum(tensor_bytes(t) for t in n.output_tensors) for n in nodes if n.kind != OpKind.view)
    totals = GraphTotals.from_nodes(nodes, params=builder.param_elements, param_bytes=builder.param_bytes,
                                    activation_bytes=activation_bytes, saved_activation_bytes=saved[0],
                                    saved_activation_bytes_amp=saved[1])
    return Graph(name=name, source="torch.export", mode=mode, job_id=job_id, nodes=tuple(nodes), totals=totals,
                 inputs=tuple(builder.user_inputs), moe=moe)


# --- internals ---------------------------------------------------------------------------------------------------


def tensor_meta(value: Any) -> TensorMeta | None:
    """TensorMeta of a (fake/meta/real) tensor; None for anything else. Symbolic sizes become their hint."""
    if not isinstance(value, torch.Tensor):
        return None
    return TensorMeta(shape=tuple(_to_int(d) for d in value.shape), dtype=str(value.dtype).removeprefix("torch."))


def _to_int(dim: Any) -> int:
    if isinstance(dim, int):
        return dim
    try:
        return int(dim)
    except Exception:  # an unbacked SymInt: its hint, else 1
        hint = getattr(getattr(dim, "node", None), "hint", None)
        return int(hint) if hint is not None else 1


def _flat_metas(value: Any) -> Iterator[TensorMeta]:
    """The tensors in a node's value (a tensor, or nested tuples/lists holding some)."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _flat_metas(v)
    else:
        meta = tensor_meta(value)
        if meta is not None:
            yield meta


def _op_name(target: Any) -> str:
    """`aten.addmm.default` for ATen overloads, the function name (`getitem`) for Python callables."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    return getattr(target, "__name__", None) or str(target)


class _Builder:
    """Walks an exported fx graph once, in order, producing Nodes."""

    def __init__(self, exported: torch.export.ExportedProgram, module: nn.Module | None, training: bool):
        signature = exported.graph_signature
        self.training = training
        self.nodes: list[Node] = []
        self.user_inputs: list[TensorMeta] = []
        self.param_elements = 0
        self.param_bytes = 0
        # Per fx node (keyed by the node object, so inlined subgraphs cannot collide): its TensorMetas, the id of
        # the graph Node producing it (None for placeholders), whether it needs a gradient, and whether it is a
        # parameter or buffer (params of consumer nodes).
        self.metas: dict[fx.Node, list[TensorMeta]] = {}
        self.producer: dict[fx.Node, str | None] = {}
        self.requires_grad: dict[fx.Node, bool] = {}
        self.weight_elements: dict[fx.Node, int] = {}
        frozen = set()
        if module is not None:
            frozen = {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}
        user_inputs = set(signature.user_inputs)
        # (read once: the signature builds these mappings anew on each access, which made this loop quadratic)
        to_parameters, to_buffers = signature.inputs_to_parameters, signature.inputs_to_buffers
        counted: set[int] = set()  # tied parameters (GPT-2's lm_head and wte) are one tensor: count it once
        for node in exported.graph.nodes:
            if node.op != "placeholder":
                continue
            metas = list(_flat_metas(node.meta.get("val")))
            self.metas[node] = metas
            self.producer[node] = None
            if node.name in to_parameters:
                param = to_parameters[node.name]
                self.requires_grad[node] = training and param not in frozen
                self.weight_elements[node] = sum(m.numel for m in metas)
                tensor = exported.state_dict.get(param)
                if tensor is None or id(tensor) not in counted:
                    counted.add(id(tensor))
                    self.param_elements += sum(m.numel for m in metas)
                    self.param_bytes += sum(tensor_bytes(m) for m in metas)
            elif node.name in to_buffers:
                self.weight_elements[node] = sum(m.numel for m in metas)
            elif node.name in user_inputs:
                self.user_inputs.extend(metas)

    def visit(self, graph_module: fx.GraphModule, prefix: str, grad_enabled: bool) -> None:
        for fx_node in graph_module.graph.nodes:
            if fx_node.op == "call_function":
                subgraphs = [sub for a in fx_node.args
                             if isinstance(a, fx.Node) and a.op == "get_attr" and isinstance(a.target, str)
                             and isinstance(sub := getattr(graph_module, a.target, None), fx.GraphModule)]
                if subgraphs:
                    self._inline(fx_node, subgraphs, prefix, grad_enabled)
                else:
                    self._add(fx_node, prefix, grad_enabled)

    def _inline(self, fx_node: fx.Node, subgraphs: list[fx.GraphModule], prefix: str, grad_enabled: bool) -> None:
        """A higher-order op: its subgraphs' placeholders take the operands after the last subgraph argument."""
        if fx_node.target is torch.ops.higher_order.wrap_with_set_grad_enabled:
            grad_enabled = bool(fx_node.args[0])
        last_sub = max(i for i, a in enumerate(fx_node.args) if isinstance(a, fx.Node) and a.op == "get_attr")
        operands = list(_flat_nodes(fx_node.args[last_sub + 1:]))
        outputs: list[fx.Node] = []
        for sub in subgraphs:
            placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
            for placeholder, operand in zip(placeholders, operands):
                self._alias(placeholder, operand)
            self.visit(sub, prefix=f"{prefix}{fx_node.name}.", grad_enabled=grad_enabled)
            output = next(n for n in sub.graph.nodes if n.op == "output")
            outputs.extend(_flat_nodes(output.args))
        # The wrapper itself: a view node over its subgraph's outputs (getitem nodes on it then index it).
        node_id = prefix + fx_node.name
        metas = list(_flat_metas(fx_node.meta.get("val")))
        self.nodes.append(Node(id=node_id, op=_op_name(fx_node.target), kind=OpKind.view,
                               inputs=tuple(dict.fromkeys(p for p in (self.producer.get(o) for o in outputs) if p)),
                               output_tensors=tuple(metas)))
        self.metas[fx_node] = metas
        self.producer[fx_node] = node_id
        self.requires_grad[fx_node] = any(self.requires_grad.get(o, False) for o in outputs)

    def _alias(self, placeholder: fx.Node, operand: fx.Node) -> None:
        self.metas[placeholder] = self.metas.get(operand, [])
        self.producer[placeholder] = self.producer.get(operand)
        self.requires_grad[placeholder] = self.requires_grad.get(operand, False)
        if operand in self.weight_elements:
            self.weight_elements[placeholder] = self.weight_elements[operand]

    def _add(self, fx_node: fx.Node, prefix: str, grad_enabled: bool) -> None:
        op = _op_name(fx_node.target)
        kind = kind_of(op)
        node_id = prefix + fx_node.name
        outputs = tuple(_flat_metas(fx_node.meta.get("val")))
        arg_nodes = list(_flat_nodes((fx_node.args, fx_node.kwargs)))
        inputs: list[TensorMeta] = []
        grad_inputs: list[bool] = []
        for a in arg_nodes:
            for meta in self.metas.get(a, ()):
                inputs.append(meta)
                grad_inputs.append(self.requires_grad.get(a, False))
        needs_grad = (self.training and grad_enabled and any(grad_inputs) and any(is_float(t) for t in outputs)
                      and fx_node.target not in _NO_GRAD_TARGETS)
        call = OpCall(inputs=tuple(inputs), outputs=outputs, attrs=self._attrs(fx_node),
                      grad_inputs=tuple(grad_inputs) if needs_grad else None)
        cost = op_cost(op, call, kind)
        producers = dict.fromkeys(p for p in (self.producer.get(a) for a in arg_nodes) if p is not None)
        stack = fx_node.meta.get("nn_module_stack")
        module_path = next(reversed(stack.values()))[0] if stack else None
        self.nodes.append(Node(
            id=node_id, op=op, kind=kind, inputs=tuple(producers), input_tensors=tuple(inputs), output_tensors=outputs,
            flops_fwd=cost.flops_fwd, flops_bwd=cost.flops_bwd,
            bytes_read_fwd=cost.bytes_read_fwd, bytes_written_fwd=cost.bytes_written_fwd,
            bytes_read_bwd=cost.bytes_read_bwd, bytes_written_bwd=cost.bytes_written_bwd,
            params=sum(self.weight_elements.get(a, 0) for a in dict.fromkeys(arg_nodes)),
            module=module_path or None, dilation=conv_dilation(call) if kind == OpKind.conv else 1,
            causal=kind == OpKind.attention and sdpa_causal(call),
            equation=einsum_equation(call),
        ))
        if fx_node.target is operator.getitem and isinstance(fx_node.args[0], fx.Node):
            # One element of a tuple: its own value, but the gradient status of the tuple.
            needs_grad = self.requires_grad.get(fx_node.args[0], False) and any(is_float(t) for t in outputs)
        self.metas[fx_node] = list(outputs)
        self.producer[fx_node] = node_id
        self.requires_grad[fx_node] = needs_grad

    def _attrs(self, fx_node: fx.Node) -> dict[str, Any]:
        """The op's arguments by schema name, tensors as TensorMeta (lists of tensors as lists)."""
        schema = getattr(fx_node.target, "_schema", None)
        if schema is None:
            return {}
        attrs = {arg.name: value for arg, value in zip(schema.arguments, fx_node.args)}
        attrs.update(fx_node.kwargs)
        return {k: self._value(v) for k, v in attrs.items()}

    def _value(self, value: Any) -> Any:
        if isinstance(value, fx.Node):
            metas = self.metas.get(value, [])
            return metas[0] if len(metas) == 1 else metas
        if isinstance(value, (list, tuple)):
            return [self._value(v) for v in value]
        return value


# Ops whose output never carries a gradient, whatever their inputs.
_NO_GRAD_TARGETS = frozenset({torch.ops.aten.detach.default})


def _flat_nodes(value: Any) -> Iterator[fx.Node]:
    if isinstance(value, fx.Node):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _flat_nodes(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flat_nodes(v)
