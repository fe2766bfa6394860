"""`perfmodel export gavel --job [JOB_TYPE=]ZOO_NAME:BATCH[:KEY=VALUE...]`: each job's own seq_len, optimizer,
precision, PyTorch version and whether its steps vary, over --seq-len, --optimizer and --precision, which are every
other job's defaults; a bad job spec is exit 2 naming it."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app

runner = CliRunner()
LM, OTHER = "LM (batch size 8)", "Other (batch size 8)"


def export(tmp_path, name, *args) -> dict[str, float]:
    """steps/s of each job type alone on one T4."""
    out = tmp_path / f"{name}.json"
    result = runner.invoke(app, ["export", "gavel", str(out), "--worker-type", "t4=t4", "--scale-factors", "1",
                                 *args])
    assert result.exit_code == 0, result.output
    return {job_type: entry["null"] for (job_type, _), entry in
            ((ast.literal_eval(key), entry) for key, entry in json.loads(out.read_text())["t4"].items())}


def test_a_jobs_own_settings_win_over_the_global_ones_which_stay_the_other_jobs_defaults(tmp_path):
    jobs = ("--job", f"{LM}=gavel-lm:8", "--job", f"{OTHER}=bert-small:8")
    default = export(tmp_path, "default", *jobs)
    own = export(tmp_path, "own", "--job", f"{LM}=gavel-lm:8:seq_len=70:optimizer=adam", *jobs[2:])
    assert own[OTHER] == pytest.approx(default[OTHER], rel=1e-9)  # another job's settings do not leak
    assert own[LM] < default[LM]  # twice the bptt, and Adam
    overridden = export(tmp_path, "overridden", "--seq-len", 70, "--optimizer", "adam",
                        "--job", f"{LM}=gavel-lm:8:seq_len=35:optimizer=sgd", *jobs[2:])
    assert overridden[LM] == pytest.approx(default[LM], rel=1e-9)  # the job's own settings win
    assert overridden[OTHER] != pytest.approx(default[OTHER], rel=1e-6)  # the global ones are the others' defaults
    kept = sorted((Path(os.environ["PERFMODEL_HOME"]) / "graphs").rglob("*"))
    assert kept  # captured graphs are kept across runs, as `perfmodel predict` keeps them
    unnamed = export(tmp_path, "unnamed", "--job", "gavel-lm:8:seq_len=70:optimizer=adam")
    assert unnamed["gavel-lm (batch size 8)"] == pytest.approx(own[LM], rel=1e-9)
    assert sorted((Path(os.environ["PERFMODEL_HOME"]) / "graphs").rglob("*")) == kept  # a job seen before: no capture
    # Gavel's jobs are answered for the PyTorch Gavel pins (1.4) unless a job names its own: the newest is faster
    newest = export(tmp_path, "newest", "--job", f"{LM}=gavel-lm:8:pytorch_version=1.13", *jobs[2:])
    assert newest[LM] > default[LM] and newest[OTHER] == pytest.approx(default[OTHER], rel=1e-9)


def test_a_job_whose_steps_vary_scales_worse_over_its_gpus_than_the_same_job_whose_steps_do_not(tmp_path):
    """`steps_vary` in a --job is that job's own: its replicas wait longer for the slowest, so on 8 GPUs it gets
    fewer steps/s than its steady twin (Gavel's LM is steady by its reference), and the same on one GPU."""
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["export", "gavel", str(out), "--worker-type", "t4=t4", "--scale-factors", "1,8",
                                 "--job", f"{LM}=gavel-lm:8:steps_vary=true", "--job", f"{OTHER}=gavel-lm:8"])
    assert result.exit_code == 0, result.output
    steps = {ast.literal_eval(key): entry["null"] for key, entry in json.loads(out.read_text())["t4"].items()}
    assert steps[(LM, 8)] < steps[(OTHER, 8)] and steps[(LM, 1)] == pytest.approx(steps[(OTHER, 1)], rel=1e-9)


@pytest.mark.parametrize(("job", "words"), [
    ("gavel-lm", ["ZOO_NAME:BATCH"]),
    ("gavel-lm:8:adam", ["ZOO_NAME:BATCH[:KEY=VALUE...]"]),
    ("gavel-lm:8:bptt=35", ["unknown setting 'bptt'", "seq_len, optimizer, precision, pytorch_version, steps_vary"]),
    ("gavel-lm:8:steps_vary=maybe", ["steps_vary", "boolean"]),
    ("gavel-lm:8:pytorch_version=latest", ["pytorch_version"]),
    ("gavel-lm:8:seq_len=0", ["seq_len must be an integer >= 1"]),
    ("gavel-lm:8:seq_len=", ["seq_len has no value"]),
    ("gavel-lm:8:seq_len=35:seq_len=70", ["seq_len is given twice"]),
    ("LM=gavel-lm:8:optimizer=adagrad", ["'LM=gavel-lm:8:optimizer=adagrad'", "optimizer"]),
    ("gavel-lm:8:precision=fp12", ["precision"]),
])
def test_a_bad_job_spec_exits_2_naming_it(tmp_path, job, words):
    out = tmp_path / "x.json"
    result = runner.invoke(app, ["export", "gavel", str(out), "--job", job, "--accelerators", "t4"])
    assert result.exit_code == 2, result.output
    assert all(word in result.output for word in words), result.output
    assert not out.exists()


def test_a_worker_type_given_twice_exits_2_naming_it(tmp_path):
    out = tmp_path / "x.json"
    result = runner.invoke(app, ["export", "gavel", str(out), "--worker-type", "v100=v100-sxm2-16gb",
                                 "--worker-type", "v100=k80", "--job", "gavel-lm:8", "--scale-factors", "1"])
    assert result.exit_code == 2, result.output
    assert "'v100' is given twice" in result.output
    assert not out.exists()


@pytest.mark.parametrize("accelerator", ["p100", "v100-sxm9"])
def test_an_ambiguous_or_unknown_worker_accelerator_exits_2_before_any_capture(tmp_path, accelerator):
    out = tmp_path / "x.json"
    result = runner.invoke(app, ["export", "gavel", str(out), "--worker-type", f"p100={accelerator}",
                                 "--job", "gavel-resnet50:64", "--scale-factors", "1"])
    assert result.exit_code == 2, result.output
    assert "--worker-type" in result.output and repr(accelerator) in result.output
    assert not out.exists()
    assert not list((Path(os.environ["PERFMODEL_HOME"]) / "graphs").rglob("*"))  # refused before capturing
