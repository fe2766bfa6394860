"""Whole-job runs in the store (schema v6): one transaction, once per (source, source_id), checked before writing,
and accelerators filled in when the catalog learns a GPU; on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime

import pytest

from perfmodel.importers.lambda_runs import WholeJobRun
from perfmodel.jobs.spec import Precision


def _run(i: int = 0, **changes) -> WholeJobRun:
    run = WholeJobRun(
        source="lambda", source_id=f"pytorch/results/A40/PyTorch_ssd_AMP/{i:02d}.txt", suite="v0", config="A40",
        host=None, variant=None, gpu_name="A40", arch="Ampere", accelerator="a40", devices=2, nodes=1,
        source_model="ssd", model="ssd300", source_precision="AMP", amp_in_log=True, precision=Precision.amp,
        batch_size=128.0, global_batch_size=256, batch_source="log", throughput=1000.0 + i, unit="images/s",
        metric="ssd_training_performance", status="ok", date=datetime(2021, 6, 1, 12, i), pytorch_version=None,
        cuda_version=None)
    return dataclasses.replace(run, **changes)


def test_runs_are_stored_once_and_read_back(store):
    oom = _run(9, status="out of memory", throughput=None, unit=None, metric=None, accelerator=None)
    runs = [_run(0), _run(1), oom]
    written = store.add_whole_job_measurements(runs)
    assert written.added == tuple((r.source, r.source_id) for r in runs) and written.present == ()
    again = store.add_whole_job_measurements([*runs, runs[0]])
    assert again.added == () and len(again.present) == 4 and again.accelerators_filled == 0
    frame = store.whole_job_measurements()
    assert len(frame) == 3
    first = frame.iloc[0]
    assert (first.source, first.model, first.accelerator, first.devices, first.nodes, first.precision,
            first.source_precision, first.batch_size, first.global_batch_size, first.throughput_items_per_s,
            first.unit, first.status) == ("lambda", "ssd300", "a40", 2, 1, "amp", "AMP", 128.0, 256, 1000.0,
                                          "images/s", "ok")
    assert first.extra == {"gradient_sync": True, "suite": "v0", "config": "A40", "arch": "Ampere",
                           "source_model": "ssd", "amp_in_log": True, "batch_source": "log",
                           "metric": "ssd_training_performance", "date": "2021-06-01T12:00:00"}
    failed = store.whole_job_measurements(status="out of memory")
    assert failed.source_id.tolist() == [oom.source_id] and math.isnan(failed.throughput_items_per_s.iloc[0])
    assert len(store.whole_job_measurements(source="lambda", status=["ok"])) == 2
    assert store.whole_job_measurements(source="nobody").empty


def test_an_accelerator_the_catalog_learned_is_filled_in_and_replace_starts_over(store):
    unknown = [_run(i, accelerator=None) for i in range(3)]
    store.add_whole_job_measurements(unknown)
    known = [_run(i) for i in range(3)]
    written = store.add_whole_job_measurements([*known, _run(3)])
    assert written.accelerators_filled == 3 and written.added == (("lambda", _run(3).source_id),)
    assert store.whole_job_measurements().accelerator.tolist() == ["a40"] * 4
    assert store.add_whole_job_measurements([_run(0, accelerator="other")]).accelerators_filled == 0  # kept
    replaced = store.add_whole_job_measurements([_run(0, throughput=5.0)], replace=True)
    assert len(replaced.added) == 1
    assert store.whole_job_measurements().throughput_items_per_s.tolist() == [5.0]


@pytest.mark.parametrize("changes,why", [
    ({"throughput": float("nan")}, "finite positive throughput"),
    ({"throughput": None}, "finite positive throughput"),
    ({"unit": None}, "and a unit"),
    ({"status": "out of memory"}, "no throughput"),
    ({"status": ""}, "needs a status"),
    ({"precision": "fp8"}, "unknown precision"),
    ({"devices": 0}, "must be positive"),
    ({"batch_size": float("inf")}, "must be positive"),
    ({"source": "a-very-long-source-name"}, "1 to 16 characters"),
])
def test_a_bad_record_is_refused_before_anything_is_written(store, changes, why):
    with pytest.raises(ValueError, match=why):
        store.add_whole_job_measurements([_run(0), _run(1, **changes)])
    assert store.whole_job_measurements().empty
