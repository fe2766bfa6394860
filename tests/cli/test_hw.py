"""`perfmodel hw list` / `hw show` on the shipped catalog."""

import json

from typer.testing import CliRunner

from perfmodel.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_hw_list_table_and_json():
    result = run("hw", "list")
    assert result.exit_code == 0, result.output
    for fragment in ("fp32 TFLOP/s", "fp16 TFLOP/s", "bandwidth GB/s", "h100-sxm5", "mi300x", "cpu"):
        assert fragment in result.stdout
    result = run("hw", "list", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert sum(row["kind"] == "gpu" for row in rows) >= 20


def test_hw_show_resolves_torch_names_and_prints_every_field():
    result = run("hw", "show", "NVIDIA H100 80GB HBM3")
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)
    assert spec["name"] == "h100-sxm5" and spec["peak_tf32_gflops"] > 0 and "interconnect" in spec
    result = run("hw", "show", "nvidia h100")
    assert result.exit_code == 2 and "did you mean" in result.output and "NVIDIA H100 PCIe" in result.output


def test_hw_show_of_an_ambiguous_name_lists_the_candidates():
    result = run("hw", "show", "RTX 6000")
    assert result.exit_code == 2
    for candidate in ("quadro-rtx-6000", "rtx-6000-ada", "rtx-pro-6000-blackwell-server"):
        assert candidate in result.output
    result = run("hw", "show", "RTXPRO6000")  # llmservingsim's folder: the card it measured
    assert result.exit_code == 0 and json.loads(result.stdout)["name"] == "rtx-pro-6000-blackwell-server"
