"""estimate_memory with expert parallelism: the experts' parameters (Graph.moe.expert_params) divided by ep."""

import math

import pytest

from perfmodel.core.ir import Graph, GraphTotals, MoEInfo, Node, TensorMeta
from perfmodel.core.opkinds import OpKind
from perfmodel.jobs.spec import JobSpec, Mode, OptimizerName, ZooSource
from perfmodel.predictor.memory import bytes_per_param, estimate_memory

EXPERTS, LAYERS, HIDDEN = 8, 4, 256


def _moe_graph(moe: bool = True) -> Graph:
    """`LAYERS` blocks of an attention-sized linear (dense) and `EXPERTS` expert MLPs (the expert parameters)."""
    act = TensorMeta(shape=(8, 128, HIDDEN), dtype="float32")
    dense_per_layer, expert_per_layer = 4 * HIDDEN * HIDDEN, EXPERTS * 8 * HIDDEN * HIDDEN
    nodes = []
    for i in range(LAYERS):
        nodes += [Node(id=f"attn_{i}", op="aten.linear", kind=OpKind.linear, output_tensors=(act,),
                       params=dense_per_layer, module=f"layers.{i}.attn"),
                  Node(id=f"experts_{i}", op="aten.bmm", kind=OpKind.bmm, output_tensors=(act,),
                       params=expert_per_layer, module=f"layers.{i}.mlp.experts")]
    params = sum(n.params for n in nodes)
    totals = GraphTotals.from_nodes(nodes, params=params, param_bytes=4 * params,
                                    activation_bytes=sum(t.numel * 4 for n in nodes for t in n.output_tensors))
    info = MoEInfo(experts=EXPERTS, top_k=2, layers=LAYERS, expert_params=LAYERS * expert_per_layer, hidden=HIDDEN,
                   tokens=8 * 128) if moe else None
    return Graph(name="moe", source="torch.export", nodes=tuple(nodes), totals=totals, moe=info)


SPEC = JobSpec(source=ZooSource(name="resnet18"), batch_size=8, optimizer=OptimizerName.adam)
GRAPH = _moe_graph()


def test_default_is_unchanged_by_moe_info():
    assert estimate_memory(SPEC, GRAPH) == estimate_memory(SPEC, _moe_graph(moe=False))
    assert estimate_memory(SPEC, GRAPH, expert_parallel=1) == estimate_memory(SPEC, GRAPH)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_expert_parallel_divides_the_experts_state(ep):
    per_param = bytes_per_param(SPEC.precision, SPEC.optimizer, SPEC.mode)
    experts = GRAPH.moe.expert_params
    dense = GRAPH.totals.params - experts
    est = estimate_memory(SPEC, GRAPH, expert_parallel=ep)
    assert est.weights_bytes == math.ceil((dense + experts / ep) * per_param.weights)
    assert est.gradients_bytes == math.ceil((dense + experts / ep) * per_param.gradients)
    assert est.optimizer_bytes == math.ceil((dense + experts / ep) * per_param.optimizer)
    assert est.peak_bytes < estimate_memory(SPEC, GRAPH).peak_bytes
    # balanced routing: a device still processes as many token rows, so its activations are the same
    inference = SPEC.model_copy(update={"mode": Mode.inference})
    assert (estimate_memory(inference, GRAPH, expert_parallel=ep).activations_bytes
            == estimate_memory(inference, GRAPH).activations_bytes)


def test_zero_shards_experts_over_the_ranks_holding_them():
    """Expert parallelism comes out of data parallelism: ep=4 of dp=8 leaves 2 ranks per expert shard."""
    per_param = bytes_per_param(SPEC.precision, SPEC.optimizer, SPEC.mode)
    experts = GRAPH.moe.expert_params
    dense = GRAPH.totals.params - experts
    est = estimate_memory(SPEC, GRAPH, data_parallel=8, zero_stage=1, expert_parallel=4)
    assert est.optimizer_bytes == math.ceil(dense * per_param.optimizer / 8 + experts * per_param.optimizer / 4 / 2)
    assert est.gradients_bytes == math.ceil((dense + experts / 4) * per_param.gradients)


def test_expert_parallel_needs_moe_experts_it_divides():
    with pytest.raises(ValueError, match="graph.moe"):
        estimate_memory(SPEC, _moe_graph(moe=False), expert_parallel=2)
    with pytest.raises(ValueError, match="does not divide"):
        estimate_memory(SPEC, GRAPH, expert_parallel=3)
    with pytest.raises(ValueError, match="expert_parallel"):
        estimate_memory(SPEC, GRAPH, expert_parallel=0)
