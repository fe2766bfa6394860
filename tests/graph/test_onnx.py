"""ONNX graphs: the same FLOPs as the PyTorch capture of the same model, symbolic dims, bad files."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from perfmodel.core.errors import PerfmodelError
from perfmodel.graph import OpKind, capture_graph, graph_for_job, graph_from_onnx
from perfmodel.jobs.onnx_export import export_onnx
from perfmodel.jobs.spec import JobSpec, Mode, OnnxSource, ZooSource


@pytest.fixture(scope="module")
def resnet18_onnx(tmp_path_factory):
    spec = JobSpec(source=ZooSource(name="resnet18"), batch_size=2, mode=Mode.inference)
    return spec, export_onnx(spec, tmp_path_factory.mktemp("onnx") / "resnet18.onnx")


@pytest.mark.parametrize("zoo_name", ["resnet18", "bert-small"])
def test_torch_and_onnx_forward_flops_agree(zoo_name, resnet18_onnx, tmp_path):
    if zoo_name == "resnet18":
        spec, path = resnet18_onnx
    else:
        spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=2, seq_len=32, mode=Mode.inference)
        path = export_onnx(spec, tmp_path / f"{zoo_name}.onnx")
    from_torch = capture_graph(spec).totals
    from_onnx = graph_from_onnx(path).totals
    assert from_onnx.flops_fwd == pytest.approx(from_torch.flops_fwd, rel=0.02)
    # The exporter folds batch norms into convs; the weights are otherwise the same.
    assert from_onnx.params == pytest.approx(from_torch.params, rel=0.01)


def test_onnx_graph_shape(resnet18_onnx):
    _, path = resnet18_onnx
    graph = graph_from_onnx(path)
    assert graph.source == "onnx" and graph.mode == "inference" and graph.name == "resnet18"
    assert graph.totals.flops_bwd == 0
    assert graph.totals.ops_by_kind["conv"] == 20
    ids = {n.id for n in graph.nodes}
    assert all(src in ids for src, _ in graph.edges)
    assert graph.inputs[0].shape == (2, 3, 224, 224)


def test_graph_for_job_reads_onnx_sources(resnet18_onnx):
    _, path = resnet18_onnx
    spec = JobSpec(source=OnnxSource(path=str(path)), batch_size=2)
    graph = graph_for_job(spec)
    assert graph.source == "onnx" and graph.job_id == spec.key() and graph.totals.flops_fwd > 0


def _dynamic_model(path, batch_dim: str = "batch_size", seq_dim: str = "sequence_length"):
    """A token model with symbolic dims: (B, S) ids -> Gather (V, H) -> MatMul (H, O) -> (B, S, O)."""
    vocab, hidden, out = 100, 16, 8
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
         helper.make_node("MatMul", ["emb", "w"], ["y"], name="proj"),
         helper.make_node("Relu", ["y"], ["z"], name="act")],
        "dynamic",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch_dim, seq_dim])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch_dim, seq_dim, out])],
        initializer=[helper.make_tensor("table", TensorProto.FLOAT, [vocab, hidden], [0.0] * vocab * hidden),
                     helper.make_tensor("w", TensorProto.FLOAT, [hidden, out], [0.0] * hidden * out)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return hidden, out, vocab * hidden + hidden * out


def test_symbolic_dims_take_batch_and_seq_len(tmp_path):
    path = tmp_path / "dynamic.onnx"
    hidden, out, params = _dynamic_model(path)
    graph = graph_from_onnx(path, batch_size=3, seq_len=11)
    (matmul,) = [n for n in graph.nodes if n.kind == OpKind.matmul]
    assert matmul.flops_fwd == 2 * 3 * 11 * hidden * out
    assert matmul.inputs == ("embed",) and matmul.params == hidden * out
    assert graph.totals.params == params
    assert graph.inputs[0].shape == (3, 11)
    assert graph.nodes[-1].output_tensors[0].shape == (3, 11, out)


def test_unnamed_first_axis_is_the_batch_and_unknown_dims_are_refused(tmp_path):
    path = tmp_path / "dims.onnx"
    _dynamic_model(path, batch_dim="d0", seq_dim="seq")
    assert graph_from_onnx(path, batch_size=4, seq_len=5).inputs[0].shape == (4, 5)
    _dynamic_model(path, batch_dim="batch", seq_dim="mystery")
    with pytest.raises(PerfmodelError, match="mystery"):
        graph_from_onnx(path, batch_size=4, seq_len=5)


def test_bad_files_raise_one_line_errors(resnet18_onnx, tmp_path):
    _, good = resnet18_onnx
    data = good.read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 3])
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(data[:200] + bytes(range(256)) * 8 + data[2248:])
    text = tmp_path / "notes.onnx"
    text.write_text("this is not an ONNX model\n")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    for path in (truncated, corrupt, text, empty, tmp_path / "missing.onnx", tmp_path):
        with pytest.raises(PerfmodelError) as info:
            graph_from_onnx(path)
        message = str(info.value)
        assert "\n" not in message and str(path) in message, message


def test_a_convolution_keeps_its_dilation(tmp_path):
    path = tmp_path / "dilated.onnx"
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="dilated", dilations=[1, 3], pads=[0, 3, 0, 3]),
         helper.make_node("Conv", ["y", "w2"], ["z"], name="plain")],
        "dilated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 1, 32])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 8, 1, 32])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [8, 4, 1, 3], [0.0] * 96),
                     helper.make_tensor("w2", TensorProto.FLOAT, [8, 8, 1, 1], [0.0] * 64)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    convs = {n.module: n for n in graph_from_onnx(path, batch_size=2).nodes if n.kind == OpKind.conv}
    assert convs["dilated"].dilation == 3 and convs["plain"].dilation == 1
    assert convs["dilated"].flops_fwd == 2 * 2 * 8 * 32 * 4 * 3


def test_a_model_with_every_shape_fixed_is_priced_only_at_the_batch_it_was_exported_at(resnet18_onnx):
    """Its graph is the same whatever batch is asked: pricing it at another would scale the throughput by the batch
    and not the work. Refused, naming the batch it was exported at; at that batch it is priced."""
    _, path = resnet18_onnx
    model = onnx.load(str(path))
    if any(not d.HasField("dim_value") for v in model.graph.input for d in v.type.tensor_type.shape.dim):
        pytest.skip("the exporter left a symbolic dimension: not a fully static model")
    with pytest.raises(PerfmodelError, match=r"exported at batch 2.*ask for batch 2"):
        graph_for_job(JobSpec(source=OnnxSource(path=str(path)), batch_size=8))
    assert graph_for_job(JobSpec(source=OnnxSource(path=str(path)), batch_size=2)).inputs[0].shape[0] == 2


def test_an_einsum_keeps_its_equation_and_lowers_to_its_batched_gemm(tmp_path):
    """ONNX `Einsum` (Transformer-XL's scores, heads and batch shared by both operands) as the PyTorch capture
    reads it: its equation kept, one batched GEMM of the IR's FLOPs."""
    from perfmodel.lowering.rows import graph_op_rows

    i, j, b, n, d = 6, 10, 2, 3, 4
    path = tmp_path / "einsum.onnx"
    graph = helper.make_graph(
        [helper.make_node("Einsum", ["q", "k"], ["s"], name="scores", equation="ibnd, jbnd -> ijbn")],
        "einsum",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [i, "batch", n, d])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [i, j, "batch", n])],
        initializer=[helper.make_tensor("k", TensorProto.FLOAT, [j, b, n, d], [0.0] * j * b * n * d)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    ir = graph_from_onnx(path, batch_size=b)
    (node,) = [x for x in ir.nodes if x.kind == OpKind.bmm]
    assert node.equation == "ibnd,jbnd->ijbn" and node.flops_fwd == 2 * i * j * b * n * d
    rows = graph_op_rows(ir)
    assert rows.query("op_class == 'bmm'")[["batch", "m", "n", "k"]].values.tolist() == [[b * n, i, j, d]]
