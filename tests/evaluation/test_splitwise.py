"""Splitwise: parsing the measured TP inference rows, the jobs and placements they stand for, and the metrics."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.evaluation.splitwise import (
    MODELS,
    evaluate_prompt_times,
    job_spec,
    parse_perf_model,
    placement,
    shapes,
    splitwise_file,
    summarise,
)
from perfmodel.predictor.placed import PlacementPredictor
from perfmodel.settings import get_settings

HEADER = ("model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,token_time,"
          "e2e_time,tensor_parallel\n")
LINES = [  # the upstream format: the PROVENANCE's first example row, then other points and TP degrees
    "llama2-70b,a100-80gb,512,1,128,1.0000125,0.73599375,196.2532191537321,54.87951193752838,7168.983697891235,2",
    "llama2-70b,a100-80gb,512,1,128,1.0000125,0.73599375,195.56166394613683,54.85629275859165,7165.2703285217285,2",
    "llama2-70b,a100-80gb,512,1,128,0.0,0.0,127.0,30.1,4000.0,4",
    "llama2-70b,a100-80gb,128,1,128,0.0,0.0,81.1,54.8,7100.0,2",
    "bloom-176b,a100-80gb,512,64,128,0.0,0.0,10958.2,96.9,23330.0,8",
]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "splitwise" / "data" / "perf_model.a100-80gb.csv"
    path.parent.mkdir(parents=True)
    path.write_text(HEADER + "\n".join(LINES) + "\n")
    return path


def test_rows_parse_with_their_units_and_unmeasured_power(tiny):
    rows = parse_perf_model(tiny)
    assert len(rows) == len(LINES)
    first = rows[0]
    assert (first.model, first.hardware, first.tp, first.batch_size, first.prompt_tokens, first.output_tokens) == (
        "llama2-70b", "a100-80gb", 2, 1, 512, 128)
    assert (first.prompt_time_ms, first.token_time_ms, first.peak_power) == (
        pytest.approx(196.2532191537321), pytest.approx(54.87951193752838), pytest.approx(1.0000125))
    assert rows[2].peak_power is None and rows[2].average_power is None  # 0.0 = not measured
    assert [r.source_row for r in rows] == list(range(len(LINES)))
    assert splitwise_file(tiny.parents[2]) == tiny == splitwise_file(tiny.parents[1]) == splitwise_file(tiny)


def test_bad_files_are_user_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("model,prompt_time\nx,1\n")
    with pytest.raises(PerfmodelError, match="not a Splitwise perf_model file"):
        parse_perf_model(bad)
    bad.write_text(HEADER + LINES[0].replace(",2\n", "").replace("512", "five hundred") + "\n")
    with pytest.raises(PerfmodelError, match="data row 0"):
        parse_perf_model(bad)
    with pytest.raises(PerfmodelError, match="no Splitwise data"):
        splitwise_file(tmp_path / "nowhere")


def test_one_graph_per_shape_serves_every_tp_degree(tiny):
    rows = parse_perf_model(tiny)
    assert shapes(rows) == [("llama2-70b", 1, 128), ("llama2-70b", 1, 512), ("bloom-176b", 64, 512)]
    assert shapes(rows, max_shapes=2) == shapes(rows)[:2]
    spec = job_spec("llama2-70b", 4, 2048)
    assert (spec.batch_size, spec.seq_len, spec.precision.value, spec.mode.value) == (4, 2048, "fp16", "inference")
    assert spec.source.config["num_key_value_heads"] == 8 and spec.source.config["hidden_size"] == 8192
    where = placement("a100-80gb", 8, 4)
    assert (where.accelerator, where.devices, where.nodes, where.parallelism.tensor, where.global_batch_size) == (
        "a100-sxm4-80gb", 8, 1, 8, 4)
    with pytest.raises(PerfmodelError, match="no HF config"):
        job_spec("gpt-5", 1, 1)
    with pytest.raises(PerfmodelError, match="no catalog id"):
        placement("h100-80gb", 8, 1)


def test_metrics_over_rows_per_model_and_tp():
    results = pd.DataFrame({"model": ["m", "m", "m", "n"], "tp": [2, 2, 4, 8],
                            "measured_prompt_ms": [100.0, 200.0, 50.0, 10.0],
                            "predicted_prompt_ms": [110.0, 100.0, 50.0, 13.0], "ape": [10.0, 50.0, 0.0, 30.0]})
    table = summarise(results).set_index(["model", "tp"], drop=False)
    assert table.loc[("m", 2), "mape"] == 30.0 and table.loc[("m", 2), "rows"] == 2
    assert table.loc[("m", 4), "median_ape"] == 0.0
    overall = table[table["model"] == "all"].iloc[0]
    assert (overall["rows"], overall["mape"], overall["median_ape"]) == (4, 22.5, 20.0)


@pytest.mark.slow  # one graph capture: ~10 s in a fresh process (torch.export's first run), ~1 s after
def test_the_real_placement_model_on_a_two_layer_llama(tiny):
    """The real predictor on Llama-2-70B's layer shapes, two layers deep (the 80-layer graph is the bench's): one
    prediction per (shape, TP degree) for every row, compute shrinking with the TP degree, communication with it."""
    configs = {"llama2-70b": {**MODELS["llama2-70b"], "num_hidden_layers": 2}}
    rows = [r for r in parse_perf_model(tiny) if r.model == "llama2-70b" and r.prompt_tokens == 512]
    calls = []

    def predict(spec, where):
        calls.append((spec.seq_len, where.parallelism.tensor))
        return predictor.predict(spec, where)

    predictor = PlacementPredictor.load()
    results = evaluate_prompt_times(rows, predict, configs=configs)
    assert sorted(calls) == [(512, 2), (512, 4)]  # three rows, two TP degrees: two predictions
    assert len(results) == 3 and results["predicted_prompt_ms"].gt(0).all()
    at_512 = results.drop_duplicates("tp").set_index("tp")
    assert at_512.loc[4, "predicted_compute_ms"] == pytest.approx(at_512.loc[2, "predicted_compute_ms"] / 2)
    assert (results["predicted_communication_ms"] > 0).all()
    assert results["ape"].notna().all()


def test_the_real_file():
    path = get_settings().datasets_dir / "splitwise"
    if not path.is_dir():
        pytest.skip(f"public dataset 'splitwise' not found at {path} (set PERFMODEL_DATASETS_DIR)")
    rows = parse_perf_model(splitwise_file(path))
    assert len(rows) == 420
    assert Counter((r.model, r.tp) for r in rows) == {("llama2-70b", 2): 105, ("llama2-70b", 4): 105,
                                                      ("llama2-70b", 8): 105, ("bloom-176b", 8): 105}
    assert {r.hardware for r in rows} == {"a100-80gb"}
    assert len(shapes(rows)) == 26  # 13 points per model, shared by its TP degrees
    centre = [r for r in rows if r.shape == ("llama2-70b", 1, 512) and r.tp == 2]
    assert len(centre) == 45 and all(150 < r.prompt_time_ms < 250 for r in centre)  # 3 sweeps: 9 points x 5
    assert all(r.prompt_time_ms > 0 and r.e2e_time_ms > r.prompt_time_ms for r in rows)
