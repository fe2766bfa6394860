"""perfmodel.jobs.dle: the NVIDIA DeepLearningExamples models of Lambda's GPU benchmark as zoo entries (build on
meta, capture with the loss in the graph, reference parameter counts, FLOPs that grow with the batch, real CPU
steps at tiny sizes), and the `task` of zoo jobs."""

from __future__ import annotations

import functools

import pytest
import torch
from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError
from perfmodel.graph import graph_for_job
from perfmodel.jobs import dle
from perfmodel.jobs.build import build_job
from perfmodel.jobs.spec import JobSpec, ZooSource
from perfmodel.jobs.zoo import ZOO, InputKind

DLE = ("ssd300", "gnmt", "ncf", "tacotron2", "waveglow", "transformer-xl-base", "transformer-xl-large", "maskrcnn")
SMALL_SEQ = {"waveglow": 64, "tacotron2": 4}  # audio samples, mel frames; tokens otherwise


def _lstm(n_in: int, hidden: int, bidirectional: bool = False) -> int:
    """nn.LSTM parameters: 4 gates x (input + hidden weights) + two biases, per direction."""
    return (4 * hidden * (n_in + hidden) + 8 * hidden) * (2 if bidirectional else 1)


def _txl(n_layer: int, d: int, n_head: int, d_head: int, d_inner: int) -> int:
    """Transformer-XL with a tied full softmax: embedding (= output weight) + output bias + r_w/r_r biases + layers
    (qkv, r_net, o_net, two layer norms, feed-forward)."""
    h = n_head * d_head
    layer = 3 * d * h + d * h + h * d + 2 * 2 * d + (d * d_inner + d_inner) + (d_inner * d + d)
    return dle.WT103_VOCAB * d + dle.WT103_VOCAB + 2 * h + n_layer * layer


# Parameter counts of the reference implementations, each derived from the reference's layer list.
REFERENCE_PARAMS = {
    # DLE SSD300 v1.1: torchvision ResNet-50 conv1..layer3 8,543,296 + extra blocks 3,773,696 + location heads
    # 497,784 + confidence heads 10,080,126 (81 classes)
    "ssd300": 8_543_296 + 3_773_696 + 497_784 + 10_080_126,
    # DLE GNMT v2, ~160.7M: shared embedding, encoder (bidirectional first layer), attention LSTM, normalized
    # Bahdanau attention (Wq, Wk, v, g, b), 3 decoder LSTMs on [x, context], classifier
    "gnmt": (32320 * 1024 + _lstm(1024, 1024, True) + _lstm(2048, 1024) + 2 * _lstm(1024, 1024)
             + _lstm(1024, 1024) + 2 * 1024 * 1024 + 1024 + 1 + 1024 + 3 * _lstm(2048, 1024) + 1024 * 32320 + 32320),
    # DLE NCF: (users + items) x (GMF 64 + MLP 128) embeddings + MLP 256-256-128-64 + final (128 -> 1)
    "ncf": (138493 + 26744) * (64 + 128) + (256 * 256 + 256) + (256 * 128 + 128) + (128 * 64 + 64) + (128 + 1),
    "tacotron2": 28_193_153,  # DLE Tacotron 2: 28.2M
    "waveglow": 268_294_760,  # DLE WaveGlow (--wn-channels 512, the arg_parser default): 268.3M
    # DLE Transformer-XL with Lambda's flags (full softmax, tied): base 191.9M, large 520.0M (DLE's own large
    # config, adaptive with div_val 4, would be ~257M)
    "transformer-xl-base": _txl(16, 512, 8, 64, 2048),
    "transformer-xl-large": _txl(18, 1024, 16, 64, 4096),
    # torchvision maskrcnn_resnet50_fpn(num_classes=81) has 44,400,693 with trainable batch norm; maskrcnn_benchmark
    # freezes batch norm (buffers, not parameters): 53,120 fewer
    "maskrcnn": 44_400_693 - 53_120,
}

