"""`perfmodel hw add SPEC --store URL`: a spec sheet stored as a custom accelerator (exit 0), bad sheets and catalog
names refused with exit code 2 and the field or name in the message."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.store import ProfileStore
from perfmodel.store.accelerators import custom_accelerators

runner = CliRunner()
SHEET = """\
name: acme-x1
kind: gpu
vendor: ACME
peak_fp32_gflops: 60 TFLOP/s
memory_bandwidth_gb_s: 3 TB/s
memory_gb: 96
compute_units: 120
source: ACME X1 datasheet rev 2
"""


def test_hw_add_stores_the_sheet_once(tmp_path, sqlite_url):
    sheet = tmp_path / "x1.yaml"
    sheet.write_text(SHEET)
    result = runner.invoke(app, ["hw", "add", str(sheet), "--store", sqlite_url, "--json"])
    assert result.exit_code == 0, result.output
    added = json.loads(result.stdout)
    assert added["created"] is True and added["memory_bandwidth_gb_s"] == 3000.0
    again = runner.invoke(app, ["hw", "add", str(sheet), "--store", sqlite_url])
    assert again.exit_code == 0 and "already stored" in again.stdout
    with ProfileStore(sqlite_url) as store:
        assert [spec.name for spec in custom_accelerators(store)] == ["acme-x1"]


def test_hw_add_refuses_bad_sheets_with_exit_2(tmp_path, sqlite_url):
    cases = {
        "clash.yaml": (SHEET.replace("name: acme-x1", "name: H100"), "h100-sxm5"),
        "unit.yaml": (SHEET.replace("3 TB/s", "3 TFLOP/s"), "memory_bandwidth_gb_s"),
        "missing.yaml": (SHEET.replace("compute_units: 120\n", ""), "compute_units"),
        "list.yaml": ("- 1\n- 2\n", "mapping"),
    }
    for file, (text, named) in cases.items():
        sheet = tmp_path / file
        sheet.write_text(text)
        result = runner.invoke(app, ["hw", "add", str(sheet), "--store", sqlite_url])
        assert result.exit_code == 2, (file, result.output)
        assert named in result.output, (file, result.output)
    missing = runner.invoke(app, ["hw", "add", str(tmp_path / "nope.yaml"), "--store", sqlite_url])
    assert missing.exit_code == 2
    with ProfileStore(sqlite_url) as store:
        assert custom_accelerators(store) == []


def test_an_added_accelerator_is_shown_listed_and_predicted_on_the_cli(tmp_path, sqlite_url):
    """`hw show`, `hw list`, `predict` and `export gavel` read the store's custom accelerators, as the service does;
    another store does not know it (exit 2 naming the accelerator, and for the export the option)."""
    sheet = tmp_path / "x1.yaml"
    sheet.write_text(SHEET)
    assert runner.invoke(app, ["hw", "add", str(sheet), "--store", sqlite_url]).exit_code == 0
    shown = runner.invoke(app, ["hw", "show", "acme-x1", "--store", sqlite_url])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["peak_fp32_gflops"] == 60_000.0
    listed = runner.invoke(app, ["hw", "list", "--store", sqlite_url, "--json"])
    assert "acme-x1" in {entry["name"] for entry in json.loads(listed.stdout)}
    predicted = runner.invoke(app, ["predict", "mlp-recommender", "-b", "64", "--accelerator", "acme-x1",
                                    "--store", sqlite_url, "--json"])
    assert predicted.exit_code == 0, predicted.output
    answer = json.loads(predicted.stdout)
    assert answer["accelerator"] == "acme-x1" and answer["throughput_samples_per_s"] > 0
    assert answer["extrapolated"] and any("custom accelerator" in r for r in answer["extrapolation_reasons"])
    other = f"sqlite:///{tmp_path / 'other.db'}"
    unknown = runner.invoke(app, ["predict", "mlp-recommender", "-b", "64", "--accelerator", "acme-x1",
                                  "--store", other])
    assert unknown.exit_code == 2 and "acme-x1" in unknown.output
    exported = tmp_path / "gavel.json"
    result = runner.invoke(app, ["export", "gavel", str(exported), "--worker-type", "x1=acme-x1", "--job",
                                 "MLP=mlp-recommender:64", "--scale-factors", "1", "--store", sqlite_url])
    assert result.exit_code == 0, result.output
    assert json.loads(exported.read_text())["x1"]["('MLP', 1)"]["null"] > 0
    elsewhere = runner.invoke(app, ["export", "gavel", str(tmp_path / "other.json"), "--worker-type", "x1=acme-x1",
                                    "--job", "MLP=mlp-recommender:64", "--scale-factors", "1", "--store", other])
    assert elsewhere.exit_code == 2 and "--worker-type" in elsewhere.output and "acme-x1" in elsewhere.output
