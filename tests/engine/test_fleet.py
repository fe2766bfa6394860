"""The engine's fleet calibration: what jobs observe on an accelerator reaches other jobs' answers in every replica,
deleting it undoes that everywhere, and no calibrated answer is physically impossible. Real SQLite stores, cheap
real parts for the models (`tests.engine.helpers`)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from perfmodel.calibration import ceiling_samples_per_s
from perfmodel.calibration.fleet import FleetPriors
from perfmodel.engine import EngineConfig, GraphCache, PredictionEngine, fleet_priors_from
from perfmodel.engine.errors import FieldError
from perfmodel.engine.models import ModelLifecycle
from perfmodel.jobs.spec import JobSpec, ZooSource
from perfmodel.placement.spec import Parallelism, PlacementSpec
from perfmodel.predictor.placed import PlacementPredictor
from perfmodel.registry.registry import ModelRegistry
from perfmodel.store.jobs import JobStore
from tests.engine.helpers import FixedRateDevice, tiny_graph


def _engine(url: str, config: EngineConfig | None = None) -> PredictionEngine:
    graphs = GraphCache(1000, capture_fn=lambda spec, deadline_s, limits: tiny_graph(spec.batch_size))
    predictor = PlacementPredictor(None, FixedRateDevice(), graphs=graphs.graph)
    lifecycle = ModelLifecycle(ModelRegistry(), None, None, load=lambda refs: predictor)
    engine = PredictionEngine(config or EngineConfig(), predictor, lifecycle, JobStore(url), graphs=graphs)
    engine.fleet()
    return engine


MODELS = ("mlp-recommender", "resnet18", "resnet50", "vgg11", "alexnet")


def _job(batch: int, model: str = "mlp-recommender") -> JobSpec:
    """A zoo job (its graph here: one linear layer at its batch)."""
    return JobSpec(source=ZooSource(name=model), batch_size=batch)


def _placement(accelerator: str, devices: int, batch: int) -> PlacementSpec:
    return PlacementSpec(accelerator=accelerator, devices_per_node=(devices,), parallelism=Parallelism(data=devices),
                         global_batch_size=devices * batch)


def test_other_jobs_observations_reach_every_replica_and_deleting_them_undoes_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    one, two = _engine(url), _engine(url)
    batches = (8, 16, 32, 64, 128)
    jobs = [one.register(_job(batch, model))[0].key for batch, model in zip(batches, MODELS)]
    ids = []
    # four jobs slower than predicted on T4, the first far more than the others (its own error beyond T4's)
    for key, batch, seen in zip(jobs[:4], batches, (0.35, 0.6, 0.6, 0.6)):
        raw = one.predict(key, _placement("t4", 1, batch))["uncalibrated_throughput_samples_per_s"]
        ids.append(one.observe(key, _placement("t4", 1, batch), raw * seen)["observation_id"])
    t4 = _placement("t4", 1, batches[4])
    mine = one.predict(jobs[4], t4)
    two.sync_once()
    theirs = two.predict(jobs[4], t4)
    for answer in (mine, theirs):
        assert answer["calibrated"] is True and answer["calibration"]["level"] == "accelerator"
        assert answer["calibration"]["jobs"] == 4 and answer["calibration"]["observations"] == 4
        assert 0.35 * 0.6 ** 3 < answer["calibration_factor"] ** 4 and answer["calibration_factor"] < 1  # not past them
        assert answer["throughput_samples_per_s"] < answer["uncalibrated_throughput_samples_per_s"]
    assert theirs["throughput_samples_per_s"] == pytest.approx(mine["throughput_samples_per_s"])
    other_chip = two.predict(jobs[4], _placement("a100-sxm4-80gb", 1, batches[4]))
    assert other_chip["calibrated"] is False and other_chip["calibration"]["level"] == "none"
    # an observed model at a batch never observed: its own evidence (the fleet's job effect is the model's)
    new_batch = two.register(_job(24, MODELS[0]))[0].key
    same_model = two.predict(new_batch, _placement("a100-sxm4-80gb", 1, 24))
    assert same_model["calibration"]["level"] == "job" and same_model["calibration_factor"] < 0.9
    for observation_id in ids:
        one.delete_observation(observation_id)
    two.sync_once()
    for engine in (one, two):
        answer = engine.predict(jobs[4], t4)
        assert answer["calibrated"] is False and answer["calibration_factor"] == 1.0
        assert answer["throughput_samples_per_s"] == answer["uncalibrated_throughput_samples_per_s"]


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'store.db'}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(observed=st.lists(st.tuples(st.sampled_from([8, 16, 32, 48]), st.sampled_from(["t4", "a10", "a100-sxm4-80gb"]),
                                   st.sampled_from([1, 2, 4]), st.floats(0.05, 8.0)), min_size=1, max_size=8),
       asked=st.tuples(st.sampled_from([8, 24, 32]), st.sampled_from(["t4", "a10", "a100-sxm4-80gb", "a100-pcie-40gb"]),
                       st.sampled_from([2, 4, 8])))
# the job (batch 32) reported 4x faster than the model on 2 GPUs only, another batch 5x slower on one: the fleet's
# one-GPU answer for it must still be at least half its own 2-GPU answer
@example(observed=[(8, "a100-sxm4-80gb", 1, 5.0), (32, "a100-sxm4-80gb", 2, 0.25)], asked=(32, "a100-sxm4-80gb", 2))
def test_no_calibrated_answer_is_physically_impossible(fleet_store, observed, asked):
    """Over random observations (jobs, accelerators, device counts, from 20x faster than predicted to 8x slower,
    what the physics check lets in): every calibrated answer stays under the placement's peak FLOP/s, and n devices
    never beat n times one device of the same accelerator."""
    engine = _engine(fleet_store)
    for key in engine.store.observed_job_ids():
        engine.delete_job(key)
    for batch, accelerator, devices, ratio in observed:
        key = engine.register(_job(batch))[0].key
        placement = _placement(accelerator, devices, batch)
        raw = engine.predict(key, placement)["uncalibrated_throughput_samples_per_s"]
        try:
            engine.observe(key, placement, raw / ratio)
        except Exception as exc:  # refused by physics (faster than the peak): the client's error, nothing stored
            assert "throughput_samples_per_s" in str(exc)
    batch, accelerator, devices = asked
    entry = engine.register(_job(batch))[0]
    single = engine.predict(entry.key, _placement(accelerator, 1, batch))
    several = _placement(accelerator, devices, batch)
    many = engine.predict(entry.key, several)
    assert many["throughput_samples_per_s"] <= devices * single["throughput_samples_per_s"] * (1 + 1e-9)
    for answer, placement in ((single, _placement(accelerator, 1, batch)), (many, several)):
        ceiling = ceiling_samples_per_s(entry.spec, entry.graph, placement, engine.catalog)
        assert answer["throughput_samples_per_s"] <= ceiling * (1 + 1e-9)
        low, high = answer["interval_ms"]
        assert 0 < low <= answer["iter_time_ms"] <= high


def test_a_jobs_own_consistent_observations_narrow_its_interval_there_and_a_steps_per_s_report_is_refused(tmp_path):
    """The answer with the most evidence is the surest: four consistent reports of the job on T4 narrow its 80 %
    interval there (more than on another device count, where what the count adds is unseen); one report narrows
    it less. Gavel's steps/s posted as samples/s is refused, naming the unit, and stores nothing."""
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    key = engine.register(_job(64))[0].key
    t4 = _placement("t4", 1, 64)

    def width(answer):
        low, high = answer["interval_ms"]
        return high / low

    served = engine.predict(key, t4)
    raw = served["uncalibrated_throughput_samples_per_s"]
    with pytest.raises(FieldError, match="steps/s"):
        engine.observe(key, t4, raw / 64 * 0.9)
    assert engine.predict(key, t4)["calibrated"] is False
    engine.observe(key, t4, raw * 0.80)
    one = engine.predict(key, t4)
    assert one["calibration"]["level"] == "job" and 0.5 < one["calibration"]["interval_scale"] <= 1
    for seen in (0.79, 0.81, 0.80):
        engine.observe(key, t4, raw * seen)
    four = engine.predict(key, t4)
    assert four["calibration_factor"] == pytest.approx(0.8, rel=0.02)
    assert four["calibration"]["interval_scale"] < one["calibration"]["interval_scale"]
    assert width(four) < width(one) <= width(served) * (1 + 1e-9)
    low, high = four["interval_ms"]
    assert low <= four["iter_time_ms"] <= high
    # another device count: the fleet carries the job's evidence over through its compute (the links apart), not
    # the one-device factor as it stands
    elsewhere = engine.predict(key, _placement("t4", 4, 64))
    assert elsewhere["calibration"]["level"] == "job" and elsewhere["calibration"]["interval_scale"] <= 1
    assert four["calibration_factor"] < elsewhere["calibration_factor"] < 1
    # on another GPU the fleet carries the job's evidence over, with its own (narrower than served) interval
    other_gpu = engine.predict(key, _placement("a100-sxm4-80gb", 1, 64))
    assert other_gpu["calibration"]["level"] == "job" and other_gpu["calibration"]["interval_scale"] < 1




