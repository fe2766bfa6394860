"""Jobs written as user modules (`--module file.py:NAME`), end to end with real torch and torchvision: a module that
imports torchvision, a builder taking the sequence length, and a loss returned next to the model (outside forward)
captured in the training graph."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.core.errors import JobLoadError
from perfmodel.graph import graph_for_job
from perfmodel.jobs.build import build_job
from perfmodel.jobs.spec import JobSpec, ModuleSource

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def write(tmp_path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


VISION = """
    import torch
    import torchvision

    def make(batch_size):
        return torchvision.models.resnet18(weights=None, num_classes=10), torch.randn(batch_size, 3, 32, 32)
"""


def test_a_module_importing_torchvision_graphs_and_predicts_through_the_cli(tmp_path):
    path = write(tmp_path, "vision.py", VISION)
    result = run("graph", "--module", f"{path}:make", "-b", 2, "--json")
    assert result.exit_code == 0, result.output
    ir = json.loads(result.stdout)
    convs = [n for n in ir["nodes"] if n["kind"] == "conv"]
    assert len(convs) == 20  # resnet18: 17 3x3 convs + 3 downsample 1x1 convs
    assert ir["totals"]["params"] == 11_181_642  # resnet18 with a 10-class head
    assert ir["nodes"][0]["input_tensors"][0]["shape"] == [2, 3, 32, 32]

    result = run("predict", "--module", f"{path}:make", "-b", 2, "--accelerator", "t4", "--json")
    assert result.exit_code == 0, result.output
    prediction = json.loads(result.stdout)
    assert prediction["iter_time_ms"] > 0 and prediction["accelerator"] == "t4"


SEQUENCE = """
    import torch
    from torch import nn

    VOCAB = 100

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 32)
            self.lstm = nn.LSTM(32, 48, batch_first=True)
            self.head = nn.Linear(48, 5)

        def forward(self, tokens):
            hidden, _ = self.lstm(self.embed(tokens))
            return self.head(hidden)

    def make(batch_size, seq_len):
        return Tagger(), torch.randint(0, VOCAB, (batch_size, seq_len))

    def make_keyword(batch_size, *, seq_len):
        return Tagger(), torch.randint(0, VOCAB, (batch_size, seq_len))

    def fixed(batch_size):
        return Tagger(), torch.randint(0, VOCAB, (batch_size, 24))

    def with_option(batch_size, hidden=7):  # a second parameter with a default is an option, not a length
        return nn.Linear(hidden, 2), torch.randn(batch_size, hidden)
"""


def _graph(path: str, batch_size: int = 2, **run_settings):
    return graph_for_job(JobSpec(source=ModuleSource(path=path), batch_size=batch_size, **run_settings))


def test_the_builder_gets_the_spec_seq_len(tmp_path):
    path = write(tmp_path, "seq.py", SEQUENCE)
    short, long = _graph(f"{path}:make", seq_len=16), _graph(f"{path}:make", seq_len=32)
    assert short.inputs[0].shape == (2, 16) and long.inputs[0].shape == (2, 32)
    assert short.totals.flops_fwd > 0 and long.totals.flops_fwd == pytest.approx(2 * short.totals.flops_fwd,
                                                                                rel=0.05)
    assert long.totals.flops_bwd > short.totals.flops_bwd
    keyword = _graph(f"{path}:make_keyword", seq_len=32)  # a keyword-only seq_len is passed by name
    assert keyword.inputs[0].shape == (2, 32) and keyword.totals.flops_fwd == long.totals.flops_fwd


def test_a_builder_without_seq_len_keeps_working_and_refuses_one(tmp_path):
    path = write(tmp_path, "seq.py", SEQUENCE)
    assert _graph(f"{path}:fixed").inputs[0].shape == (2, 24)  # called NAME(batch_size), as before
    assert build_job(JobSpec(source=ModuleSource(path=f"{path}:with_option"), batch_size=3),
                     "meta").module.in_features == 7  # not given the default seq_len 128 as `hidden`
    with pytest.raises(JobLoadError, match=r"seq_len 32 .*fixed\(batch_size\) takes no seq_len"):
        build_job(JobSpec(source=ModuleSource(path=f"{path}:fixed"), batch_size=2, seq_len=32), "meta")

    result = run("graph", "--module", f"{path}:fixed", "--seq-len", 32)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1 and "seq_len" in message


LOSSES = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, x):
            return self.body(x)

    class ClassifierWithLoss(Classifier):
        def forward(self, x, target):
            return F.cross_entropy(super().forward(x), target)

    def outside(batch_size):
        target = torch.randint(0, 10, (batch_size,))
        return Classifier(), torch.randn(batch_size, 20), lambda out: F.cross_entropy(out, target)

    def inside(batch_size):
        return ClassifierWithLoss(), (torch.randn(batch_size, 20), torch.randint(0, 10, (batch_size,)))

    def plain(batch_size):
        return Classifier(), torch.randn(batch_size, 20)
"""


