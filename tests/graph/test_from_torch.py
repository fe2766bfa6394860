"""perfmodel.graph.from_torch: every zoo model, and a 175B-parameter GPT, capture on the meta device."""

from __future__ import annotations

import resource
import time

import pytest

from perfmodel.graph import OpKind, capture_graph, summarize
from perfmodel.jobs.spec import HFConfigSource, JobSpec, ZooSource
from perfmodel.jobs.zoo import ZOO


@pytest.mark.parametrize("zoo_name", sorted(n for n in ZOO if not n.startswith("gavel-")))  # tests/jobs/test_gavel_zoo
def test_zoo_model_captures(zoo_name):
    spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=2, seq_len=32)
    graph = capture_graph(spec)
    totals = graph.totals
    assert graph.source == "torch.export" and graph.mode == "train" and graph.job_id == spec.key()
    assert totals.nodes == len(graph.nodes) > 0
    assert totals.params > 0 and totals.flops_fwd > 0 and totals.activation_bytes > 0
    # what autograd saves (perfmodel.graph.saved) is measured for every zoo model, as captured and under autocast
    assert totals.saved_activation_bytes and totals.saved_activation_bytes_amp
    # Backward: about twice the forward (GEMM/conv), never more than three times.
    assert 1.0 <= totals.flops_bwd / totals.flops_fwd <= 3.0
    ids = [n.id for n in graph.nodes]
    assert len(set(ids)) == len(ids)
    seen: set[str] = set()
    for node in graph.nodes:  # topological order: producers come first
        assert set(node.inputs) <= seen, node.id
        seen.add(node.id)
    # The FLOP table knows the ops that do the work: unknown ops hold no tensor arithmetic we miss.
    heavy = {OpKind.conv.value, OpKind.linear.value, OpKind.matmul.value, OpKind.bmm.value,
             OpKind.attention.value, OpKind.rnn.value}
    assert sum(f for k, f in totals.flops_fwd_by_kind.items() if k in heavy) > 0.8 * totals.flops_fwd
    assert summarize(graph)["nodes"] == totals.nodes


@pytest.mark.slow
def test_gpt_175b_captures_on_meta():
    config = {"model_type": "gpt2", "n_embd": 12288, "n_layer": 96, "n_head": 96, "n_positions": 2048}
    spec = JobSpec(source=HFConfigSource(config=config, task="causal-lm"), batch_size=1, seq_len=2048)
    rss_before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    graph = capture_graph(spec)
    elapsed_s = time.perf_counter() - start
    assert graph.totals.params == pytest.approx(1.75e11, rel=0.01)
    assert graph.totals.nodes > 1000
    # Forward FLOPs of a decoder: about 2 * params * tokens, plus attention.
    assert graph.totals.flops_fwd == pytest.approx(2 * graph.totals.params * 2048, rel=0.1)
    assert elapsed_s < 60
    # Meta tensors only: the 700 GB of fp32 weights are never allocated.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 < max(rss_before_mb, 0) + 4096



def test_garbage_collection_is_back_on_after_a_capture_and_after_a_failed_one():
    """The export runs with the cyclic collector paused (`_gc_paused`); it is on again afterwards, whatever
    happened, and stays off for a caller that had turned it off."""
    import gc

    import torch
    from torch import nn

    from perfmodel.core.errors import PerfmodelError
    from perfmodel.graph import graph_from_module

    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("this model cannot run")

    assert gc.isenabled()
    graph_from_module(nn.Linear(4, 2), (torch.randn(3, 4),), name="linear")
    assert gc.isenabled()
    with pytest.raises(PerfmodelError, match="torch.export could not capture"):
        graph_from_module(Broken(), (torch.randn(3, 4),), name="broken")
    assert gc.isenabled()
    gc.disable()
    try:
        graph_from_module(nn.Linear(4, 2), (torch.randn(3, 4),), name="linear")
        assert not gc.isenabled()
    finally:
        gc.enable()