def test_a_jobs_gpu_observations_leave_its_cpu_answer_alone(tmp_path):
    """The CPU is priced by a model of its own: what a job showed on a GPU says nothing of the CPU model's error for
    it (an A100 report 1.9x faster moved the job's CPU answer 1.6x). (This engine has no CPU model: what calibrates
    a CPU answer is asked directly.)"""
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    key = engine.register(_job(64))[0].key
    a100 = _placement("a100-sxm4-80gb", 2, 64)
    raw = engine.predict(key, a100)["uncalibrated_throughput_samples_per_s"]
    engine.observe(key, a100, raw * 0.5)
    assert engine.predict(key, a100)["calibration"]["level"] == "job"
    assert engine.predict(key, _placement("a100-sxm4-80gb", 1, 64))["calibration"]["level"] == "job"
    entry = engine.job(key)
    on_cpu = engine.applied(entry, "cpu", 1, 0.0, engine.calibration(entry))
    assert on_cpu.level == "none" and on_cpu.throughput_factor == 1.0
    assert engine.applied(entry, "t4", 1, 0.0, engine.calibration(entry)).level == "job"  # other GPUs: it says


def test_an_answer_where_the_job_never_ran_is_no_surer_than_where_it_did(tmp_path):
    """A job reported on 8 A100s only: its answers on 1, 2 and 4 A100s (the fleet's, through its compute) narrow
    the served interval no more than its own reports narrow the 8-GPU one (QA saw 0.35 against 0.68)."""
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    key = engine.register(_job(64))[0].key
    eight = _placement("a100-sxm4-80gb", 8, 64)
    raw = engine.predict(key, eight)["uncalibrated_throughput_samples_per_s"]
    engine.observe(key, eight, raw * 0.8)
    observed = engine.predict(key, eight)["calibration"]
    assert observed["level"] == "job"
    for devices in (1, 2, 4):
        elsewhere = engine.predict(key, _placement("a100-sxm4-80gb", devices, 64))["calibration"]
        assert elsewhere["level"] == "job"
        assert elsewhere["interval_scale"] >= observed["interval_scale"] - 1e-9, devices


