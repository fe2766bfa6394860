"""Measured-profile transfer (`perfmodel.predictor.transfer`) against NeuSight's per-op label tables.

NeuSight measured one-layer versions of its models (embeddings + one block + head) node by node on several GPUs:
`label/<GPU>/<model>-<train|inf>-<seq>-<batch>.csv`, a torch.fx node table with `op`, `target`, `meta` (the
module stack), `_args`, `input_shapes`, `input_contiguous`, `output_shape`, `dtype`, `fw_latency`, `bw_latency`
(ms). The same (model, mode, seq, batch) table on two GPUs is the same graph timed twice, so each GPU's forward
per-op times can be transferred to every other GPU and compared with what that GPU measured.

`label_table_ops` maps every node to a row of the regressor's schema, or says why it has none (`status`):

- `mapped`: a kernel of an op class the regressor knows (`FX_RULES`, keyed by the node's target: the function or
  method name, or `module:<class>` for a module call, the class read from `meta`'s nn_module_stack);
- `no-kernel`: nothing runs on the GPU: views (view, permute, transpose, expand, getitem, ...), Python values
  (the node's output has no dtype: size, getattr, int arithmetic on sizes), dropout in inference, conversions to the
  dtype the input already has, `contiguous` / `reshape` of a contiguous input, graph inputs / outputs / attributes.
  NeuSight still timed these (~0.01 ms each: the timer's floor);
- `unmapped`: a kernel with no rule (e.g. `torch.tensor`, a host-to-device copy).

Mapping (numel = elements of the node's output; element-wise and memory rows are batch × hidden with hidden = the
output's last dim):

| target | row |
|---|---|
| module:Linear, linear, addmm, mm, matmul / bmm with a 2-D right operand | `linear` m = rows of the input, n, k |
| bmm, baddbmm, matmul with batched operands | `bmm` batch (broadcast), m, n, k |
| softmax, log_softmax, module:Softmax | `softmax` over the last dim |
| module:LayerNorm, layer_norm | `layernorm` over the last dim |
| add, sub, rsub, where, masked_fill, max, min, comparisons / mul / truediv, div / pow | `elementwise` add / mul / div / pow when two inputs have the output's numel, else the `u` (tensor-with-scalar) name |
| tanh, gelu, relu and their modules (Tanh, GELU, NewGELUActivation, ReLU) | `elementwise` tanh / gelu / relu |
| dropout, module:Dropout | training: `elementwise mul` (x × mask); inference: no kernel |
| embedding, module:Embedding | memory row reading and writing numel (a row gather) |
| contiguous, reshape, flatten of a non-contiguous input; clone; cumsum | memory row reading and writing numel |
| to, type, type_as, long, bool, float, half, int changing the dtype | memory row reading and writing numel |
| full, ones, zeros, arange, *_like | memory row writing numel |

A memory row is `perfmodel.lowering.rows.memory_row` (the element-wise row of equal bytes). Every row is
fp32 when the node's output is float32 (fp16 / bf16 likewise); int64 and bool outputs (masks, position ids) are
mapped as fp32 too: few and small.

`evaluate_transfer` does every ordered GPU pair of every table that exists on two or more GPUs: the source GPU's
forward times of the mapped nodes are transferred to the target (`transfer_ops`) and summed, and compared with the
target's measured sum over the same nodes; the regressor's direct prediction on the target (its
`target_predicted_ms`, which uses no measurement) is the baseline. The `_all` columns add the nodes without a row
at the source GPU's measured time (their share is small, see `coverage`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.lowering.ops import SHAPE_COLUMNS
from perfmodel.lowering.rows import Gemm, Row, bmm_row, linear_row, memory_row, vector_row
from perfmodel.predictor.transfer import transfer_ops

MAPPED, NO_KERNEL, UNMAPPED = "mapped", "no-kernel", "unmapped"
NODE_COLUMNS = ("name", "fx_op", "fx_target", "status", "reason", "op_class", "op_name", "dtype", *SHAPE_COLUMNS,
                "fw_ms", "bw_ms")
TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


# --- one fx node ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FxNode:
    """What a rule may look at: the node's shapes, output dtype, inputs' contiguity and the table's mode."""

    name: str
    fx_op: str
    target: str
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    contiguous_inputs: tuple[bool, ...]
    dtype: str | None  # torch dtype of the output ("torch.float32"); None for a Python value
    input_dtype: str | None  # dtype of the node the first argument names, when known
    training: bool

    @property
    def numel(self) -> int:
        return max(int(np.prod(self.output)) if self.output else 1, 1)

    @property
    def hidden(self) -> int:
        return max(self.output[-1], 1) if self.output else 1


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str
    row: Row | None = None


