"""A graph is affine in the batch: two captures give every other batch, equal to a capture there (real captures on
the meta device; `bench/batch_affine.py` checks every zoo model)."""

from __future__ import annotations

import pytest

from perfmodel.engine.graphs import GraphCache
from perfmodel.graph import graph_for_job
from perfmodel.graph.batch_affine import affine
from perfmodel.jobs.spec import JobSpec

MODELS = [("resnet18", None), ("bert-small", 32), ("mlp-recommender", None),
          ("ncf", None)]
TOTALS = ("flops_fwd", "flops_bwd", "bytes_read_fwd", "bytes_written_fwd", "bytes_read_bwd", "bytes_written_bwd",
          "activation_bytes", "saved_activation_bytes", "saved_activation_bytes_amp")


def _spec(name: str, seq_len: int | None, batch: int) -> JobSpec:
    return JobSpec.from_options(zoo=name, batch_size=batch, seq_len=seq_len)


@pytest.mark.parametrize("name,seq_len", MODELS)
def test_two_captures_give_every_batch_as_a_capture_would(name, seq_len):
    model = affine(graph_for_job(_spec(name, seq_len, 2)), 2, graph_for_job(_spec(name, seq_len, 5)), 5)
    assert model is not None
    for batch in (3,):
        made, captured = model.at(batch), graph_for_job(_spec(name, seq_len, batch))
        for field in TOTALS:
            want = getattr(captured.totals, field)
            assert getattr(made.totals, field) == pytest.approx(want, rel=0.005), field
        assert [n.output_tensors for n in made.nodes] == [n.output_tensors for n in captured.nodes]
        assert made.inputs == captured.inputs


def test_other_structures_have_no_affine_model():
    small = graph_for_job(_spec("resnet18", None, 2))
    other = graph_for_job(_spec("resnet34", None, 4))
    assert affine(small, 2, other, 4) is None
    assert affine(small, 2, small, 2) is None  # one batch fixes no line


def test_the_graph_cache_captures_three_batches_then_none():
    cache = GraphCache(100, isolated=False)
    spec = _spec("mlp-recommender", None, 8)
    first = cache.graph(spec)
    assert cache.prepare_batches(spec, first) and cache.captures == 3 and cache.has_batches(spec)
    for batch in (1, 5, 100, 4096):
        graph = cache.graph(spec.model_copy(update={"batch_size": batch}))
        assert graph.inputs[0].shape[0] == batch
    assert cache.captures == 3 and cache.synthesized == 4


def test_a_spec_whose_third_capture_disagrees_is_captured_at_every_batch():
    from tests.engine.helpers import tiny_graph

    def quadratic(spec, deadline_s, limits):  # a graph whose FLOPs grow with the square of the batch
        graph = tiny_graph(spec.batch_size)
        node = graph.nodes[0].model_copy(update={"flops_fwd": graph.nodes[0].flops_fwd * spec.batch_size})
        totals = graph.totals.model_copy(update={"flops_fwd": node.flops_fwd})
        return graph.model_copy(update={"nodes": (node,), "totals": totals})

    cache = GraphCache(100, capture_fn=quadratic)
    spec = _spec("mlp-recommender", None, 4)
    assert not cache.prepare_batches(spec, cache.graph(spec))
    assert cache.captures == 3 and not cache.has_batches(spec)
    graph = cache.graph(spec.model_copy(update={"batch_size": 7}))
    assert cache.captures == 4 and cache.synthesized == 0 and graph.totals.flops_fwd == quadratic(
        spec.model_copy(update={"batch_size": 7}), None, None).totals.flops_fwd


def test_a_spec_whose_capture_is_slow_gets_no_more_captures_up_front():
    """Registration waits for one capture of a model that takes minutes to capture (Tacotron 2's unrolled decoder),
    not three: other batches of it are captured when asked."""
    from perfmodel.engine.graphs import PREPARE_MAX_CAPTURE_S
    from tests.engine.helpers import tiny_graph

    ticks = iter(range(0, 10_000, 30))  # every capture takes 30 s
    cache = GraphCache(100, capture_fn=lambda spec, deadline_s, limits: tiny_graph(spec.batch_size),
                       clock=lambda: float(next(ticks)))
    spec = _spec("mlp-recommender", None, 4)
    assert PREPARE_MAX_CAPTURE_S < 30
    assert not cache.prepare_batches(spec, cache.graph(spec))
    assert cache.captures == 1 and not cache.has_batches(spec)
    assert cache.graph(spec.model_copy(update={"batch_size": 7})).inputs[0].shape[0] == 7  # asked: captured
    assert cache.captures == 2
