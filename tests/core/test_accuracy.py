import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.core.accuracy import ape_pct, throughput_ape

steps = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
batches = st.integers(min_value=1, max_value=1 << 20)


def test_a_step_predicted_twice_too_fast_is_a_throughput_twice_too_high():
    assert throughput_ape(50.0, 100.0) == pytest.approx(1.0)  # 100 %, where the step time is 50 % off
    assert throughput_ape(200.0, 100.0) == pytest.approx(0.5)
    assert throughput_ape(100.0, 100.0) == 0.0


@given(predicted_ms=steps, measured_ms=steps, batch=batches)
def test_the_throughput_ape_is_the_ape_of_the_samples_per_second_the_steps_imply(predicted_ms, measured_ms, batch):
    predicted_rate, measured_rate = batch / predicted_ms * 1e3, batch / measured_ms * 1e3
    assert throughput_ape(predicted_ms, measured_ms) * 100 == pytest.approx(
        float(ape_pct(predicted_rate, measured_rate)), rel=1e-9, abs=1e-9)


@given(predicted_ms=steps, measured_ms=steps)
def test_an_optimistic_answer_is_never_scored_lower_on_throughput_than_on_step_time(predicted_ms, measured_ms):
    on_time = abs(predicted_ms / measured_ms - 1.0)
    if predicted_ms <= measured_ms:
        assert throughput_ape(predicted_ms, measured_ms) >= on_time - 1e-12
    else:
        assert throughput_ape(predicted_ms, measured_ms) <= on_time + 1e-12


def test_it_takes_arrays():
    np.testing.assert_allclose(throughput_ape([50.0, 200.0], [100.0, 100.0]), [1.0, 0.5])
