"""Mixture-of-experts models capture on the meta device with balanced top-k routing, with the FLOPs that routing
implies and `Graph.moe` describing their MoE layers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from perfmodel.graph import Graph, OpKind, capture_graph
from perfmodel.graph.moe import balanced_routing, moe_layers
from perfmodel.jobs.hf import build_hf_model
from perfmodel.jobs.spec import HFConfigSource, JobSpec, ZooSource

BATCH, SEQ = 2, 16
TOKENS = BATCH * SEQ
GEMM_KINDS = {OpKind.linear, OpKind.bmm, OpKind.matmul}

SWITCH = {"model_type": "switch_transformers", "architectures": ["SwitchTransformersForConditionalGeneration"],
          "d_model": 64, "d_ff": 128, "d_kv": 16, "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2,
          "num_sparse_encoder_layers": 1, "num_sparse_decoder_layers": 1, "num_experts": 8, "expert_capacity": 64,
          "vocab_size": 128}
MIXTRAL = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 64}


def _capture(config: dict, mode: str = "train", batch: int = BATCH, seq: int = SEQ) -> Graph:
    return capture_graph(JobSpec(source=HFConfigSource(config=config), batch_size=batch, seq_len=seq, mode=mode))


def _flops(graph: Graph, keep, *, backward: bool = False) -> int:
    return sum(n.flops_bwd if backward else n.flops_fwd for n in graph.nodes
               if n.kind in GEMM_KINDS and n.module and keep(n.module))


@pytest.fixture(scope="module")
def mixtral_train() -> Graph:
    return _capture(MIXTRAL)


@pytest.fixture(scope="module")
def switch_train() -> Graph:
    return _capture(SWITCH)


def test_mixtral_moe_info_and_flops(mixtral_train):
    c = MIXTRAL
    hidden, inter, experts, top_k = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], \
        c["num_experts_per_tok"]
    layers = c["num_hidden_layers"]
    moe = mixtral_train.moe
    assert moe is not None and moe.routing == "balanced"
    assert (moe.experts, moe.top_k, moe.layers, moe.hidden, moe.tokens) == (experts, top_k, layers, hidden, TOKENS)
    expert_mlp_params = 2 * inter * hidden + hidden * inter  # gate_up_proj + down_proj of one expert
    assert moe.expert_params == layers * experts * expert_mlp_params
    # every expert's weights are parameters of the model
    with torch.device("meta"):
        model = build_hf_model(MIXTRAL)
    assert mixtral_train.totals.params == sum(p.numel() for p in model.parameters())
    # experts: top_k * tokens tokens through one expert MLP (2 FLOPs per weight element); router: 2 T H E
    expert_flops = _flops(mixtral_train, lambda m: ".experts" in m)
    assert expert_flops == layers * top_k * TOKENS * 2 * expert_mlp_params
    assert _flops(mixtral_train, lambda m: m.endswith("mlp.gate")) == layers * 2 * TOKENS * hidden * experts
    # training: both the expert GEMMs' operands need a gradient (activations and weights)
    assert _flops(mixtral_train, lambda m: ".experts" in m, backward=True) == 2 * expert_flops


def test_switch_moe_info_and_flops(switch_train):
    c = SWITCH
    hidden, d_ff, experts = c["d_model"], c["d_ff"], c["num_experts"]
    with torch.device("meta"):
        model = build_hf_model(SWITCH)
    layers = len(moe_layers(model))  # the sparse encoder and decoder blocks
    assert layers == c["num_sparse_encoder_layers"] + c["num_sparse_decoder_layers"]
    moe = switch_train.moe
    assert moe is not None
    assert (moe.experts, moe.top_k, moe.layers, moe.hidden, moe.tokens) == (experts, 1, layers, hidden, TOKENS)
    assert moe.expert_params == layers * experts * 2 * hidden * d_ff  # wi, wo without bias
    assert switch_train.totals.params == sum(p.numel() for p in model.parameters())
    expert_flops = _flops(switch_train, lambda m: ".experts." in m)
    assert expert_flops == layers * 1 * TOKENS * 2 * (2 * hidden * d_ff)
    router_flops = _flops(switch_train, lambda m: m.endswith(".mlp") and "layer." in m)
    assert router_flops == layers * 2 * TOKENS * hidden * experts
    assert _flops(switch_train, lambda m: ".experts." in m, backward=True) == 2 * expert_flops


@pytest.mark.parametrize("config", [SWITCH, MIXTRAL], ids=["switch", "mixtral"])
def test_inference_capture_has_no_backward(config, request):
    graph = _capture(config, mode="inference")
    assert graph.mode == "inference" and graph.moe is not None and graph.moe.tokens == TOKENS
    assert graph.totals.flops_bwd == 0
    train = request.getfixturevalue("switch_train" if config is SWITCH else "mixtral_train")
    assert _flops(graph, lambda m: ".experts" in m) == _flops(train, lambda m: ".experts" in m)


def test_switch_expert_capacity_caps_rows_per_expert():
    """Switch drops the tokens an expert gets beyond `expert_capacity` per sequence: each expert computes at most
    batch * capacity rows."""
    capacity = 1
    graph = _capture({**SWITCH, "expert_capacity": capacity})
    hidden, d_ff, experts = SWITCH["d_model"], SWITCH["d_ff"], SWITCH["num_experts"]
    assert BATCH * capacity < math.ceil(TOKENS / experts)
    rows = experts * BATCH * capacity
    assert _flops(graph, lambda m: ".experts." in m) == graph.moe.layers * rows * 2 * (2 * hidden * d_ff)


def test_uneven_split_pads_each_expert_to_the_ceiling():
    batch, seq = 1, 5  # 10 (token, expert) pairs over 8 experts: 2 rows each
    graph = _capture(MIXTRAL, mode="inference", batch=batch, seq=seq)
    hidden, inter, experts, top_k = MIXTRAL["hidden_size"], MIXTRAL["intermediate_size"], \
        MIXTRAL["num_local_experts"], MIXTRAL["num_experts_per_tok"]
    rows = experts * math.ceil(batch * seq * top_k / experts)
    assert graph.moe.tokens == batch * seq
    assert _flops(graph, lambda m: ".experts" in m) == graph.moe.layers * rows * 2 * 3 * hidden * inter


QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
             "shared_expert_intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 128,
             "max_position_embeddings": 64}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 64}
OLMOE = {"model_type": "olmoe", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
         "vocab_size": 128, "max_position_embeddings": 64}
PHIMOE = {"model_type": "phimoe", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
          "vocab_size": 128, "max_position_embeddings": 64}


DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
               "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
               "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
               "topk_group": 1, "vocab_size": 128, "max_position_embeddings": 64, "q_lora_rank": 32,
               "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16}
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,  # transposed
           "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16, "num_local_experts": 8,  # + bias
           "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 64,
           "layer_types": ["full_attention", "sliding_attention"]}


@pytest.mark.parametrize("config", [QWEN2_MOE, QWEN3_MOE, OLMOE, PHIMOE, DEEPSEEK_V3, GPT_OSS],
                         ids=lambda c: c["model_type"])
def test_other_moe_families_capture(config):
    graph = _capture(config)
    with torch.device("meta"):
        model = build_hf_model(config)
    layers = moe_layers(model)
    assert layers and len({type(experts) for experts in layers}) == 1
    moe = graph.moe
    assert moe is not None and moe.layers == len(layers) and moe.tokens == TOKENS
    assert moe.experts == layers[0].num_experts and moe.hidden == config["hidden_size"]
    assert moe.expert_params == sum(p.numel() for experts in layers for p in experts.parameters())
    down = layers[0].down_proj  # (E, hidden, inter), or (E, inter, hidden) when stored transposed
    inter = down.shape[1] if layers[0].is_transposed else down.shape[2]
    per_token = 2 * 3 * moe.hidden * inter  # gate, up and down projections (biases are element-wise adds)
    assert _flops(graph, lambda m: ".experts" in m) == moe.layers * moe.top_k * TOKENS * per_token
    assert graph.totals.params == sum(p.numel() for p in model.parameters())


DENSE_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "vocab_size": 128}


@pytest.mark.parametrize("source", [HFConfigSource(config=DENSE_GPT2), ZooSource(name="resnet18")],
                         ids=["gpt2", "resnet18"])
def test_dense_models_have_no_moe_and_unchanged_json(source):
    graph = capture_graph(JobSpec(source=source, batch_size=2, seq_len=SEQ))
    assert graph.moe is None
    assert "moe" not in json.loads(graph.to_json())  # dense IR JSON is what it was before MoEInfo existed


def test_moe_json_round_trip(mixtral_train):
    text = mixtral_train.to_json()
    assert json.loads(text)["moe"]["experts"] == MIXTRAL["num_local_experts"]
    assert Graph.from_json(text) == mixtral_train


def test_modules_are_restored_after_capture():
    with torch.device("meta"):
        model = build_hf_model(SWITCH)
    experts = moe_layers(model)
    blocks = [m for m in model.modules() if getattr(m, "experts", None) in experts]
    assert experts and len(blocks) == len(experts)
    with balanced_routing(model) as record:
        assert all("forward" in m.__dict__ for m in experts + blocks)
    assert all("forward" not in m.__dict__ for m in experts + blocks)
    assert record.info() is None  # no forward ran
