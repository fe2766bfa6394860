"""ONNX training graphs: backward costs derived from the forward graph the way torch graphs get them, so a training
prediction from a model's ONNX export (`optimize=False`, batch norms kept) is within 6 % of the prediction from its
torch capture (the capture's BatchNorm counter increments are the difference), and the derived FLOPs and parameters
match the capture's."""

from __future__ import annotations

import pytest

from perfmodel.graph import capture_graph, graph_for_job, graph_from_onnx
from perfmodel.jobs.onnx_export import export_onnx
from perfmodel.jobs.spec import JobSpec, Mode, OnnxSource, ZooSource

BATCH = 2
ACCELERATOR = "a100-sxm4-80gb"


@pytest.fixture(scope="module")
def device_predictor():
    from perfmodel.predictor.gpu_iteration import DevicePredictor

    return DevicePredictor.load()


@pytest.mark.parametrize("zoo_name", ["resnet18", "mobilenet_v2", "alexnet"])
def test_onnx_training_prediction_is_within_6_percent_of_the_torch_capture(zoo_name, tmp_path, device_predictor):
    exported = export_onnx(JobSpec(source=ZooSource(name=zoo_name), batch_size=BATCH, mode=Mode.inference),
                           tmp_path / f"{zoo_name}.onnx", optimize=False)
    torch_spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=BATCH)
    onnx_spec = JobSpec(source=OnnxSource(path=str(exported)), batch_size=BATCH)
    torch_graph, onnx_graph = capture_graph(torch_spec), graph_for_job(onnx_spec)
    assert onnx_graph.mode == "train"
    assert onnx_graph.totals.params == torch_graph.totals.params  # running statistics are buffers, not trained
    assert onnx_graph.totals.flops_bwd == pytest.approx(torch_graph.totals.flops_bwd, rel=0.01)
    from_torch = device_predictor.predict(torch_spec, ACCELERATOR, graph=torch_graph)
    from_onnx = device_predictor.predict(onnx_spec, ACCELERATOR, graph=onnx_graph)
    assert from_onnx.breakdown_ms["backward"] > 0 and from_onnx.breakdown_ms["optimizer"] > 0
    assert from_onnx.breakdown_ms["optimizer"] == pytest.approx(from_torch.breakdown_ms["optimizer"], rel=1e-6)
    # the torch capture also runs each BatchNorm's num_batches_tracked += 1 (52 tiny kernels in MobileNet-v2, ~5 % of
    # its step once its convolutions are priced no dearer than im2col + GEMM); the ONNX export has no such counter
    assert from_onnx.iter_time_ms == pytest.approx(from_torch.iter_time_ms, rel=0.06)


def test_training_derives_gradients_from_parameters_only(tmp_path):
    """A first layer fed by the data input needs only its weight gradient; a layer after it needs both."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w1 = numpy_helper.from_array(np.ones((8, 16), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((16, 4), np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", "w2"], ["y"], name="second")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[w1, w2])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    train = {n.id: n for n in graph_from_onnx(path, batch_size=3, mode="train").nodes}
    assert train["first"].flops_bwd == train["first"].flops_fwd == 2 * 3 * 8 * 16
    assert train["second"].flops_bwd == 2 * train["second"].flops_fwd
    inference = graph_from_onnx(path, batch_size=3)
    assert inference.mode == "inference" and inference.totals.flops_bwd == 0
    with pytest.raises(Exception, match="mode"):
        graph_from_onnx(path, mode="training")


def test_a_matmul_by_a_weight_and_its_bias_add_is_one_linear_layer(tmp_path):
    """MatMul(x, Transpose(W)) + Add(b) (how the exporter writes nn.Linear) and Gemm(x, W (K, N), b) (GPT-2's
    Conv1D) are torch's linear(x, W (N, K), b) in a training graph; the weight's Transpose is a view."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from perfmodel.graph import OpKind

    k, n, m = 8, 16, 4
    inits = [numpy_helper.from_array(np.ones((n, k), np.float32), "w1"),
             numpy_helper.from_array(np.ones((n,), np.float32), "b1"),
             numpy_helper.from_array(np.ones((n, k), np.float32), "w2"),
             numpy_helper.from_array(np.ones((k,), np.float32), "b2")]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w1"], ["w1t"], name="t", perm=[1, 0]),
         helper.make_node("MatMul", ["x", "w1t"], ["h"], name="mm"),
         helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
         helper.make_node("Gemm", ["hb", "w2", "b2"], ["y"], name="gemm")],
        "linears", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", k])], initializer=inits)
    path = tmp_path / "linears.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    nodes = {node.id: node for node in graph_from_onnx(path, batch_size=m, mode="train").nodes}
    assert "bias" not in nodes and nodes["t"].kind == OpKind.view  # the Add is part of the linear layer
    first, second = nodes["mm"], nodes["gemm"]
    assert first.kind == second.kind == OpKind.linear
    assert [t.shape for t in first.input_tensors] == [(m, k), (n, k), (n,)]
    assert [t.shape for t in second.input_tensors] == [(m, n), (k, n), (k,)]  # Gemm's W (K, N) as (N, K)
    assert first.params == n * k + n and first.output_tensors[0].shape == (m, n)
    assert first.flops_bwd == first.flops_fwd == 2 * m * n * k  # x is data: only the weight's gradient
    assert second.flops_bwd == 2 * second.flops_fwd
    inference = {node.id: node for node in graph_from_onnx(path, batch_size=m).nodes}
    assert inference["bias"].kind == OpKind.elementwise and inference["mm"].kind == OpKind.matmul
