"""IR graph -> kernel rows (perfmodel.lowering.rows), priced by the rows' work (perfmodel.lowering.ops)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.core.opkinds import OpKind
from perfmodel.graph import graph_for_job
from perfmodel.graph.from_torch import graph_from_module
from perfmodel.hardware.catalog import load_catalog
from perfmodel.jobs.spec import JobSpec
from perfmodel.lowering.ops import FUSED, OP_CLASSES, SHAPE_COLUMNS, moved_bytes, op_roofline_ms, op_work
from perfmodel.lowering.rows import (
    ROW_COLUMNS,
    ROW_RULES,
    Gemm,
    bmm_row,
    causal_keys,
    einsum_shape,
    graph_op_rows,
    infer_stride_padding,
    linear_row,
    memory_row,
    recurrent_rows,
    vector_row,
)

TINY_BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 64}
DEVICE = "v100-pcie-32gb"
GEMM_CLASSES = ("linear", "bmm", "conv2d")


def tiny_bert(mode: str = "train", attn: str | None = None):
    config = dict(TINY_BERT, **({"attn_implementation": attn} if attn else {}))
    return graph_for_job(JobSpec.from_options(hf_config=config, batch_size=2, seq_len=16, mode=mode))


@pytest.fixture(scope="module")
def bert_sdpa():
    return tiny_bert()  # the default attention: one fused scaled_dot_product_attention node per layer


@pytest.fixture(scope="module")
def bert_eager():
    return tiny_bert(attn="eager")  # matmul, scale, mask, softmax, dropout, matmul


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.wide = nn.Conv2d(8, 4, (1, 3), padding=(0, 1))  # not square: an implicit-GEMM linear row
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 16 * 16, 10)

    def forward(self, x, target):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.sigmoid(self.dw(x))
        x = self.pool(self.up(self.wide(x)))
        logits = self.fc(x.flatten(1))
        return nn.functional.cross_entropy(logits, target) + logits.mean()


@pytest.fixture(scope="module")
def convnet():
    with torch.device("meta"):
        module = ConvNet()
        x, target = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    return graph_from_module(module.train(), (x, target), name="convnet", mode="train")


def flops(rows: pd.DataFrame) -> np.ndarray:
    return op_work(rows).flops


def test_every_kind_has_a_rule_and_rows_have_the_schema(bert_sdpa):
    assert set(ROW_RULES) == set(OpKind)
    rows = graph_op_rows(bert_sdpa)
    assert tuple(rows.columns) == ROW_COLUMNS
    assert set(rows["op_class"]) <= set(OP_CLASSES)
    assert set(rows["phase"]) == {"forward", "backward"}
    assert (rows["dtype"] == "fp32").all()


@pytest.mark.parametrize("fixture", ["bert_sdpa", "bert_eager"])
def test_every_non_view_node_has_forward_rows(fixture, request):
    graph = request.getfixturevalue(fixture)
    rows = graph_op_rows(graph)
    forward = set(rows.loc[rows["phase"] == "forward", "node_id"])
    expected = {n.id for n in graph.nodes if n.kind != OpKind.view
                and not (n.op.startswith("aten.to.") and n.input_tensors and n.input_tensors[0] == n.output_tensors[0])}
    assert forward == expected
    assert not set(rows["node_id"]) & {n.id for n in graph.nodes if n.kind == OpKind.view}


def test_linear_rows_flops_equal_2mnk_and_the_ir(bert_sdpa):
    rows = graph_op_rows(bert_sdpa)
    nodes = {n.id: n for n in bert_sdpa.nodes}
    fwd = rows[(rows["phase"] == "forward") & (rows["kind"] == "linear")]
    assert len(fwd) == sum(n.kind == OpKind.linear for n in bert_sdpa.nodes) == 2 * 6 + 2
    expected = 2 * fwd["batch"] * fwd["m"] * fwd["n"] * fwd["k"]
    np.testing.assert_array_equal(flops(fwd), expected)
    np.testing.assert_array_equal(flops(fwd), [nodes[i].flops_fwd for i in fwd["node_id"]])
    first = fwd.iloc[0]  # query projection: (2·16) × 64 · 64 × 64
    assert (first["m"], first["n"], first["k"]) == (32, 64, 64)


@pytest.mark.parametrize("fixture", ["bert_sdpa", "bert_eager"])
def test_backward_gemm_flops_are_twice_the_forward_and_the_ir(fixture, request):
    graph = request.getfixturevalue(fixture)
    rows = graph_op_rows(graph)
    rows = rows.assign(flops=flops(rows))
    gemm = rows[rows["op_class"].isin(GEMM_CLASSES)]
    by_node = gemm.groupby(["node_id", "phase"])["flops"].sum().unstack()
    assert len(by_node) and not by_node.isna().any().any()  # every GEMM node has forward and backward GEMMs
    np.testing.assert_allclose(by_node["backward"], 2 * by_node["forward"])
    nodes = {n.id: n for n in graph.nodes}
    for node_id, fb in by_node.iterrows():
        node = nodes[node_id]
        if node.kind in (OpKind.linear, OpKind.matmul, OpKind.bmm):
            assert fb["forward"] == node.flops_fwd and fb["backward"] == node.flops_bwd
    bwd = rows[(rows["phase"] == "backward") & (rows["kind"] == "linear")]
    assert set(bwd["part"]) == {"dX", "dW", "dbias"}
    q = bwd[bwd["node_id"] == bwd["node_id"].iloc[-1]].set_index("part")  # the first layer's query, last in bwd
    assert tuple(q.loc["dX", ["m", "n", "k"]]) == (32, 64, 64)  # dY (32×64) · W (64×64)
    assert tuple(q.loc["dW", ["m", "n", "k"]]) == (64, 64, 32)  # dYᵀ (64×32) · X (32×64)
    # the bias grad reads dY (32×64) once (and writes the 64 biases): a reduction, not a pass that writes dY back
    dbias = bwd[bwd["node_id"] == bwd["node_id"].iloc[-1]]
    dbias = dbias[dbias["part"] == "dbias"]
    assert moved_bytes(dbias, op_work(dbias)).sum() == pytest.approx(32 * 64 * 4)
    assert dbias["batch"].item() == 32  # the rows of dY: affine in the job's batch


def test_attention_is_decomposed_like_eager(bert_sdpa, bert_eager):
    sdpa = graph_op_rows(bert_sdpa)
    attention = sdpa[(sdpa["kind"] == "attention") & (sdpa["phase"] == "forward")]
    node = attention["node_id"].iloc[0]
    parts = list(attention.loc[attention["node_id"] == node, "part"])
    # no padding mask in the batch: transformers' sdpa passes none, as it does outside export
    assert parts == ["scores", "scale", "softmax", "dropout", "context"]
    scores = attention[(attention["node_id"] == node) & (attention["part"] == "scores")].iloc[0]
    assert (scores["batch"], scores["m"], scores["n"], scores["k"]) == (2 * 4, 16, 16, 16)
    eager = graph_op_rows(bert_eager)
    for phase in ("forward", "backward"):
        a, b = sdpa[sdpa["phase"] == phase], eager[eager["phase"] == phase]
        assert flops(a[a["op_class"] == "bmm"]).sum() == flops(b[b["op_class"] == "bmm"]).sum()
    # no attention dropout asked for: neither the fused decomposition nor eager's dropout after softmax has one
    for graph in (bert_sdpa, bert_eager):
        without = graph_op_rows(graph, attention_dropout=False)
        assert len(without) == len(graph_op_rows(graph)) - 2 * 2  # 2 layers, forward + backward


class CausalAttention(nn.Module):
    """nanoGPT's attention: `is_causal=True`, no mask tensor."""

    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()