def test_an_answer_on_a_gpu_where_the_job_never_ran_is_no_surer_than_on_the_one_where_it_did(tmp_path):
    """A job reported four times on an L40S; two other jobs reported on an L4: the job's answer on the L4 (its own
    effect from the L40S plus the L4's from the others) narrows the served interval no more than its own reports
    narrow the L40S one (QA saw 0.35 on the L4 against 0.65 on the L40S)."""
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    key = engine.register(_job(64))[0].key
    l40s, l4 = _placement("l40s", 1, 64), _placement("l4", 1, 64)
    raw = engine.predict(key, l40s)["uncalibrated_throughput_samples_per_s"]
    for seen in (0.79, 0.80, 0.81, 0.80):
        engine.observe(key, l40s, raw * seen)
    for batch in (16, 32):
        other = engine.register(_job(batch))[0].key
        at = _placement("l4", 1, batch)
        engine.observe(other, at, engine.predict(other, at)["uncalibrated_throughput_samples_per_s"] * 0.7)
    observed = engine.predict(key, l40s)["calibration"]
    elsewhere = engine.predict(key, l4)["calibration"]
    assert observed["level"] == "job" and observed["interval_scale"] < 1
    assert elsewhere["level"] == "job"
    assert elsewhere["interval_scale"] >= observed["interval_scale"] - 1e-9


