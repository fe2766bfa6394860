"""examples/scheduler.py: the simulation's invariants on a hand-made matrix, and the whole example against a real
`perfmodel serve`."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scheduler.py"


@pytest.fixture(scope="module")
def scheduler():
    spec = importlib.util.spec_from_file_location("example_scheduler", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


LAYOUT = (("fast", 1, 4), ("slow", 2, 4))


def _matrix(scheduler, jobs, fast_samples_per_s=100.0, slow_samples_per_s=25.0, too_big=()):
    m = scheduler.Matrix()
    for job in jobs:
        for name, rate in (("fast", fast_samples_per_s), ("slow", slow_samples_per_s)):
            for n in scheduler.DEVICE_COUNTS:
                m.throughput[job.job_id, name, n] = rate * n
                m.fits[job.job_id, name, n] = not (name == "slow" and job.job_id in too_big)
    return m


def _queue(scheduler, count=12):
    return [scheduler.QueuedJob(i, "m", 8, devices=(1, 2, 4)[i % 3], samples=1e5 * (1 + i % 5), job_id=f"job{i}")
            for i in range(count)]


def test_every_job_finishes_once_and_the_cluster_is_never_oversubscribed(scheduler):
    queue = _queue(scheduler)
    matrix = _matrix(scheduler, queue, too_big={"job3"})
    finished = []
    for policy in ("blind", "perfmodel"):
        run = scheduler.simulate(policy, queue, LAYOUT, matrix.duration_s, oom_cost_s=60,
                                 predicted=(lambda: matrix) if policy == "perfmodel" else None,
                                 on_finish=lambda job, name, rate, policy=policy: finished.append(
                                     (policy, job.index, rate)))
        assert sorted(run.placed) == [j.index for j in queue]
        assert run.placed[3] == "fast"  # the job that does not fit the slow GPUs ran on the fast ones
        # no schedule beats the total work over the whole cluster's speed
        capacity = 4 * 100 + 8 * 25
        assert run.makespan_s >= sum(j.samples for j in queue) / capacity
        if policy == "perfmodel":
            assert run.failures == 0  # it knows job3 does not fit the slow GPUs
    assert sorted(i for p, i, _ in finished if p == "perfmodel") == [j.index for j in queue]
    assert all(math.isclose(rate, 100.0 * queue[i].devices) or math.isclose(rate, 25.0 * queue[i].devices)
               for _, i, rate in finished)


def test_predictions_shorten_the_makespan_when_gpu_types_differ(scheduler):
    queue = _queue(scheduler)
    matrix = _matrix(scheduler, queue)
    blind = scheduler.simulate("blind", queue, LAYOUT, matrix.duration_s, oom_cost_s=60)
    aware = scheduler.simulate("perfmodel", queue, LAYOUT, matrix.duration_s, oom_cost_s=60,
                               predicted=lambda: matrix)
    assert aware.makespan_s <= blind.makespan_s


def test_a_consolidated_placement_takes_whole_nodes_beyond_one(scheduler):
    cluster = scheduler.Cluster.of((("g", 3, 4),))
    assert cluster.take("g", 2) == [0, 0]
    assert cluster.take("g", 8) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert cluster.take("g", 4) is None and cluster.has_room("g", 2)
    cluster.give_back("g", [1, 1, 1, 1])
    assert cluster.free["g"] == [2, 4, 0]
    assert scheduler.placement_of("t4", 6, 4) == {"accelerator": "t4", "devices_per_node": [4, 2]}


@pytest.mark.slow  # starts a real server
def test_the_example_runs_against_a_real_server(scheduler, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PERFMODEL_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["scheduler.py", "--jobs", "6", "--seed", "1"])
    monkeypatch.setattr(scheduler, "TEMPLATES", (("mlp-recommender", 256), ("resnet18", 32)))
    scheduler.main()
    out = capsys.readouterr().out
    assert "6 jobs of 2 types" in out and "makespan with perfmodel's predictions" in out
