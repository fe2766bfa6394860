"""The prediction engine: bounded caches under many distinct jobs, the cached path, IR batch checks."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from perfmodel.core.ir import Graph
from perfmodel.engine import EngineConfig, FieldError, GraphCache, PredictionEngine, capture
from perfmodel.engine.engine import PLACEMENT_CACHE_SIZE
from perfmodel.engine.models import ModelLifecycle
from perfmodel.jobs.spec import GraphSource, JobSpec, ZooSource
from perfmodel.placement.spec import Parallelism, PlacementSpec
from perfmodel.predictor.placed import PlacementPredictor
from perfmodel.registry.registry import ModelRegistry
from tests.engine.helpers import FixedRateDevice, tiny_graph


def _tiny_capture(spec: JobSpec, deadline_s, limits) -> Graph:
    """An IR parsed for real (`capture`); any other source: a one-node graph at its batch (no torch)."""
    if isinstance(spec.source, GraphSource):
        return capture(spec, deadline_s, limits, isolated=False)
    return tiny_graph(spec.batch_size)


def fixed_rate_engine(max_jobs: int, max_computes: int) -> PredictionEngine:
    """An engine whose graphs are one-node graphs and whose per-device model prices FLOPs at a fixed rate."""
    graphs = GraphCache(max_jobs, capture_fn=_tiny_capture)
    predictor = PlacementPredictor(None, FixedRateDevice(), cache_size=max_computes, graphs=graphs.graph)
    config = EngineConfig(max_cached_jobs=max_jobs, max_cached_computes=max_computes)
    lifecycle = ModelLifecycle(ModelRegistry(), None, None, load=lambda refs: predictor)
    return PredictionEngine(config, predictor, lifecycle, graphs=graphs)


def _drive(engine: PredictionEngine, jobs: int, *, strong_scaled: bool = True) -> list[float]:
    """`jobs` distinct jobs, each on two data-parallel T4s at its own batch, and (`strong_scaled`) at half of it
    (a second micro-batch graph and compute per job)."""
    source = ZooSource(name="mlp-recommender")
    throughputs = []
    for batch in range(2, 2 * jobs + 2, 2):
        spec = JobSpec(source=source, batch_size=batch)
        two = PlacementSpec(accelerator="t4", devices_per_node=(2,), parallelism=Parallelism(data=2),
                            global_batch_size=2 * batch)
        halves = two.model_copy(update={"global_batch_size": batch})
        throughputs.append(engine.predict(spec, two)["throughput_samples_per_s"])
        if strong_scaled:
            engine.predict(spec, halves)
    return throughputs


def _assert_within_bounds(engine: PredictionEngine, max_jobs: int, max_computes: int) -> None:
    stats = engine.stats()
    assert stats["jobs"] == max_jobs and stats["graphs"] == max_jobs
    assert stats["predictor_computes"] == stats["predictor_memory"] == max_computes
    assert stats["predictor_graphs"] <= max_computes and stats["placements"] <= 4096


def test_caches_stay_within_their_bounds_under_thousands_of_distinct_jobs():
    engine = fixed_rate_engine(max_jobs=16, max_computes=32)
    throughputs = _drive(engine, 2_000)
    _assert_within_bounds(engine, 16, 32)
    # an evicted job is predicted again, the same (the caches forget, they do not change answers)
    again = engine.predict(JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=2),
                           PlacementSpec(accelerator="t4", devices_per_node=(2,), parallelism=Parallelism(data=2),
                                         global_batch_size=4))
    assert again["throughput_samples_per_s"] == pytest.approx(throughputs[0], rel=1e-12)


def test_caches_stay_within_their_bounds_under_6000_distinct_jobs():
    """6,000 jobs, each at its own placement: six times the job and compute bounds, and past the engine's own
    placement cache (PLACEMENT_CACHE_SIZE, 4,096), which stays full and no bigger (~4 s here, ~0.7 ms a job)."""
    engine = fixed_rate_engine(max_jobs=1_000, max_computes=1_000)
    _drive(engine, 6_000, strong_scaled=False)
    _assert_within_bounds(engine, 1_000, 1_000)
    assert engine.stats()["placements"] == PLACEMENT_CACHE_SIZE


def test_the_cached_path_answers_only_once_warm_and_then_as_the_blocking_path():
    engine = fixed_rate_engine(max_jobs=8, max_computes=8)
    spec = JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=8)
    placement = PlacementSpec(accelerator="t4", global_batch_size=8)
    assert engine.predict_cached(spec, placement) is None  # no graph yet: the caller must go to a thread
    blocking = engine.predict(spec, placement)
    cached = engine.predict_cached(spec, placement)
    assert cached == blocking
    other = PlacementSpec(accelerator="v100", global_batch_size=8)
    assert engine.predict_cached(spec, other) is None  # a compute not cached yet: not on the caller's thread


def test_an_ir_whose_inputs_say_another_batch_is_refused_naming_batch_size():
    engine = fixed_rate_engine(max_jobs=8, max_computes=8)
    ir = json.loads(tiny_graph(16).to_json())
    right = JobSpec.model_validate({"source": {"kind": "ir", "graph": ir}, "batch_size": 16})
    assert engine.job(right).graph.inputs[0].shape[0] == 16
    wrong = JobSpec.model_validate({"source": {"kind": "ir", "graph": ir}, "batch_size": 32})
    with pytest.raises(FieldError) as refused:
        engine.job(wrong)
    assert refused.value.loc == ("job", "batch_size") and "captured at batch 16" in str(refused.value)


def test_twenty_threads_predicting_one_new_job_capture_it_once():
    import threading

    engine = fixed_rate_engine(max_jobs=8, max_computes=8)
    captured: list[int] = []
    tiny = engine.graphs._capture_fn

    def slow_capture(spec, deadline_s, limits):
        captured.append(spec.batch_size)
        time.sleep(0.2)  # long enough for every thread to arrive while it runs
        return tiny(spec, deadline_s, limits)

    engine.graphs._capture_fn = slow_capture
    spec = JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=8)
    placement = PlacementSpec(accelerator="t4", global_batch_size=8)
    start = threading.Barrier(20)
    answers = []

    def ask():
        start.wait()
        answers.append(engine.predict(JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=8), placement))

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert captured == [8] and engine.graphs.captures == 1 and len(answers) == 20
    assert all(a == answers[0] for a in answers) and engine.predict_cached(spec, placement) == answers[0]


def test_a_step_is_named_host_bound_by_its_zoo_models_host_work_or_by_its_own_reports_far_above_the_device_time():
    from perfmodel.calibration.job import Calibration, Excluded, ObservedPoint
    from perfmodel.engine.engine import host_bound_reason
    from perfmodel.jobs.zoo import ZOO
    from perfmodel.predictor.predict import HOST_BOUND_RATIO

    a3c = JobSpec(source=ZooSource(name="gavel-a3c"), batch_size=1)
    assert ZOO["gavel-a3c"].host_work
    why = host_bound_reason(a3c, None)
    assert why is not None and "Atari" in why and "graph does not show" in why
    plain = JobSpec(source=ZooSource(name="resnet50"), batch_size=32)
    assert not ZOO["resnet50"].host_work
    assert host_bound_reason(plain, None) is None  # no reports: nothing says so

    def point(i: int, accelerator: str, observed_over_predicted: float, device_share: float) -> ObservedPoint:
        return ObservedPoint(i, accelerator, 1, 100.0 * observed_over_predicted, 100.0, device_share=device_share)

    # a step predicted 80 % device time that ran at half the predicted throughput: 2.5x its device time
    assert point(0, "t4", 0.5, 0.8).over_device_time == pytest.approx(2.5)
    calibration = Calibration(points=(point(1, "t4", 0.5, 0.8), point(2, "t4", 0.45, 0.8), point(3, "a10", 0.9, 0.9),
                                      point(4, "a10", 0.05, 0.9)),
                              excluded=(Excluded(4, "an outlier"),))
    accelerator, ratio = calibration.slowest_over_device_time
    assert accelerator == "t4" and ratio == pytest.approx(statistics.median([2.5, 1 / 0.45 / 0.8]))
    why = host_bound_reason(plain, (accelerator, ratio))
    assert why is not None and "own reports on t4" in why and f"{ratio:.1f}x" in why
    assert host_bound_reason(plain, ("a10", HOST_BOUND_RATIO)) is None  # at most twice the device time: not named
    assert Calibration().slowest_over_device_time is None
