"""The CLI through typer's runner: real models, the real profilers and a real SQLite store (per-test home)."""

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.store import ProfileStore

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_zoo_list_json():
    result = run("zoo", "list", "--json")
    assert result.exit_code == 0
    names = {row["name"] for row in json.loads(result.stdout)}
    assert {"resnet18", "bert-base", "gpt2", "lstm-lm", "mlp-recommender"} <= names


def test_graph_summary_and_json():
    result = run("graph", "resnet18", "-b", 2)
    assert result.exit_code == 0, result.output
    assert "conv" in result.stdout and "params" in result.stdout
    result = run("graph", "bert-small", "-b", 2, "--seq-len", 16, "--json")
    assert result.exit_code == 0, result.output
    ir = json.loads(result.stdout)
    assert ir["schema_version"] >= 1 and ir["totals"]["flops_fwd"] > 0 and ir["nodes"]


@pytest.mark.parametrize("args,fragment", [
    (("graph", "resnet15"), "did you mean"),
    (("graph", "resnet18", "-b", 0), "-b/--batch-size: Input should be greater than 0 (got 0)"),
    (("graph", "resnet18", "--precision", "fp8"), "--precision: Input should be"),
    (("graph", "resnet18", "--optimizer", "lamb"), "--optimizer: Input should be"),
    (("profile", "resnet18", "--device", "cuda"), "cuda"),
    (("graph", "--module", "nowhere.py:make"), "not found"),
    (("graph", "--onnx", "nowhere.onnx"), "not found"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = run(*args)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1 and fragment in message


@pytest.mark.parametrize("source,path,fragment", [
    ("neusight", "nowhere/neusight", "no neusight dataset at {tmp}/nowhere/neusight: no such folder"),
    ("vidur", "file.csv", "no vidur dataset at {tmp}/file.csv: not a folder"),
    ("deepbench", "", "{tmp} does not look like the deepbench dataset: expected tidy/deepbench_<section>.csv"),
    ("neusight", "", "{tmp} does not look like the neusight dataset"),
    ("mlperf", "", "unknown dataset 'mlperf': choose one of neusight, vidur, deepbench"),
])
def test_import_of_a_bad_path_is_one_line_and_exit_2(tmp_path, source, path, fragment):
    (tmp_path / "file.csv").write_text("a,b\n1,2\n")
    result = run("import", source, tmp_path / path, "--store", f"sqlite:///{tmp_path / 'store.db'}")
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1
    assert fragment.format(tmp=tmp_path) in message
    assert not (tmp_path / "store.db").exists()  # the store is not even created


def test_corrupt_onnx_is_exit_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07\x12\x04junk-not-a-model")
    result = run("profile", "--onnx", bad)
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1].startswith("error:")
    with ProfileStore() as store:
        assert store.count() == 0


def test_failed_user_module_writes_nothing(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def make(batch_size):\n    raise ValueError('no model today')\n")
    result = run("profile", "--module", f"{path}:make")
    assert result.exit_code == 2 and "no model today" in result.stderr
    with ProfileStore() as store:
        assert store.count() == 0


def test_profile_store_list_show_export_import(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(textwrap.dedent("""
        import torch
        def make(batch_size):
            net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
            return net, torch.randn(batch_size, 64)
    """))
    result = run("profile", "--module", f"{path}:make", "-b", 4, "--repeats", 3, "--warmup", 1, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["iteration"]["repeats"] == 3 and data["iteration"]["iter_time_ms_median"] > 0
    listed = json.loads(run("profiles", "list", "--json").stdout)
    assert len(listed) == 1
    shown = run("profiles", "show", data["profile_id"], "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["job_id"] == data["job_id"]
    assert run("profiles", "show", 999).exit_code == 2
    export_dir = tmp_path / "export"
    assert run("profiles", "export", export_dir).exit_code == 0
    other = f"sqlite:///{tmp_path / 'other.db'}"
    imported = run("profiles", "import", export_dir, "--store", other)
    assert imported.exit_code == 0 and "imported 1" in imported.stdout
    assert "imported 0" in run("profiles", "import", export_dir, "--store", other).stdout


def test_sweep_is_resumable(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text("import torch\ndef make(b):\n    return torch.nn.Linear(8, 8), torch.randn(b, 8)\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("jobs:\n  - module: tiny.py:make\n    batch_size: [1, 2]\n    mode: [train, inference]\n")
    first = run("profile", "--sweep", sweep, "--repeats", 2, "--warmup", 0, "--no-per-op", "--json")
    assert first.exit_code == 0, first.output
    assert sum("profile_id" in r for r in json.loads(first.stdout)) == 4
    second = run("profile", "--sweep", sweep, "--repeats", 2, "--warmup", 0, "--no-per-op", "--json")
    assert all(r.get("skipped") for r in json.loads(second.stdout))
    with ProfileStore() as store:
        assert store.count() == 4


def test_profile_runs_a_channels_last_job_as_its_own_job(tmp_path):
    """`--channels-last`: the model and its image batch converted on the device, profiled as a job of its own."""
    path = tmp_path / "convnet.py"
    path.write_text(textwrap.dedent("""
        import torch
        def make(batch_size):
            net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                      torch.nn.Flatten(), torch.nn.Linear(8, 10))
            return net, torch.randn(batch_size, 3, 16, 16)
    """))
    args = ("profile", "--module", f"{path}:make", "-b", 2, "--repeats", 3, "--warmup", 1, "--no-per-op", "--json")
    plain, converted = (run(*args, *extra) for extra in ((), ("--channels-last",)))
    assert plain.exit_code == 0 and converted.exit_code == 0, converted.output
    plain, converted = json.loads(plain.stdout), json.loads(converted.stdout)
    assert converted["job_id"] != plain["job_id"] and converted["iteration"]["iter_time_ms_median"] > 0


def test_predict_prices_a_fused_optimizer_step_faster_and_profile_runs_it_as_its_own_job(tmp_path):
    """`--fused-optimizer`: the answer's optimizer part shrinks and nothing else moves; `profile` runs torch's
    fused implementation as a job of its own."""
    args = ("predict", "bert-small", "-b", 8, "--seq-len", 64, "--optimizer", "adamw", "--accelerator", "a100",
            "--json")
    plain, fused = (run(*args, *extra) for extra in ((), ("--fused-optimizer",)))
    assert plain.exit_code == 0 and fused.exit_code == 0, fused.output
    plain, fused = json.loads(plain.stdout)["breakdown_ms"], json.loads(fused.stdout)["breakdown_ms"]
    assert fused["optimizer"] < plain["optimizer"]
    assert (fused["forward"], fused["backward"]) == (plain["forward"], plain["backward"])
    path = tmp_path / "mlp.py"
    path.write_text(textwrap.dedent("""
        import torch
        def make(batch_size):
            return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), \\
                torch.randn(batch_size, 16)
    """))
    args = ("profile", "--module", f"{path}:make", "-b", 2, "--optimizer", "adam", "--repeats", 3, "--warmup", 1,
            "--no-per-op", "--json")
    plain, fused = (run(*args, *extra) for extra in ((), ("--fused-optimizer",)))
    assert plain.exit_code == 0 and fused.exit_code == 0, fused.output
    assert json.loads(fused.stdout)["job_id"] != json.loads(plain.stdout)["job_id"]


def test_predict_counts_torch_ddps_bucket_copy_only_when_told():
    args = ("predict", "bert-small", "-b", 8, "--seq-len", 64, "--accelerator", "a100", "--per-node", 4, "--json")
    lean, copy = (run(*args, *extra) for extra in ((), ("--gradient-bucket-copy",)))
    assert lean.exit_code == 0 and copy.exit_code == 0, copy.output
    lean, copy = json.loads(lean.stdout), json.loads(copy.stdout)
    assert copy["peak_memory_bytes"] > lean["peak_memory_bytes"] and copy["iter_time_ms"] == lean["iter_time_ms"]
    assert copy["placement"]["parallelism"]["gradient_bucket_copy"] is True


@pytest.mark.parametrize("accelerator,fragment", [("p100", "ambiguous accelerator 'p100'"), ("v100-sxm9", "v100")])
def test_predict_refuses_a_bad_accelerator_before_capturing_the_job(accelerator, fragment):
    result = run("predict", "resnet18", "-b", 8, "--accelerator", accelerator)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and fragment in message
    assert not list((Path(os.environ["PERFMODEL_HOME"]) / "graphs").rglob("*"))  # nothing captured for it


@pytest.mark.parametrize("args,fragment", [
    (("predict", "resnet18", "-b", 8, "--accelerator", "t4", "--with", "resnet51:8"),
     "--with: unknown zoo model 'resnet51'; did you mean: resnet51q, resnet50, resnet18,"),
    (("export", "gavel", "{out}", "--job", "resnet18:8", "--job", "resnet51:8", "--worker-type", "t4=t4"),
     "unknown zoo model 'resnet51'"),
])
def test_a_misspelt_zoo_name_is_refused_before_any_job_is_captured(tmp_path, args, fragment):
    """The other job of a pair, or a later job of an export, is checked by name before the first is captured."""
    result = run(*(str(a).format(out=tmp_path / "x.json") for a in args))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith("error:") and fragment in result.stderr
    assert not list((Path(os.environ["PERFMODEL_HOME"]) / "graphs").rglob("*"))  # nothing captured