Rule = Callable[[FxNode], Outcome]


def _mapped(row: Row, reason: str) -> Outcome:
    return Outcome(MAPPED, reason, row)


def _none(reason: str) -> Rule:
    return lambda node: Outcome(NO_KERNEL, reason)


def _numel(shape: Sequence[int]) -> int:
    return max(int(np.prod(shape)) if len(shape) else 1, 1)


def _vector(op_class: str, op_name: str, numel: int, hidden: int) -> Row:
    return vector_row(op_class, op_name, "fwd", numel, hidden)


def _linear(m: int, n: int, k: int) -> Row:
    return linear_row(m, n, k, "fwd")


def _bmm(batch: int, m: int, n: int, k: int) -> Row:
    return bmm_row(Gemm(batch, m, n, k), "fwd")


def _gemm(a: Sequence[int], b: Sequence[int]) -> Row:
    """A (..., M, K) @ B (..., K, N): `linear` when B is a matrix (shared weight), else a broadcast `bmm`."""
    a = (1, a[0]) if len(a) == 1 else tuple(a)
    b = (b[0], 1) if len(b) == 1 else tuple(b)
    if len(b) == 2:
        return _linear(_numel(a[:-1]), b[-1], a[-1])
    width = max(len(a), len(b)) - 2
    a_batch = (1,) * (width - (len(a) - 2)) + a[:-2]
    b_batch = (1,) * (width - (len(b) - 2)) + b[:-2]
    return _bmm(_numel([max(x, y) for x, y in zip(a_batch, b_batch)]), a[-2], b[-1], a[-1])


def _linear_module(node: FxNode) -> Outcome:
    if not node.inputs or not node.inputs[0] or not node.output:
        return Outcome(UNMAPPED, "linear without shapes")
    x = node.inputs[0]
    return _mapped(_linear(_numel(x[:-1]), node.output[-1], x[-1]), "linear")


def _linear_function(node: FxNode) -> Outcome:  # F.linear(x, w (N, K), b)
    if len(node.inputs) >= 2 and len(node.inputs[1]) == 2:
        x, w = node.inputs[0], node.inputs[1]
        return _mapped(_linear(_numel(x[:-1]), w[0], x[-1]), "linear")
    return _linear_module(node)


def _operands(first: int) -> Rule:
    """A GEMM whose operands are inputs `first` and `first + 1` (addmm, baddbmm: the bias comes first)."""

    def rule(node: FxNode) -> Outcome:
        if len(node.inputs) < first + 2 or not node.inputs[first] or not node.inputs[first + 1]:
            return Outcome(UNMAPPED, "GEMM without operand shapes")
        return _mapped(_gemm(node.inputs[first], node.inputs[first + 1]), "GEMM")

    return rule


def _softmax(node: FxNode) -> Outcome:
    return _mapped(_vector("softmax", "softmax", node.numel, node.hidden), "softmax over the last dim")


def _layernorm(node: FxNode) -> Outcome:
    return _mapped(_vector("layernorm", "ln", node.numel, node.hidden), "layernorm over the last dim")


def _binary(node: FxNode) -> bool:
    return sum(1 for shape in node.inputs if _numel(shape) == node.numel) >= 2


def _elementwise(base: str) -> Rule:
    """`base` when two inputs have the output's numel (two tensors read), else `base` + u (one tensor read)."""

    def rule(node: FxNode) -> Outcome:
        name = base if _binary(node) else base + "u"
        return _mapped(_vector("elementwise", name, node.numel, node.hidden), f"element-wise {name}")

    return rule


