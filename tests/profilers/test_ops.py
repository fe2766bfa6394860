import pytest

from perfmodel.core.ir import Graph, GraphTotals, Node, TensorMeta
from perfmodel.core.opkinds import OpKind
from perfmodel.graph.from_torch import capture_graph
from perfmodel.jobs.build import build_job
from perfmodel.profilers.ops import TraceEvent, ops_from_events, profile_ops, tensor_shapes

from .helpers import user_spec, zoo_spec

X, W, B, H = (4, 32), (64, 32), (64,), (4, 64)


def _step_events(first_id: int, t0: float, addmm_self_us: float) -> list[TraceEvent]:
    """One training step as torch.profiler reports it: forward on the main thread, backward under the autograd
    engine (no parent on the main thread), an optimizer step; `t0` offsets every time."""
    i = first_id

    def ev(offset, name, start, end, self_us=0.0, parent=None, shapes=(), seq=-1):
        return TraceEvent(id=i + offset, name=name, start_us=t0 + start, end_us=t0 + end, self_us=self_us,
                          parent=None if parent is None else i + parent, input_shapes=shapes, sequence_nr=seq)

    return [
        ev(0, "perfmodel::step", 0, 1000),
        ev(1, "perfmodel::forward", 10, 400, 5, parent=0),
        ev(2, "aten::linear", 20, 300, 10, parent=1, shapes=(X, W, B)),
        ev(3, "aten::t", 25, 40, 5, parent=2, shapes=(W,)),
        ev(4, "aten::addmm", 50, 290, addmm_self_us, parent=2, shapes=(B, X, (32, 64)), seq=first_id),
        ev(5, "aten::relu", 300, 350, 40, parent=1, shapes=(H,)),
        ev(6, "mkldnn::eltwise", 310, 320, 10, parent=5),  # a non-aten event inside an aten call: folded into it
        ev(7, "aten::mean", 360, 390, 35, parent=1, shapes=((4, 10),)),  # the loss: in no IR
        ev(8, "perfmodel::backward", 400, 800, 3, parent=0),
        # bookkeeping, not an op; its sequence number is the forward addmm's, which attributes the mm below
        ev(9, "autograd::engine::evaluate_function: AddmmBackward0", 410, 700, 20, seq=first_id),
        ev(10, "aten::mm", 420, 690, 250, parent=9, shapes=(H, W)),
        ev(11, "perfmodel::optimizer", 800, 990, 2, parent=0),
        ev(12, "Optimizer.step#SGD.step", 805, 980, 30, parent=11),
        ev(13, "aten::add_", 810, 900, 80, parent=12, shapes=(W, W)),
        ev(14, "aten::zeros", 992, 998, 2, parent=0, shapes=()),  # in the step, in no phase
    ]


def _graph(*nodes: Node) -> Graph:
    return Graph(name="tiny", source="torch.export", nodes=nodes,
                 totals=GraphTotals.from_nodes(nodes, params=0, param_bytes=0, activation_bytes=0))


def _node(node_id: str, op: str, kind: OpKind, *shapes: tuple[int, ...]) -> Node:
    return Node(id=node_id, op=op, kind=kind, input_tensors=tuple(TensorMeta(shape=s, dtype="float32") for s in shapes))


EVENTS = (_step_events(100, 0.0, addmm_self_us=200) + _step_events(200, 1100.0, addmm_self_us=300)
          + [TraceEvent(id=999, name="aten::empty", start_us=1050, end_us=1060, self_us=7)])  # between steps


def test_ops_from_events_handwritten_trace():
    graph = _graph(_node("linear", "aten.linear.default", OpKind.linear, X, W, B),
                   _node("relu", "aten.relu.default", OpKind.activation, H))
    profile = ops_from_events(EVENTS, graph=graph)
    assert profile.steps == 2 and profile.iter_time_ms == pytest.approx(1.0)
    names = [(r.seq, r.phase, r.name) for r in profile.ops]
    assert names == [(0, "forward", "aten::linear"), (1, "forward", "aten::t"), (2, "forward", "aten::addmm"),
                     (3, "forward", "aten::relu"), (4, "forward", "aten::mean"), (5, "backward", "aten::mm"),
                     (6, "optimizer", "aten::add_"), (7, "other", "aten::zeros")]
    by_name = {r.name: r for r in profile.ops}
    assert by_name["aten::addmm"].self_time_ms == pytest.approx(0.250)  # (200 + 300) / 2 steps
    assert by_name["aten::relu"].self_time_ms == pytest.approx(0.050)  # 40 + the folded 10
    assert by_name["aten::linear"].input_shapes == (X, W, B)
    assert by_name["aten::addmm"].kind == OpKind.linear and by_name["aten::mm"].kind == OpKind.matmul
    assert [by_name[n].ir_node for n in ("aten::linear", "aten::t", "aten::addmm")] == ["linear"] * 3
    assert by_name["aten::relu"].ir_node == "relu"
    assert by_name["aten::mean"].ir_node is None
    assert by_name["aten::mm"].ir_node == "linear"  # backward, through the autograd sequence number
    # aten self times only: 10 + 5 + 250 + 50 + 35 + 250 + 80 + 2 us per step, over a 1000 us step
    assert profile.coverage == pytest.approx(0.682)
    assert profile.matched_fraction == pytest.approx(315 / 350)


