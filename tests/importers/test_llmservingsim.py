"""llmservingsim: each profiled layer as a row of the op schema, with the shapes of its model's TP shard."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pandas as pd
import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.catalog import load_catalog, save_local
from perfmodel.importers import ImportStats, get_importer, import_llmservingsim
from perfmodel.store import ProfileStore
from tests.importers.conftest import make_spec

PRO6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
LLAMA = "meta-llama/Llama-3.1-8B"
DENSE_TP1 = f"profiler/perf/RTXPRO6000/{LLAMA}/bf16/tp1/dense.csv"
DENSE_TP2 = f"profiler/perf/RTXPRO6000/{LLAMA}/bf16/tp2/dense.csv"
PER_SEQ_TP1 = f"profiler/perf/RTXPRO6000/{LLAMA}/bf16/tp1/per_sequence.csv"
V0_TP2 = f"profiler/v0/perf_models/A6000/{LLAMA}/tp2/layers.csv.gz"
REAL_4090_DENSE = f"profiler/perf/RTX4090/{LLAMA}/bf16/tp1/dense.csv"

META = """profiler_version: 1.0.0
vllm_version: 0.19.0
gpu: NVIDIA RTX PRO 6000 Blackwell Server Edition
hardware: RTXPRO6000
model: meta-llama/Llama-3.1-8B
variant: bf16
tp_degrees: [1, 2]
engine_effective:
  load_format: dummy
  enforce_eager: true
  hf_overrides:
    num_hidden_layers: 1
    intermediate_size: {intermediate}
    num_attention_heads: 16
    num_key_value_heads: 4
    vocab_size: 64128
measurement_iterations: 3
"""


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


@pytest.fixture
def tiny(tmp_path):
    """A two-section copy of the dataset's layout and formats with a few rows each."""
    root = tmp_path / "llmservingsim"
    bundle = root / f"profiler/perf/RTXPRO6000/{LLAMA}/bf16"
    _write(bundle / "meta.yaml", META.format(intermediate=7168))
    _write(root / DENSE_TP1, "layer,tokens,time_us\n"
                             "act_fn,2048,94.3577\nembedding,1,3.10433\nlayernorm,2048,15.7068\n"
                             "qkv_proj,2048,302.965\nrotary_emb,2048,12.0107\no_proj,2048,193.195\n"
                             "gate_up_proj,2048,1152.83\ndown_proj,2048,608.715\nfinal_layernorm,2048,19.5837\n")
    # tp2: the TP-stable layernorms are copies of tp1's (identical series), the rest measured at the tp2 shard
    _write(root / DENSE_TP2, "layer,tokens,time_us\n"
                             "act_fn,2048,27.4453\nlayernorm,2048,15.7068\nqkv_proj,2048,172.672\n"
                             "final_layernorm,2048,19.5837\n")
    _write(root / PER_SEQ_TP1, "layer,sequences,time_us\nlm_head,1,714.006\nlm_head,8,690.934\nsampler,1,51.2\n")
    _write(bundle / "tp1/moe.csv", "tokens,activated_experts,time_us\n1,8,50.2297\n")
    _write(bundle / "tp1/attention.csv.gz", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
                                            "0,0,1,16,7.69067\n16,0,0,0,9.1\n")
    _write(root / V0_TP2, "layer_name,input,kv_cache,tp_size,latency(ns)\n"
                          "q_proj,2048,0,2,352932\nk_proj,2048,0,2,96995\nlm_head,2048,0,2,8754910\n"
                          "act_fn,2048,0,2,205379\nrope,2048,0,2,199880\nattn,2048,0,2,232281\n"
                          "input_layernorm,1,0,2,16453\n")
    return root


@pytest.fixture
def devices():
    return {"test-pro6000": make_spec("test-pro6000", (PRO6000,)),
            "test-a6000": make_spec("test-a6000", ("NVIDIA RTX A6000",))}


def _by_file_layer(records):
    return {(r.source_file, r.extra["layer"], r.num_tokens): r for r in records}


