"""perfmodel.graph.saved: what autograd saves in a training forward, measured on meta tensors (exact bytes)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from perfmodel.graph import Graph, graph_from_module
from perfmodel.graph.saved import measure_saved_bytes, saved_activation_bytes


def _stack(inplace: bool = False) -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=inplace), nn.Linear(32, 8))


# Linear(16, 32) -> ReLU -> Linear(32, 8) on x (4, 16), x not requiring grad. The first linear saves x (for its
# weight's gradient; not its weight: x needs no gradient), ReLU saves its result, which the second linear saves
# too (one storage; its weight is a parameter, left out); then the output. Float32:
X_BYTES, HIDDEN_BYTES, OUT_BYTES = 4 * 16 * 4, 4 * 32 * 4, 4 * 8 * 4
STACK_FP32 = X_BYTES + HIDDEN_BYTES + OUT_BYTES  # 896
# Under CUDA autocast: the half copy of x (the linear casts it), ReLU's half result, the second weight's half copy
# (saved for the gradient of ReLU's result), the half output, and the float32 input itself.
STACK_AMP = X_BYTES // 2 + HIDDEN_BYTES // 2 + 8 * 32 * 2 + OUT_BYTES // 2 + X_BYTES  # 1216


def test_linear_relu_stack_exact_bytes():
    model, x = _stack().to("meta"), torch.empty(4, 16, device="meta")
    assert saved_activation_bytes(model, (x,)) == STACK_FP32 == 896
    assert saved_activation_bytes(model, (x,), autocast=True) == STACK_AMP == 1216


def test_in_place_and_shared_tensors_count_once():
    """An in-place ReLU writes into the linear's output: one storage, saved by ReLU and the next linear."""
    model, x = _stack(inplace=True).to("meta"), torch.empty(4, 16, device="meta")
    assert saved_activation_bytes(model, (x,)) == STACK_FP32


def test_real_tensors_are_measured_on_fake_ones_with_the_same_answer():
    torch.manual_seed(0)
    model, x = _stack(), torch.randn(4, 16)
    assert saved_activation_bytes(model, (x,)) == STACK_FP32
    assert all(p.grad is None for p in model.parameters())  # nothing ran for real


def _real_saved_bytes(model: nn.Module, *args: torch.Tensor) -> int:
    """What a real CPU forward saves (distinct storages by address), plus outputs and inputs, parameters and buffers
    excluded: the measurement's rule on real tensors."""
    excluded = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}
    keep = []

    def add(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
            keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(add, lambda t: t):
        out = model(*args)
    for t in (out, *args):
        add(t)
    return sum(seen.values())


def test_meta_measurement_equals_a_real_cpu_forward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10), nn.LogSoftmax(dim=1))
    x = torch.randn(4, 3, 16, 16)
    real = _real_saved_bytes(model, x)
    # every node's output (the graph's rule) is more: BatchNorm's output and ReLU's are one tensor here
    assert graph_from_module(model, (x,), name="convnet").totals.activation_bytes > real
    meta = saved_activation_bytes(copy.deepcopy(model).to("meta"), (x.to("meta"),), kernels="cpu")
    assert meta == real


class _Attention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.qkv, self.dropout = nn.Linear(32, 96), dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.size(0), x.size(1), 3, 2, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout)


def test_attention_keeps_no_probabilities_on_cuda_kernels():
    """CUDA's memory-efficient SDPA saves q, k, v, the output and the log-sum-exp; the math fallback the meta
    device (and the CPU with dropout) would run also saves the seq x seq probabilities."""
    seq = 256
    model, x = _Attention(dropout=0.1).to("meta"), torch.empty(2, seq, 32, device="meta")
    probabilities = 2 * 2 * seq * seq * 4  # (batch, heads, seq, seq) float32
    cuda = saved_activation_bytes(model, (x,))
    cpu = saved_activation_bytes(model, (x,), kernels="cpu")
    assert cuda < probabilities < cpu
    assert saved_activation_bytes(model, (x,), autocast=True) < cuda