def test_a_fused_attention_is_one_kernel_forward_and_backward_with_the_flops_flash_attention_counts(bert_sdpa):
    fused = graph_op_rows(bert_sdpa, fused_attention=True)
    decomposed = graph_op_rows(bert_sdpa)
    attention = fused[fused["kind"] == "attention"]
    for phase, k in (("forward", 16 + 16), ("backward", 3 * 16 + 2 * 16)):
        rows = attention[attention["phase"] == phase]
        assert len(rows) == 2  # one kernel per layer
        assert (rows["launch"] == FUSED).all() and (rows["op_class"] == "bmm").all()
        assert [tuple(rows[f]) for f in ("batch", "m", "n", "k")] == [(8, 8), (16, 16), (16, 16), (k, k)]
        # the matmul FLOPs of the decomposition, and the recomputed scores in the backward
        eager = decomposed[(decomposed["kind"] == "attention") & (decomposed["phase"] == phase)]
        recompute = flops(eager[(eager["op_class"] == "bmm")]).sum() / 4 if phase == "backward" else 0
        assert flops(rows).sum() == flops(eager[eager["op_class"] == "bmm"]).sum() + recompute
        # its scores never go through memory: it reads its operands only
        assert (moved_bytes(rows, op_work(rows)) == op_work(rows).bytes_read).all()
    # everything but attention lowers as before
    assert fused[fused["kind"] != "attention"].reset_index(drop=True).equals(
        decomposed[decomposed["kind"] != "attention"].reset_index(drop=True))


