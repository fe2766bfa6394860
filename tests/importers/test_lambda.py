"""Lambda's whole-job training runs: parsed as published (the real folder, read in place, when it is beside the
checkout; a small synthetic folder otherwise), stored once per run in one transaction, and `perfmodel import lambda`
end to end."""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import event
from typer.testing import CliRunner

import perfmodel.store.store as store_module
from perfmodel.cli.main import app
from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.catalog import save_local
from perfmodel.importers import WHOLE_JOB_READERS, get_importer, read_lambda, unresolved_gpus
from perfmodel.importers.lambda_runs import NGC_RELEASED, UNITS, ZOO_MODELS
from perfmodel.jobs.spec import Precision
from perfmodel.store import ProfileStore
from tests.importers.conftest import dataset, make_spec

runner = CliRunner()

# --- the real folder (skips without it) ---

# GPU names as Lambda writes them -> test catalog ids: the tests do not depend on what the shipped catalog knows
REAL_CATALOG = {"test-a100-40-pcie": ("A100 40GB PCIe",), "test-v100-16": ("V100 16GB SXM2",)}
# PROVENANCE.md, "Models, units and what the throughput is": runs per model and unit
PUBLISHED = {"gnmt": (266, "tokens/s"), "maskrcnn": (214, "images/s"), "ncf": (257, "samples/s"),
             "ssd": (260, "images/s"), "tacotron2": (276, "mel frames/s"), "transformerxlbase": (256, "tokens/s"),
             "transformerxllarge": (209, "tokens/s"), "waveglow": (248, "audio samples/s")}


@pytest.fixture(scope="module")
def lambda_root() -> Path:
    return dataset("lambda")


@pytest.fixture(scope="module")
def real_runs(lambda_root):
    return read_lambda(lambda_root, catalog={n: make_spec(n, aliases) for n, aliases in REAL_CATALOG.items()})


def test_the_real_runs_as_published(real_runs):
    ok = [r for r in real_runs if r.ok]
    failed = [r for r in real_runs if not r.ok]
    assert len(ok) == 1986 and len(failed) == 44
    assert len({r.source_id for r in real_runs}) == 2030 and {r.source for r in real_runs} == {"lambda"}
    assert Counter(r.suite for r in ok) == {"v0": 1658, "v1": 328}
    assert {m: (n, u) for (m, u), n in Counter((r.source_model, r.unit) for r in ok).items()} == PUBLISHED
    assert {r.model for r in real_runs} == set(ZOO_MODELS.values()) and UNITS == {m: u for m, (_, u) in
                                                                                  PUBLISHED.items()}
    assert all(r.throughput > 0 and r.nodes == 1 and r.devices in (1, 2, 3, 4, 8, 16) for r in ok)
    reasons = Counter(r.status if r.status == "out of memory" else r.status.split(":")[0] for r in failed)
    assert reasons == {"out of memory": 42, "exception (FileNotFoundError": 2}
    assert all(r.throughput is None and r.unit is None for r in failed)
    first = real_runs[0]  # the first line of runs.csv
    assert (first.source_id, first.config, first.gpu_name, first.accelerator, first.model, first.source_precision,
            first.amp_in_log, first.precision, first.batch_size, first.global_batch_size, first.throughput,
            first.unit, first.date, first.pytorch_version, first.cuda_version) == (
        "pytorch/results/A100_PCIe/PyTorch_gnmt_FP16/31-10-2020_16-27-06.txt", "A100_PCIe", "A100 40GB PCIe",
        "test-a100-40-pcie", "gnmt", "FP16", True, Precision.fp16_master, 800.0, 800, 171504.0, "tokens/s",
        datetime(2020, 10, 31, 16, 27, 6), "1.7.0a0+7036e91", "11.1.74")
    uneven = [r for r in real_runs if r.batch_size != int(r.batch_size)]  # global batches that do not split evenly
    assert len(uneven) == 9 and {r.source_model for r in uneven} == {"ncf", "transformerxllarge"}
    assert all(math.isclose(r.batch_size * r.devices, r.global_batch_size) for r in real_runs)
    # the folders recording two containers: each given run is dated before the later container was released
    two_builds = {r.config: (r.pytorch_version, r.cuda_version) for r in real_runs
                  if r.config in ("4x3090", "8x3090", "p3.16xlarge")}
    assert two_builds == {"4x3090": ("1.7.0a0+7036e91", "11.1.74"), "8x3090": ("1.7.0a0+7036e91", "11.1.74"),
                          "p3.16xlarge": ("1.4.0a0+a5b4d78", "10.2.89")}
    assert all(r.pytorch_version for r in real_runs)


