"""`perfmodel predict-ops IN.csv OUT.csv [--model REF]` with a tiny per-op model trained on NeuSight rows."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.evaluation.transfer import neusight_sweep_ops
from perfmodel.hardware.catalog import load_catalog
from perfmodel.registry.registry import ModelRegistry
from perfmodel.regressors.device_ops import DeviceOpRegressor
from perfmodel.settings import get_settings

NEUSIGHT = get_settings().datasets_dir / "neusight"

# every op class, devices by the names NeuSight writes, a column of text and numbers as a user wrote them
IN_CSV = """\
OPName,Latency,Device,B,M,N,K,H,Input_Channel,Output_Channel,Kernel_Szie,Input_Size,Stride,Padding,note
bmm,0.035466667264699936,Tesla T4,64,512,512,64,,,,,,,,attention scores
linear,,NVIDIA A100-PCIE-40GB,1,4096,1024,1024,,,,,,,,"qkv, fused"
conv,1.0,Tesla V100-PCIE-32GB,8,,,,,64,64,3,56,1,1,
add,0.1,Tesla P4,4096,,,,1024,,,,,,,
gelu,0.1,t4,4096,,,,4096,,,,,,,
softmax,0.1,AMD Instinct MI210,8192,,,,512,,,,,,,
ln,0.1,Tesla P100-PCIE-16GB,4096,,,,1024,,,,,,,
"""

runner = CliRunner()


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """A registry holding one tiny xgb-device-ops model (40 rows of every NeuSight sweep file, 30 rounds)."""
    if not NEUSIGHT.is_dir():
        pytest.skip(f"NeuSight dataset not found at {NEUSIGHT} "
                    "(set PERFMODEL_DATASETS_DIR, or put shared/datasets beside the checkout)")
    catalog = load_catalog()
    ops = neusight_sweep_ops(NEUSIGHT, catalog, max_rows_per_file=40)
    root = tmp_path_factory.mktemp("models")
    registry = ModelRegistry(root)
    registry.save(DeviceOpRegressor(n_estimators=30, nthread=1).fit(ops, catalog), "tiny-ops", {})
    return root


@pytest.fixture
def promoted(models_dir, monkeypatch):
    registry = ModelRegistry(models_dir)
    registry.promote("tiny-ops/v1")
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(models_dir))
    return models_dir


def run(*args):
    return runner.invoke(app, ["predict-ops", *[str(a) for a in args]])


def write_in(tmp_path: Path, text: str = IN_CSV, name: str = "in.csv") -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_out_is_in_plus_predictions(promoted, tmp_path):
    source, out = write_in(tmp_path), tmp_path / "out.csv"
    result = run(source, out)
    assert result.exit_code == 0, result.output
    assert "predicted 7 ops on 6 device(s)" in result.stdout and "tiny-ops/v1" in result.stdout
    assert len(result.stdout.strip().splitlines()) == 1
    given = pd.read_csv(source, dtype=str, keep_default_na=False)
    written = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(written.columns) == [*given.columns, "predicted_ms", "p10_ms", "p90_ms", "extrapolated"]
    pd.testing.assert_frame_equal(written[given.columns], given)  # every cell as it was written
    numbers = pd.read_csv(out)
    assert (numbers["predicted_ms"] > 0).all()
    assert (numbers["p10_ms"] <= numbers["predicted_ms"]).all() and (numbers["predicted_ms"] <= numbers["p90_ms"]).all()
    assert set(numbers["extrapolated"]) <= {True, False}


def test_gzip_in_and_out_and_model_option(models_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(models_dir))  # nothing promoted for device-ops here
    source, out = write_in(tmp_path, name="in.csv.gz"), tmp_path / "out.csv.gz"
    result = run(source, out, "--model", "tiny-ops")
    assert result.exit_code == 0, result.output
    with gzip.open(out, "rt") as handle:
        assert len(pd.read_csv(handle)) == 7


@pytest.mark.parametrize("edit,fragments", [
    (lambda text: text.replace("Tesla P4", "Tesla T5"),
     ["row 4, column 'Device': unknown accelerator 'Tesla T5'", "did you mean", "Tesla T4"]),
    (lambda text: text.replace("\ngelu,", "\ngelux,"), ["row 5, column 'OPName'", "'gelux'", "gelu"]),
    (lambda text: text.replace("64,512,512,64", "64,512,,64"), ["row 1, column 'N'", "needs a number"]),
    (lambda text: text.replace("note", "predicted_ms"), ["already has column(s) predicted_ms"]),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(promoted, tmp_path, edit, fragments):
    source, out = write_in(tmp_path, edit(IN_CSV)), tmp_path / "out.csv"
    result = run(source, out)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1
    for fragment in fragments:
        assert fragment in message
    assert not out.exists() and list(tmp_path.iterdir()) == [source]  # no OUT, no temporary file


def test_a_failed_run_leaves_an_existing_out_alone(promoted, tmp_path):
    source, out = write_in(tmp_path, IN_CSV.replace("Tesla P4", "Tesla T5")), tmp_path / "out.csv"
    out.write_text("previous results\n")
    assert run(source, out).exit_code == 2
    assert out.read_text() == "previous results\n"


def test_no_model_missing_input_and_unknown_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_MODELS_DIR", str(tmp_path / "models"))
    source, out = write_in(tmp_path), tmp_path / "out.csv"
    result = run(source, out)
    assert result.exit_code == 2 and "no promoted device-ops model" in result.stderr and "--model" in result.stderr
    assert not out.exists()
    result = run(source, out, "--model", "nothing/v1")
    assert result.exit_code == 2 and "unknown model 'nothing/v1'" in result.stderr
    result = run(tmp_path / "missing.csv", out)
    assert result.exit_code == 2 and "no such file" in result.stderr
    result = run(source, tmp_path / "no" / "such" / "out.csv")
    assert result.exit_code == 2 and "no such folder" in result.stderr
