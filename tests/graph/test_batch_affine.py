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


def test_the_graph_cache_captures_two_batches_then_none():
    cache = GraphCache(100, isolated=False)
    spec = _spec("mlp-recommender", None, 8)
    first = cache.graph(spec)
    assert cache.prepare_batches(spec, first) and cache.captures == 2 and cache.has_batches(spec)
    for batch in (1, 3, 100, 4096):
        graph = cache.graph(spec.model_copy(update={"batch_size": batch}))
        assert graph.inputs[0].shape[0] == batch
    assert cache.captures == 2 and cache.synthesized == 4