def test_vllm_layers_get_the_shapes_of_their_shard(tiny, devices):
    stats = ImportStats()
    records = _by_file_layer(import_llmservingsim(tiny, catalog=devices, stats=stats))
    qkv1, qkv2 = records[(DENSE_TP1, "qkv_proj", 2048)], records[(DENSE_TP2, "qkv_proj", 2048)]
    # Llama-3.1-8B: h 4096, 32 q heads and 8 kv heads of 128; tp2 halves the heads
    assert (qkv1.op_class, qkv1.batch, qkv1.m, qkv1.k, qkv1.n) == ("linear", 1, 2048, 4096, 6144)
    assert (qkv2.m, qkv2.k, qkv2.n, qkv2.tensor_parallel) == (2048, 4096, 3072, 2)
    assert qkv1.latency_ms == pytest.approx(0.302965)  # µs as published -> ms
    assert (qkv1.dtype, qkv1.phase, qkv1.device, qkv1.extra["model"]) == ("bf16", "forward", "test-pro6000", LLAMA)
    shapes = {layer: (r.op_class, r.op_name, r.batch, r.m, r.k, r.n, r.hidden)
              for (file, layer, _), r in records.items() if file == DENSE_TP1}
    assert shapes == {
        "act_fn": ("elementwise", "mul", 2048, None, None, None, 14336),
        "embedding": ("elementwise", "addu", 1, None, None, None, 4096),
        "layernorm": ("layernorm", "layernorm", 2048, None, None, None, 4096),
        "qkv_proj": ("linear", "linear", 1, 2048, 4096, 6144, None),
        "rotary_emb": ("elementwise", "mulu", 2048, None, None, None, 4096 + 1024),
        "o_proj": ("linear", "linear", 1, 2048, 4096, 4096, None),
        "gate_up_proj": ("linear", "linear", 1, 2048, 4096, 2 * 14336, None),
        "down_proj": ("linear", "linear", 1, 2048, 14336, 4096, None),
        "final_layernorm": ("layernorm", "layernorm", 2048, None, None, None, 4096)}
    assert records[(DENSE_TP1, "act_fn", 2048)].extra["input_width"] == 2 * 14336
    lm_head = records[(PER_SEQ_TP1, "lm_head", 8)]
    assert (lm_head.m, lm_head.k, lm_head.n) == (8, 4096, 128256)  # one position per sequence
    # tp2's layernorms are copies of tp1's measurement: skipped, counted; the sampler, moe and attention too
    assert {layer for (file, layer, _) in records if file == DENSE_TP2} == {"act_fn", "qkv_proj"}
    assert stats.skipped["TP-stable layer copied from tp1 (the tp1 record is the measurement)"] == 2
    assert stats.skipped["sampler (top-k/top-p sampling kernels)"] == 1
    assert stats.skipped["MoE block (fused experts: no op class)"] == 1
    assert stats.skipped["attention (FlashAttention / SDPA: no op class)"] == 2 + 1  # section 1 file + v0 attn row


def test_legacy_hf_layers_are_fp16_nanoseconds(tiny, devices):
    records = _by_file_layer(import_llmservingsim(tiny, catalog=devices, files=[V0_TP2]))
    q, k, lm_head = (records[(V0_TP2, name, 2048)] for name in ("q_proj", "k_proj", "lm_head"))
    assert [(r.m, r.k, r.n) for r in (q, k, lm_head)] == [(2048, 4096, 2048), (2048, 4096, 512),
                                                          (2048, 4096, 64128)]  # HF's lm_head: every position
    assert q.latency_ms == pytest.approx(0.352932) and q.dtype == "fp16" and q.device == "test-a6000"
    assert records[(V0_TP2, "act_fn", 2048)].hidden == 7168
    layers = {layer for (_, layer, _) in records}
    # eager HF norms and rotary embeddings are several kernels timed as one: not imported as one op row
    assert not layers & {"attn", "rope", "input_layernorm", "post_layernorm", "final_layernorm"}


