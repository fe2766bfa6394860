"""Ops of CNNs whose kernel rows stand for another op's shape: the sweep runs them as themselves.

`perfmodel.lowering.rows` prices some ops as rows of a class the sweep times in another form: a depthwise
convolution is a `conv2d` row with the groups folded into the batch (N·C convolutions of one channel), a training
batch norm a `layernorm` row (C rows normalised over N·H·W). A dense-convolution or row-wise sweep never times
those kernels (PyTorch runs a depthwise convolution and a batch norm in kernels of their own), so an adaptation
fitted on it extrapolates there. Each `RealOp` here is such an op on an NCHW input: the sweep captures it as a
one-op training graph on the meta device (`lowered_rows`: the rows a job with this op gets, lowered by the same
code) and times, for each of its rows, the kernel the row stands for (`build_kernel`): the module's forward for
`fwd`, and for a backward row the gradient autograd computes for it (`dX`: the input's, `dW`: the weight's, `grad`:
every one the op's backward gives) through `torch.autograd.grad` over the recorded forward, which runs the op's
backward kernel and nothing else.

A max pool is an element-wise memory row of its bytes, named `maxpool` (`perfmodel.lowering.rows`) so that the
adaptation can tell it from the additions and ReLUs over the same tensors: the 3 x 3, stride 2 max pool of the CNN
stems runs as itself too. Average pools stay memory rows like the others (a global average pool reads its input
once, as they do).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.opkinds import OpKind
from perfmodel.lowering.ops import SHAPE_COLUMNS

Tensor4 = tuple[int, int, int, int]  # N, C, H, W


@dataclass(frozen=True)
class RealOp:
    """An op on an NCHW tensor of C channels: `module(C)` builds it (a `torch.nn.Module`); `kind` is the IR kind
    of its node (the rows kept from its captured graph); `grads` the tensors each backward row's kernel computes
    the gradient of ("input", or a parameter's name; "all": the input and every parameter); `stages` the (C, H)
    of the CNN stages that run it, its swept inputs."""

    kind: OpKind
    module: Callable[[int], Any]
    grads: Mapping[str, str]
    stages: tuple[tuple[int, int], ...]


# MobileNet-v2, EfficientNet-B0, ShuffleNet-v2 and ConvNeXt stages; ResNet, MobileNet and ShuffleNet batch norms
DEPTHWISE_STAGES = ((32, 112), (144, 56), (240, 28), (116, 28), (480, 14), (232, 14), (960, 7))
BATCH_NORM_STAGES = ((32, 112), (64, 56), (144, 56), (128, 28), (256, 14), (576, 14), (512, 7), (1024, 7))
# ResNet, ShuffleNet and SqueezeNet max pools (their stems, SqueezeNet's later stages)
MAX_POOL_STAGES = ((24, 112), (64, 112), (128, 56), (256, 28))


def _depthwise(kernel: int, stride: int) -> RealOp:
    def module(channels: int) -> Any:
        import torch.nn as nn

        return nn.Conv2d(channels, channels, kernel, stride, kernel // 2, groups=channels, bias=False)
    return RealOp(OpKind.conv, module, {"dX": "input", "dW": "weight"}, DEPTHWISE_STAGES)


def _batch_norm(channels: int) -> Any:
    import torch.nn as nn

    return nn.BatchNorm2d(channels)


def _max_pool(channels: int) -> Any:
    import torch.nn as nn

    return nn.MaxPool2d(3, 2, 1)


# the ops the sweep runs as themselves, by name: depthwise convolutions of MobileNet, EfficientNet, ShuffleNet and
# ConvNeXt (3 x 3 and 5 x 5, stride 1 and 2; 7 x 7), the training batch norm and the 3 x 3, stride 2 max pool
REAL_OPS: dict[str, RealOp] = {
    "dwconv3x3": _depthwise(3, 1),
    "dwconv3x3s2": _depthwise(3, 2),
    "dwconv5x5": _depthwise(5, 1),
    "dwconv5x5s2": _depthwise(5, 2),
    "dwconv7x7": _depthwise(7, 1),
    "batch_norm": RealOp(OpKind.batchnorm, _batch_norm, {"grad": "all"}, BATCH_NORM_STAGES),
    "max_pool3x3s2": RealOp(OpKind.pool, _max_pool, {"grad": "input"}, MAX_POOL_STAGES),
}
CPU_BATCHES = (1, 2, 4, 8)  # the swept inputs' N
GPU_BATCHES = (8, 32, 128)


def real_op(name: str) -> RealOp:
    op = REAL_OPS.get(name)
    if op is None:
        raise PerfmodelError(f"no real op {name!r}; known: {', '.join(REAL_OPS)}")
    return op


def swept_tensors(name: str, gpu: bool) -> list[Tensor4]:
    """The NCHW inputs the sweep runs op `name` on."""
    return [(n, c, h, h) for n in (GPU_BATCHES if gpu else CPU_BATCHES) for c, h in real_op(name).stages]


@dataclass(frozen=True)
class LoweredRow:
    """One kernel row of a real op: its class, name, part (fwd, dX, dW, grad) and shape columns (every column of
    `SHAPE_COLUMNS`, 0 where unset, as a job's rows have them)."""

    op_class: str
    op_name: str
    part: str
    shape: tuple[tuple[str, int], ...]


@functools.lru_cache(maxsize=512)
def lowered_rows(name: str, tensor: Tensor4) -> tuple[LoweredRow, ...]:
    """The rows a training job running op `name` on an input of `tensor` gets (the op's node in a captured
    one-op graph, on the meta device, lowered by `perfmodel.lowering.rows.graph_op_rows`), those with a kernel
    `build_kernel` runs. A learnable scale before the op makes its input need a gradient, as inside a network."""
    import torch
    import torch.nn as nn

    from perfmodel.graph.from_torch import graph_from_module
    from perfmodel.lowering.rows import graph_op_rows

    op = real_op(name)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.op = op.module(tensor[1])

        def forward(self, x: Any) -> Any:
            return self.op(x * self.scale)

    graph = graph_from_module(Scaled().to("meta").train(), (torch.empty(*tensor, device="meta"),),
                              name=f"{name}-{'x'.join(map(str, tensor))}", mode="train")
    rows = graph_op_rows(graph)
    mine = rows[(rows["kind"] == op.kind.value) & rows["part"].isin(["fwd", *op.grads])]
    return tuple(LoweredRow(str(r.op_class), str(r.op_name), str(r.part),
                            tuple((col, int(getattr(r, col))) for col in SHAPE_COLUMNS))
                 for r in mine.itertuples(index=False))


def build_kernel(name: str, part: str, tensor: tuple[int, ...], dtype: Any, device: str) -> Callable[[], Any]:
    """A zero-argument callable running the kernel of row `part` of op `name` once, on an input of `tensor`
    (torch `dtype`: the module's parameters stay fp32 and a half `dtype` runs under autocast, as mixed precision
    training runs it). `fwd`: the module's forward, recorded for autograd as in training; a backward part: the
    gradients it names (`RealOp.grads`) through a kept forward graph."""
    import torch

    op = real_op(name)
    if part != "fwd" and part not in op.grads:
        raise PerfmodelError(f"real op {name!r} has no kernel for row part {part!r}; "
                             f"parts: fwd, {', '.join(op.grads)}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    module = op.module(tensor[1]).to(device).train()
    x = torch.randn(*tensor, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    half = dtype in (torch.float16, torch.bfloat16)
    device_type = torch.device(device).type

    def forward() -> Any:
        with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=half):
            return module(x)

    if part == "fwd":
        return forward
    y = forward()
    params = dict(module.named_parameters())
    wanted = op.grads[part]
    wrt = (x, *params.values()) if wanted == "all" else (x,) if wanted == "input" else (params[wanted],)
    grad_y = torch.randn(*y.shape, generator=gen).to(device=device, dtype=y.dtype)
    return lambda: torch.autograd.grad(y, wrt, grad_y, retain_graph=True)


__all__ = ["REAL_OPS", "LoweredRow", "RealOp", "build_kernel", "lowered_rows", "real_op", "swept_tensors"]