# ops each model's loss puts in its graph
LOSS_OPS = {
    "ssd300": ("aten.cross_entropy_loss", "aten.smooth_l1_loss", "aten.sort"),
    "gnmt": ("aten.log_softmax", "aten.gather"),
    "ncf": ("aten.binary_cross_entropy_with_logits",),
    "tacotron2": ("aten.mse_loss", "aten.binary_cross_entropy_with_logits"),
    "waveglow": ("aten.logdet", "aten.exp"),
    "transformer-xl-base": ("aten.log_softmax", "aten.gather"),
    "transformer-xl-large": ("aten.log_softmax", "aten.gather"),
    "maskrcnn": ("aten.cross_entropy_loss", "aten.binary_cross_entropy_with_logits", "aten.topk"),
}
# capturing these takes 4-8 s each here (tests/graph/test_from_torch.py captures every zoo model too);
# transformer-xl-large is transformer-xl-base's module at other sizes: its parameters are checked on a meta build
SLOW_CAPTURE = {"ssd300", "waveglow", "maskrcnn"}


def spec(name: str, batch_size: int = 2, **kw) -> JobSpec:
    return JobSpec(source=ZooSource(name=name), batch_size=batch_size, seq_len=SMALL_SEQ.get(name, 8), **kw)


def graph(name: str, batch_size: int = 2):
    return _graph(name, batch_size)  # graph("x") and graph("x", 2) share one capture


@functools.cache
def _graph(name: str, batch_size: int):
    return graph_for_job(spec(name, batch_size))


def _captures(name: str):
    return pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CAPTURE else name


def test_entries_name_family_unit_and_items():
    expected = {  # name: (family, unit, reference_seq_len (padded), real items per sample there)
        "ssd300": ("ssd", "images", None, 1), "gnmt": ("gnmt", "tokens", 32, 50), "ncf": ("ncf", "samples", None, 1),
        "tacotron2": ("tacotron2", "mel frames", 850, 566), "waveglow": ("waveglow", "audio samples", 8000, 8000),
        "transformer-xl-base": ("transformer-xl", "tokens", 192, 192),
        "transformer-xl-large": ("transformer-xl", "tokens", 256, 256), "maskrcnn": ("maskrcnn", "images", None, 1),
    }
    for name, (family, unit, reference, items) in expected.items():
        entry = ZOO[name]
        assert (entry.family, entry.library, entry.inputs, entry.unit) == (family, "perfmodel", InputKind.custom, unit)
        assert entry.reference_seq_len == reference and entry.description
        assert entry.items(reference or 128) == pytest.approx(items)
        assert 0 < entry.real_item_share <= 1
    assert ZOO["gnmt"].items_per_sample(50) == 99  # source + target - 1 tokens per (padded) sentence pair


@pytest.mark.parametrize("name", DLE)
def test_meta_build_has_the_reference_parameter_count(name):
    job = build_job(spec(name), "meta")
    assert all(p.device.type == "meta" for p in job.module.parameters())
    assert job.family == ZOO[name].family and job.module.training
    inputs = list(job.args) + list(job.kwargs.values())
    assert inputs and all(t.device.type == "meta" and t.shape[0] == 2 for t in inputs)  # batch-first
    assert sum(p.numel() for p in job.module.parameters()) == REFERENCE_PARAMS[name]


def test_reference_counts_quoted():
    assert round(REFERENCE_PARAMS["gnmt"] / 1e6, 1) == 160.7
    assert round(REFERENCE_PARAMS["transformer-xl-base"] / 1e6, 1) == 191.9
    assert round(REFERENCE_PARAMS["transformer-xl-large"] / 1e6) == 520
    with torch.device("meta"):
        adaptive_large = dle.MemTransformerLM(18, 1024, 16, 64, 4096, adaptive=True)
    clusters = 3 * 1024 + 3  # cluster weights and biases of the adaptive softmax's head
    assert sum(p.numel() for p in adaptive_large.parameters()) == REFERENCE_PARAMS["transformer-xl-large"] + clusters