def test_the_precision_mapping(real_runs):
    by_label = Counter((r.source_precision, r.amp_in_log, r.precision) for r in real_runs)
    assert {(label, amp, p) for label, amp, p in by_label} == {
        ("FP32", False, Precision.tf32), ("FP32", None, Precision.tf32),  # NGC containers: TF32 on
        ("FP16", True, Precision.amp), ("AMP", True, Precision.amp), ("FP16", None, Precision.amp),
        ("FP16", True, Precision.fp16_master), ("AMP", True, Precision.fp16_master),  # apex O2's recipe
        ("FP16", False, Precision.tf32),  # the log shows mixed precision off
    }
    # mixed precision as each script ran it: apex O2 (a half model, fp32 master weights) or per-op casts
    recipes = {(r.source_model, r.suite, r.precision) for r in real_runs if r.precision.half_dtype}
    assert recipes == {
        *((m, suite, Precision.fp16_master) for m in ("gnmt", "ncf", "transformerxlbase", "transformerxllarge")
          for suite in ("v0", "v1")),
        ("ssd", "v0", Precision.fp16_master), ("ssd", "v1", Precision.amp),  # v1's SSD: torch.cuda.amp
        ("maskrcnn", "v0", Precision.amp), ("tacotron2", "v0", Precision.amp), ("waveglow", "v0", Precision.amp)}
    assert sum(n for (_, amp, _), n in by_label.items() if amp is None) == 54  # the log does not say: the label
    not_amp = [r for r in real_runs if r.source_precision != "FP32" and r.amp_in_log is False]
    assert Counter(r.source_model for r in not_amp) == {"ncf": 6, "tacotron2": 82, "waveglow": 76}
    ncf = [r for r in not_amp if r.source_model == "ncf"]  # PROVENANCE's exception: the v1 80 GB template
    assert all(r.ok and r.suite == "v1" and r.precision is Precision.tf32 for r in ncf)
    assert {r.config for r in ncf} == {"A100_80GB_PCIe_v1", "2xA100_80GB_PCIe_v1", "A100_80GB_SXM4_v1",
                                       "2xA100_80GB_SXM4_v1", "4xA100_80GB_SXM4_v1", "8xA100_80GB_SXM4_v1"}


def test_only_the_multi_gpu_transformer_xl_runs_trained_without_gradient_sync(real_runs):
    unsynced = [r for r in real_runs if not r.gradient_sync]
    assert unsynced and {r.source_model for r in unsynced} == {"transformerxlbase", "transformerxllarge"}
    assert all(r.devices > 1 and r.extra["gradient_sync"] is False for r in unsynced)
    assert all(r.extra["gradient_sync"] is True for r in real_runs if r.gradient_sync)
    single_txl = [r for r in real_runs if r.source_model.startswith("transformerxl") and r.devices == 1]
    assert single_txl and all(r.gradient_sync for r in single_txl)  # one GPU has nothing to synchronise


def test_gpu_names_the_catalog_lacks_are_kept_and_counted(real_runs):
    unresolved = unresolved_gpus(real_runs)
    assert "A100 40GB PCIe" not in unresolved and "V100 16GB SXM2" not in unresolved
    assert unresolved["RTX 2080 Ti"] == 208 and sum(unresolved.values()) == sum(r.accelerator is None
                                                                                for r in real_runs)
    assert Counter(r.accelerator for r in real_runs)["test-v100-16"] == 120  # 119 runs and an OOM


def test_the_real_runs_into_a_store_twice(real_runs, tmp_path):
    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        assert len(store.add_whole_job_measurements(real_runs).added) == 2030
        again = store.add_whole_job_measurements(real_runs)
        assert again.added == () and len(again.present) == 2030 and again.accelerators_filled == 0
        frame = store.whole_job_measurements(status="ok")
        assert len(frame) == 1986 and len(store.whole_job_measurements()) == 2030
        ssd = frame[frame.model == "ssd300"]
        assert set(ssd.unit) == {"images/s"} and ssd.throughput_items_per_s.sum() == pytest.approx(
            sum(r.throughput for r in real_runs if r.ok and r.model == "ssd300"))


