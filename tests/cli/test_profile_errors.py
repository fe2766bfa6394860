"""Bad input to `perfmodel profile` (one job or a sweep) and `perfmodel profiles export`: one line on stderr, exit
code 2, before any progress line, and nothing profiled, stored or written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.settings import Settings
from perfmodel.store import ProfileStore

runner = CliRunner()
TINY = ("import torch\n\ndef make(batch_size):\n    return torch.nn.Linear(8, 8), torch.randn(batch_size, 8)\n\n"
        "class Net:\n    pass\n")


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def default_store_exists() -> bool:
    return (Settings().home / "perfmodel.db").exists()


@pytest.fixture
def tiny(tmp_path) -> Path:
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07\x12\x04junk-not-a-model")
    return tmp_path / "tiny.py"


@pytest.mark.parametrize("second,fragment", [
    ("zoo: resnet5", "jobs[1]: unknown zoo model 'resnet5'; did you mean: resnet50"),
    ("module: gone.py:make", "jobs[1]: module file not found: {tmp}/gone.py"),
    ("module: tiny.py:nope",
     "jobs[1]: {tmp}/tiny.py defines no 'nope'; the functions and classes it defines: make, Net"),
    ("onnx: bad.onnx", "jobs[1]: {tmp}/bad.onnx is not a readable ONNX model"),
])
def test_a_sweep_with_an_unresolvable_job_runs_nothing(tmp_path, tiny, second, fragment):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"jobs:\n  - module: tiny.py:make\n    batch_size: 1\n  - {second}\n    batch_size: 1\n")
    result = run("profile", "--sweep", sweep, "--repeats", 2, "--warmup", 0, "--no-per-op")
    message = one_line_error(result)
    assert message.startswith(f"error: sweep file {sweep}: ") and fragment.format(tmp=tmp_path) in message
    assert result.stdout == "" and not default_store_exists()


@pytest.mark.parametrize("text,fragment", [
    ("jobs: []\n", "holds no job: its 'jobs' list is empty"),
    ("jobs:\n  - zoo: resnet18\n    hf_config: gpt2.json\n    batch_size: 1\n",
     "jobs[0]: give exactly one model source, one of the keys zoo, hf_config, module or onnx; it gives zoo and "
     "hf_config"),
    ("jobs:\n  - zoo: [resnet18, resnet50\n    batch_size: 1\n", "is not valid YAML at line 3, column 15: "
     "expected ',' or ']', but got ':' (while parsing a flow sequence that starts at line 2, column 10)"),
    ("device: cuda\njobs:\n  - zoo: resnet18\n    batch_size: 1\n",
     "has top-level fields ['device'] that nothing reads: a sweep holds only 'jobs'; the device and the profiling "
     "options are the command's"),
])
def test_a_sweep_with_nothing_to_run_or_a_bad_entry_is_exit_2(tmp_path, text, fragment):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(text)
    message = one_line_error(run("profile", "--sweep", sweep))
    assert fragment in message and "--hf-config" not in message
    assert not default_store_exists()


@pytest.mark.parametrize("args,fragment", [
    (("--module", "{tmp}/nope.py:make"), "module file not found: {tmp}/nope.py"),
    (("--module", "{tmp}/tiny.py:nope"),
     "{tmp}/tiny.py defines no 'nope'; the functions and classes it defines: make, Net"),
    (("resnet5",), "unknown zoo model 'resnet5'"),
    (("--onnx", "{tmp}/bad.onnx"), "{tmp}/bad.onnx is not a readable ONNX model"),
])
def test_one_job_that_does_not_resolve_is_one_line_without_progress(tmp_path, tiny, args, fragment):
    message = one_line_error(run("profile", *(a.format(tmp=tmp_path) for a in args)))
    assert fragment.format(tmp=tmp_path) in message  # no "building ..." or "profiling ..." line before it
    assert not default_store_exists()


def test_a_wrong_name_of_a_module_that_runs_names_the_file_and_its_callables(tmp_path, tiny):
    (tmp_path / "made.py").write_text("import torch\nexec('def make(batch_size):\\n    return None')\nsize = 3\n"
                                      "def helper():\n    pass\n")
    message = one_line_error(run("graph", "--module", f"{tmp_path}/made.py:size"))
    assert f"{tmp_path}/made.py defines 'size' as an int, not a function; the functions and classes it defines: " \
           "make, helper" in message
    message = one_line_error(run("graph", "--module", f"{tiny}:nope"))
    assert f"{tiny} defines no 'nope'; the functions and classes it defines: make, Net" in message


# --- profiles export -------------------------------------------------------------------------------------------


def test_export_to_a_file_is_exit_2_and_leaves_it(tmp_path):
    target = tmp_path / "export.parquet"
    target.write_text("mine")
    message = one_line_error(run("profiles", "export", target))
    assert message == (f"error: cannot export to {target}: it is a file; give a folder (the export writes Parquet "
                       "files and manifest.json into it)")
    assert target.read_text() == "mine" and not default_store_exists()


@pytest.mark.parametrize("where,fragment", [
    ("missing/export", "cannot export to {tmp}/missing/export: no such folder {tmp}/missing"),
    ("afile/export", "cannot export to {tmp}/afile/export: {tmp}/afile is a file, not a folder"),
])
def test_export_into_a_missing_folder_or_under_a_file_is_exit_2(tmp_path, where, fragment):
    (tmp_path / "afile").write_text("x")
    message = one_line_error(run("profiles", "export", tmp_path / where))
    assert fragment.format(tmp=tmp_path) in message
    assert not (tmp_path / "missing").exists() and not default_store_exists()


def test_export_where_this_user_cannot_write_is_exit_2(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anywhere: the OS refusal is simulated
            def refuse(self, *args, **kwargs):
                raise PermissionError(13, "Permission denied", str(self))

            monkeypatch.setattr(Path, "mkdir", refuse)
        message = one_line_error(run("profiles", "export", locked / "export"))
    finally:
        locked.chmod(0o755)
    assert message == f"error: cannot export to {locked / 'export'}: Permission denied"
    assert list(locked.iterdir()) == []


def test_an_export_that_fails_midway_is_exit_2_and_removes_its_folder(tmp_path, monkeypatch):
    def disk_full(self, directory):
        (Path(directory) / ".profiles.parquet.tmp").write_text("partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ProfileStore, "export_parquet", disk_full)
    message = one_line_error(run("profiles", "export", tmp_path / "export"))
    assert message == f"error: cannot export to {tmp_path / 'export'}: No space left on device"
    assert not (tmp_path / "export").exists()


def test_export_into_an_existing_folder_replaces_an_earlier_export(tmp_path):
    target = tmp_path / "export"
    for _ in range(2):
        result = run("profiles", "export", target)
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in target.iterdir()) == ["graphs.parquet", "manifest.json", "onnx_nodes.parquet",
                                                        "op_records.parquet", "profiles.parquet"]
