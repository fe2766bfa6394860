"""The engine's graph cache: one capture per spec however many threads ask at once, one capture at a time."""

from __future__ import annotations

import json
import threading
import time

import pytest

from perfmodel.core.lru import LRU
from perfmodel.engine.graphs import GraphCache, SingleFlight, capture
from perfmodel.jobs.spec import JobSpec, OptimizerName, Precision
from tests.engine.helpers import tiny_graph


def test_twenty_threads_asking_for_one_new_spec_cause_exactly_one_capture():
    runs: list[str] = []

    def slow_capture(spec, deadline_s, limits):  # the real in-process capture, slowed so the threads overlap
        runs.append(spec.key())
        time.sleep(0.3)
        return capture(spec, deadline_s, limits, isolated=False)

    ir = json.loads(tiny_graph(8).to_json())
    spec = JobSpec.model_validate({"source": {"kind": "ir", "graph": ir}, "batch_size": 8})
    cache = GraphCache(16, capture_fn=slow_capture)
    start = threading.Barrier(20)
    graphs, errors = [], []

    def ask():
        start.wait()
        try:
            graphs.append(cache.graph(JobSpec.model_validate(spec.model_dump())))  # equal specs, distinct objects
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(runs) == 1 and len(graphs) == 20
    assert all(g is graphs[0] for g in graphs) and graphs[0].totals.flops_fwd == tiny_graph(8).totals.flops_fwd
    assert cache.get(spec) is graphs[0]


def test_captures_of_different_specs_run_one_at_a_time_and_a_failure_reaches_every_waiter():
    running, most = [0], [0]
    lock = threading.Lock()

    def tracked_capture(spec, deadline_s, limits):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        if spec.batch_size == 3:
            from perfmodel.core.errors import PerfmodelError

            raise PerfmodelError("source: no such model today")
        return tiny_graph(spec.batch_size)

    cache = GraphCache(16, capture_fn=tracked_capture)
    models = ("mlp-recommender", "resnet18", "resnet34", "vgg11", "alexnet", "gpt2")  # no batch of one from another
    specs = [JobSpec.model_validate({"source": {"kind": "zoo", "name": name}, "batch_size": b})
             for name, b in zip(models, (1, 2, 3, 4, 5, 6))]
    outcomes: dict[int, object] = {}

    def ask(spec):
        try:
            outcomes[spec.batch_size] = cache.graph(spec)
        except Exception as exc:
            outcomes[spec.batch_size] = exc

    threads = [threading.Thread(target=ask, args=(s,)) for s in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1 and cache.captures == 6  # serialised by the one capture lock (torch.export is not
    assert "no such model" in str(outcomes[3])  # thread-safe); a failure is raised, not cached
    assert len(cache) == 5 and all(outcomes[b].totals.nodes == 1 for b in (1, 2, 4, 5, 6))


def test_single_flight_and_lru_hold_their_contracts():
    flight = SingleFlight()
    assert flight.run("k", lambda: 3) == 3 and flight.running == 0
    with pytest.raises(ZeroDivisionError):
        flight.run("k", lambda: 1 / 0)
    lru: LRU[int, int] = LRU(3)
    for i in range(10):
        lru.put(i, i)
        lru.get(0)
    assert len(lru) == 3 and lru.keys() == [8, 9, 0]  # 0, read after every put, is never the least recent
    with pytest.raises(ValueError):
        LRU(0)


def test_a_graph_directory_serves_later_processes_without_a_capture(tmp_path):
    from tests.engine.helpers import tiny_graph

    def capture_fn(spec, deadline_s, limits):
        return tiny_graph(spec.batch_size)

    zoo = JobSpec.model_validate({"source": {"kind": "zoo", "name": "mlp-recommender"}, "batch_size": 8})
    first = GraphCache(16, capture_fn=capture_fn, directory=tmp_path)
    graph = first.graph(zoo)
    assert first.captures == 1 and len(list(tmp_path.glob("*.json"))) == 1
    later = GraphCache(16, capture_fn=capture_fn, directory=tmp_path)  # another process on the same home
    assert later.graph(zoo) == graph and later.captures == 0
    (next(tmp_path.glob("*.json"))).write_text("{not json")  # a damaged file is captured again
    again = GraphCache(16, capture_fn=capture_fn, directory=tmp_path)
    assert again.graph(zoo) == graph and again.captures == 1


def test_a_job_in_another_float32_math_or_optimizer_costs_no_capture_and_gets_its_own_label():
    from tests.engine.helpers import tiny_graph

    captured: list[JobSpec] = []

    def capture_fn(spec, deadline_s, limits):
        captured.append(spec)
        return tiny_graph(spec.batch_size).model_copy(update={"job_id": spec.key()})

    cache = GraphCache(16, capture_fn=capture_fn)
    fp32 = JobSpec.from_options(zoo="resnet18", batch_size=8)
    twins = [fp32.model_copy(update=u) for u in ({"precision": Precision.tf32},
                                                  {"precision": Precision.amp, "optimizer": OptimizerName.adam})]
    graphs = [cache.graph(s) for s in (fp32, *twins)]
    assert len(captured) == 1 and cache.captures == 1
    assert [g.job_id for g in graphs] == [s.key() for s in (fp32, *twins)]  # each labelled as its own job's
    assert graphs[1].nodes == graphs[0].nodes and cache.get(twins[1]).job_id == twins[1].key()
    half = fp32.model_copy(update={"precision": Precision.fp16})  # a model cast to half: another graph
    assert cache.graph(half).job_id == half.key() and cache.captures == 2