@pytest.mark.parametrize("name", [_captures(n) for n in DLE if n != "transformer-xl-large"])
def test_captures_on_meta_with_the_loss_in_the_graph(name, check_training_graph):
    g = graph(name)
    check_training_graph(g)
    ops = {n.op.rsplit(".", 1)[0] for n in g.nodes}
    assert set(LOSS_OPS[name]) <= ops, sorted(ops)
    assert g.totals.params == REFERENCE_PARAMS[name]


def _grows(two, four) -> None:
    assert two.totals.nodes == four.totals.nodes
    assert 1.5 * two.totals.flops_fwd < four.totals.flops_fwd <= 2.0 * two.totals.flops_fwd * 1.01


@pytest.mark.parametrize("name", ["ncf", "tacotron2"] + [pytest.param(n, marks=pytest.mark.slow) for n in (
    "gnmt", "transformer-xl-base", "ssd300", "maskrcnn")])
def test_flops_grow_with_the_batch(name):
    _grows(graph(name, 2), graph(name, 4))  # (batch 1 cannot train SSD300: batch norm of its 1x1 map)


def test_waveglow_flops_grow_with_the_batch():
    from perfmodel.graph import graph_from_module

    def captured(batch_size: int):  # a small WaveGlow (the zoo one takes 8 s to capture here)
        with torch.device("meta"):
            model = dle.WaveGlow(n_flows=5, wn_layers=2, wn_channels=16)
            args, kwargs = model.example_inputs(batch_size, 512)
        return graph_from_module(model.train(), args, kwargs, name="waveglow-small")

    _grows(captured(2), captured(4))


def test_tacotron2_loops_over_mel_frames_and_derives_the_text_length():
    assert dle.tacotron2_text_len(550) == 97 and dle.tacotron2_text_len(1) == 2
    four, five = graph("tacotron2"), graph_for_job(JobSpec(source=ZooSource(name="tacotron2"), batch_size=2,
                                                          seq_len=5))
    per_frame = five.totals.nodes - four.totals.nodes
    assert 30 <= per_frame <= 80  # one decoder step's ops per frame
    assert five.totals.flops_fwd > four.totals.flops_fwd


def test_ncf_captures_at_lambdas_largest_batch():
    g = graph_for_job(JobSpec(source=ZooSource(name="ncf"), batch_size=16_000_000))
    assert g.totals.flops_fwd > 16_000_000 * 2 * 100_000


def test_short_sequences_are_refused():
    with pytest.raises(PerfmodelError, match="waveglow needs seq_len >= 8"):
        build_job(JobSpec(source=ZooSource(name="waveglow"), batch_size=1, seq_len=4), "meta")
    with pytest.raises(PerfmodelError, match="gnmt needs seq_len >= 2"):
        build_job(JobSpec(source=ZooSource(name="gnmt"), batch_size=1, seq_len=1), "meta")


# --- real CPU training steps, at tiny sizes ----------------------------------------------------------------------


def _train_step(module: torch.nn.Module, batch_size: int, seq_len: int) -> torch.Tensor:
    torch.manual_seed(0)
    module.train()
    args, kwargs = module.example_inputs(batch_size, seq_len)
    out = module(*args, **kwargs)
    loss = out[0] if isinstance(out, tuple) else out
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads)
    return out


@pytest.mark.parametrize("make,seq_len", [
    (lambda: dle.NeuMF(nb_users=50, nb_items=40, mf_dim=8, mlp_layer_sizes=(16, 8, 4)), 1),
    (lambda: dle.GNMT(vocab_size=64, hidden_size=16), 6),
    (lambda: dle.Tacotron2(embedding_dim=32, attention_rnn_dim=32, decoder_rnn_dim=32, prenet_dim=16,
                           attention_dim=8, location_filters=4, location_kernel=5, postnet_dim=16), 12),
    (lambda: dle.MemTransformerLM(2, 16, 2, 8, 32, n_token=300), 6),
], ids=["ncf", "gnmt", "tacotron2", "transformer-xl"])
def test_cpu_training_step_at_tiny_size(make, seq_len):
    _train_step(make(), 3, seq_len)