def test_the_math_backend_and_eager_attention_are_never_fused(bert_eager):
    assert graph_op_rows(bert_eager, fused_attention=True).equals(graph_op_rows(bert_eager))


def test_a_causal_fused_attention_computes_the_keys_each_query_sees():
    with torch.device("meta"):
        module = CausalAttention()
        x = torch.randn(2, 32, 64)
    graph = graph_from_module(module.train(), (x,), name="causal", mode="train")
    (node,) = [n for n in graph.nodes if n.kind == OpKind.attention]
    assert node.causal and Graph.from_json(graph.to_json()) == graph
    assert '"causal"' not in node.model_copy(update={"causal": False}).model_dump_json()  # older IR JSON unchanged
    rows = graph_op_rows(graph, fused_attention=True)
    assert set(rows.loc[rows["kind"] == "attention", "n"]) == {causal_keys(32, 32)} == {16}  # 528 / 32 = 16.5
    # decomposed, a causal attention computes every score and masks half (PyTorch's math backend)
    decomposed = graph_op_rows(graph)
    assert set(decomposed.loc[(decomposed["kind"] == "attention") & (decomposed["part"] == "scores"), "n"]) == {32}


@pytest.mark.parametrize("config", [
    {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "vocab_size": 1000},
    {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
     "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000},
])
def test_a_hugging_face_causal_lm_calls_its_attention_as_an_eager_step_without_padding_does(config):
    """Outside export, transformers' sdpa attention passes `is_causal=True` and no mask for a batch without padding;
    the capture records that call (not the mask tensor export would build), and leaves transformers as it was."""
    import transformers.masking_utils as masking

    before = masking._ignore_causal_mask_sdpa, masking.find_packed_sequence_indices
    graph = graph_for_job(JobSpec.from_options(hf_config=config, batch_size=2, seq_len=32))
    attention = [n for n in graph.nodes if n.kind == OpKind.attention]
    assert attention and all(n.causal and len(n.input_tensors) == 3 for n in attention)
    assert (masking._ignore_causal_mask_sdpa, masking.find_packed_sequence_indices) == before


@pytest.mark.parametrize(("lq", "lk", "expected"), [(1, 1, 1), (4, 4, 2), (1024, 1024, 512), (4, 16, 2), (16, 4, 4)])
def test_causal_keys_average_what_each_query_sees(lq, lk, expected):
    assert causal_keys(lq, lk) == expected == round(sum(min(i + 1, lk) for i in range(lq)) / lq)


def test_elementwise_names_and_backward(bert_eager):
    rows = graph_op_rows(bert_eager)
    nodes = {n.id: n for n in bert_eager.nodes}
    fwd = rows[rows["phase"] == "forward"].set_index("node_id")
    bwd = rows[rows["phase"] == "backward"]
    for node_id, row in fwd.iterrows():
        op = nodes[node_id].op
        if op == "aten.gelu.default":
            assert row["op_name"] == "gelu"
        elif op == "aten.add.Tensor" and len(nodes[node_id].input_tensors) == 2:
            shapes = {t.shape for t in nodes[node_id].input_tensors}
            assert row["op_name"] == ("add" if len(shapes) == 1 else "addu")
        elif op == "aten.dropout.default":
            assert row["op_name"] == "mul"
    # add passes its gradient through: no backward rows; gelu's is grad × gelu'(x), with the work of a `mul`
    assert not bwd["node_op"].eq("aten.add.Tensor").any()
    gelu_grad = bwd[bwd["node_op"] == "aten.gelu.default"]
    assert set(gelu_grad["op_name"]) == {"gelu_grad"}
    for field in ("flops", "bytes_read", "bytes_written"):
        np.testing.assert_array_equal(getattr(op_work(gelu_grad), field),
                                      getattr(op_work(gelu_grad.assign(op_name="mul")), field))
    assert set(bwd.loc[bwd["node_op"] == "aten.mul.Tensor", "op_name"]) == {"mulu"}  # the scale, by a scalar


def test_an_embeddings_backward_scatters_the_grad_and_writes_the_zeroed_weight_grad_once(bert_sdpa):
    rows = graph_op_rows(bert_sdpa)
    embeddings = rows[(rows["kind"] == "embedding") & (rows["phase"] == "backward")].reset_index(drop=True)
    embeddings = embeddings.assign(moved=moved_bytes(embeddings, op_work(embeddings)))
    words = embeddings[embeddings["node_id"] == embeddings.loc[embeddings["moved"].idxmax(), "node_id"]]
    moved = dict(zip(words["part"], words["moved"]))  # the word embeddings: the largest table
    tokens, dim, vocab = 2 * 16, 64, 1000
    assert moved["grad"] == pytest.approx(3 * tokens * dim * 4, rel=0.01)  # read grad and rows, write rows
    assert moved["zero_grad"] == pytest.approx(vocab * dim * 4, rel=0.01)  # a fill writes, reads nothing


def test_inference_has_forward_rows_only(bert_sdpa):
    inference = tiny_bert(mode="inference")
    rows = graph_op_rows(inference)
    assert set(rows["phase"]) == {"forward"}
    assert not (rows["kind"] == "dropout").any()  # eval dropout is the identity
    assert set(graph_op_rows(bert_sdpa, mode="inference")["phase"]) == {"forward"}
    with pytest.raises(PerfmodelError, match="inference"):
        graph_op_rows(inference, mode="train")
    with pytest.raises(PerfmodelError, match="dtype"):
        graph_op_rows(inference, dtype="int8")


def test_conv_net_rows(convnet):
    rows = graph_op_rows(convnet)
    nodes = {n.id: n for n in convnet.nodes}
    conv = rows[(rows["kind"] == "conv") & (rows["phase"] == "forward")]
    assert list(conv["op_class"]) == ["conv2d", "conv2d", "linear", "conv2d"]
    first = conv.iloc[0]
    assert (first["batch"], first["in_channels"], first["out_channels"], first["kernel_size"], first["input_size"],
            first["stride"], first["padding"]) == (2, 3, 8, 3, 32, 2, 1)
    depthwise = conv.iloc[1]  # 8 groups folded into the batch
    assert (depthwise["batch"], depthwise["in_channels"], depthwise["out_channels"]) == (16, 1, 1)
    np.testing.assert_array_equal(flops(conv), [nodes[i].flops_fwd for i in conv["node_id"]])
    # the first conv's input needs no gradient: the weight grad only (its FLOPs are the IR's backward FLOPs)
    bwd = rows[(rows["phase"] == "backward") & rows["op_class"].isin(GEMM_CLASSES)]
    for node_id, group in bwd.groupby("node_id"):
        assert flops(group).sum() == nodes[node_id].flops_bwd
    first_bwd = bwd[bwd["node_id"] == first["node_id"]]
    assert list(first_bwd["part"]) == ["dW"]
    kinds = set(rows["kind"])
    assert {"batchnorm", "pool", "loss", "activation", "conv", "linear"} <= kinds
    assert rows.loc[rows["kind"] == "loss", "op_class"].iloc[0] == "softmax"
    assert rows.loc[rows["kind"] == "batchnorm", "op_class"].iloc[0] == "layernorm"


def test_silu_and_sigmoid_rows_are_named_apart_with_the_work_of_the_cheap_rows_they_were(convnet):
    """The convnet's sigmoid is a `sigmoid` row with a `mulu`'s work (its gradient, from the output, a `mul`); a SiLU
    a `silu` row, its gradient a `gelu_grad`: the names tell a CPU's exponentials apart, a GPU prices the same work."""
    rows = graph_op_rows(convnet)
    sigmoid = rows[rows["node_op"].str.contains("sigmoid")]
    assert list(sigmoid["op_name"]) == ["sigmoid", "mul"]
    with torch.device("meta"):
        module, x = nn.Sequential(nn.Linear(16, 16), nn.SiLU()), torch.randn(2, 8, 16, 16)
    silu = graph_op_rows(graph_from_module(module.train(), (x,), name="silu", mode="train"))
    silu = silu[silu["kind"] == "activation"]
    assert list(silu["op_name"]) == ["silu", "gelu_grad"]
    as_before = silu.assign(op_name=["mulu", "mul"])
    for field in ("flops", "bytes_read", "bytes_written", "elements_written"):
        np.testing.assert_array_equal(getattr(op_work(silu), field), getattr(op_work(as_before), field))


def test_a_max_pools_rows_are_named_apart_and_priced_as_the_memory_rows_they_are(convnet):
    """A max pool's rows carry `maxpool` names (a device adaptation tells them from an addition's) and exactly the
    FLOPs and bytes of the `add` / `addu` memory rows of its bytes, so a GPU model prices them as before."""
    from perfmodel.lowering.ops import MAX_POOL_ROW_NAMES

    rows = graph_op_rows(convnet)
    pool = rows[rows["kind"] == "pool"]
    assert list(pool["op_name"]) == ["maxpool", "maxpoolu"]
    as_memory = pool.assign(op_name=pool["op_name"].map({v: k for k, v in MAX_POOL_ROW_NAMES.items()}))
    for field in ("flops", "bytes_read", "bytes_written", "elements_written"):
        np.testing.assert_array_equal(getattr(op_work(pool), field), getattr(op_work(as_memory), field))
    with torch.device("meta"):
        x = torch.randn(2, 8, 16, 16)
    avg = graph_op_rows(graph_from_module(nn.AvgPool2d(2).train(), (x,), name="avg", mode="train"))
    assert set(avg.loc[avg["kind"] == "pool", "op_name"]) <= {"add", "addu"}  # other pools: plain memory rows


def test_rows_of_every_class_pass_through_op_work(bert_sdpa, bert_eager, convnet):
    rows = pd.concat([graph_op_rows(g, dtype=dtype) for g in (bert_sdpa, bert_eager, convnet)
                      for dtype in ("fp32", "bf16")], ignore_index=True)
    assert set(rows["op_class"]) == set(OP_CLASSES)
    work = op_work(rows)
    assert np.isfinite(work.flops).all() and (work.flops > 0).all()
    assert (work.bytes_read + work.bytes_written > 0).all()
    catalog = load_catalog()
    ms = op_roofline_ms(rows.assign(device=DEVICE), catalog)
    assert np.isfinite(ms).all() and (ms > 0).all()


@pytest.mark.parametrize("size, out, kernel, expected", [
    (32, 32, 3, (1, 1)), (32, 16, 3, (2, 1)), (224, 112, 7, (2, 3)), (56, 56, 1, (1, 0)), (28, 14, 1, (2, 0)),
    (7, 1, 7, (1, 0)), (16, 16, 5, (1, 2)),
])
def test_infer_stride_padding(size, out, kernel, expected):
    assert infer_stride_padding(size, out, kernel) == expected


def test_row_constructors_make_rows_op_work_prices():
    b, m, k, n = 4, 32, 64, 48
    rows = [linear_row(m, n, k, "fwd"), bmm_row(Gemm(b, m, n, k), "fwd"),
            vector_row("softmax", "softmax", "p", 1000, 10), memory_row(3000, 1000, 10, "copy")]
    frame = pd.DataFrame([{"op_class": r.op_class, "op_name": r.op_name, "dtype": "fp32",
                                             "device": "a100-sxm4-80gb",
                                             **{c: r.shape.get(c, 0) for c in SHAPE_COLUMNS}} for r in rows])
    assert set(frame["op_class"]) <= set(OP_CLASSES)
    work = op_work(frame)
    assert work.flops[0] == 2 * m * n * k and work.flops[1] == 2 * b * m * n * k
    assert frame.loc[2, "batch"] * frame.loc[2, "hidden"] == 1000
    # a memory row moves the bytes it was given: 3000 read + 1000 written fp32 elements
    assert work.bytes_read[3] + work.bytes_written[3] == pytest.approx(4 * 4000, rel=0.01)
    roof = op_roofline_ms(frame, load_catalog())
    assert np.all(np.isfinite(roof)) and np.all(roof > 0)


class TwoLayerLSTM(nn.Module):
    def __init__(self, n_in: int = 16, hidden: int = 32):
        super().__init__()
        self.lstm = nn.LSTM(n_in, hidden, num_layers=2)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out).mean()


