"""PlacementPredictor: the shipped models + the placement model, on real zoo graphs."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import Parallelism, PlacementSpec
from perfmodel.predictor.device import DevicePredictor
from perfmodel.predictor.placed import PlacementPredictor


@pytest.fixture(scope="module")
def predictor() -> PlacementPredictor:
    return PlacementPredictor.load()


@pytest.fixture(scope="module")
def spec() -> JobSpec:
    return JobSpec.from_options(zoo="resnet18", batch_size=16)


def test_one_device_predicts_what_the_single_device_model_does(predictor, spec):
    placed = predictor.predict(spec, PlacementSpec(accelerator="t4", global_batch_size=16))
    single = DevicePredictor.load().predict(spec, "t4")
    assert placed.iteration_time_ms == pytest.approx(single.iteration_time_ms, rel=1e-9)
    assert placed.breakdown_ms["communication"] == 0
    assert placed.devices == 1 and placed.fits is True
    assert placed.iteration_time_ms == pytest.approx(sum(placed.breakdown_ms.values()))


def test_data_parallel_adds_communication_and_never_beats_linear_scaling(predictor, spec):
    one = predictor.predict(spec, PlacementSpec(accelerator="t4", global_batch_size=16))
    four = predictor.predict(spec, PlacementSpec.grid("t4", nodes=1, per_node=4, global_batch_size=64))
    spread = predictor.predict(spec, PlacementSpec.grid("t4", nodes=4, per_node=1, global_batch_size=64,
                                                        inter_node_bandwidth_gbps=10))
    assert four.breakdown_ms["communication"] > 0
    assert four.throughput_samples_per_s <= 4 * one.throughput_samples_per_s
    assert spread.throughput_samples_per_s <= four.throughput_samples_per_s
    assert spread.nodes == 4 and spread.devices == 4


def _assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b)
    else:
        assert a == b


def test_the_matrix_equals_one_by_one_predictions(predictor, spec):
    # one pair is evaluated in floats, a matrix in arrays: the same model, so every field must agree
    other = JobSpec.from_options(zoo="mlp-recommender", batch_size=32)
    placements = [PlacementSpec(accelerator="a100", global_batch_size=32),
                  PlacementSpec.grid("v100", nodes=2, per_node=2, global_batch_size=64),
                  PlacementSpec(accelerator="a100", devices_per_node=(4, 4), global_batch_size=64,
                                parallelism=Parallelism(data=2, tensor=2, pipeline=2, micro_batches=4, zero_stage=1,
                                                        activation_checkpointing=True)),
                  PlacementSpec(accelerator="t4", devices_per_node=(2, 2, 2), global_batch_size=48,
                                parallelism=Parallelism(data=6, zero_stage=3))]
    matrix = predictor.predict_matrix([spec, other], placements)
    arrays = predictor.matrix_arrays([spec, other], placements)
    assert arrays["iteration_ms"].shape == (2, 4)
    for i, job in enumerate([spec, other]):
        for j, placement in enumerate(placements):
            alone = predictor.predict(job, placement)
            _assert_same(matrix[i][j].model_dump(), alone.model_dump())
            assert arrays["iteration_ms"][i, j] == pytest.approx(alone.iteration_time_ms)
            assert arrays["throughput_samples_per_s"][i, j] == pytest.approx(alone.throughput_samples_per_s)
            assert arrays["fits"][i, j] == alone.fits
            for part, value in alone.breakdown_ms.items():
                assert arrays[part][i, j] == pytest.approx(value)


def test_memory_shrinks_with_zero_and_tensor_parallelism_and_fits_is_against_the_catalog(predictor):
    job = JobSpec.from_options(zoo="gpt2", batch_size=8, seq_len=256, optimizer="adam")
    plain = predictor.predict(job, PlacementSpec.grid("t4", per_node=4, global_batch_size=32))
    zero = predictor.predict(job, PlacementSpec(accelerator="t4", devices_per_node=(4,), global_batch_size=32,
                                                parallelism=Parallelism(data=4, zero_stage=3)))
    tp = predictor.predict(job, PlacementSpec(accelerator="t4", devices_per_node=(4,), global_batch_size=8,
                                              parallelism=Parallelism(data=1, tensor=4)))
    assert zero.peak_memory_bytes < plain.peak_memory_bytes
    assert tp.peak_memory_bytes < plain.peak_memory_bytes
    assert tp.breakdown_ms["communication"] > 0
    assert plain.memory_capacity_bytes == int(16e9 * 0.95)
    huge = predictor.predict(job.model_copy(update={"batch_size": 512}),
                             PlacementSpec(accelerator="t4", global_batch_size=512))
    assert huge.fits is False and huge.peak_memory_bytes > huge.memory_capacity_bytes


def test_multi_device_cpu_placements_are_refused(predictor, spec):
    from perfmodel.errors import PerfmodelError

    with pytest.raises(PerfmodelError, match="need a GPU"):
        predictor.predict(spec, PlacementSpec.grid("cpu", per_node=2, global_batch_size=32))
    assert np.isfinite(predictor.predict(spec, PlacementSpec(accelerator="cpu", global_batch_size=16))
                       .iteration_time_ms)