def test_a_report_faster_than_linear_over_the_jobs_own_report_says_what_is_answered(tmp_path):
    """A job reported on one A100, then on eight at 1.5x linear scaling of that report: eight GPUs are answered at
    most eight times its one-GPU report (never faster than linear), and the 8-GPU report's response says so instead
    of announcing its own factor alone (QA read x1.000 there while predictions served x0.54)."""
    engine = _engine(f"sqlite:///{tmp_path / 'store.db'}")
    key = engine.register(_job(64))[0].key
    one, eight = _placement("a100-sxm4-80gb", 1, 64), _placement("a100-sxm4-80gb", 8, 64)
    raw_one = engine.predict(key, one)["uncalibrated_throughput_samples_per_s"]
    assert "linear scaling" not in engine.observe(key, one, raw_one * 0.5)["message"]
    response = engine.observe(key, eight, 8 * raw_one * 0.5 * 1.5)
    answered = engine.predict(key, eight)
    assert answered["throughput_samples_per_s"] == pytest.approx(8 * raw_one * 0.5)
    assert answered["calibration_factor"] < response["calibration_factor"]
    assert "within linear scaling" in response["message"]
    assert f"answered ×{answered['calibration_factor']:.3f}" in response["message"]


def test_the_fleet_priors_come_from_the_settings_and_a_tighter_job_prior_lets_other_jobs_move_an_answer_further(
        tmp_path, monkeypatch):
    from perfmodel.settings import get_settings

    assert fleet_priors_from(get_settings()) == FleetPriors()  # the defaults, unless set
    monkeypatch.setenv("PERFMODEL_FLEET_JOB_PRIOR", "0.15")
    monkeypatch.setenv("PERFMODEL_FLEET_CHIP_PRIOR", "0.8")
    tight = EngineConfig.from_settings(get_settings())  # the service's settings extend these
    assert tight.fleet_priors == FleetPriors(job=0.15, chip=0.8) == fleet_priors_from(get_settings())
    factors = []
    for name, config in (("default", EngineConfig()), ("tight", tight)):
        engine = _engine(f"sqlite:///{tmp_path / (name + '.db')}", config)
        observed = engine.register(_job(32, "resnet18"))[0].key
        raw = engine.predict(observed, _placement("t4", 1, 32))["uncalibrated_throughput_samples_per_s"]
        engine.observe(observed, _placement("t4", 1, 32), raw * 0.7)
        asked = engine.register(_job(64, "vgg11"))[0].key
        answer = engine.predict(asked, _placement("t4", 1, 64))
        assert answer["calibration"]["level"] == "accelerator"
        factors.append(answer["calibration_factor"])
    # one other job at 0.7x the model: the default priors move the next about half-way, the tight ones (a job's
    # own error thought smaller, a chip's larger) most of it; neither past what was observed
    assert 0.7 < factors[1] < factors[0] < 1.0
    assert 0.7 ** 0.7 < factors[0] < 0.7 ** 0.4 and factors[1] < 0.7 ** 0.75
    monkeypatch.setenv("PERFMODEL_FLEET_JOB_PRIOR", "0")
    with pytest.raises(ValidationError, match="fleet_job_prior"):
        get_settings()