def test_an_rnn_runs_its_recurrence_one_step_at_a_time_with_the_same_flops():
    steps, batch, n_in, hidden = 7, 3, 16, 32
    with torch.device("meta"):
        module, x = TwoLayerLSTM(n_in, hidden), torch.randn(steps, batch, n_in)
    graph = graph_from_module(module.train(), (x,), name="lstm", mode="train")
    rows = graph_op_rows(graph)
    rnn = rows[rows.kind == OpKind.rnn.value]
    gemm = rnn[rnn.op_class == "linear"]
    recurrent_fwd = gemm[(gemm.phase == "forward") & gemm.part.str.endswith(".step")]
    # two layers x `steps` GEMMs of the batch's hidden states by the 4h x h recurrent weight, in order
    assert len(recurrent_fwd) == 2 * steps
    assert set(recurrent_fwd.m) == {batch} and set(recurrent_fwd.n) == {4 * hidden} and set(recurrent_fwd.k) == {hidden}
    # the input projections run over every position at once
    inputs_fwd = gemm[(gemm.phase == "forward") & ~gemm.part.str.endswith(".step")]
    assert sorted(inputs_fwd.k) == [n_in, hidden] and set(inputs_fwd.m) == {steps * batch}
    # the same FLOPs as one GEMM per weight over every position: 2 x tokens x 4h x (in + h) per layer
    forward_flops = flops(gemm[gemm.phase == "forward"]).sum()
    assert forward_flops == 2 * steps * batch * 4 * hidden * ((n_in + hidden) + (hidden + hidden))
    assert flops(gemm[gemm.phase == "backward"]).sum() == 2 * forward_flops
    # backward through time is sequential too
    assert (gemm[gemm.phase == "backward"].part.str.endswith("dX.step")).sum() == 2 * steps


