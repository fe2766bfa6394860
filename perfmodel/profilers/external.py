"""Op timings measured by others on real GPUs (public research data), as frozen records the store keeps.

An `OpMeasurement` is one measured op on one device: what it computed (op class, shapes, dtype, phase), where it
ran (a hardware-catalog id), how long it took (ms), and where the number came from (source, file, row). The
importers in `perfmodel.importers` read them from the published datasets; the store keeps them in the
`op_measurements` table for training per-op regressors across GPU types.

Shape conventions (all optional; a field is None when it does not apply or the source does not say):

- GEMM-like (`gemm`, `bmm`, `linear`): C[batch] (m x n) = A[batch] (m x k) @ B[batch] (k x n), so
  FLOPs = 2 * batch * m * n * k. `batch` is 1 for a plain matrix product or a linear layer (m = rows, tokens).
- element-wise, norms, softmax, embedding, rope: a [batch, hidden] tensor (NeuSight's B, H); for token ops
  `batch` is the token count and `hidden` the feature width the op writes.
- conv2d: NCHW input `batch` x `in_channels` x `input_height` x `input_width`, `out_channels` filters of
  `kernel_height` x `kernel_width`, with `stride_*` and `padding_*`. The H/W fields are always set for a conv;
  the square shorthands (`input_size`, `kernel_size`, `stride`, `padding`) only when height equals width.
- rnn: `batch` sequences of `seq_len` steps, `hidden` units (input width = hidden unless `extra` says otherwise).
- collectives (`allreduce`, `send_recv`): `message_bytes` per rank, over `world_size` ranks on `nodes` nodes.
- vidur's and llmservingsim's transformer ops also carry `num_tokens` and `tensor_parallel` (the degree the
  weights are sharded by).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

Source = Literal["neusight", "vidur", "deepbench", "llmservingsim", "phantora",
                 "microbench"]  # microbench: `perfmodel hw bench` on the user's own device
SOURCES: tuple[str, ...] = get_args(Source)

OpClass = Literal[
    "gemm",  # a plain matrix product (DeepBench GEMM)
    "bmm",  # a batched matrix product
    "linear",  # a linear layer: input (m x k) times weight (n x k) transposed
    "conv2d",
    "elementwise",  # add, mul, div, pow (and their scalar forms), relu, gelu, tanh, silu-and-mul, residual add
    "softmax",
    "layernorm",
    "rmsnorm",
    "embedding",
    "rope",  # rotary position embedding applied to q and k
    "attention",
    "rnn",  # vanilla RNN, LSTM, GRU layers (cuDNN)
    "allreduce",
    "send_recv",
]
OP_CLASSES: tuple[str, ...] = get_args(OpClass)
GEMM_OP_CLASSES: tuple[str, ...] = ("gemm", "bmm", "linear")  # records with batch, m, n, k all set

DType = Literal["fp32", "tf32", "fp16", "bf16", "int8"]
DTYPES: tuple[str, ...] = get_args(DType)

MeasuredPhase = Literal[
    "forward",  # the op as called: a layer's forward pass, a GEMM, one collective call
    "backward_data",  # gradient with respect to the inputs
    "backward_weight",  # gradient with respect to the parameters
    "backward",  # both backward passes, timed together
    "total",  # forward and backward timed together (only where the source gives nothing finer)
]
MEASURED_PHASES: tuple[str, ...] = get_args(MeasuredPhase)

Count = Annotated[int, Field(ge=0)]

# the shape fields, in table order (the store and the DataFrames use these names)
SHAPE_FIELDS: tuple[str, ...] = (
    "batch", "m", "n", "k", "hidden", "seq_len",
    "in_channels", "out_channels", "input_height", "input_width", "kernel_height", "kernel_width",
    "stride_height", "stride_width", "padding_height", "padding_width",
    "input_size", "kernel_size", "stride", "padding",
    "message_bytes", "world_size", "nodes",
    "num_tokens", "tensor_parallel",
)


# `OpMeasurement.extra` key of the op's name upstream, where `op_name` says the work instead: part of the record's
# identity (`store.rows.measurement_uid`), so a re-import finds the rows an import under the upstream name stored
UPSTREAM_OP = "upstream_op"


class OpMeasurement(BaseModel):
    """One op measured on one device by a public benchmark."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Source
    source_file: str = Field(min_length=1, description="path of the data file, relative to the dataset root")
    source_row: int = Field(ge=0, description="0-based data row of that file (header excluded)")
    device: str = Field(min_length=1, description="hardware-catalog id (get_accelerator(...).name)")
    op_class: OpClass
    op_name: str = Field(min_length=1, description="the op's name upstream (add, mulu, ln, attn_pre_proj, lstm), "
                         "or the element-wise op whose work it does where upstream's name does not say (an "
                         "activation kernel: `mul` for SiLU-and-mul; its own name then in extra[UPSTREAM_OP])")
    dtype: DType
    phase: MeasuredPhase

    # GEMM-like: C[batch] (m x n) = A[batch] (m x k) @ B[batch] (k x n)
    batch: Count | None = None
    m: Count | None = None
    n: Count | None = None
    k: Count | None = None
    # [batch, hidden] ops; rnn hidden units and steps
    hidden: Count | None = None
    seq_len: Count | None = None
    # conv2d (NCHW)
    in_channels: Count | None = None
    out_channels: Count | None = None
    input_height: Count | None = None
    input_width: Count | None = None
    kernel_height: Count | None = None
    kernel_width: Count | None = None
    stride_height: Count | None = None
    stride_width: Count | None = None
    padding_height: Count | None = None
    padding_width: Count | None = None
    input_size: Count | None = None  # input_height when it equals input_width
    kernel_size: Count | None = None  # idem for the kernel
    stride: Count | None = None  # idem for the stride
    padding: Count | None = None  # idem for the padding
    # collectives
    message_bytes: Count | None = None  # bytes of the buffer each rank contributes (all-reduce) or sends
    world_size: Count | None = None  # ranks taking part
    nodes: Count | None = None  # hosts they are spread over
    # vidur's transformer ops
    num_tokens: Count | None = None
    tensor_parallel: Count | None = None

    latency_ms: float = Field(gt=0, allow_inf_nan=False)
    extra: dict[str, Any] = Field(default_factory=dict, description="everything else worth keeping: kernel "
                                  "names, launch geometry, software versions, the other timing statistics")

    def gemm_flops(self) -> int | None:
        """2 * batch * m * n * k for a GEMM-like record; None for other ops."""
        if self.op_class not in GEMM_OP_CLASSES or None in (self.batch, self.m, self.n, self.k):
            return None
        return 2 * self.batch * self.m * self.n * self.k  # type: ignore[operator]
