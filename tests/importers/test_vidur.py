"""vidur: each op of a decoder layer as a record, projections with the GEMM shapes of the model and TP degree."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.importers import ImportStats, import_vidur
from perfmodel.lowering.ops import op_work
from perfmodel.profilers.external import UPSTREAM_OP

LLAMA2_7B = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv.gz"
CODELLAMA = "data/profiling/compute/a40/codellama/CodeLlama-34b-Instruct-hf/mlp.csv.gz"
PHI2 = "data/profiling/compute/a100/microsoft/phi-2/mlp.csv.gz"
DGX_ALLREDUCE = "data/profiling/network/a100_dgx/all_reduce.csv.gz"


def _by_row_and_op(root, catalog, *files, stats=None):
    return {(r.source_file, r.source_row, r.extra.get(UPSTREAM_OP, r.op_name)): r
            for r in import_vidur(root, catalog=catalog, files=files, stats=stats)}


def _row(root, name, tokens, tp):
    frame = pd.read_csv(root / name)
    match = frame[(frame.num_tokens == tokens) & (frame.num_tensor_parallel_workers == tp)]
    return int(match.index[0]), match.iloc[0]


def test_llama2_7b_projections_are_gemms_of_its_dimensions(vidur_root, catalog):
    records = _by_row_and_op(vidur_root, catalog, LLAMA2_7B)
    for tp in (1, 2, 4):
        index, upstream = _row(vidur_root, LLAMA2_7B, 4096, tp)
        shapes = {op: (records[(LLAMA2_7B, index, op)].m, records[(LLAMA2_7B, index, op)].k,
                       records[(LLAMA2_7B, index, op)].n)
                  for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")}
        # h 4096, 32 heads (= kv heads) of 128, gated MLP of 11008: QKV 3 h, gate + up 2 f, sharded by tp
        assert shapes == {"attn_pre_proj": (4096, 4096, 3 * 4096 // tp), "attn_post_proj": (4096, 4096 // tp, 4096),
                          "mlp_up_proj": (4096, 4096, 2 * 11008 // tp), "mlp_down_proj": (4096, 11008 // tp, 4096)}
        up = records[(LLAMA2_7B, index, "mlp_up_proj")]
        assert (up.op_class, up.batch, up.dtype, up.device, up.num_tokens, up.tensor_parallel) == (
            "linear", 1, "fp16", "test-a100-80-pcie", 4096, tp)
        assert up.latency_ms == upstream["time_stats.mlp_up_proj.median"]  # ms as published
        assert up.extra["mean_ms"] == upstream["time_stats.mlp_up_proj.mean"]
        assert up.extra["model"] == "meta-llama/Llama-2-7b-hf" and up.extra["device_assumed"] is True
    index, _ = _row(vidur_root, LLAMA2_7B, 4096, 1)
    first = {op: records[(LLAMA2_7B, index, op)] for op in
             ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")}
    assert {op: (r.op_class, r.batch, r.hidden) for op, r in first.items()} == {
        "emb": ("embedding", 4096, 4096), "input_layernorm": ("rmsnorm", 4096, 4096),
        "attn_rope": ("rope", 4096, 2 * 4096), "post_attention_layernorm": ("rmsnorm", 4096, 4096),
        "mlp_act": ("elementwise", 4096, 11008), "add": ("elementwise", 4096, 4096)}
    assert first["mlp_act"].extra["activation"] == "silu_and_mul" and first["mlp_act"].extra["input_width"] == 22016
    # named by its work: SiLU-and-mul reads the gate and up halves (2 f) and writes f, as `mul` does
    act = first["mlp_act"]
    work = op_work(pd.DataFrame([{"op_class": act.op_class, "op_name": act.op_name, "dtype": act.dtype,
                                  "batch": act.batch, "hidden": act.hidden}]))
    assert act.op_name == "mul"
    assert (work.bytes_read[0], work.bytes_written[0]) == (2 * 4096 * 11008 * 2, 4096 * 11008 * 2)
    # the PROVENANCE example: first row, 4096 tokens, TP 1, attn_pre_proj mean 1.857 ms
    assert records[(LLAMA2_7B, 0, "attn_pre_proj")].extra["mean_ms"] == pytest.approx(1.857, abs=1e-3)


def test_grouped_query_attention_shards_q_and_kv_heads(vidur_root, catalog):
    records = _by_row_and_op(vidur_root, catalog, CODELLAMA)
    index, _ = _row(vidur_root, CODELLAMA, 1024, 8)
    qkv = records[(CODELLAMA, index, "attn_pre_proj")]
    # h 8192, 64 q heads and 8 kv heads of 128: (64 + 2 * 8) * 128 / 8
    assert (qkv.m, qkv.k, qkv.n, qkv.device) == (1024, 8192, 1280, "test-a40")
    assert "device_assumed" not in qkv.extra
    assert records[(CODELLAMA, index, "attn_rope")].hidden == (64 + 8) * 128 // 8


def test_phi2_has_layernorm_a_gelu_mlp_and_no_post_attention_norm(vidur_root, catalog):
    records = _by_row_and_op(vidur_root, catalog, PHI2)
    ops = {op for (_, row, op) in records if row == 0}
    assert "post_attention_layernorm" not in ops and len(ops) == 9
    index, _ = _row(vidur_root, PHI2, 512, 1)
    assert records[(PHI2, index, "input_layernorm")].op_class == "layernorm"
    up, act = records[(PHI2, index, "mlp_up_proj")], records[(PHI2, index, "mlp_act")]
    assert (up.m, up.k, up.n) == (512, 2560, 10240) and act.extra["activation"] == "gelu" and act.op_name == "gelu"
    assert records[(PHI2, index, "add")].extra["operands"] == 3


def test_collectives_carry_bytes_ranks_and_nodes(vidur_root, catalog):
    records = list(import_vidur(vidur_root, catalog=catalog, files=[DGX_ALLREDUCE]))
    upstream = pd.read_csv(vidur_root / DGX_ALLREDUCE)
    assert len(records) == len(upstream)
    # the PROVENANCE example: 16 MiB over 2 ranks, one per node (2.886 ms) and both on one node (0.139 ms)
    example = {r.source_row: r for r in records if r.source_row in (608, 1602)}
    assert [(r.message_bytes, r.world_size, r.nodes, r.extra["devices_per_node"], r.latency_ms)
            for r in example.values()] == [(16_777_216, 2, 2, 1, 2.886), (16_777_216, 2, 1, 2, 0.139)]
    assert {(r.op_class, r.op_name, r.dtype, r.device) for r in records} == {
        ("allreduce", "all_reduce", "fp16", "test-a100-80-sxm")}
    assert {(r.world_size, r.nodes) for r in records} == {(2, 2), (2, 1), (4, 2), (4, 1), (8, 2), (8, 1), (16, 2)}


def test_unknown_gpus_and_bad_folders(vidur_root, catalog, tmp_path):
    del catalog["test-a40"]
    stats = ImportStats()
    assert list(import_vidur(vidur_root, catalog=catalog, files=[CODELLAMA], stats=stats)) == []
    assert stats.unknown_devices == {"NVIDIA A40": 10 * len(pd.read_csv(vidur_root / CODELLAMA))}
    with pytest.raises(PerfmodelError, match="does not look like the vidur dataset"):
        import_vidur(tmp_path)


def test_an_activation_keeps_the_identity_of_its_upstream_name(vidur_root, catalog):
    """Named by its work, vidur's `mlp_act` keeps the uid it had under vidur's name: a store imported before
    finds the same rows on a re-import (no duplicate)."""
    from perfmodel.store.rows import measurement_uid

    records = _by_row_and_op(vidur_root, catalog, LLAMA2_7B)
    index, _ = _row(vidur_root, LLAMA2_7B, 4096, 1)
    act = records[(LLAMA2_7B, index, "mlp_act")]
    upstream = act.model_copy(update={"op_name": "mlp_act",
                                      "extra": {k: v for k, v in act.extra.items() if k != UPSTREAM_OP}})
    assert act.op_name == "mul" and measurement_uid(act) == measurement_uid(upstream)
    assert measurement_uid(act) != measurement_uid(records[(LLAMA2_7B, index, "add")])