def test_the_import_command_on_the_real_folder(lambda_root, tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    result = runner.invoke(app, ["import", "lambda", str(lambda_root), "--store", url, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["read"] == summary["added"] == {"runs": 1986, "failed_runs": 44}
    with ProfileStore(url) as store:
        frame = store.whole_job_measurements()
    assert sum(summary["unresolved_gpus"].values()) == frame.accelerator.isna().sum()


# --- a synthetic folder (always runs) ---

RUN_HEADER = ["config", "suite", "gpu", "arch", "num_gpus", "host", "variant", "model", "precision", "amp_in_log",
              "batch_per_gpu", "global_batch", "batch_source", "throughput", "unit", "metric", "date", "log_path"]
FAILED_HEADER = [*RUN_HEADER[:13], "reason", "date", "log_path"]
SYSTEM_HEADER = ["config", "suite", "gpu", "gpu_reported", "gpu_memory", "nvidia_driver", "cuda", "cudnn", "pytorch",
                 "cpu", "cpu_memory", "os", "records"]
RUNS = [
    ["G1", "v0", "Test GPU A", "Ampere", "1", "", "", "gnmt", "FP16", "true", "256", "256", "log", "97000.5",
     "tokens/s", "gnmt_epoch_train_tok_s", "2021-06-01T12:00:00", "r/G1/PyTorch_gnmt_FP16/a.txt"],
    ["4xG2", "v1", "Test GPU B", "Turing", "4", "LambdaCloud", "NVLink bridge; test round trt", "ncf", "FP16",
     "false", "2504145.5", "10016582", "log", "33608906.065", "samples/s", "ncf_best_train_throughput",
     "2022-11-02T01:02:03", "r/4xG2/PyTorch_ncf_FP16/b.txt"],
    ["G1", "v0", "Test GPU A", "Ampere", "2", "", "", "ssd", "FP32", "", "64", "128", "config_v0 script", "500.25",
     "images/s", "ssd_training_performance", "2021-06-02T00:00:00", "r/G1/PyTorch_ssd_FP32/c.txt"],
    ["G1", "v0", "Test GPU A", "Ampere", "2", "", "", "ssd", "AMP", "", "128", "256", "config_v0 script", "900",
     "images/s", "ssd_training_performance", "2021-06-02T01:00:00", "r/G1/PyTorch_ssd_AMP/d.txt"],
]
FAILED = [["4xG2", "v1", "Test GPU B", "Turing", "4", "LambdaCloud", "", "transformerxllarge", "FP16", "true", "1",
           "4", "log", "out of memory", "2022-11-03T00:00:00", "r/4xG2/PyTorch_transformerxllarge_FP16/e.txt"]]
SYSTEMS = [["G1", "v0", "Test GPU A", "Test_GPU_A", "1_MiB", "460.84", "V11.2.142", "..", "1.9.0a0+df837d0", "cpu",
            "1G", "Ubuntu", "3"],
           ["4xG2", "v1", "Test GPU B", "Test_GPU_B", "1_MiB", "1 | 2", "V11.1.74 | V11.2.142", "..",
            "1.7.0a0+7036e91 | 1.9.0a0+df837d0", "cpu", "1G", "Ubuntu", "2"]]
TEST_CATALOG = {"test-gpu-a": ("Test GPU A",)}


def write_folder(folder: Path, runs=RUNS, failed=FAILED, systems=SYSTEMS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, header, rows in (("runs.csv", RUN_HEADER, runs), ("failed_runs.csv", FAILED_HEADER, failed),
                               ("systems.csv", SYSTEM_HEADER, systems)):
        with (folder / name).open("w", newline="") as file:
            csv.writer(file, lineterminator="\n").writerows([header, *rows])
    return folder


def read_synthetic(folder: Path):
    return read_lambda(folder, catalog={n: make_spec(n, aliases) for n, aliases in TEST_CATALOG.items()})


def test_a_synthetic_folder_is_parsed(tmp_path):
    runs = read_synthetic(write_folder(tmp_path / "lambda"))
    assert [r.source_id for r in runs] == [row[-1] for row in RUNS + FAILED]
    gnmt, ncf, ssd_fp32, ssd_amp, oom = runs
    assert (gnmt.model, gnmt.accelerator, gnmt.devices, gnmt.nodes, gnmt.precision, gnmt.amp_in_log,
            gnmt.batch_size, gnmt.global_batch_size, gnmt.throughput, gnmt.unit, gnmt.status, gnmt.host,
            gnmt.variant, gnmt.pytorch_version, gnmt.cuda_version) == (
        "gnmt", "test-gpu-a", 1, 1, Precision.fp16_master, True, 256.0, 256, 97000.5, "tokens/s", "ok", None, None,
        "1.9.0a0+df837d0", "11.2.142")
    assert (ncf.accelerator, ncf.precision, ncf.source_precision, ncf.batch_size, ncf.host, ncf.variant) == (
        None, Precision.tf32, "FP16", 2504145.5, "LambdaCloud", "NVLink bridge; test round trt")
    # the folder recorded two builds, and both containers had been released by the run's date (2022-11)
    assert (ncf.pytorch_version, ncf.cuda_version) == (None, None)
    assert (ssd_fp32.model, ssd_fp32.precision, ssd_fp32.amp_in_log, ssd_fp32.batch_source) == (
        "ssd300", Precision.tf32, None, "config_v0 script")
    assert (ssd_amp.precision, ssd_amp.source_precision) == (Precision.fp16_master, "AMP")  # v0's SSD: apex O2
    assert (oom.status, oom.throughput, oom.unit, oom.metric, oom.model, oom.precision) == (
        "out of memory", None, None, None, "transformer-xl-large", Precision.fp16_master)
    assert unresolved_gpus(runs) == {"Test GPU B": 2}
    assert oom.extra == {"gradient_sync": False, "suite": "v1", "config": "4xG2", "host": "LambdaCloud",
                         "arch": "Turing", "source_model": "transformerxllarge", "amp_in_log": True,
                         "batch_source": "log", "date": "2022-11-03T00:00:00"}


@pytest.mark.parametrize("column,value,message", [
    ("model", "resnet50", "runs.csv line 3: model 'resnet50' is not a model of the dataset"),
    ("precision", "BF16", "runs.csv line 3: precision 'BF16' is not one of FP32, FP16, AMP"),
    ("unit", "images/s", "runs.csv line 3: unit 'images/s' is not the unit of ncf (samples/s)"),
    ("throughput", "N/A", "runs.csv line 3: throughput 'N/A' is not a number"),
    ("throughput", "0", "is not a positive number"),
    ("num_gpus", "2.5", "runs.csv line 3: num_gpus '2.5' is not a whole number"),
    ("global_batch", "10016583", "batch_per_gpu '2504145.5' times 4 GPUs is not the global batch 10016583"),
    ("amp_in_log", "yes", "amp_in_log 'yes' is not true, false or empty"),
    ("date", "02-11-2022", "date '02-11-2022' is not an ISO date"),
    ("log_path", "", "log_path '' is empty"),
])
def test_a_row_that_does_not_parse_names_its_file_and_line(tmp_path, column, value, message):
    runs = [list(row) for row in RUNS]
    runs[1][RUN_HEADER.index(column)] = value
    with pytest.raises(PerfmodelError, match=re.escape(message)):
        read_synthetic(write_folder(tmp_path / "lambda", runs=runs))


def test_a_folder_that_is_not_the_dataset_is_a_user_error(tmp_path):
    with pytest.raises(PerfmodelError, match="no lambda dataset at .*: no such folder"):
        read_lambda(tmp_path / "nowhere")
    (tmp_path / "file.csv").write_text("a\n")
    with pytest.raises(PerfmodelError, match="no lambda dataset at .*: not a folder"):
        read_lambda(tmp_path / "file.csv")
    with pytest.raises(PerfmodelError, match="does not look like the lambda dataset: expected runs.csv"):
        read_lambda(tmp_path)
    folder = write_folder(tmp_path / "lambda")
    (folder / "failed_runs.csv").unlink()
    with pytest.raises(PerfmodelError, match="does not look like the lambda dataset: no failed_runs.csv"):
        read_lambda(folder)
    (folder / "failed_runs.csv").write_text("config,reason\n")
    with pytest.raises(PerfmodelError, match="is not the lambda dataset's failed_runs.csv: no column suite"):
        read_lambda(folder)


def test_a_store_import_twice_adds_nothing_and_fills_in_learned_gpus(tmp_path):
    folder = write_folder(tmp_path / "lambda")
    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first = store.add_whole_job_measurements(read_synthetic(folder))
        assert len(first.added) == 5 and first.present == ()
        again = store.add_whole_job_measurements(read_synthetic(folder))
        assert again.added == () and len(again.present) == 5 and again.accelerators_filled == 0
        TEST_CATALOG["test-gpu-b"] = ("Test GPU B",)  # the catalog learns the GPU: importing again fills it in
        try:
            learned = store.add_whole_job_measurements(read_synthetic(folder))
        finally:
            del TEST_CATALOG["test-gpu-b"]
        assert learned.added == () and learned.accelerators_filled == 2
        frame = store.whole_job_measurements()
        assert frame.accelerator.tolist() == ["test-gpu-a", "test-gpu-b", "test-gpu-a", "test-gpu-a", "test-gpu-b"]
        assert frame.precision.tolist() == ["fp16-master", "tf32", "tf32", "fp16-master", "fp16-master"]
        assert frame.unit.tolist()[:4] == ["tokens/s", "samples/s", "images/s", "images/s"]


def test_an_error_in_the_middle_of_an_import_leaves_nothing(tmp_path, monkeypatch):
    folder = write_folder(tmp_path / "lambda")
    runs = read_synthetic(folder)
    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        monkeypatch.setattr(store_module, "MEASUREMENT_CHUNK_ROWS", 2)
        inserts = []

        def fail_on_second_chunk(connection, cursor, statement, parameters, context, executemany):
            if statement.startswith("INSERT INTO whole_job_measurements"):
                inserts.append(len(parameters))
                if len(inserts) == 2:  # the first chunk is already written
                    raise RuntimeError("disk on fire")

        event.listen(store.engine, "before_cursor_execute", fail_on_second_chunk)
        with pytest.raises(RuntimeError, match="disk on fire"):
            store.add_whole_job_measurements(runs)
        event.remove(store.engine, "before_cursor_execute", fail_on_second_chunk)
        assert inserts == [2, 2]
        assert store.whole_job_measurements().empty  # the first chunk was rolled back with the rest
        assert len(store.add_whole_job_measurements(runs).added) == 5  # and the store is still usable


def test_the_import_command(tmp_path):
    save_local(make_spec("test-gpu-a", ("Test GPU A",)))  # this test's local catalog ($PERFMODEL_HOME)
    folder = write_folder(tmp_path / "lambda")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    first = runner.invoke(app, ["import", "lambda", str(folder), "--store", url])
    assert first.exit_code == 0, first.output
    text = " ".join(first.stdout.split())
    assert "lambda: 4 runs and 1 failed runs read from" in text
    assert "imported 4 runs and 1 failed runs; skipped as already present: 0 runs and 0 failed runs" in text
    assert "1 GPU names not in the hardware catalog" in text and "Test GPU B (2 runs)" in text
    again = runner.invoke(app, ["import", "Lambda", str(folder), "--store", url])
    assert again.exit_code == 0, again.output
    assert "imported 0 runs and 0 failed runs; skipped as already present: 4 runs and 1 failed runs" in " ".join(
        again.stdout.split())
    with ProfileStore(url) as store:
        assert store.whole_job_measurements().accelerator.tolist()[:1] == ["test-gpu-a"]


@pytest.mark.parametrize("path,fragment", [
    ("nowhere", "no lambda dataset at {tmp}/nowhere: no such folder"),
    ("", "{tmp} does not look like the lambda dataset: expected runs.csv, failed_runs.csv and systems.csv"),
])
def test_the_import_command_on_a_bad_folder_is_one_line_and_exit_2(tmp_path, path, fragment):
    result = runner.invoke(app, ["import", "lambda", str(tmp_path / path), "--store",
                                 f"sqlite:///{tmp_path / 'store.db'}"])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1
    assert fragment.format(tmp=tmp_path) in message
    assert not (tmp_path / "store.db").exists()  # the store is not even created


def test_lambda_is_a_whole_job_dataset_not_an_op_importer():
    assert WHOLE_JOB_READERS["lambda"] is read_lambda
    with pytest.raises(PerfmodelError, match="lambda holds whole training jobs, not op measurements"):
        get_importer("Lambda")
    with pytest.raises(PerfmodelError, match="choose one of neusight, .*, phantora, lambda"):
        get_importer("mlperf")


def test_a_run_in_a_folder_of_two_builds_ran_on_the_one_released_by_its_date(tmp_path):
    """1.9.0a0+df837d0 ships in NGC 21.03: a run of February 2021 in a folder that also names it ran on the other
    build, 1.7.0a0+7036e91 (20.10); a run of June 2021 could have run on either (unknown); and a run before both
    containers on neither."""
    def run_on(date: str) -> list[str]:
        return ["4xG2", "v1", "Test GPU B", "Turing", "4", "", "", "gnmt", "FP16", "true", "64", "256", "log", "1000",
                "tokens/s", "gnmt_epoch_train_tok_s", date, f"r/4xG2/PyTorch_gnmt_FP16/{date}.txt"]

    runs = read_synthetic(write_folder(tmp_path / "lambda", runs=[run_on("2021-02-10T00:00:00"),
                                                                  run_on("2021-06-10T00:00:00"),
                                                                  run_on("2020-06-10T00:00:00")], failed=[]))
    assert [(r.pytorch_version, r.cuda_version) for r in runs] == [("1.7.0a0+7036e91", "11.1.74"), (None, None),
                                                                   (None, None)]
    assert NGC_RELEASED["1.9.0a0+df837d0"] == datetime(2021, 3, 1)
