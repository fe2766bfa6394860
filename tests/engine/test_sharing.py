"""Reports of a job while sharing its GPUs calibrate its co-located answers (every partner, that accelerator and
mode), never its answers alone nor another job's; every replica follows, deleting a report undoes it. Real SQLite
stores, cheap real parts for the models (`tests.engine.helpers`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.calibration.sharing import SHARING_PRIOR_OBSERVATIONS, SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN
from perfmodel.engine.errors import FieldError
from perfmodel.placement.colocation import load_colocation_params
from perfmodel.placement.spec import Parallelism, PlacementSpec
from tests.engine.test_fleet import _engine, _job


def _one(accelerator: str, batch: int) -> PlacementSpec:
    return PlacementSpec(accelerator=accelerator, devices_per_node=(1,), global_batch_size=batch)


def _shared(engine, a: str, b: str, accelerator: str = "t4", sharing: str = "time-slicing") -> dict:
    return engine.colocation([a, b], _one(accelerator, 8), sharing)


def test_a_report_while_sharing_moves_that_jobs_shared_answers_only_in_every_replica_and_deleting_it_undoes_it(
        tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    one, two = _engine(url), _engine(url)
    a, b, c = (one.register(_job(8, model))[0].key for model in ("mlp-recommender", "resnet18", "resnet50"))
    before_ab, before_ac = _shared(one, a, b), _shared(one, a, c)
    alone = one.predict(a, _one("t4", 8))
    assert before_ab["calibration"][0] == {"level": "none", "factor": 1.0, "observations": 0, "partners": 0}
    # a keeps 60 % of what the model gives it next to b
    seen = before_ab["throughput_samples_per_s"][0] * 0.6
    report = one.observe(a, _one("t4", 8), seen, colocated_with=b)
    factor = math.exp(math.log(0.6) / (1 + SHARING_PRIOR_OBSERVATIONS))
    assert report["calibrated"] and report["calibration_factor"] == pytest.approx(factor)
    assert report["colocated_with"] == b and report["sharing"] == "time-slicing"
    two.sync_once()
    for engine in (one, two):
        ab, ac = _shared(engine, a, b), _shared(engine, a, c)
        # with the partner it reported, and with one it never ran with
        for after, before in ((ab, before_ab), (ac, before_ac)):
            assert after["calibration"][0] == {"level": "job", "factor": pytest.approx(factor), "observations": 1,
                                               "partners": 1}
            assert after["throughput_samples_per_s"][0] == pytest.approx(before["throughput_samples_per_s"][0] * factor)
            assert after["throughput_samples_per_s"][1] == pytest.approx(before["throughput_samples_per_s"][1])
            assert after["calibration"][1]["level"] == "none"
        # alone, a is answered as before; so is it sharing another accelerator or in another mode
        assert engine.predict(a, _one("t4", 8))["throughput_samples_per_s"] == alone["throughput_samples_per_s"]
        assert _shared(engine, a, b, "a10")["calibration"][0]["level"] == "none"
        assert _shared(engine, a, b, sharing="mps")["calibration"][0]["level"] == "none"
    # its interval while sharing is the band of a job that reported once, each side no wider than the model's (a
    # report is evidence: it never widens an interval), so narrower than the model's where a side of the band is
    band = load_colocation_params().reported_band(1)
    for partner, before in ((b, before_ab), (c, before_ac)):
        after = _shared(one, a, partner)
        throughput, (low, high) = after["throughput_samples_per_s"][0], after["interval_samples_per_s"][0]
        model_low, model_high = (v / before["throughput_samples_per_s"][0] for v in before["interval_samples_per_s"][0])
        assert low == pytest.approx(throughput * max(math.exp(band[0]), model_low))
        assert high == pytest.approx(throughput * min(math.exp(band[1]), model_high))
        width, model_width = math.log(high / low), math.log(model_high / model_low)
        assert width <= model_width + 1e-9
        if math.exp(band[0]) > model_low or math.exp(band[1]) < model_high:  # here: its top
            assert width < model_width
    one.delete_observation(report["observation_id"])
    two.sync_once()
    for engine in (one, two):
        assert _shared(engine, a, b)["throughput_samples_per_s"] == pytest.approx(before_ab["throughput_samples_per_s"])


def test_a_report_faster_than_alone_is_answered_no_faster_than_alone_and_the_pair_within_the_device(tmp_path):
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    a, b = (engine.register(_job(8, model))[0].key for model in ("mlp-recommender", "resnet18"))
    for job, partner in ((a, b), (b, a)):
        alone = engine.predict(job, _one("t4", 8))["throughput_samples_per_s"]
        engine.observe(job, _one("t4", 8), alone * 0.99, colocated_with=partner)  # as if it never noticed the other
    shared = _shared(engine, a, b)
    for i in (0, 1):
        assert shared["throughput_samples_per_s"][i] <= shared["isolated_throughput_samples_per_s"][i] * (1 + 1e-9)
        assert shared["calibration"][i]["factor"] > 1
    assert shared["combined_device_share"] <= 1 + 1e-9


def test_a_report_with_an_unknown_partner_or_beyond_physics_is_refused_and_not_stored(tmp_path):
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    a, b = (engine.register(_job(8, model))[0].key for model in ("mlp-recommender", "resnet18"))
    with pytest.raises(FieldError) as unknown:
        engine.observe(a, _one("t4", 8), 100.0, colocated_with="0" * 24)
    assert unknown.value.loc == ("colocated_with",)
    with pytest.raises(FieldError) as beyond:
        engine.observe(a, _one("t4", 8), 1e12, colocated_with=b)
    assert beyond.value.loc == ("throughput_samples_per_s",)
    assert engine.store.observations(a) == []


def test_deleting_the_partner_deletes_the_reports_made_with_it_in_every_replica(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    one, two = _engine(url), _engine(url)
    a, b, c = (one.register(_job(8, model))[0].key for model in ("mlp-recommender", "resnet18", "resnet50"))
    seen = _shared(one, a, b)["throughput_samples_per_s"][0] * 0.5
    one.observe(a, _one("t4", 8), seen, colocated_with=b)
    one.observe(a, _one("t4", 8), _shared(one, a, c)["throughput_samples_per_s"][0] * 0.5, colocated_with=c)
    two.sync_once()
    assert _shared(two, a, c)["calibration"][0]["observations"] == 2
    one.delete_job(b)
    two.sync_once()
    assert [o.colocated_with for o in one.store.observations(a)] == [c]
    for engine in (one, two):
        assert _shared(engine, a, c)["calibration"][0]["observations"] == 1


@pytest.fixture(scope="module")
def sharing_store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('sharing') / 'store.db'}"


MODELS = ("mlp-recommender", "resnet18", "resnet50", "vgg11")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from(["t4", "a10"]),
                                  st.sampled_from(["time-slicing", "mps"]), st.floats(0.05, 20.0)),
                        min_size=1, max_size=6),
       asked=st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from(["t4", "a10"]),
                       st.sampled_from(["time-slicing", "mps"]), st.sampled_from([1, 2])))
def test_no_answer_while_sharing_is_physically_impossible_whatever_was_reported(sharing_store, reports, asked):
    engine = _engine(sharing_store)
    keys = [engine.register(_job(8 * (i + 1), model))[0].key for i, model in enumerate(MODELS)]
    stored = set()
    for a, b, accelerator, mode, ratio in reports:
        answer = engine.colocation([keys[a], keys[b]], _one(accelerator, 8 * (a + 1)), mode)
        try:
            engine.observe(keys[a], _one(accelerator, 8 * (a + 1)), answer["throughput_samples_per_s"][0] * ratio,
                           colocated_with=keys[b], sharing=mode)
            stored.add((a, accelerator, mode))
        except FieldError as exc:  # beyond physics or absurdly low: refused, not stored
            assert exc.loc == ("throughput_samples_per_s",)
    a, b, accelerator, mode, devices = asked
    placement = PlacementSpec(accelerator=accelerator, devices_per_node=(devices,),
                              parallelism=Parallelism(data=devices), global_batch_size=devices * 8 * (a + 1))
    shared = engine.colocation([keys[a], keys[b]], placement, mode)
    for i in (0, 1):
        assert 0 < shared["throughput_samples_per_s"][i] <= shared["isolated_throughput_samples_per_s"][i] * (1 + 1e-9)
        low, high = shared["interval_samples_per_s"][i]
        assert low <= shared["throughput_samples_per_s"][i] * (1 + 1e-9) and high >= low
    assert shared["combined_device_share"] <= 1 + 1e-9
    assert (shared["calibration"][0]["level"] == "job") == ((a, accelerator, mode) in stored)
    for observation in engine.store.observations():
        engine.store.delete_observation(observation.id)


def test_a_job_whose_own_isolated_reports_calibrate_it_there_takes_its_reports_while_sharing_with_the_heavier_prior(
        tmp_path):
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    a, b = (engine.register(_job(8, model))[0].key for model in ("mlp-recommender", "resnet18"))
    alone = engine.predict(a, _one("t4", 8))["throughput_samples_per_s"]
    engine.observe(a, _one("t4", 8), alone * 0.8)  # its isolated answer on the T4 is now its own
    before = _shared(engine, a, b)
    assert before["isolated_throughput_samples_per_s"][0] == pytest.approx(alone * 0.8)
    report = engine.observe(a, _one("t4", 8), before["throughput_samples_per_s"][0] * 0.6, colocated_with=b)
    heavier = math.exp(math.log(0.6) / (1 + SHARING_PRIOR_OBSERVATIONS_ISOLATED_KNOWN))
    assert report["calibration_factor"] == pytest.approx(heavier)
    assert _shared(engine, a, b)["calibration"][0]["factor"] == pytest.approx(heavier)
    # on another accelerator, where its isolated answer is not its own, the lighter one
    on_a10 = _shared(engine, a, b, "a10")
    engine.observe(a, _one("a10", 8), on_a10["throughput_samples_per_s"][0] * 0.6, colocated_with=b)
    light = math.exp(math.log(0.6) / (1 + SHARING_PRIOR_OBSERVATIONS))
    assert _shared(engine, a, b, "a10")["calibration"][0]["factor"] == pytest.approx(light)


def test_the_engine_takes_the_constants_of_the_gpus_preemption(tmp_path):
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    assert engine.colocation_params("k80") == load_colocation_params(preemption="thread-block")
    assert engine.colocation_params("m40") == load_colocation_params(preemption="thread-block")
    for name in ("p100-pcie-16gb", "t4", "h100-sxm5"):
        assert engine.colocation_params(name) == load_colocation_params(preemption="instruction")
