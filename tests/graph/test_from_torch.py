"""perfmodel.graph.from_torch: every zoo model (Gavel's and DeepLearningExamples' in tests/jobs), and a
175B-parameter GPT, capture on the meta device."""

from __future__ import annotations

import resource
import time

import pytest

from perfmodel.graph import capture_graph
from perfmodel.jobs.spec import HFConfigSource, JobSpec, ZooSource
from perfmodel.jobs.zoo import ZOO

# Gavel's and DeepLearningExamples' models are captured (with their loss) by tests/jobs/test_gavel_zoo.py and
# tests/jobs/test_dle.py (its DLE tuple), which check the same through the `check_training_graph` fixture
DLE = {"ssd300", "gnmt", "ncf", "tacotron2", "waveglow", "transformer-xl-base", "transformer-xl-large", "maskrcnn"}


@pytest.mark.parametrize("zoo_name", sorted(n for n in ZOO if not n.startswith("gavel-") and n not in DLE))
def test_zoo_model_captures(zoo_name, check_training_graph):
    spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=2, seq_len=32)
    graph = capture_graph(spec)
    assert graph.job_id == spec.key()
    check_training_graph(graph)


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


@pytest.mark.parametrize("zoo_name", ["resnet18", "bert-small"])
def test_a_capture_with_lazy_graph_modules_is_the_graph_of_an_eager_one(zoo_name, monkeypatch):
    """The export builds its fx modules lazily (`_lazy_graph_modules`: their Python code is never generated, the
    graph is only read): the captured graph is the one an export with eager modules gives, field for field, and
    torch's own setting is as it was afterwards, also after a failed capture."""
    import torch
    from torch import nn
    from torch.fx import _lazy_graph_module as lazy

    from perfmodel.core.errors import PerfmodelError
    from perfmodel.graph import graph_from_module
    from perfmodel.graph.from_torch import graph_of_job
    from perfmodel.jobs.build import build_job

    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("this model cannot run")

    generated: list[int] = []  # per capture, how many times an fx module's Python code was written
    recompile = torch.fx.GraphModule.recompile

    def counted(self):
        generated[-1] += 1
        return recompile(self)

    monkeypatch.setattr(torch.fx.GraphModule, "recompile", counted)
    generated.append(0)
    spec = JobSpec(source=ZooSource(name=zoo_name), batch_size=2, seq_len=16)
    before = lazy._use_lazy_graph_module_flag
    lazy_graph = graph_of_job(build_job(spec, "meta"))
    assert lazy._use_lazy_graph_module_flag == before
    generated.append(0)
    with lazy._force_skip_lazy_graph_module():  # every module eager, whatever the capture asks
        eager_graph = graph_of_job(build_job(spec, "meta"))
    assert generated[0] < generated[1], generated
    assert lazy_graph.model_dump() == eager_graph.model_dump()
    with pytest.raises(PerfmodelError, match="torch.export could not capture"):
        graph_from_module(Broken(), (torch.randn(3, 4),), name="broken")
    assert lazy._use_lazy_graph_module_flag == before
