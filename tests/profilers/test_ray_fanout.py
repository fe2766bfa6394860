"""Ray fan-out on a local Ray instance (`ray.init(num_cpus=2)`): real profiles of tiny user modules written to a real
SQLite store; a task killed mid-run (os._exit in its first attempt, detected by a marker file) is retried by Ray and
leaves exactly one row, whether it died before or after its write. Skipped where Ray (the `ray` extra) is absent."""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import JobSpec
from perfmodel.profilers import ray_fanout
from perfmodel.profilers.ray_fanout import FanoutTask, RayOptions, gpus_for, run_on_ray
from perfmodel.store import ProfileStore
from perfmodel.store.profiling import profile_and_store

USER_MODELS = Path(__file__).parent / "user_models.py"
QUICK = {"warmup": 1, "repeats": 2, "per_op": False, "time_budget_s": None}


def tiny_spec(name: str = "tiny_mlp", batch_size: int = 2) -> JobSpec:
    """Inference: a training step's optimizer imports torch._dynamo, ~6 s in every fresh Ray worker."""
    return JobSpec.from_options(module=f"{USER_MODELS}:{name}", batch_size=batch_size, mode="inference")


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray", reason="Ray is the optional extra perfmodel[ray]; not installed here")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def killed_once(marker: str, when: str, spec_json: dict, url: str, run_id: str) -> dict:
    """Profile and store, but the first attempt dies (os._exit, as a preempted worker would) `when` = before or
    after its write."""
    first = not os.path.exists(marker)
    if first:
        Path(marker).write_text(str(os.getpid()))
        if when == "before":
            os._exit(1)
    result = profile_and_store(spec_json, "cpu", url, run_id, QUICK, force=True)
    if first and when == "after":
        os._exit(1)
    return {**result, "pid": os.getpid()}


def raises(message: str) -> None:
    raise ValueError(message)


@pytest.mark.slow  # a Ray cluster kills and retries a task
def test_a_task_killed_mid_run_is_retried_and_leaves_one_row(ray, tmp_path):
    """Two tasks at once: one dies before its write, one right after it (and is re-run with --force semantics,
    so the retry profiles again and its write finds the first attempt's row by uid)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    ProfileStore(url).close()  # create the schema once, before the workers race for it
    specs = {"before": tiny_spec(batch_size=2), "after": tiny_spec(batch_size=3)}
    tasks = [FanoutTask(when, partial(killed_once, str(tmp_path / f"{when}.attempt-1"), when,
                                      spec.model_dump(mode="json"), url, "run-1"))
             for when, spec in specs.items()]
    results = run_on_ray(tasks, options=RayOptions(max_retries=2))
    assert [r.key for r in results] == ["before", "after"] and all(r.ok for r in results), results
    for result in results:
        marker = tmp_path / f"{result.key}.attempt-1"
        assert int(marker.read_text()) != result.value["pid"]  # the first attempt's worker died; another finished
    before, after = (r.value for r in results)
    assert before["added"] is True and after["added"] is False  # the retry found the first attempt's row
    with ProfileStore(url) as store:
        rows = store.list()
        assert sorted(r.batch_size for r in rows) == [2, 3]  # exactly one row per job
        assert {r.id for r in rows} == {before["profile_id"], after["profile_id"]}
        assert all(store.get(r.id).iteration.iter_time_ms_median > 0 for r in rows)


def test_a_task_that_keeps_dying_is_reported_after_max_retries(ray, tmp_path):
    results = run_on_ray([FanoutTask("dies", partial(os._exit, 3)), FanoutTask("fails", partial(raises, "bad"))],
                         options=RayOptions(max_retries=1, retry_exceptions=()))
    assert [r.key for r in results] == ["dies", "fails"] and not any(r.ok for r in results)
    assert "died" in results[0].error.lower() or "worker" in results[0].error.lower()
    assert results[1].error == "ValueError: bad"


@pytest.mark.slow  # a sweep on a Ray cluster through the CLI
def test_profile_sweep_on_ray_through_the_cli_is_resumable(ray, tmp_path):
    from perfmodel.cli.main import app

    url = f"sqlite:///{tmp_path / 'store.db'}"
    ProfileStore(url).close()
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"jobs:\n  - module: {USER_MODELS}:tiny_mlp\n    batch_size: [2, 4]\n    mode: inference\n")
    args = ["profile", "--sweep", str(sweep), "--ray", "local", "--store", url, "--json", "--warmup", "1",
            "--repeats", "2", "--no-per-op", "--time-budget", "0"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    results = json.loads(first.stdout)
    assert len(results) == 2 and all(r["added"] and r["outcome"] == "ok" for r in results)
    with ProfileStore(url) as store:
        assert sorted(s.batch_size for s in store.list()) == [2, 4]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert all(r["skipped"] for r in json.loads(again.stdout))
    with ProfileStore(url) as store:
        assert store.count() == 2


def test_a_task_asking_for_gpus_the_cluster_lacks_fails_at_once(ray):
    more = ray.cluster_resources().get("GPU", 0) + 1  # one more GPU than this machine has
    with pytest.raises(PerfmodelError, match=f"asks for {more:g} GPU"):
        run_on_ray([FanoutTask("needs-a-gpu", partial(print, "never runs"), num_gpus=more)])


def test_gpus_per_task_follow_the_device():
    assert gpus_for("cpu") == 0 and gpus_for("cuda") == 1 and gpus_for("cuda:3") == 1
    with pytest.raises(PerfmodelError, match="expected cpu"):
        gpus_for("tpu")


def test_without_ray_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(ray_fanout.RayUnavailableError, match=r"perfmodel\[ray\]"):
        run_on_ray([FanoutTask("x", partial(print, "x"))])


def test_add_once_stores_a_result_uid_once(tmp_path):
    """The write a retried task repeats: same run id + job key -> the same uid -> one row (no Ray needed)."""
    from perfmodel.profilers.ray_fanout import result_uid

    shipped = Path(__file__).parents[2] / "profiles" / "cpu-sample"
    with ProfileStore("sqlite://") as memory:
        memory.import_parquet(shipped)
        profile = memory.get(memory.list(limit=1)[0].id)
    key = profile.job.key()
    uid = result_uid("run-1", key, "AMD EPYC")
    assert uid == result_uid("run-1", key, "AMD EPYC") != result_uid("run-2", key, "AMD EPYC")
    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        first, added = store.add_once(profile, uid)
        again, added_again = store.add_once(profile, uid)
        assert added and not added_again and first == again and store.count() == 1
        assert store.get(first).ops.ops == profile.ops.ops
