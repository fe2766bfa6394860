"""Whole-model evaluation against NeuSight's model labels (perfmodel.evaluation.neusight_models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.evaluation.neusight_models import (
    RESULT_COLUMNS,
    GraphCache,
    LabelName,
    ModelLabel,
    evaluate_models,
    mape_by,
    parse_label_name,
    scan_labels,
)
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import op_roofline_ms as roofline_ms
from perfmodel.settings import get_settings

DATASETS = get_settings().datasets_dir
NEUSIGHT = DATASETS / "neusight"

TINY_BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 64,
             "attention_probs_dropout_prob": 0.1}


@pytest.fixture(scope="module")
def neusight() -> Path:
    if not (NEUSIGHT / "label").is_dir():
        pytest.skip(f"NeuSight dataset not found at {NEUSIGHT} (set PERFMODEL_DATASETS_DIR, or put shared/datasets "
                    "beside the checkout)")
    return NEUSIGHT


@pytest.mark.parametrize("name, expected", [
    ("bert_large-train-512-8.json", LabelName("bert_large", "train", 512, 8, None)),
    ("gpt3_xl-inf-2048-2.json", LabelName("gpt3_xl", "inference", 2048, 2, None)),
    ("gpt2_large-inf-1024-4-fusion.json", LabelName("gpt2_large", "inference", 1024, 4, "fusion")),
    ("gpt2_large-train-1024-4-pp4_1.json", LabelName("gpt2_large", "train", 1024, 4, "pp4_1")),
    ("label_summary.json", None),
    ("bert-eval-512-8.json", None),
])
def test_parse_label_name(name, expected):
    assert parse_label_name(name) == expected


def label(tmp_path: Path, model: str, mode: str, device: str = "v100-pcie-32gb") -> ModelLabel:
    return ModelLabel(path=tmp_path / f"{model}.json", gpu="Tesla_V100-PCIE-32GB", device=device, model=model,
                      mode=mode, seq_len=16, batch_size=2, num_layer=2, e2e_ms=30.0, fw_ms=10.0,
                      bw_ms=20.0 if mode == "train" else 0.0)


def test_evaluate_models_with_a_stub_predictor(tmp_path):
    (tmp_path / "tiny_bert.json").write_text(json.dumps(TINY_BERT))
    (tmp_path / "broken.json").write_text(json.dumps({"model_type": "no_such_model_type"}))
    graphs = GraphCache(config_dir=tmp_path)
    labels = [label(tmp_path, "tiny_bert", "train"), label(tmp_path, "tiny_bert", "train", "a100-pcie-40gb"),
              label(tmp_path, "tiny_bert", "inference"), label(tmp_path, "broken", "inference")]
    asked: list[str] = []

    def predict_fn_for_device(device: str):
        asked.append(device)
        return lambda ops: np.full(len(ops), 0.01)

    results = evaluate_models(predict_fn_for_device, labels, graphs=graphs)
    assert tuple(results.columns) == RESULT_COLUMNS and len(results) == 4
    assert asked == ["v100-pcie-32gb", "a100-pcie-40gb"]  # once per device
    assert len(graphs.graphs) == 2 and ("tiny_bert", 2, 16, "train") in graphs.graphs  # one per (model, b, s, mode)
    train, other_gpu, inference, broken = (results.iloc[i] for i in range(4))
    assert pd.isna(train["error"]) and train["rows"] > 0
    assert train["predicted_fw_ms"] > 0 and train["predicted_bw_ms"] > 0
    assert train["predicted_total_ms"] == pytest.approx(train["rows"] * 0.01)
    assert train["ape_total"] == pytest.approx(abs(train["predicted_total_ms"] - 30.0) / 30.0 * 100)
    assert other_gpu["predicted_total_ms"] == train["predicted_total_ms"]
    assert np.isnan(inference["predicted_bw_ms"]) and np.isnan(inference["ape_bw"])
    assert inference["predicted_total_ms"] == inference["predicted_fw_ms"]
    assert "broken" in broken["error"] and np.isnan(broken["ape_total"])
    per_device = mape_by(results, "device")
    assert set(per_device.index) == {"v100-pcie-32gb", "a100-pcie-40gb"}
    assert mape_by(results, None)["labels"].iloc[0] == 3


def test_labels_from_the_dataset(neusight):
    labels, skipped = scan_labels(neusight)
    assert len(labels) + len(skipped) == len(list((neusight / "label").glob("*/*.json")))
    assert all("variant" in reason for _, reason in skipped)
    assert {s[0].name.split("-")[-1] for s in skipped} <= {"fusion.json", "dp4.json", "tp4.json", "pp4_1.json"}
    assert {x.device for x in labels} >= {"v100-pcie-32gb", "a100-pcie-40gb", "t4", "mi210"}
    assert {x.mode for x in labels} == {"train", "inference"}
    v100 = next(x for x in labels if x.gpu == "Tesla_V100-PCIE-32GB" and x.path.name == "bert_large-train-512-8.json")
    assert (v100.device, v100.model, v100.mode, v100.seq_len, v100.batch_size, v100.num_layer) == \
        ("v100-pcie-32gb", "bert_large", "train", 512, 8, 24)
    assert v100.e2e_ms == pytest.approx(v100.fw_ms + v100.bw_ms)
    # a directory of all public datasets works as the root too
    assert len(scan_labels(DATASETS)[0]) == len(labels)


@pytest.mark.slow  # captures BERT-large and Switch-XL
def test_evaluate_a_real_label_with_the_roofline(neusight):
    catalog = load_catalog()
    labels = [x for x in scan_labels(neusight, catalog)[0] if x.gpu == "Tesla_V100-PCIE-32GB"
              and x.path.name in ("bert_large-train-512-2.json", "switchxl4-inf-512-1.json")]
    assert len(labels) == 2
    graphs = GraphCache.for_root(neusight)
    results = evaluate_models(lambda device: (lambda ops: roofline_ms(ops, catalog)), labels, graphs=graphs,
                              catalog=catalog).set_index("model")
    bert = results.loc["bert_large"]
    assert pd.isna(bert["error"])
    assert 0 < bert["predicted_fw_ms"] < bert["predicted_bw_ms"]
    assert bert["ape_total"] < 100  # the roofline is a lower bound, but not a wild one for these GEMM-bound models
    switch = results.loc["switchxl4"]  # a mixture of experts, captured with balanced routing
    assert pd.isna(switch["error"]) and switch["predicted_fw_ms"] > 0 and switch["ape_total"] < 100
    assert graphs.capture_s[("bert_large", 2, 512, "train")] > 0


def test_config_gives_the_head_neusight_ran_in_each_mode(tmp_path):
    (tmp_path / "tiny.json").write_text(json.dumps(TINY_BERT))
    graphs = GraphCache(config_dir=tmp_path)
    # BERT inference labels were timed with a sequence-classification head, training ones with the LM head
    assert graphs.config("tiny", "inference")["architectures"] == ["BertForSequenceClassification"]
    assert graphs.config("tiny", "train")["architectures"] == TINY_BERT["architectures"]
    assert graphs.config("tiny")["architectures"] == TINY_BERT["architectures"]