def _unary(name: str) -> Rule:
    return lambda node: _mapped(_vector("elementwise", name, node.numel, node.hidden), f"element-wise {name}")


def _memory(read: float, written: float, why: str) -> Rule:
    """A memory-bound kernel reading `read` × numel and writing `written` × numel elements."""
    return lambda node: _mapped(memory_row(read * node.numel, written * node.numel, node.hidden, "fwd"), why)


def _dropout(node: FxNode) -> Outcome:
    if not node.training:
        return Outcome(NO_KERNEL, "dropout in inference is the identity")
    return _mapped(_vector("elementwise", "mul", node.numel, node.hidden), "dropout: x × mask")


def _copy_if_strided(node: FxNode) -> Outcome:
    if node.contiguous_inputs and not node.contiguous_inputs[0]:
        return _memory(1, 1, "copy of a non-contiguous input")(node)
    return Outcome(NO_KERNEL, "view of a contiguous input")


def _conversion(node: FxNode) -> Outcome:
    if node.input_dtype is not None and node.input_dtype == node.dtype:
        return Outcome(NO_KERNEL, "conversion to the input's own dtype")
    return _memory(1, 1, "dtype conversion")(node)


_VIEWS = ("view", "permute", "transpose", "expand", "expand_as", "view_as", "unsqueeze", "squeeze", "split",
          "chunk", "unbind", "getitem", "t", "narrow", "select", "detach", "size", "dim", "getattr", "torch.finfo",
          "torch.iinfo")
_BINARY = {"add": "add", "iadd": "add", "sub": "add", "rsub": "add", "where": "add", "masked_fill": "add",
           "masked_fill_": "add", "max": "add", "min": "add", "maximum": "add", "minimum": "add", "eq": "add",
           "ne": "add", "lt": "add", "gt": "add", "le": "add", "ge": "add", "and_": "add", "or_": "add",
           "mul": "mul", "imul": "mul", "truediv": "div", "div": "div", "floordiv": "div", "pow": "pow"}
_UNARY = {"tanh": "tanh", "module:Tanh": "tanh", "gelu": "gelu", "module:GELU": "gelu",
          "module:NewGELUActivation": "gelu", "module:GELUActivation": "gelu", "relu": "relu", "module:ReLU": "relu",
          "sqrt": "powu", "rsqrt": "powu", "exp": "mulu", "log": "mulu", "neg": "mulu", "erf": "mulu"}

# the node's target -> its rule (targets of call_module nodes are "module:<class>")
FX_RULES: dict[str, Rule] = {
    "module:Linear": _linear_module, "linear": _linear_function, "addmm": _operands(1), "mm": _operands(0),
    "matmul": _operands(0), "bmm": _operands(0), "baddbmm": _operands(1),
    "softmax": _softmax, "log_softmax": _softmax, "module:Softmax": _softmax,
    "module:LayerNorm": _layernorm, "layer_norm": _layernorm,
    **{name: _elementwise(base) for name, base in _BINARY.items()},
    **{name: _unary(op) for name, op in _UNARY.items()},
    "dropout": _dropout, "module:Dropout": _dropout,
    "embedding": _memory(1, 1, "embedding: a row gather"), "module:Embedding": _memory(1, 1, "embedding: a row gather"),
    "contiguous": _copy_if_strided, "reshape": _copy_if_strided, "flatten": _copy_if_strided,
    "clone": _memory(1, 1, "copy"), "cumsum": _memory(1, 1, "scan"),
    **{name: _conversion for name in ("to", "type", "type_as", "long", "bool", "float", "half", "int")},
    **{name: _memory(0, 1, "fill") for name in ("full", "ones", "zeros", "arange", "empty", "ones_like",
                                                  "zeros_like", "full_like")},
    **{name: _none("a view (no kernel)") for name in _VIEWS},
    "placeholder": _none("graph input"), "get_attr": _none("parameter or buffer"), "output": _none("graph output"),
}