@pytest.mark.parametrize("backward", [False, True])
def test_a_recurrent_layer_alone_is_what_its_graph_lowers_to_per_step(backward):
    # the recurrence of one layer (what DeepBench times, without the input projection) is the graph's step rows
    steps, batch, hidden = 5, 3, 8
    with torch.device("meta"):
        module, x = nn.LSTM(hidden, hidden), torch.randn(steps, batch, hidden)
    graph = graph_from_module(module.train(), (x,), name="lstm", mode="train")
    rows = graph_op_rows(graph)
    phase = "backward" if backward else "forward"
    stepped = rows[(rows.kind == OpKind.rnn.value) & (rows.phase == phase)
                   & (rows.part.str.endswith(".step") | (rows.part == "gates"))]
    alone = recurrent_rows(4 * hidden, hidden, batch, steps, backward, "w1")
    assert len(alone) == len(stepped) == 2 * steps
    expected = list(zip(stepped.op_class, stepped.op_name, stepped.part, strict=True))
    assert [(r.op_class, r.op_name, r.part) for r in alone] == expected
    gemm = [r for r in alone if r.op_class == "linear"]
    # per step a batch x 4h GEMM on the hidden state: 2 x steps x batch x 4h x h FLOPs in all
    assert sum(2 * r.shape["m"] * r.shape["n"] * r.shape["k"] for r in gemm) == 2 * steps * batch * 4 * hidden * hidden