@pytest.mark.parametrize("inplace", [False, True])
def test_dropout_keeps_a_one_byte_mask_on_cuda_kernels(inplace):
    """Training dropout on CUDA is the fused kernel: its backward keeps a boolean mask (1 byte an element); the
    meta device and the CPU multiply by a mask in the input's dtype (4 bytes in float32). Linear(16, 32) -> dropout
    on x (4, 16): x, the mask, the output."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1, inplace=inplace)).to("meta")
    x = torch.empty(4, 16, device="meta")
    elements = 4 * 32
    assert saved_activation_bytes(model, (x,)) == X_BYTES + elements * 1 + elements * 4
    assert saved_activation_bytes(model, (x,), kernels="cpu") == X_BYTES + elements * 4 + elements * 4
    # the CPU figure is what a real CPU forward saves
    torch.manual_seed(0)
    real = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1, inplace=inplace))
    assert _real_saved_bytes(real, torch.randn(4, 16)) == X_BYTES + elements * 4 + elements * 4
    # not training, p = 0: nothing saved for dropout
    assert saved_activation_bytes(model.eval(), (x,)) == X_BYTES + elements * 4
    assert saved_activation_bytes(nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.0)).to("meta"), (x,)) == (
        X_BYTES + elements * 4)


def test_measure_returns_none_where_the_forward_cannot_run():
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("no")

    assert measure_saved_bytes(Broken(), (torch.empty(2, device="meta"),)) == (None, None)


def test_training_graphs_carry_both_figures_and_old_json_still_loads():
    model, x = _stack(), torch.randn(4, 16)
    graph = graph_from_module(model, (x,), name="stack", mode="train")
    assert (graph.totals.saved_activation_bytes, graph.totals.saved_activation_bytes_amp) == (STACK_FP32, STACK_AMP)
    assert Graph.from_json(graph.to_json()) == graph
    inference = graph_from_module(model.eval(), (x,), name="stack", mode="inference")
    assert inference.totals.saved_activation_bytes is None
    assert "saved_activation_bytes" not in inference.to_json()  # absent fields stay out of the JSON
    old = json.loads(graph.to_json())
    for key in ("saved_activation_bytes", "saved_activation_bytes_amp"):
        del old["totals"][key]
    restored = Graph.from_json(json.dumps(old))  # IR written before the fields
    assert restored.totals.saved_activation_bytes is None and restored.totals.nodes == graph.totals.nodes


@pytest.mark.parametrize("name", ["resnet18", "bert-small", "transformer-xl-base"])
def test_zoo_captures_measure_less_than_every_output(name):
    from perfmodel.graph import capture_graph
    from perfmodel.jobs.spec import JobSpec, ZooSource

    graph = capture_graph(JobSpec(source=ZooSource(name=name), batch_size=2, seq_len=64))
    totals = graph.totals
    assert totals.saved_activation_bytes is not None and totals.saved_activation_bytes_amp is not None
    assert 0 < totals.saved_activation_bytes < totals.activation_bytes


class _FeedForward(nn.Module):
    """A layer norm of a transposed (non-contiguous) sum, whose output a multiply saves and a linear reads: the
    linear saves the output itself if it is contiguous, a copy if not (Gavel's Transformer sublayer)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.linear = nn.Conv1d(8, 8, 1), nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x.transpose(1, 2)).transpose(1, 2) + x)
        return self.linear(y) * y


def _norm_cases() -> list[tuple[str, nn.Module, torch.Tensor]]:
    frozen = nn.Sequential(nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3))
    frozen[0].requires_grad_(False)  # nothing before it needs a gradient: torch saves nothing for it
    return [
        ("bn 2d", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True)), torch.empty(4, 3, 9, 9)),
        ("bn channels last", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).to(memory_format=torch.channels_last),
         torch.empty(4, 3, 9, 9).to(memory_format=torch.channels_last)),
        ("bn 1d on (N, C)", nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8)), torch.empty(5, 6)),
        ("bn 1d on (N, C, L)", nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8)), torch.empty(2, 3, 11)),
        ("bn no affine, no running stats", nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, affine=False, track_running_stats=False)), torch.empty(2, 3, 7, 7)),
        ("bn half", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).half(), torch.empty(2, 3, 7, 7).half()),
        ("bn frozen", frozen, torch.empty(2, 8, 7, 7)),
        ("ln", nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 4)), torch.empty(3, 5, 6)),
        ("ln over two dims, no affine", nn.Sequential(nn.Linear(6, 8), nn.LayerNorm((5, 8), elementwise_affine=False)),
         torch.empty(3, 5, 6)),
        ("ln of a transposed sum", _FeedForward(), torch.empty(2, 7, 8)),
    ]


@pytest.mark.parametrize("case", range(len(_norm_cases())), ids=[c[0] for c in _norm_cases()])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "amp"])
def test_norms_save_what_torchs_own_meta_ops_save(case, autocast, monkeypatch):
    """Training batch norm and layer norm on meta run as shapes only (torch's meta kernels for them are Python
    decompositions): the bytes are exactly those of torch's own ops, whatever the layout, dtype, affine and running
    statistics, and the layout of what they return."""
    import perfmodel.graph.saved as saved

    _, model, x = _norm_cases()[case]
    model, x = model.to("meta"), x.to("meta")
    answered = []
    shapes_only = {func: (lambda args, kwargs, fast=fast: answered.append(fast(args, kwargs)) or answered[-1])
                   for func, fast in saved._SHAPES_ONLY.items()}
    monkeypatch.setattr(saved, "_SHAPES_ONLY", shapes_only)
    fast = saved_activation_bytes(model, (x,), autocast=autocast)
    assert answered and all(isinstance(out, torch.Tensor) for out in answered)  # the shapes-only path ran
    monkeypatch.setattr(saved, "_SHAPES_ONLY", {})  # torch's ops
    assert fast == saved_activation_bytes(model, (x,), autocast=autocast) > 0