_CALLABLE = re.compile(r"^<(?:built-in (?:function|method)|function) ([A-Za-z_]\w*)")
_CLASS = re.compile(r"<class '([\w.]+)'>")
_FIRST_ARG = re.compile(r"^\(*\s*([A-Za-z_]\w*)")


def fx_target(fx_op: str, target: Any, meta: Any) -> str:
    """The key of a node in `FX_RULES`: the function or method name, `module:<class>` for a module call (the
    innermost class of `meta`'s nn_module_stack), or the fx op for placeholder / get_attr / output."""
    if fx_op in ("placeholder", "get_attr", "output"):
        return fx_op
    if fx_op == "call_module":
        classes = _CLASS.findall(str(meta))
        return "module:" + (classes[-1].rsplit(".", 1)[-1] if classes else str(target))
    text = str(target)
    match = _CALLABLE.match(text)
    if match:
        return match.group(1)
    match = _CLASS.fullmatch(text)
    return match.group(1) if match else text


def _literal(text: Any) -> Any:
    if not isinstance(text, str):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return ()


def _dtype(value: Any) -> str | None:
    return value if isinstance(value, str) and value.startswith("torch.") else None


def label_table_ops(frame: pd.DataFrame, mode: str) -> pd.DataFrame:
    """One row per node of a NeuSight per-op label table (`NODE_COLUMNS`): its mapping (`status`, `reason`, and
    for mapped nodes the regressor's schema, `device` left out) and measured `fw_ms` / `bw_ms`. `mode` is the
    table's: train or inference (dropout runs a kernel only in training)."""
    if mode not in ("train", "inference"):
        raise PerfmodelError(f"mode must be 'train' or 'inference', got {mode!r}")
    needed = ("op", "target", "input_shapes", "output_shape", "fw_latency")
    missing = [c for c in needed if c not in frame]
    if missing:
        raise PerfmodelError(f"not a NeuSight per-op label table: no column(s) {', '.join(missing)}")
    names = frame["Name"].astype(str) if "Name" in frame else pd.Series([f"node{i}" for i in range(len(frame))])
    dtypes = frame["dtype"] if "dtype" in frame else pd.Series([None] * len(frame))
    dtype_of = {name: _dtype(d) for name, d in zip(names, dtypes)}
    records = []
    for i, row in enumerate(frame.to_dict("records")):
        fx_op = str(row["op"])
        target = fx_target(fx_op, row["target"], row.get("meta"))
        inputs = tuple(_shape(s) for s in (_literal(row["input_shapes"]) or ()))
        contiguous = _literal(row.get("input_contiguous")) or ()
        first_arg = _FIRST_ARG.match(str(row.get("_args") or ""))
        node = FxNode(name=names.iloc[i], fx_op=fx_op, target=target, inputs=inputs,
                      output=_shape(_literal(row["output_shape"])),
                      contiguous_inputs=tuple(bool(c) for c in contiguous if isinstance(c, bool)),
                      dtype=_dtype(row.get("dtype")),
                      input_dtype=dtype_of.get(first_arg.group(1)) if first_arg else None,
                      training=mode == "train")
        if node.dtype is None and fx_op not in ("placeholder", "get_attr", "output"):
            outcome = Outcome(NO_KERNEL, "a Python value (host)")
        else:
            rule = FX_RULES.get(target)
            outcome = rule(node) if rule else Outcome(UNMAPPED, f"no rule for {target!r}")
        record: dict[str, Any] = {"name": node.name, "fx_op": fx_op, "fx_target": target, "status": outcome.status,
                                  "reason": outcome.reason, "op_class": None, "op_name": None, "dtype": None,
                                  **dict.fromkeys(SHAPE_COLUMNS, 0),
                                  "fw_ms": _ms(row.get("fw_latency")), "bw_ms": _ms(row.get("bw_latency"))}
        if outcome.row is not None:
            record.update(op_class=outcome.row.op_class, op_name=outcome.row.op_name,
                          dtype=TORCH_DTYPES.get(node.dtype or "", "fp32"),
                          **{k: int(v) for k, v in outcome.row.shape.items()})
        records.append(record)
    out = pd.DataFrame.from_records(records, columns=list(NODE_COLUMNS))
    for column in SHAPE_COLUMNS:
        out[column] = out[column].astype(np.int64)
    return out