def test_only_the_recurrent_steps_are_launched_by_the_library():
    steps, batch, hidden = 5, 3, 8
    with torch.device("meta"):
        module, x = TwoLayerLSTM(hidden, hidden), torch.randn(steps, batch, hidden)
    rows = graph_op_rows(graph_from_module(module.train(), (x,), name="lstm", mode="train"))
    stepped = rows.part.str.endswith(".step") | (rows.part == "gates")
    assert set(rows.launch[stepped]) == {"library"} and set(rows.launch[~stepped]) == {"eager"}
    # two layers, forward and backward through time: a GEMM and a gates kernel per step each
    assert stepped.sum() == 2 * 2 * 2 * steps


def test_depthwise_is_one_group_per_input_channel():
    """A depthwise convolution (groups = input channels, any channel multiplier) is one; a plain, a grouped and a
    one-channel convolution are not."""
    from perfmodel.lowering.rows import depthwise

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Conv2d(1, 8, 3, padding=1)  # one input channel: groups = 1
            self.plain = nn.Conv2d(8, 16, 3, padding=1)
            self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
            self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.multiplier = nn.Conv2d(16, 32, 3, padding=1, groups=16)

        def forward(self, x):
            return self.multiplier(self.depthwise(self.grouped(self.plain(self.first(x)))))

    graph = graph_from_module(Net(), (torch.empty(2, 1, 8, 8),), name="convs", mode="inference")
    convs = [node for node in graph.nodes if node.kind == OpKind.conv]
    assert [depthwise(node) for node in convs] == [False, False, False, True, True]