@pytest.mark.slow  # oneDNN prepares the 1024-wide transposed convolution of the upsampler for ~3 s
def test_waveglow_cpu_training_step_at_tiny_size():
    model = dle.WaveGlow(n_flows=5, wn_layers=2, wn_channels=16)
    assert all(torch.det(conv.conv.weight.squeeze(-1)) > 0 for conv in model.convinv)  # log|det W| is defined
    _train_step(model, 3, 520)


def test_transformer_xl_adaptive_softmax_and_memories():
    model = dle.MemTransformerLM(2, 16, 2, 8, 32, n_token=dle.WT103_VOCAB, adaptive=True)
    _, mems = _train_step(model, 2, 5)
    assert mems.shape == (2, 2, 5, 16) and not mems.requires_grad  # (batch, layer, mem_len, d_model)
    shares = dle.zipf_cluster_shares(dle.WT103_CUTOFFS, dle.WT103_VOCAB)
    assert sum(shares) == pytest.approx(1.0) and shares[0] > 0.75


def test_roi_align_averages_bilinear_samples():
    ramp = torch.arange(16.0).repeat(4, 1)  # value = x
    features = torch.stack([ramp, 2 * ramp]).unsqueeze(0)  # (1, 2, 4, 16)
    boxes = torch.tensor([[[0.0, 0.0, 16.0, 8.0], [8.0, 4.0, 24.0, 12.0]]])  # image coordinates, scale 1/2
    out = dle.roi_align(features, boxes, output_size=2, scale=0.5)
    assert out.shape == (2, 2, 2, 2)
    # box 0 spans x in [0, 8) on the map: cells [0, 4) and [4, 8), sampled at 1, 3 and 5, 7 -> means 2 and 6
    assert torch.allclose(out[0, 0], torch.tensor([[2.0, 6.0], [2.0, 6.0]]))
    assert torch.allclose(out[0, 1], 2 * out[0, 0])
    assert torch.allclose(out[1, 0], torch.tensor([[6.0, 10.0], [6.0, 10.0]]))


def test_ssd300_meta_maps_and_default_boxes():
    with torch.device("meta"):
        model = dle.SSD300()
        images = torch.empty(2, 3, 300, 300)
    x = model.feature_extractor(images)
    sizes = [x.shape[-1]]
    for block in model.additional_blocks:
        x = block(x)
        sizes.append(x.shape[-1])
    assert sizes == [38, 19, 10, 5, 3, 1]
    assert dle._ssd300_default_boxes().shape == (1, 4, 8732)


# --- the task of zoo jobs ----------------------------------------------------------------------------------------


def test_spec_keys_without_a_task_are_unchanged():
    # computed before ZooSource had a `task`: stored jobs and shipped data use these keys
    assert JobSpec(source=ZooSource(name="resnet50"), batch_size=32).key() == "a16c30d7f9094ea4675908cf"
    assert "task" not in JobSpec(source=ZooSource(name="gpt2"), batch_size=1).model_dump()["source"]


def test_zoo_task_picks_the_head_of_a_transformers_model():
    qa = JobSpec.from_options(zoo="bert-small", task="question-answering", batch_size=2, seq_len=8)
    assert qa.source.task == "question-answering" and qa.key() != spec("bert-small").key()
    assert JobSpec.model_validate_json(qa.model_dump_json()) == qa
    assert type(build_job(qa, "meta").module).__name__ == "BertForQuestionAnswering"
    assert type(build_job(spec("bert-small"), "meta").module).__name__ == "BertForSequenceClassification"
    assert ZOO["bert-small"].default_task == "sequence-classification" and ZOO["gnmt"].default_task is None


@pytest.mark.parametrize("name,task,message", [
    ("resnet50", "causal-lm", "torchvision model with one head"),
    ("gnmt", "base", "perfmodel model with one head"),
    ("bert-base", "qa", "unknown task 'qa'"),
])
def test_bad_zoo_tasks_are_refused(name, task, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec.from_options(zoo=name, task=task, batch_size=1)