def _ms(value: Any) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        return 0.0
    return result if np.isfinite(result) and result > 0 else 0.0


def coverage(nodes: pd.DataFrame) -> dict[str, float]:
    """Measured forward ms of a parsed table by status, and the mapped share of the total."""
    by = nodes.groupby("status")["fw_ms"].sum()
    total = float(nodes["fw_ms"].sum())
    result = {f"{status}_ms": float(by.get(status, 0.0)) for status in (MAPPED, NO_KERNEL, UNMAPPED)}
    result["total_ms"] = total
    result["mapped_share"] = result[f"{MAPPED}_ms"] / total if total else float("nan")
    return result


# --- the tables on disk --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelTable:
    path: Path
    gpu: str  # the folder name
    device: str  # its catalog id
    model: str
    mode: str  # train | inference
    seq_len: int
    batch_size: int

    @property
    def key(self) -> tuple[str, str, int, int]:
        return self.model, self.mode, self.seq_len, self.batch_size


def scan_label_tables(root: str | Path, catalog: Mapping[str, HardwareSpec]) -> tuple[list[LabelTable], list[str]]:
    """The per-op label tables under `root/label/<GPU>/` (root: the NeuSight folder or the one holding it) whose
    GPU the catalog knows, and the files skipped with why."""
    from perfmodel.evaluation.neusight_models import label_folder_device, neusight_root, parse_label_name

    label_dir = neusight_root(root) / "label"
    if not label_dir.is_dir():
        raise PerfmodelError(f"no NeuSight label folder at {label_dir}")
    tables, skipped = [], []
    devices: dict[str, str | None] = {}
    for path in sorted(label_dir.glob("*/*.csv")):
        name = parse_label_name(path.stem)
        if name is None or name.variant is not None:
            skipped.append(f"{path.parent.name}/{path.name}: not <model>-<train|inf>-<seq>-<batch>.csv")
            continue
        gpu = path.parent.name
        device = label_folder_device(gpu, catalog, devices)
        if device is None:
            skipped.append(f"{gpu}/{path.name}: GPU not in the hardware catalog")
            continue
        tables.append(LabelTable(path, gpu, device, name.model, name.mode, name.seq_len, name.batch_size))
    return tables, skipped


def read_label_table(table: LabelTable) -> pd.DataFrame:
    try:
        frame = pd.read_csv(table.path, low_memory=False)
    except (OSError, ValueError) as exc:
        raise PerfmodelError(f"cannot read {table.path}: {exc}") from None
    return label_table_ops(frame, table.mode)


# --- training rows from the op sweeps -----------------------------------------------------------------------------

SWEEP_PATTERNS = ("data/dataset/train/collect/*/*/*.csv*", "data/dataset_amd/train/collect/*/*/*.csv*")