@pytest.mark.parametrize(("equation", "a", "b", "expected"), [
    ("ibnd,jbnd->ijbn", (192, 24, 8, 64), (384, 24, 8, 64), Gemm(24 * 8, 192, 384, 64)),  # Transformer-XL's scores
    ("ibnd,jnd->ijbn", (192, 24, 8, 64), (384, 8, 64), Gemm(8, 192 * 24, 384, 64)),  # ... against shared positions
    ("ijbn,jbnd->ibnd", (192, 384, 24, 8), (384, 24, 8, 64), Gemm(24 * 8, 192, 64, 384)),  # probabilities x values
    ("bij,bjk", (3, 4, 5), (3, 5, 6), Gemm(1, 4, 6, 3 * 5)),  # implicit output "ik": b and j are summed
    ("bij,bjk->bik", (3, 4, 5), (1, 5, 6), Gemm(3, 4, 6, 5)),  # a broadcast batch
])
def test_an_einsum_is_the_batched_gemm_its_equation_says(equation, a, b, expected):
    assert einsum_shape(equation, a, b) == expected


@pytest.mark.parametrize(("equation", "a", "b"), [("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5)),
                                                  ("ij,jk,kl->il", (2, 3), (3, 4)), ("bij,jk->bik", (3, 4), (4, 5))])
def test_an_einsum_the_rule_cannot_read_has_no_shape(equation, a, b):
    assert einsum_shape(equation, a, b) is None


def test_a_captured_einsum_keeps_its_equation_and_lowers_to_its_batched_gemm():
    """Transformer-XL's attention scores, `einsum("ibnd,jbnd->ijbn")`: heads and batch are the GEMM's batch, not rows
    of one GEMM against a shared right operand; forward and backward rows carry the IR's FLOPs; a graph whose
    einsum has no equation (IR JSON of an older capture) keeps the rule from the output and the FLOPs."""
    class Scores(nn.Module):
        def forward(self, q, k):
            return torch.einsum("ibnd,jbnd->ijbn", q, k)

    i, j, b, n, d = 6, 10, 2, 3, 4
    q, k = torch.randn(i, b, n, d, requires_grad=True), torch.randn(j, b, n, d, requires_grad=True)
    graph = graph_from_module(Scores(), (q, k), name="scores")
    (node,) = [x for x in graph.nodes if x.op.startswith("aten.einsum")]
    assert node.equation == "ibnd,jbnd->ijbn"
    assert Graph.from_json(graph.to_json()).nodes == graph.nodes
    rows = graph_op_rows(graph)
    gemms = rows[rows.op_class == "bmm"]
    assert gemms[["batch", "m", "n", "k"]].iloc[0].tolist() == [b * n, i, j, d]
    flops = 2 * gemms.batch * gemms.m * gemms.n * gemms.k
    assert flops[gemms.phase == "forward"].sum() == node.flops_fwd
    assert flops[gemms.phase == "backward"].sum() == node.flops_bwd
    old = graph.model_copy(update={"nodes": tuple(x.model_copy(update={"equation": None}) for x in graph.nodes)})
    assert "equation" not in old.to_json()
    assert graph_op_rows(old).query("op_class == 'bmm'")[["batch", "m"]].iloc[0].tolist() == [1, i * j * b]
