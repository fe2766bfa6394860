"""`perfmodel zoo show` and `zoo list`'s unit column; `--task` on zoo jobs."""

import json

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_zoo_show_json_at_the_reference_and_another_seq_len():
    result = run("zoo", "show", "gnmt", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert {k: info[k] for k in ("name", "family", "library", "inputs", "unit", "reference_seq_len", "seq_len")} == {
        "name": "gnmt", "family": "gnmt", "library": "perfmodel", "inputs": "custom", "unit": "tokens",
        "reference_seq_len": 32, "seq_len": 32}
    # 63 tokens computed per padded sentence pair, 50 of them real (what the benchmark counts)
    assert info["items_per_sample"] == pytest.approx(50) and info["real_item_share"] == pytest.approx(50 / 63)
    assert info["default_task"] is None and "GNMT" in info["description"]
    assert info["optimizer"] == "adam"  # what DLE GNMT trains with: a job naming none gets it
    info = json.loads(run("zoo", "show", "gnmt", "--seq-len", 50, "--json").stdout)
    assert info["seq_len"] == 50 and info["items_per_sample"] == pytest.approx(99 * 50 / 63)


def test_zoo_show_defaults_and_table():
    info = json.loads(run("zoo", "show", "bert-base", "--json").stdout)
    assert info["default_task"] == "sequence-classification" and info["reference_seq_len"] is None
    assert info["optimizer"] == "adamw"  # transformers' Trainer default
    assert info["seq_len"] == 128 and info["items_per_sample"] == 1 and info["unit"] == "samples"
    assert "fp16-master" in info["description"]  # NVIDIA's recipe, which the zoo's eager BERT stands for
    assert "fp16-master" not in json.loads(run("zoo", "show", "roberta-base", "--json").stdout)["description"]
    result = run("zoo", "show", "tacotron2")
    assert result.exit_code == 0, result.output
    assert "mel frames" in result.stdout and "850" in result.stdout and "566" in result.stdout


def test_zoo_show_unknown_name_is_exit_2_with_close_matches():
    result = run("zoo", "show", "gnmtt")
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1 and "did you mean: gnmt" in message
    assert run("zoo", "show", "gnmt", "--seq-len", 0).exit_code == 2


def test_zoo_list_has_the_unit():
    rows = {row["name"]: row for row in json.loads(run("zoo", "list", "--json").stdout)}
    assert rows["waveglow"]["unit"] == "audio samples" and rows["resnet18"]["unit"] == "samples"
    assert rows["transformer-xl-large"]["family"] == "transformer-xl"


def test_task_reaches_zoo_jobs():
    result = run("graph", "bert-small", "--task", "question-answering", "-b", 2, "--seq-len", 8, "--json")
    assert result.exit_code == 0, result.output
    ir = json.loads(result.stdout)
    classes = json.loads(run("graph", "bert-small", "-b", 2, "--seq-len", 8, "--json").stdout)
    # BertForQuestionAnswering: no pooler (512 x 512 + 512), a 2-logit span head like the 2-class classifier
    assert ir["totals"]["params"] == classes["totals"]["params"] - (512 * 512 + 512)
    result = run("graph", "resnet18", "--task", "causal-lm")
    assert result.exit_code == 2
    assert "task" in result.stderr and "torchvision model with one head" in result.stderr
