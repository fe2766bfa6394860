"""The framework-neutral graph IR: op nodes with canonical kinds, shapes, dtypes, FLOPs and bytes, and edges.

Built from PyTorch (`perfmodel.graph.from_torch`) and from ONNX (`perfmodel.graph.from_onnx`); serialised as JSON
with `schema_version`. Nodes are in execution (topological) order. Costs are per node for forward and for backward
(backward is zero for nodes that need no gradient work, and for inference graphs). Totals are explicit sums over
the nodes (`GraphTotals.from_nodes`).

A mixture-of-experts model's graph also carries `Graph.moe` (`MoEInfo`): its sparse blocks were captured with
balanced top-k routing (`perfmodel.graph.moe`), and the placement model needs the experts' sizes. The field is
optional and left out of the JSON when absent, so dense graphs serialise as before and older IR JSON still loads.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfmodel.core.opkinds import OpKind
from perfmodel.core.renamed import upgrade_names

SCHEMA_VERSION = 1
# What a capture records beyond what the schema requires; a new revision (2: convolutions' dilation; 3: causal fused
# attention; 4: einsums' equations; 5: saved bytes with CUDA's one-byte dropout masks) makes caches of captured graphs
# (`perfmodel.engine.graphs`) capture again rather than serve a graph that lacks it.
CAPTURE_REVISION = 5


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TensorMeta(_Frozen):
    shape: tuple[int, ...]
    dtype: str  # torch-style name: float32, float16, bfloat16, int64, bool, ...

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class Node(_Frozen):
    id: str  # unique within the graph
    op: str  # framework op name: aten.addmm.default, onnx::Gemm
    kind: OpKind
    inputs: tuple[str, ...] = ()  # ids of the nodes producing this node's inputs (the graph's edges)
    input_tensors: tuple[TensorMeta, ...] = ()
    output_tensors: tuple[TensorMeta, ...] = ()
    flops_fwd: int = 0
    flops_bwd: int = 0
    bytes_read_fwd: int = 0
    bytes_written_fwd: int = 0
    bytes_read_bwd: int = 0
    bytes_written_bwd: int = 0
    params: int = 0  # parameter elements this node reads (weights, biases)
    module: str | None = None  # owning nn.Module path or ONNX node name, when known
    # A convolution's largest dilation (`perfmodel.graph.flops.conv_dilation`): what decides whether cuDNN has a
    # tensor-core algorithm for it (`perfmodel.predictor.math_modes`). Left out of the JSON at 1, so graphs without
    # dilated convolutions serialise as before and older IR JSON still loads.
    dilation: int = Field(default=1, ge=1, exclude_if=lambda value: value == 1)
    # A fused attention (`scaled_dot_product_attention`) called with `is_causal=True`
    # (`perfmodel.graph.flops.sdpa_causal`): a fused kernel skips the key blocks above the diagonal. Left out of the
    # JSON when false, as `dilation` at 1.
    causal: bool = Field(default=False, exclude_if=lambda value: not value)
    # An einsum's equation (`perfmodel.graph.flops.einsum_equation`, spaces removed: "ibnd,jbnd->ijbn"): which of its
    # dimensions are batch, rows, columns and contraction of the GEMM it runs (`perfmodel.lowering.rows`). Left out
    # of the JSON when None, as `dilation` at 1.
    equation: str | None = Field(default=None, exclude_if=lambda value: value is None)


class GraphTotals(_Frozen):
    nodes: int
    flops_fwd: int
    flops_bwd: int
    bytes_read_fwd: int
    bytes_written_fwd: int
    bytes_read_bwd: int
    bytes_written_bwd: int
    params: int  # parameter elements of the model (each counted once)
    param_bytes: int
    activation_bytes: int  # bytes of the outputs of compute nodes (what training keeps for backward, upper bound)
    ops_by_kind: dict[str, int]
    flops_fwd_by_kind: dict[str, int]
    # What autograd really saves for backward in one training forward, plus the forward's outputs and inputs
    # (distinct storages, parameters and buffers excluded), measured at capture (`perfmodel.graph.saved`): with the
    # module as captured, and under CUDA float16 autocast (emulated). None when not measured (inference, ONNX and
    # hand-built graphs, IR written before these fields); left out of the JSON then, so older IR loads unchanged.
    saved_activation_bytes: int | None = Field(default=None, ge=0, exclude_if=lambda value: value is None)
    saved_activation_bytes_amp: int | None = Field(default=None, ge=0, exclude_if=lambda value: value is None)

    @classmethod
    def from_nodes(cls, nodes: list[Node] | tuple[Node, ...], params: int, param_bytes: int,
                   activation_bytes: int, saved_activation_bytes: int | None = None,
                   saved_activation_bytes_amp: int | None = None) -> GraphTotals:
        kinds: Counter[str] = Counter()
        flops_by_kind: Counter[str] = Counter()
        for n in nodes:
            kinds[n.kind.value] += 1
            flops_by_kind[n.kind.value] += n.flops_fwd
        return cls(
            nodes=len(nodes),
            flops_fwd=sum(n.flops_fwd for n in nodes),
            flops_bwd=sum(n.flops_bwd for n in nodes),
            bytes_read_fwd=sum(n.bytes_read_fwd for n in nodes),
            bytes_written_fwd=sum(n.bytes_written_fwd for n in nodes),
            bytes_read_bwd=sum(n.bytes_read_bwd for n in nodes),
            bytes_written_bwd=sum(n.bytes_written_bwd for n in nodes),
            params=params,
            param_bytes=param_bytes,
            activation_bytes=activation_bytes,
            ops_by_kind=dict(sorted(kinds.items())),
            flops_fwd_by_kind=dict(sorted(flops_by_kind.items())),
            saved_activation_bytes=saved_activation_bytes,
            saved_activation_bytes_amp=saved_activation_bytes_amp,
        )


class MoEInfo(_Frozen):
    """The mixture-of-experts layers of a graph, captured assuming perfectly balanced top-k routing."""

    routing: Literal["balanced"] = "balanced"
    experts: int = Field(gt=0, description="experts per MoE layer")
    top_k: int = Field(gt=0, description="experts each token goes to")
    layers: int = Field(gt=0, description="number of MoE layers")
    expert_params: int = Field(ge=0, description="parameter elements of all experts of all MoE layers")
    hidden: int = Field(gt=0, description="hidden size of the tokens sent to the experts")
    tokens: int = Field(gt=0, description="tokens per micro-batch entering each MoE layer (batch x seq)")


class Graph(_Frozen):
    schema_version: int = SCHEMA_VERSION
    name: str
    source: Literal["torch.export", "onnx"]
    mode: Literal["train", "inference"] = "train"
    job_id: str | None = None
    nodes: tuple[Node, ...]
    totals: GraphTotals
    inputs: tuple[TensorMeta, ...] = Field(default=(), description="the graph's user inputs")
    batch_size: int | None = Field(default=None, ge=1, exclude_if=lambda value: value is None,
                                   description="the per-device batch the graph was captured at (None: not recorded; "
                                               "then its inputs' shared leading dimension is taken)")
    moe: MoEInfo | None = Field(default=None, exclude_if=lambda value: value is None,
                                description="mixture-of-experts layers (balanced routing assumed); None if dense")

    @property
    def edges(self) -> list[tuple[str, str]]:
        """(producer id, consumer id) pairs."""
        return [(src, n.id) for n in self.nodes for src in n.inputs]

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        import json

        data = json.loads(text)
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            from perfmodel.core.errors import PerfmodelError

            raise PerfmodelError(f"graph IR schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
        return cls.model_validate(data)

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """Inputs written before the renames of issue 15 (`perfmodel.core.renamed`) under today's names."""
        return upgrade_names(data)