def neusight_sweep_ops(root: str | Path, catalog: Mapping[str, HardwareSpec], *,
                       exclude_devices: Iterable[str] = (), op_classes: Iterable[str] | None = None,
                       max_rows_per_file: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Training rows (the regressor's schema + `latency_ms`) from NeuSight's per-GPU op sweeps
    (`data/dataset*/train/collect/<op>/p<torch>/<GPU>.csv.gz`), leaving out `exclude_devices` (catalog ids) and
    op classes not in `op_classes`; `max_rows_per_file` samples each file (seeded)."""
    from perfmodel.evaluation.neusight_models import neusight_root
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.lowering.ops import NEUSIGHT_OP_CLASS
    from perfmodel.predictor.op_table import ops_from_neusight_frame

    root = neusight_root(root)
    exclude = set(exclude_devices)
    classes = set(op_classes) if op_classes is not None else None
    paths = sorted({p for pattern in SWEEP_PATTERNS for p in root.glob(pattern)})
    if not paths:
        raise PerfmodelError(f"no NeuSight op sweeps under {root} (expected {SWEEP_PATTERNS[0]})")
    frames = []
    for path in paths:
        op = path.parent.parent.name
        if classes is not None and NEUSIGHT_OP_CLASS.get(op) not in classes:
            continue
        gpu = path.name.split(".csv")[0]
        try:
            if get_accelerator(gpu, catalog).name in exclude:
                continue
        except UnknownNameError:
            continue
        frame = pd.read_csv(path, low_memory=False)
        if max_rows_per_file is not None and len(frame) > max_rows_per_file:
            frame = frame.sample(n=max_rows_per_file, random_state=seed)
        frames.append(ops_from_neusight_frame(frame, catalog, with_latency=True))
    if not frames:
        raise PerfmodelError("no training rows left after the exclusions")
    return pd.concat(frames, ignore_index=True)


# --- the evaluation --------------------------------------------------------------------------------------------------

PAIR_COLUMNS = ("model", "mode", "seq_len", "batch_size", "source", "target", "source_device", "target_device",
                "rows", "mapped_share", "source_ms", "measured_ms", "transferred_ms", "direct_ms", "ape_transfer",
                "ape_direct", "extrapolated_share", "measured_all_ms", "transferred_all_ms", "ape_transfer_all")
CLASS_COLUMNS = ("model", "mode", "seq_len", "batch_size", "source", "target", "op_class", "rows", "source_ms",
                 "measured_ms", "transferred_ms", "direct_ms", "ape_transfer", "ape_direct")
COVERAGE_COLUMNS = ("model", "mode", "seq_len", "batch_size", "gpu", "device", "nodes", "total_ms", "mapped_ms",
                    "no-kernel_ms", "unmapped_ms", "mapped_share")


@dataclass
class TransferEvaluation:
    pairs: pd.DataFrame  # one row per (table, source, target)
    classes: pd.DataFrame  # one row per (table, source, target, op class)
    coverage: pd.DataFrame  # one row per table and GPU
    unmapped: pd.DataFrame  # measured forward ms of the nodes without a row, by status and target, over all tables


def ape(predicted: float, measured: float) -> float:
    if not measured or not np.isfinite(predicted):
        return float("nan")
    return abs(predicted - measured) / measured * 100.0


def evaluate_transfer(tables: Iterable[LabelTable], regressor_for_target: Callable[[str], Any],
                      catalog: Mapping[str, HardwareSpec],
                      progress: Callable[[str], None] | None = None) -> TransferEvaluation:
    """Transfer every GPU's forward per-op times to every other GPU that measured the same table (see the module
    docstring). `regressor_for_target(device id)` gives the regressor used for pairs ending on that device (e.g.
    one trained without it)."""
    groups: dict[tuple[str, str, int, int], list[LabelTable]] = {}
    for table in tables:
        groups.setdefault(table.key, []).append(table)
    pairs: list[dict[str, Any]] = []
    classes: list[dict[str, Any]] = []
    covered: list[Any] = []
    unmapped: list[Any] = []
    for key, members in sorted(groups.items()):
        members = sorted(members, key=lambda t: t.gpu)
        if len(members) < 2:
            continue
        model, mode, seq_len, batch_size = key
        if progress:
            progress(f"{model} {mode} seq {seq_len} batch {batch_size}: {len(members)} GPUs")
        nodes = {t.gpu: read_label_table(t) for t in members}
        for t in members:
            c = coverage(nodes[t.gpu])
            covered.append({"model": model, "mode": mode, "seq_len": seq_len, "batch_size": batch_size,
                            "gpu": t.gpu, "device": t.device, "nodes": len(nodes[t.gpu]), **c})
            rest = nodes[t.gpu][nodes[t.gpu]["status"] != MAPPED]
            unmapped.append(rest[["status", "fx_target", "reason", "fw_ms"]])
        for source in members:
            for target in members:
                if source is target:
                    continue
                pair, by_class = _transfer_pair(nodes[source.gpu], nodes[target.gpu], source, target,
                                                regressor_for_target(target.device), catalog)
                keys = {"model": model, "mode": mode, "seq_len": seq_len, "batch_size": batch_size,
                        "source": source.gpu, "target": target.gpu}
                pairs.append({**keys, **pair})
                classes.extend({**keys, **row} for row in by_class)
    unmapped_frame = (pd.concat(unmapped).groupby(["status", "fx_target", "reason"], as_index=False)
                      .agg(nodes=("fw_ms", "size"), fw_ms=("fw_ms", "sum")).sort_values("fw_ms", ascending=False)
                      if unmapped else pd.DataFrame(columns=["status", "fx_target", "reason", "nodes", "fw_ms"]))
    return TransferEvaluation(pd.DataFrame.from_records(pairs, columns=list(PAIR_COLUMNS)),
                              pd.DataFrame.from_records(classes, columns=list(CLASS_COLUMNS)),
                              pd.DataFrame.from_records(covered, columns=list(COVERAGE_COLUMNS)),
                              unmapped_frame.reset_index(drop=True))


def _transfer_pair(source_nodes: pd.DataFrame, target_nodes: pd.DataFrame, source: LabelTable, target: LabelTable,
                   regressor: Any, catalog: Mapping[str, HardwareSpec]) -> tuple[dict[str, Any], list[dict]]:
    """The source's mapped nodes that the target table has too, transferred and compared."""
    measured_on_target = target_nodes.set_index("name")["fw_ms"]
    mapped = source_nodes[(source_nodes["status"] == MAPPED) & source_nodes["name"].isin(measured_on_target.index)]
    ops = mapped.assign(device=source.device, latency_ms=mapped["fw_ms"])
    moved = transfer_ops(ops, target.device, regressor, catalog)
    moved["measured_ms"] = measured_on_target.reindex(moved["name"]).to_numpy()
    others = source_nodes[~source_nodes.index.isin(mapped.index)]
    measured_all = float(target_nodes["fw_ms"].sum())
    transferred_all = float(moved["transferred_ms"].sum() + others["fw_ms"].sum())
    pair: dict[str, Any] = {
        "source_device": source.device, "target_device": target.device, "rows": len(moved),
        "mapped_share": float(mapped["fw_ms"].sum() / source_nodes["fw_ms"].sum()) if source_nodes["fw_ms"].sum()
        else float("nan"),
        "source_ms": float(moved["latency_ms"].sum()), "measured_ms": float(moved["measured_ms"].sum()),
        "transferred_ms": float(moved["transferred_ms"].sum()),
        "direct_ms": float(moved["target_predicted_ms"].sum()),
        "extrapolated_share": float(moved["extrapolated"].mean()) if len(moved) else float("nan"),
        "measured_all_ms": measured_all, "transferred_all_ms": transferred_all,
        "ape_transfer_all": ape(transferred_all, measured_all),
    }
    pair["ape_transfer"] = ape(pair["transferred_ms"], pair["measured_ms"])
    pair["ape_direct"] = ape(pair["direct_ms"], pair["measured_ms"])
    by_class = []
    for op_class, rows in moved.groupby("op_class"):
        row: dict[str, Any] = {"op_class": op_class, "rows": len(rows), "source_ms": float(rows["latency_ms"].sum()),
               "measured_ms": float(rows["measured_ms"].sum()), "transferred_ms": float(rows["transferred_ms"].sum()),
               "direct_ms": float(rows["target_predicted_ms"].sum())}
        row["ape_transfer"] = ape(row["transferred_ms"], row["measured_ms"])
        row["ape_direct"] = ape(row["direct_ms"], row["measured_ms"])
        by_class.append(row)
    return pair, by_class


def mape_table(frame: pd.DataFrame, by: str | Sequence[str] | None) -> pd.DataFrame:
    """Mean and median APE (%) of transfer and direct prediction per `by` (None: overall)."""
    metrics = {"pairs": ("ape_transfer", "size"), "mape_transfer": ("ape_transfer", "mean"),
               "median_ape_transfer": ("ape_transfer", "median"), "mape_direct": ("ape_direct", "mean"),
               "median_ape_direct": ("ape_direct", "median")}
    if by is None:
        return frame.assign(_all="all").groupby("_all").agg(**metrics).rename_axis(None)
    return frame.groupby(by if isinstance(by, str) else list(by)).agg(**metrics)
