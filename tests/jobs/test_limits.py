"""JobLimits: real large models pass, absurd ones are refused naming the field and the limit, cheaply."""

from __future__ import annotations

import json
import time

import pytest

from perfmodel.core.ir import Graph
from perfmodel.jobs.limits import JobLimitError, JobLimits, check_graph, check_hf_config, check_spec, estimate_params
from perfmodel.jobs.spec import HFConfigSource, JobSpec, ZooSource

LIMITS = JobLimits()
GPT3_175B = {"model_type": "gpt2", "n_embd": 12288, "n_layer": 96, "n_head": 96, "n_positions": 2048,
             "vocab_size": 50257}
LLAMA3_405B = {"model_type": "llama", "hidden_size": 16384, "num_hidden_layers": 126, "intermediate_size": 53248,
               "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
               "max_position_embeddings": 131072}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
               "num_experts_per_tok": 8, "vocab_size": 129280, "max_position_embeddings": 163840}
MIXTRAL_8X22B = {"model_type": "mixtral", "hidden_size": 6144, "num_hidden_layers": 56, "intermediate_size": 16384,
                 "num_local_experts": 8, "vocab_size": 32768}
T5_11B = {"model_type": "t5", "d_model": 1024, "d_ff": 65536, "num_layers": 24, "num_decoder_layers": 24,
          "num_heads": 128, "d_kv": 128, "vocab_size": 32128}


@pytest.mark.parametrize(("config", "params"), [(GPT3_175B, 175e9), (LLAMA3_405B, 405e9), (DEEPSEEK_V3, 671e9),
                                                (MIXTRAL_8X22B, 141e9), (T5_11B, 11e9)])
def test_real_large_models_pass_and_the_estimate_bounds_them(config, params):
    estimate = check_hf_config(config, LIMITS)
    assert estimate == estimate_params(config)
    assert 0.8 * params <= estimate <= 2.0 * params  # close (the exact count is checked after the meta build)
    check_spec(JobSpec(source=HFConfigSource(config=config), batch_size=8, seq_len=2048), LIMITS)


@pytest.mark.parametrize(("change", "field", "limit"), [
    ({"n_layer": 1e5}, "source.config.n_layer", "max_layers"),
    ({"n_embd": 1e6}, "source.config.n_embd", "max_width"),
    ({"vocab_size": 10**9}, "source.config.vocab_size", "max_vocab"),
    ({"n_positions": 10**12}, "source.config.n_positions", "max_positions"),
    ({"n_embd": 200_000, "n_layer": 1000}, "source.config", "max_params"),
])
def test_absurd_configs_are_refused_naming_field_and_limit(change, field, limit):
    with pytest.raises(JobLimitError) as refused:
        check_hf_config({**GPT3_175B, **change}, LIMITS)
    message = str(refused.value)
    assert message.startswith(f"{field}: ") and limit in message


@pytest.mark.parametrize("change", [{"n_layer": -1}, {"n_head": -8}, {"vocab_size": -3}])
def test_negative_counts_and_widths_are_refused_naming_the_field(change):
    (key, value), = change.items()
    with pytest.raises(JobLimitError, match=rf"^source.config.{key}: .* {value} is negative"):
        check_hf_config({**GPT3_175B, **change}, LIMITS)


def test_the_issue_probe_is_refused_in_microseconds():
    config = {"model_type": "gpt2", "n_layer": 1e5, "n_embd": 1e6, "n_head": 8}
    start = time.perf_counter()
    with pytest.raises(JobLimitError, match="max_layers|max_width"):
        check_spec(JobSpec(source=HFConfigSource(config=config), batch_size=1), LIMITS)
    assert time.perf_counter() - start < 0.01


def test_nested_configs_are_bounded_in_depth_size_and_numbers():
    deep: dict = {}
    inner = deep
    for _ in range(10_000):  # far past Python's recursion limit: refused, not a RecursionError
        inner["a"] = {}
        inner = inner["a"]
    with pytest.raises(JobLimitError, match="max_config_depth = 32"):
        check_hf_config({"model_type": "gpt2", "x": deep}, LIMITS)
    with pytest.raises(JobLimitError, match="max_config_items"):
        check_hf_config({"model_type": "gpt2", "x": list(range(200_000))}, LIMITS)
    with pytest.raises(JobLimitError, match=r"source\.config\.text_config\.layer_norm_eps: inf is not a finite"):
        check_hf_config({"model_type": "x", "text_config": {"layer_norm_eps": float("inf")}}, LIMITS)
    with pytest.raises(JobLimitError, match=r"source\.config\.vision_config\.num_hidden_layers"):
        check_hf_config({"model_type": "x", "vision_config": {"num_hidden_layers": 5000}}, LIMITS)


def test_batch_and_sequence_are_bounded():
    with pytest.raises(JobLimitError, match="^batch_size: .*max_batch_size"):
        check_spec(JobSpec(source=ZooSource(name="resnet18"), batch_size=10**10), LIMITS)
    # real recommender batches (NCF: 16 million samples per GPU) are admitted; the work is what is bounded
    check_spec(JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=16_000_000), LIMITS)
    with pytest.raises(JobLimitError, match="^batch_size: .*max_tensor_elements"):
        check_spec(JobSpec(source=ZooSource(name="bert-base"), batch_size=2**30, seq_len=2**20), LIMITS)
    with pytest.raises(JobLimitError, match="^seq_len: .*max_seq_len"):
        check_spec(JobSpec(source=ZooSource(name="bert-base"), batch_size=1, seq_len=10**8), LIMITS)
    check_spec(JobSpec(source=ZooSource(name="resnet18"), batch_size=10**7), JobLimits(max_batch_size=10**8))


def _tiny_graph(**node_fields) -> Graph:
    node = {"id": "mm", "op": "aten.mm.default", "kind": "matmul", "flops_fwd": 8,
            "input_tensors": [{"shape": [2, 2], "dtype": "float32"}],
            "output_tensors": [{"shape": [2, 2], "dtype": "float32"}], **node_fields}
    totals = {"nodes": 1, "flops_fwd": 8, "flops_bwd": 0, "bytes_read_fwd": 0, "bytes_written_fwd": 0,
              "bytes_read_bwd": 0, "bytes_written_bwd": 0, "params": 0, "param_bytes": 0, "activation_bytes": 16,
              "ops_by_kind": {"matmul": 1}, "flops_fwd_by_kind": {"matmul": 8}}
    return Graph.model_validate({"name": "g", "source": "onnx", "mode": "inference", "nodes": [node],
                                 "totals": totals})


def test_a_graph_is_checked_for_negative_costs_huge_tensors_and_node_count():
    check_graph(_tiny_graph(), LIMITS)
    with pytest.raises(JobLimitError, match=r"^graph\.nodes\.0\.flops_fwd: -5 is negative"):
        check_graph(_tiny_graph(flops_fwd=-5), LIMITS)
    huge = [{"shape": [10**6, 10**6, 10**6], "dtype": "float32"}]
    with pytest.raises(JobLimitError, match="1e\\+18 elements.*max_tensor_elements"):
        check_graph(_tiny_graph(output_tensors=huge), LIMITS)
    with pytest.raises(JobLimitError, match="max_graph_nodes"):
        check_graph(_tiny_graph(), JobLimits(max_graph_nodes=0 + 1).model_copy(update={"max_graph_nodes": 0}))


def test_limits_round_trip_through_json():
    limits = JobLimits(max_layers=7)
    assert JobLimits.model_validate_json(limits.model_dump_json()) == limits
    assert json.loads(limits.model_dump_json())["max_layers"] == 7