def test_ops_from_events_matches_decomposed_ir_through_nested_calls():
    graph = _graph(_node("t", "aten.t.default", OpKind.view, W),
                   _node("addmm", "aten.addmm.default", OpKind.linear, B, X, (32, 64)),
                   _node("relu", "aten.relu.default", OpKind.activation, H))
    ops = {r.name: r.ir_node for r in ops_from_events(EVENTS, graph=graph).ops}
    assert ops["aten::linear"] == "t" and ops["aten::relu"] == "relu"


def test_ops_from_events_without_graph_or_steps():
    profile = ops_from_events(EVENTS)
    assert profile.matched_fraction == 0.0 and all(r.ir_node is None for r in profile.ops)
    with pytest.raises(ValueError, match="perfmodel::step"):
        ops_from_events([e for e in EVENTS if e.name != "perfmodel::step"])


def test_tensor_shapes_keeps_tensor_inputs_only():
    assert tensor_shapes([[8, 3], [], [[2, 2], [3]], [5]]) == ((8, 3), (5,))
    assert tensor_shapes(None) == ()


def _check_training_profile(spec, min_matched: float):
    job = build_job(spec)
    profile = profile_ops(job, capture_graph(spec), warmup=2, steps=3)
    phase_ms = {phase: sum(r.self_time_ms for r in profile.ops if r.phase == phase)
               for phase in ("forward", "backward", "optimizer", "other")}
    assert phase_ms["forward"] > 0 and phase_ms["backward"] > 0 and phase_ms["optimizer"] > 0
    assert 0.8 <= profile.coverage <= 1.2, profile.coverage
    assert profile.matched_fraction >= min_matched
    backward = [r for r in profile.ops if r.phase == "backward"]
    attributed_ms = sum(r.self_time_ms for r in backward if r.ir_node is not None)
    assert attributed_ms >= min_matched * sum(r.self_time_ms for r in backward)
    assert all(r.self_time_ms >= 0 for r in profile.ops)
    other_ms = sum(r.self_time_ms for r in profile.ops if r.kind == OpKind.other)
    assert other_ms < 0.01 * sum(phase_ms.values())  # the kind table knows the ops that take the time
    return profile


@pytest.mark.slow
def test_resnet18_training_coverage():
    # batch 2: what is checked (coverage, attribution, shapes) does not need more; batch 8 took three times as long
    profile = _check_training_profile(zoo_spec("resnet18", batch_size=2), min_matched=0.95)
    conv = [r for r in profile.ops if r.name == "aten::conv2d" and r.phase == "forward"]
    assert len(conv) == 20 and conv[0].input_shapes == ((2, 3, 224, 224), (64, 3, 7, 7))


@pytest.mark.slow
def test_bert_small_training_coverage():
    _check_training_profile(zoo_spec("bert-small", batch_size=2, seq_len=128), min_matched=0.95)


def test_inference_profile_has_only_forward_ops():
    spec = user_spec("tiny_mlp", mode="inference")
    profile = profile_ops(build_job(spec), capture_graph(spec), warmup=1, steps=2)
    assert {r.phase for r in profile.ops} == {"forward"}
    assert profile.matched_fraction == pytest.approx(1.0)
    assert {r.name for r in profile.ops} >= {"aten::linear", "aten::addmm", "aten::relu"}


def test_profiling_prints_none_of_the_profiler_librarys_own_log_lines():
    """kineto writes "USDT: ... profiler_start" to stderr at every profile: not the user's output (a fresh process,
    since kineto reads its log level once)."""
    import os
    import subprocess
    import sys

    code = ("from perfmodel.profilers.ops import profile_ops\n"
            "from perfmodel.jobs.build import build_job\n"
            "from tests.profilers.helpers import zoo_spec\n"
            "profile_ops(build_job(zoo_spec('mlp-recommender', 4)), warmup=0, steps=1)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"})
    assert done.returncode == 0, done.stderr
    assert "profiler_start" not in done.stderr and "USDT" not in done.stderr, done.stderr
