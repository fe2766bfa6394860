"""ProfileStore: exact round trips, runs accumulate, has() for resumable sweeps, list filters."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import Mode, Precision
from perfmodel.records import Outcome
from perfmodel.store import ProfileStore, ProfileSummary


def test_full_profile_round_trips_exactly(store, factory):
    profile = factory.profile(n_ops=300, n_onnx=17)
    got = store.get(store.add(profile))
    assert got == profile
    assert got.ops.ops == profile.ops.ops and isinstance(got.ops.ops, tuple)
    assert isinstance(got.ops.ops[0].input_shapes[0], tuple)
    assert got.iteration.samples_ms == profile.iteration.samples_ms  # floats bit for bit
    assert got.iteration.outcome is Outcome.ok
    assert got.job.precision is Precision.amp


def test_hf_job_on_gpu_round_trips_and_times_come_back_utc(store, factory):
    profile = factory.hf_profile()
    got = store.get(store.add(profile))
    assert got == profile
    assert got.created_at.utcoffset() == timedelta(0)  # stored as UTC, returned zone-aware
    assert got.created_at == profile.created_at  # same instant as the -07:00 original
    assert got.environment.captured_at == profile.environment.captured_at
    assert got.job.source.config == profile.job.source.config


@pytest.mark.parametrize(
    "parts",
    [
        {"outcome": None, "n_ops": None, "n_onnx": None},  # environment only
        {"outcome": Outcome.oom, "n_ops": None},  # OOM: error message and peak memory > 2**32
        {"n_ops": 0, "n_onnx": 0},  # op and ONNX profiles present but empty
        {"outcome": None, "n_ops": None, "n_onnx": 5},  # ONNX only
    ],
)
def test_partial_profiles_round_trip(store, factory, parts):
    profile = factory.profile(**parts)
    assert store.get(store.add(profile)) == profile


def test_extreme_floats_and_unicode_round_trip(store, factory):
    base = factory.profile(n_ops=3)
    ops = base.ops.model_copy(update={"ops": tuple(
        op.model_copy(update={"self_time_ms": value, "ir_node": "блок.注意力"})
        for op, value in zip(base.ops.ops, (5e-324, 1.7976931348623157e308, 0.1 + 0.2), strict=True)
    )})
    iteration = base.iteration.model_copy(update={"iter_time_cv": 1 / 3, "samples_ms": (1e-300, 2.5e300)})
    profile = base.model_copy(update={"ops": ops, "iteration": iteration, "family": "ünïcode ✓"})
    assert store.get(store.add(profile)) == profile


def test_repeated_adds_keep_every_run(store, factory):
    first, second = factory.profile(), factory.profile(created_at=factory.profile().created_at + timedelta(hours=1))
    ids = [store.add(first), store.add(second), store.add(first)]
    assert len(set(ids)) == 3
    assert store.count() == 3
    assert [store.get(i) for i in ids] == [first, second, first]
    assert [s.id for s in store.list(job=first.job_id)] == [ids[1], ids[2], ids[0]]  # newest first


def test_has_counts_only_finished_runs_per_device(store, factory):
    ok = factory.profile(name="resnet50")
    oom = factory.profile(name="vit_b_16", outcome=Outcome.oom, environment=factory.cuda_environment())
    no_iteration = factory.profile(name="bert-base", outcome=None)
    for profile in (ok, oom, no_iteration):
        store.add(profile)
    assert store.has(ok.job_id)
    assert store.has(ok.job_id, ok.environment.device_name)
    assert not store.has(ok.job_id, "NVIDIA A100-SXM4-80GB")
    assert store.has(oom.job_id, "NVIDIA A100-SXM4-80GB")  # an OOM is an answer: a sweep need not retry it
    assert not store.has(no_iteration.job_id)  # stored, but never timed
    assert not store.has("0" * 24)


def test_list_filters_orders_and_limits(store, factory):
    t0 = factory.profile().created_at
    cpu = factory.profile(name="resnet50", created_at=t0)
    gpu = factory.profile(name="resnet50", environment=factory.cuda_environment(), created_at=t0 + timedelta(1))
    other = factory.profile(name="vit_b_16", batch_size=64, n_ops=None, created_at=t0 + timedelta(2))
    cpu_id, gpu_id, other_id = (store.add(p) for p in (cpu, gpu, other))

    everything = store.list()
    assert [s.id for s in everything] == [other_id, gpu_id, cpu_id]  # newest first
    assert all(isinstance(s, ProfileSummary) for s in everything)
    assert [s.id for s in store.list(job="resnet50")] == [gpu_id, cpu_id]
    assert [s.id for s in store.list(job=other.job_id)] == [other_id]
    assert [s.id for s in store.list(device="cuda:0")] == [gpu_id]
    assert [s.id for s in store.list(device="a100")] == [gpu_id]  # part of the device name, any case
    assert [s.id for s in store.list(job="resnet50", device="Xeon")] == [cpu_id]
    assert [s.id for s in store.list(limit=2)] == [other_id, gpu_id]
    assert store.list(job="no-such-job") == []
    assert store.list(device="100%") == []  # LIKE wildcards are matched literally

    summary = store.list(job="vit_b_16")[0]
    assert summary == ProfileSummary(
        id=other_id, job_name="vit_b_16", job_id=other.job_id, family="resnet",
        device_name=other.environment.device_name, batch_size=64, seq_len=128, precision=Precision.amp,
        mode=Mode.train, outcome=Outcome.ok, iter_time_ms_median=other.iteration.iter_time_ms_median,
        throughput_samples_per_s=other.iteration.throughput_samples_per_s, coverage=None, created_at=other.created_at,
    )
    assert summary.created_at.tzinfo is not None
    with pytest.raises(ValidationError):
        summary.id = 5  # frozen


def test_unknown_id_is_a_user_error(store):
    with pytest.raises(PerfmodelError, match="no profile with id 42"):
        store.get(42)


def test_default_url_is_sqlite_under_perfmodel_home(tmp_path, monkeypatch, factory):
    home = tmp_path / "deep" / "home"
    monkeypatch.setenv("PERFMODEL_HOME", str(home))
    with ProfileStore() as store:
        assert store.url == f"sqlite:///{home / 'perfmodel.db'}"
        store.add(factory.profile())
    assert (home / "perfmodel.db").is_file()
    with ProfileStore() as reopened:  # data persists across opens
        assert reopened.count() == 1


def test_store_url_setting_is_used(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_STORE_URL", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    with ProfileStore():
        pass
    assert (tmp_path / "elsewhere.db").is_file()


@pytest.mark.parametrize("url", ["not a url", "nosuchdialect://x/y"])
def test_bad_urls_are_user_errors(url):
    with pytest.raises(PerfmodelError):
        ProfileStore(url)


def test_a_file_that_is_not_a_database_is_a_user_error(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(PerfmodelError, match="cannot open profile store"):
        ProfileStore(f"sqlite:///{path}")


def test_in_memory_sqlite_works(factory):
    with ProfileStore("sqlite://") as store:
        profile = factory.profile()
        assert store.get(store.add(profile)) == profile


# --- graphs of profiled jobs (schema v5) ---


def _tiny_graph(job_key: str, width: int = 8):
    """A real graph IR (torch.export of a two-layer MLP on the meta device) standing for the job `job_key`."""
    import torch

    from perfmodel.graph.from_torch import graph_from_module

    module = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("meta")
    return graph_from_module(module, (torch.empty(2, width, device="meta"),), name="tiny", job_id=job_key)


def test_a_stored_graph_comes_back_equal_and_is_added_once(store, factory):
    key = factory.profile().job.key()
    graph = _tiny_graph(key)
    assert store.graph(key) is None and store.graph_keys() == set()
    assert store.add_graph(key, graph) is True
    assert store.graph(key) == graph and store.graph(key).to_json() == graph.to_json()
    assert store.add_graph(key, _tiny_graph(key, width=12)) is False  # the first graph of a job stays
    assert store.graph(key) == graph
    assert store.graph_keys() == {key} and store.graphs_json() == {key: graph.to_json()}
    assert store.graphs_json(["0" * 64]) == {}


def test_a_graph_of_another_job_or_a_bad_key_is_refused(store, factory):
    graph = _tiny_graph("a" * 64)
    with pytest.raises(PerfmodelError, match="cannot be stored as the graph of job"):
        store.add_graph("b" * 64, graph)
    with pytest.raises(PerfmodelError, match="1 to 64 characters"):
        store.add_graphs({"c" * 65: graph.to_json()})
    assert store.graph_keys() == set()


def test_two_writers_racing_store_one_graph(store_url, factory):
    import threading

    key = factory.profile().job.key()
    graphs = [_tiny_graph(key, width=w) for w in (8, 12)]
    barrier = threading.Barrier(2)
    results: dict[int, bool] = {}
    ProfileStore(store_url).close()  # created before the race

    def write(i: int) -> None:
        with ProfileStore(store_url) as writer:
            barrier.wait()
            results[i] = writer.add_graph(key, graphs[i])

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results.values()) == [False, True]
    with ProfileStore(store_url) as reader:
        winner = next(i for i, added in results.items() if added)
        assert reader.graph(key) == graphs[winner] and reader.graph_keys() == {key}


def test_profiled_jobs_are_listed_once_and_those_without_a_graph_apart(store, factory):
    first, other = factory.profile(), factory.profile(name="vit_b_16")
    for profile in (first, other, factory.profile(created_at=first.created_at + timedelta(hours=1))):
        store.add(profile)
    assert store.profiled_jobs() == [(first.job_id, first.job), (other.job_id, other.job)]
    store.add_graph(first.job_id, _tiny_graph(first.job_id))
    assert store.profiled_jobs(without_graph=True) == [(other.job_id, other.job)]


def test_a_stored_graph_that_no_longer_parses_is_a_user_error(store, factory):
    key = factory.profile().job.key()
    store.add_graphs({key: '{"schema_version": 0}'})
    with pytest.raises(PerfmodelError, match=f"stored graph of job {key} is not valid"):
        store.graph(key)
