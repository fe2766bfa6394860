"""perfmodel.jobs.gavel_zoo: Gavel's seven job types as zoo entries (build on meta, capture with the loss in the
graph, parameter counts of Gavel's reference scripts, FLOPs that grow with the batch, the unit `zoo show` gives, real
CPU steps at tiny sizes)."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.graph import graph_for_job
from perfmodel.jobs import gavel_zoo
from perfmodel.jobs.build import build_job
from perfmodel.jobs.spec import JobSpec
from perfmodel.jobs.zoo import ZOO, InputKind

GAVEL = ("gavel-resnet18", "gavel-resnet50", "gavel-transformer", "gavel-lm", "gavel-recommendation",
         "gavel-cyclegan", "gavel-a3c")
SMALL_SEQ = {"gavel-transformer": 8, "gavel-lm": 8, "gavel-a3c": 3}  # tokens, bptt, rollout steps


def _conv(n_in: int, n_out: int, k: int, bias: bool = True) -> int:
    return n_in * n_out * k * k + (n_out if bias else 0)


def _lstm(n_in: int, hidden: int) -> int:
    """One LSTM layer (or cell): 4 gates x (input + hidden weights) + two biases."""
    return 4 * hidden * (n_in + hidden) + 8 * hidden


def _cifar_block(n_in: int, n_out: int) -> int:
    """kuangliu BasicBlock: two 3x3 convs without bias + BN (2 x channels each), a 1x1 conv + BN shortcut when the
    width changes."""
    shortcut = _conv(n_in, n_out, 1, False) + 2 * n_out if n_in != n_out else 0
    return _conv(n_in, n_out, 3, False) + _conv(n_out, n_out, 3, False) + 4 * n_out + shortcut


_MHA = 4 * (512 * 512 + 512) + 2 * 512  # w_qs, w_ks, w_vs, fc with biases + layer norm (SubLayers.py)
_FFN = (512 * 2048 + 2048) + (2048 * 512 + 512) + 2 * 512  # two 1x1 Conv1d + layer norm
_GENERATOR = (_conv(3, 64, 7) + _conv(64, 128, 3) + _conv(128, 256, 3) + 9 * 2 * _conv(256, 256, 3)
              + _conv(256, 128, 3) + _conv(128, 64, 3) + _conv(64, 3, 7))  # instance norm has no affine parameters
_DISCRIMINATOR = _conv(3, 64, 4) + _conv(64, 128, 4) + _conv(128, 256, 4) + _conv(256, 512, 4) + _conv(512, 1, 4)

# Parameter counts derived from the layer lists of Gavel's reference code (stanford-futuredata/gavel,
# workloads/pytorch/* and the repositories those scripts come from), with the flags scheduler/job_table.py passes.
REFERENCE_PARAMS = {
    # image_classification/cifar10: kuangliu ResNet18(): stem 3x3 conv + BN, [2, 2, 2, 2] basic blocks, linear 10
    "gavel-resnet18": (_conv(3, 64, 3, False) + 2 * 64 + 2 * _cifar_block(64, 64) + _cifar_block(64, 128)
                       + _cifar_block(128, 128) + _cifar_block(128, 256) + _cifar_block(256, 256)
                       + _cifar_block(256, 512) + _cifar_block(512, 512) + 512 * 10 + 10),
    "gavel-resnet50": 25_557_032,  # image_classification/imagenet `-a resnet50`: torchvision resnet50
    # translation (jadore801120 Transformer, -proj_share_weight, no -embs_share_weight): source (2911) and target
    # (3149) embeddings of 512, the projection being the target embedding; 6 encoder layers (MHA + FFN) and 6
    # decoder layers (2 MHA + FFN); the sinusoid position tables are frozen (not trained)
    "gavel-transformer": 2911 * 512 + 3149 * 512 + 6 * (_MHA + _FFN) + 6 * (2 * _MHA + _FFN),
    # language_modeling (word_language_model, no --tied): embedding 33278 x 200, LSTM 200 -> 200 -> 200, decoder
    "gavel-lm": 33278 * 200 + _lstm(200, 200) + _lstm(200, 200) + 200 * 33278 + 33278,
    # recommendation (recoder DynamicAutoencoder([200])): encoder and decoder item embeddings 20108 x 200, encoder
    # bias 200, decoder bias 20108
    "gavel-recommendation": 2 * 20108 * 200 + 200 + 20108,
    # cyclegan (PyTorch-GAN): two 9-block ResNet generators (11,378,179 each), two PatchGANs (2,764,737 each)
    "gavel-cyclegan": 2 * _GENERATOR + 2 * _DISCRIMINATOR,
    # rl (rl_a3c_pytorch A3Clstm, 1 x 80 x 80 frames, Pong's 6 actions): 4 convs, LSTM cell 1024 -> 512, critic 1
    # and actor 6 heads
    "gavel-a3c": (_conv(1, 32, 5) + _conv(32, 32, 5) + _conv(32, 64, 4) + _conv(64, 64, 3) + _lstm(1024, 512)
                  + (512 + 1) + (512 * 6 + 6)),
}
TOLERANCE = 0.0  # the counts are exact: rel. tolerance of the comparison

LOSS_OPS = {  # ops each model's loss puts in its graph
    "gavel-resnet18": ("aten.cross_entropy_loss",),
    "gavel-resnet50": ("aten.cross_entropy_loss",),
    "gavel-transformer": ("aten.cross_entropy_loss",),
    "gavel-lm": ("aten.cross_entropy_loss",),
    "gavel-recommendation": ("aten.binary_cross_entropy_with_logits",),
    "gavel-cyclegan": ("aten.l1_loss", "aten.mse_loss"),
    "gavel-a3c": ("aten.log_softmax", "aten.multinomial", "aten.gather", "aten.pow"),
}

UNITS = {  # name: (family, unit, reference_seq_len, items per sample there)
    "gavel-resnet18": ("resnet", "images", None, 1), "gavel-resnet50": ("resnet", "images", None, 1),
    "gavel-transformer": ("transformer-nmt", "sentence pairs", 27, 1), "gavel-lm": ("rnn", "tokens", 35, 35),
    "gavel-recommendation": ("recoder", "users", None, 1), "gavel-cyclegan": ("cyclegan", "image pairs", None, 1),
    "gavel-a3c": ("a3c", "rollouts", 20, 1),
}


def spec(name: str, batch_size: int) -> JobSpec:
    return JobSpec.from_options(zoo=name, batch_size=batch_size, seq_len=SMALL_SEQ.get(name, 8))


@functools.cache
def graph(name: str, batch_size: int):
    return graph_for_job(spec(name, batch_size))


def test_reference_counts_quoted():
    assert REFERENCE_PARAMS["gavel-resnet18"] == 11_173_962  # kuangliu ResNet18 as widely quoted (11.17M)
    assert _GENERATOR == 11_378_179 and _DISCRIMINATOR == 2_764_737  # CycleGAN resnet_9blocks / basic PatchGAN
    assert REFERENCE_PARAMS["gavel-transformer"] == 47_241_216


def test_entries_name_family_unit_and_items():
    for name, (family, unit, reference, items) in UNITS.items():
        entry = ZOO[name]
        assert (entry.family, entry.library, entry.inputs, entry.unit) == (family, "perfmodel", InputKind.custom, unit)
        assert entry.reference_seq_len == reference and "Gavel" in entry.description
        assert entry.items_per_sample(reference or 128) == items
    assert set(UNITS) == set(GAVEL) == {n for n in ZOO if n.startswith("gavel-")}


@pytest.mark.parametrize("name", GAVEL)
def test_meta_build_has_the_reference_parameter_count(name):
    job = build_job(spec(name, 2), "meta")
    assert all(p.device.type == "meta" for p in job.module.parameters())
    assert job.family == ZOO[name].family and job.module.training
    inputs = list(job.args) + list(job.kwargs.values())
    assert inputs and all(t.device.type == "meta" and t.shape[0] == 2 for t in inputs)  # batch-first
    trainable = sum(p.numel() for p in job.module.parameters() if p.requires_grad)
    assert trainable == pytest.approx(REFERENCE_PARAMS[name], rel=TOLERANCE)


@pytest.mark.parametrize("name", GAVEL)
def test_captures_on_meta_with_the_loss_in_the_graph(name, check_training_graph):
    g = graph(name, 1)
    check_training_graph(g)
    ops = {n.op.rsplit(".", 1)[0] for n in g.nodes}
    assert set(LOSS_OPS[name]) <= ops, sorted(ops)
    assert g.totals.params == pytest.approx(REFERENCE_PARAMS[name], rel=TOLERANCE)


@pytest.mark.parametrize("name", GAVEL)
def test_flops_grow_about_linearly_with_the_batch(name):
    one, two = graph(name, 1), graph(name, 2)
    for a, b in ((one.totals.flops_fwd, two.totals.flops_fwd), (one.totals.flops_bwd, two.totals.flops_bwd)):
        assert 0 < a and 1.8 * a < b <= 2.0 * a * 1.01


@pytest.mark.parametrize("name", GAVEL)
def test_zoo_show_json_gives_the_unit(name):
    result = CliRunner().invoke(app, ["zoo", "show", name, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    family, unit, reference, items = UNITS[name]
    assert (info["unit"], info["family"], info["reference_seq_len"], info["items_per_sample"]) == (
        unit, family, reference, items)


def test_a3c_rollout_length_is_seq_len():
    two = graph_for_job(JobSpec.from_options(zoo="gavel-a3c", batch_size=1, seq_len=2))
    three = graph(("gavel-a3c"), 1)  # seq_len 3
    per_step = three.totals.flops_fwd - two.totals.flops_fwd
    # one step: conv1..4 on 80x80 / 40x40 / 19x19 / 9x9 and the LSTM cell's two GEMMs, ~117.6 MFLOP
    assert per_step == pytest.approx(2 * (32 * 25 * 80 * 80 + 32 * 32 * 25 * 38 * 38 + 64 * 32 * 16 * 18 * 18
                                          + 64 * 64 * 9 * 9 * 9 + 4 * 512 * (1024 + 512)), rel=0.02)


def test_transformer_positions_past_gavels_longest_sentence_reuse_the_last_row():
    model = gavel_zoo.Transformer(50, 60, d_model=16, d_inner=32, n_layers=1, n_head=2, d_k=8, d_v=8)
    (src, src_pos, tgt, tgt_pos), _ = model.example_inputs(2, 60)  # Gavel's sentences: at most 52 tokens
    assert src.shape == tgt.shape == src_pos.shape == (2, 60) and model.position_table.shape == (53, 16)
    assert src_pos[0, :52].tolist() == list(range(1, 53)) and set(src_pos[0, 52:].tolist()) == {52}
    assert torch.isfinite(model(src, src_pos, tgt, tgt_pos))
    assert all(p.requires_grad for p in model.parameters())  # the frozen sinusoid table is a buffer


def test_recommendation_width_is_every_item():
    with torch.device("meta"):
        model = gavel_zoo.DynamicAutoencoder()
        (rows,), _ = model.example_inputs(3, 128)
    assert rows.shape == (3, gavel_zoo.ML20M_ITEMS) == (3, 20_108)


# --- real CPU training steps, at tiny sizes ----------------------------------------------------------------------


def _train_step(module: torch.nn.Module, batch_size: int, seq_len: int) -> torch.Tensor:
    torch.manual_seed(0)
    module.train()
    args, kwargs = module.example_inputs(batch_size, seq_len)
    loss = module(*args, **kwargs)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    return loss


@pytest.mark.parametrize("make,batch_size,seq_len", [
    (lambda: gavel_zoo.CifarResNet18(), 2, 1),
    (lambda: gavel_zoo.Transformer(50, 60, 20, d_model=16, d_inner=32, n_layers=1, n_head=2, d_k=8, d_v=8), 3, 6),
    (lambda: gavel_zoo.Transformer(50, 60, 20, d_model=16, d_inner=32, n_layers=1, n_head=2, d_k=8, d_v=8,
                                   label_smoothing=True), 3, 6),
    (lambda: gavel_zoo.WordLanguageModel(vocab_size=100, emsize=16, nhid=16), 3, 5),
    (lambda: gavel_zoo.DynamicAutoencoder(num_items=50, hidden=8), 4, 1),
    (lambda: gavel_zoo.CycleGAN(n_residual_blocks=1, image_size=32), 1, 1),
    (lambda: gavel_zoo.A3C(), 2, 3),
], ids=["resnet18", "transformer", "transformer-smoothed", "lm", "recommendation", "cyclegan", "a3c"])
def test_cpu_training_step_at_tiny_size(make, batch_size, seq_len):
    _train_step(make(), batch_size, seq_len)


def test_transformer_loss_is_summed_over_non_padding_targets():
    torch.manual_seed(0)
    model = gavel_zoo.Transformer(50, 60, 20, d_model=16, d_inner=32, n_layers=1, n_head=2, d_k=8, d_v=8).eval()
    (src, src_pos, tgt, tgt_pos), _ = model.example_inputs(2, 6)
    full = model(src, src_pos, tgt, tgt_pos)
    padded = tgt.clone()
    padded[:, -1] = gavel_zoo.PAD  # the last target token is padding: it is neither read nor scored
    pad_pos = tgt_pos.clone()
    pad_pos[:, -1] = 0
    assert model(src, src_pos, padded, pad_pos) < full  # one fewer term per sentence in the sum
