"""Importing real files into a store: idempotent, and `perfmodel import` end to end."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.importers import ImportStats, import_neusight, import_vidur
from perfmodel.profilers.external import GEMM_OP_CLASSES
from perfmodel.store import ProfileStore

runner = CliRunner()
LINEAR_P4 = "data/dataset/train/collect/linear/p2.1.0/Tesla P4.csv.gz"
SOFTMAX_T4 = "data/dataset/train/collect/softmax/p2.1.0/Tesla T4.csv.gz"
LLAMA2_7B_A40 = "data/profiling/compute/a40/meta-llama/Llama-2-7b-hf/mlp.csv.gz"


def test_importing_a_file_again_adds_nothing(neusight_root, vidur_root, catalog, tmp_path):
    def neusight():
        return import_neusight(neusight_root, catalog=catalog, files=[LINEAR_P4, SOFTMAX_T4])

    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = store.add_op_measurements(neusight())
        assert first == store.count_op_measurements() > 8_000
        assert store.add_op_measurements(neusight()) == 0
        assert store.add_op_measurements(neusight(), replace=True) == first
        assert store.count_op_measurements() == first
        stats = ImportStats()
        added = store.add_op_measurements(import_vidur(vidur_root, catalog=catalog, files=[LLAMA2_7B_A40],
                                                       stats=stats))
        assert added == stats.total == 10 * 1044
        assert store.count_op_measurements(device="test-a40", op_class="linear") == 4 * 1044
        gemms = store.op_measurements(op_class=list(GEMM_OP_CLASSES), extra=False)
        linear_rows = len(pd.read_csv(neusight_root / LINEAR_P4))
        assert len(gemms) == linear_rows + 4 * 1044  # each linear row of the P4 file, four projections a vidur row
        assert gemms[["batch", "m", "n", "k"]].notna().all().all()  # what FLOPs and bytes need
        assert set(gemms["dtype"]) == {"fp32", "fp16"}


def test_the_import_command(deepbench_root, local_catalog, tmp_path):
    local_catalog()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = runner.invoke(app, ["import", "deepbench", str(deepbench_root), "--store", url, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] == summary["added"] > 5_000
    assert {f["file"] for f in summary["files"]} >= {"tidy/deepbench_convolution.csv",
                                                     "tidy/deepbench_dense_matrix_multiplication.csv"}
    by_device = {(d["device"], d["op_class"]): d["records"] for d in summary["by_device"]}
    assert by_device[("test-v100-sxm2", "gemm")] == 320  # 160 problems, fp32 and fp16
    assert not {"NV_V100", "NV_T4", "NV_P100", "NV_1080Ti"} & set(summary["unknown_devices"])
    assert summary["skipped"]["no latency"] > 0
    again = runner.invoke(app, ["import", "DeepBench", str(deepbench_root), "--store", url])
    assert again.exit_code == 0, again.output
    assert f"{summary['records']} records read from 6 file(s), 0 new in the store" in " ".join(again.stdout.split())
    assert "test-v100-sxm2" in again.stdout and "records per device and op class" in again.stdout
    counts = runner.invoke(app, ["profiles", "ops-summary", "--store", url, "--json"])
    assert counts.exit_code == 0, counts.output
    assert sum(row["records"] for row in json.loads(counts.stdout)) == summary["records"]