def test_unknown_devices_dims_that_disagree_and_bad_folders(tiny, devices, tmp_path):
    del devices["test-pro6000"]
    stats = ImportStats()
    assert list(import_llmservingsim(tiny, catalog=devices, files=[DENSE_TP1, PER_SEQ_TP1], stats=stats)) == []
    assert stats.unknown_devices == {PRO6000: 9 + 3}
    # a meta.yaml whose shard is not the table's: the model is skipped, not guessed
    _write(tiny / f"profiler/perf/RTXPRO6000/{LLAMA}/bf16/meta.yaml", META.format(intermediate=7000))
    devices["test-pro6000"] = make_spec("test-pro6000", (PRO6000,))
    stats = ImportStats()
    assert list(import_llmservingsim(tiny, catalog=devices, files=[DENSE_TP1], stats=stats)) == []
    assert any("hf_overrides disagree" in reason for reason in stats.skipped)
    with pytest.raises(PerfmodelError, match="does not look like the llmservingsim dataset"):
        import_llmservingsim(tmp_path)
    assert get_importer("LLMServingSim") is import_llmservingsim


def test_importing_again_adds_nothing(tiny, devices, tmp_path):
    def records():
        return import_llmservingsim(tiny, catalog=devices)

    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        added = store.add_op_measurements(records())
        assert added == store.count_op_measurements(source="llmservingsim") == 9 + 2 + 2 + 4  # v0: no eager norm, rope
        assert store.add_op_measurements(records()) == 0
        stored = store.op_measurements(op_class="linear")
        assert stored[["batch", "m", "n", "k"]].notna().all().all()
        assert set(stored["tensor_parallel"]) == {1, 2}


def test_the_real_dataset(llmservingsim_root):
    catalog = load_catalog()
    stats = ImportStats()
    files = [f for f in import_llmservingsim.files_in(llmservingsim_root) if "/attention.csv" not in f]
    assert len(files) == 2 * 7 + 1 + 8  # dense, per_sequence of 7 bundles; one moe.csv; 8 v0 layers.csv
    files = [f for f in files if f.startswith("profiler/perf/") or "/Llama-3.1-8B/tp1/" in f]  # (for speed)
    records = list(import_llmservingsim(llmservingsim_root, catalog=catalog, stats=stats, files=files))
    by_device = Counter((r.device, r.op_class) for r in records)
    for device, classes in (("rtx-4090", ("linear", "layernorm", "elementwise")),
                            ("rtx-a6000", ("linear", "elementwise")), ("rtx-3090", ("linear", "elementwise"))):
        for op_class in classes:  # (the legacy profiler's eager norms are not imported)
            assert by_device[(device, op_class)] > 0, (device, op_class)
    qkv = next(r for r in records if r.source_file == REAL_4090_DENSE and r.extra["layer"] == "qkv_proj"
               and r.num_tokens == 2048)
    assert (qkv.m, qkv.k, qkv.n, qkv.dtype) == (2048, 4096, 6144, "bf16")
    # every GEMM runs at most at its GPU's half-precision tensor peak (the RTX 3090 boosts ~8% past its spec clock;
    # a shape twice too large would show 2x), and the large ones above 5% of it
    for r in records:
        if r.op_class != "linear":
            continue
        peak_tflops = catalog[r.device].peak_fp16_gflops / 1e3
        achieved_tflops = r.gemm_flops() / (r.latency_ms * 1e-3) / 1e12
        assert achieved_tflops < 1.15 * peak_tflops, (r.source_file, r.source_row, achieved_tflops)
        if r.gemm_flops() > 5e10:
            assert achieved_tflops > 0.05 * peak_tflops, (r.source_file, r.source_row, achieved_tflops)
    attn_rows = sum((pd.read_csv(llmservingsim_root / f)["layer_name"] == "attn").sum()
                    for f in files if f.endswith("layers.csv.gz"))
    assert stats.skipped["attention (FlashAttention / SDPA: no op class)"] == attn_rows > 0


def test_the_import_command(tiny, tmp_path):
    for name, alias in (("test-pro6000", PRO6000), ("test-a6000", "NVIDIA RTX A6000")):
        save_local(make_spec(name, (alias,)))  # the local catalog wins over the shipped one
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = CliRunner().invoke(app, ["import", "llmservingsim", str(tiny), "--store", url, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == summary["added"] == 17  # (9 + 2 + 2 section-1 rows, 4 legacy rows)
    again = CliRunner().invoke(app, ["import", "llmservingsim", str(tiny), "--store", url, "--json"])
    assert json.loads(again.stdout)["added"] == 0