def test_a_loss_outside_forward_is_in_the_training_graph(tmp_path):
    path = write(tmp_path, "losses.py", LOSSES)
    outside, inside, plain = (_graph(f"{path}:{name}", batch_size=8) for name in ("outside", "inside", "plain"))

    losses = [n for n in outside.nodes if n.kind == "loss"]
    assert [n.op for n in losses] == ["aten.cross_entropy_loss.default"]
    assert losses[0].flops_fwd > 0 and losses[0].flops_bwd > 0  # backward flows from the loss
    assert losses[0].inputs == (outside.nodes[-2].id,) and losses[0].module is None
    # the same step as the loss written inside forward, node for node and in every total
    assert outside.totals.flops_fwd == pytest.approx(inside.totals.flops_fwd, rel=1e-6)
    assert outside.totals.flops_bwd == pytest.approx(inside.totals.flops_bwd, rel=1e-6)
    assert outside.totals == inside.totals
    assert [(n.op, n.module) for n in outside.nodes] == [(n.op, n.module) for n in inside.nodes]
    assert [n.module for n in outside.nodes if n.kind == "linear"] == ["body.0", "body.2"]
    # ... and more than the model alone: the loss's FLOPs count
    assert outside.totals.flops_fwd == plain.totals.flops_fwd + losses[0].flops_fwd
    assert not any(n.kind == "loss" for n in plain.nodes)

    # an inference step computes no loss: none in its graph
    inference = _graph(f"{path}:outside", batch_size=8, mode="inference")
    assert not any(n.kind == "loss" for n in inference.nodes)
    assert inference.totals.flops_fwd == plain.totals.flops_fwd


def test_the_child_process_capture_includes_the_loss(tmp_path):
    """What a capture's child process runs (`perfmodel.graph.capture._capture`), here in-process: the same graph,
    loss included, as the in-process capture."""
    from perfmodel.graph.capture import _capture
    from perfmodel.jobs.limits import JobLimits

    path = write(tmp_path, "losses.py", LOSSES)
    spec = JobSpec(source=ModuleSource(path=f"{path}:outside"), batch_size=8)
    graph = _capture(spec, JobLimits())
    assert graph.to_json() == graph_for_job(spec).to_json()
    assert any(n.op == "aten.cross_entropy_loss.default" for n in graph.nodes)


TIME_MAJOR = """
    import torch
    from torch import nn

    class LanguageModel(nn.Module):  # Gavel's LM: inputs (seq_len, batch), as nn.LSTM's default layout
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(1000, 32)
            self.lstm = nn.LSTM(32, 32)
            self.head = nn.Linear(32, 1000)

        def forward(self, tokens):
            hidden, _ = self.lstm(self.embed(tokens))
            return self.head(hidden)

    def make(batch_size, seq_len):
        return LanguageModel(), torch.randint(0, 1000, (seq_len, batch_size))
"""


def test_a_time_major_modules_ir_records_its_batch_and_registers_at_it(tmp_path):
    """An IR says the batch it was captured at: a model whose inputs lead with the sequence registers at its
    real batch, not at its inputs' leading dimension; and a module job is named after its file and builder."""
    from perfmodel.core.ir import Graph
    from perfmodel.engine import ir_batch
    from perfmodel.jobs.spec import GraphSource

    path = write(tmp_path, "lstm_lm.py", TIME_MAJOR)
    result = run("graph", "--module", f"{path}:make", "-b", 20, "--seq-len", 35, "--json")
    assert result.exit_code == 0, result.output
    ir = json.loads(result.stdout)
    assert ir["batch_size"] == 20 and ir["inputs"][0]["shape"] == [35, 20]
    assert ir["name"] == "module:lstm_lm.make"
    graph = Graph.from_json(result.stdout)
    assert ir_batch(graph) == 20
    without = Graph.model_validate({k: v for k, v in ir.items() if k != "batch_size"})
    assert ir_batch(without) == 35  # an IR that does not say: its inputs' leading dimension, as before
    spec = JobSpec(source=GraphSource(graph=ir), batch_size=20, seq_len=35)
    assert spec.name == "ir:module:lstm_lm.make"
