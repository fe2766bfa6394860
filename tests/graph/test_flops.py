"""Analytic FLOP counts of single ops, captured through graph_from_module, equal their closed forms exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perfmodel.graph import OpCall, OpKind, TensorMeta, graph_from_module, op_cost


def _compute_nodes(graph, kind: OpKind):
    return [n for n in graph.nodes if n.kind == kind]


class _MatMul(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


class _Bmm(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


class _Mm(nn.Module):
    def forward(self, a, b):
        return a @ b


def test_linear_flops_are_2mnk():
    m, k, n = 6, 40, 24
    graph = graph_from_module(nn.Linear(k, n), (torch.randn(m, k),), name="linear", mode="inference")
    (node,) = _compute_nodes(graph, OpKind.linear)
    assert node.flops_fwd == 2 * m * n * k
    assert graph.totals.flops_fwd == 2 * m * n * k
    assert graph.totals.flops_bwd == 0
    assert node.params == k * n + n
    assert graph.totals.params == k * n + n


def test_linear_3d_input_on_meta_and_backward():
    b, s, k, n = 2, 5, 16, 32
    model = nn.Sequential(nn.Linear(k, n), nn.Linear(n, n)).to("meta")
    graph = graph_from_module(model, (torch.randn(b, s, k, device="meta"),), name="mlp", mode="train")
    first, second = _compute_nodes(graph, OpKind.linear)
    assert first.flops_fwd == 2 * b * s * n * k
    assert second.flops_fwd == 2 * b * s * n * n
    # The first layer's input is the graph input (no gradient): only its weight gradient is computed.
    assert first.flops_bwd == first.flops_fwd
    assert second.flops_bwd == 2 * second.flops_fwd
    assert second.inputs == (first.id,)


@pytest.mark.parametrize("groups, stride, padding", [(1, 1, 1), (4, 2, 0), (8, 1, 2)])
def test_conv2d_flops(groups, stride, padding):
    n, cin, cout, h, w, kh, kw = 2, 8, 16, 17, 13, 3, 5
    conv = nn.Conv2d(cin, cout, (kh, kw), stride=stride, padding=padding, groups=groups)
    x = torch.randn(n, cin, h, w)
    graph = graph_from_module(conv, (x,), name="conv", mode="inference")
    (node,) = _compute_nodes(graph, OpKind.conv)
    _, _, hout, wout = conv(x).shape
    assert node.output_tensors[0].shape == (n, cout, hout, wout)
    assert node.flops_fwd == 2 * n * cout * hout * wout * (cin // groups) * kh * kw


@pytest.mark.parametrize("a_shape, b_shape, m, k, n, batch", [
    ((7, 9), (9, 5), 7, 9, 5, 1),
    ((3, 7, 9), (9, 5), 7, 9, 5, 3),  # broadcast weight
    ((2, 3, 7, 9), (3, 9, 5), 7, 9, 5, 6),  # broadcast batch dims
])
def test_matmul_flops_with_broadcasting(a_shape, b_shape, m, k, n, batch):
    graph = graph_from_module(_MatMul(), (torch.randn(*a_shape), torch.randn(*b_shape)), name="matmul",
                              mode="inference")
    assert graph.totals.flops_fwd == 2 * batch * m * n * k


def test_bmm_and_mm_flops():
    b, m, k, n = 4, 6, 10, 3
    graph = graph_from_module(_Bmm(), (torch.randn(b, m, k), torch.randn(b, k, n)), name="bmm", mode="inference")
    (node,) = _compute_nodes(graph, OpKind.bmm)
    assert node.flops_fwd == 2 * b * m * n * k
    graph = graph_from_module(_Mm(), (torch.randn(m, k), torch.randn(k, n)), name="mm", mode="train")
    assert graph.totals.flops_fwd == 2 * m * n * k
    assert graph.totals.flops_bwd == 0  # neither operand needs a gradient


def test_view_ops_cost_nothing_and_bytes_are_counted():
    class Reshape(nn.Module):
        def forward(self, x):
            return torch.relu(x.view(4, 6).transpose(0, 1))

    graph = graph_from_module(Reshape(), (torch.randn(2, 12),), name="reshape", mode="inference")
    views = [n for n in graph.nodes if n.kind == OpKind.view]
    assert views and all(n.flops_fwd == n.bytes_read_fwd == n.bytes_written_fwd == 0 for n in views)
    (relu,) = [n for n in graph.nodes if n.kind == OpKind.activation]
    assert relu.flops_fwd == 24
    assert relu.bytes_read_fwd == relu.bytes_written_fwd == 24 * 4
    assert graph.totals.activation_bytes == 24 * 4


def test_sdpa_counts_two_gemms_plus_softmax():
    b, h, lq, lk, d = 2, 3, 5, 7, 8
    q, k, v = (TensorMeta(shape=(b, h, length, d), dtype="float32") for length in (lq, lk, lk))
    out = TensorMeta(shape=(b, h, lq, d), dtype="float32")
    cost = op_cost("aten.scaled_dot_product_attention.default", OpCall(inputs=(q, k, v), outputs=(out,)))
    scores = b * h * lq * lk
    assert cost.flops_fwd == 4 * b * h * lq * lk * d + scores * (1 + 5)
    assert cost.flops_bwd == 0
    trained = op_cost("aten.scaled_dot_product_attention.default",
                      OpCall(inputs=(q, k, v), outputs=(out,), grad_inputs=(True, True, True)))
    assert trained.flops_bwd == 2 * trained.flops_fwd


def test_onnx_gemm_and_embedding_bytes():
    a = TensorMeta(shape=(12, 5), dtype="float32")  # transposed A: K = 12
    w = TensorMeta(shape=(7, 12), dtype="float32")
    out = TensorMeta(shape=(5, 7), dtype="float32")
    cost = op_cost("onnx::Gemm", OpCall(inputs=(a, w), outputs=(out,), attrs={"transA": 1, "transB": 1}))
    assert cost.flops_fwd == 2 * 5 * 7 * 12
    table = TensorMeta(shape=(50_000, 64), dtype="float32")
    ids = TensorMeta(shape=(2, 10), dtype="int64")
    rows = TensorMeta(shape=(2, 10, 64), dtype="float32")
    cost = op_cost("aten.embedding.default", OpCall(inputs=(table, ids), outputs=(rows,)))
    assert cost.flops_fwd == 0
    assert cost.bytes_read_fwd == 2 * 10 * 64 * 4 + 2 * 10 * 8  # the gathered rows, not the table


def test_unknown_op_costs_nothing():
    t = TensorMeta(shape=(3, 3), dtype="float32")
    assert op_cost("aten.some_new_op.default", OpCall(inputs=(t,), outputs=(t,))).flops_fwd == 0


def test_conv_transpose_and_einsum_flops():
    n, cin, cout, h, w, kernel = 2, 6, 4, 5, 7, 3
    graph = graph_from_module(nn.ConvTranspose2d(cin, cout, kernel, stride=2), (torch.randn(n, cin, h, w),),
                              name="deconv", mode="inference")
    assert graph.totals.flops_fwd == 2 * n * cin * h * w * cout * kernel * kernel

    class Einsum(nn.Module):
        def forward(self, a, b):
            return torch.einsum("bij,bjk->bik", a, b)

    b, i, j, k = 3, 4, 5, 6
    graph = graph_from_module(Einsum(), (torch.randn(b, i, j), torch.randn(b, j, k)), name="einsum",
                              mode="inference")
    assert graph.totals.flops_fwd == 2 * b * i * j * k
