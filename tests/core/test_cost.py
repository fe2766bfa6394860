"""The analytic cost formulas (perfmodel.core.cost): roofline and α-β invariants, on numbers and on arrays."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.core import cost

RNG = np.random.default_rng(7)
FLOPS = 10 ** RNG.uniform(3, 15, 500)
BYTES = 10 ** RNG.uniform(3, 12, 500)
PEAK_GFLOPS = 10 ** RNG.uniform(2, 6, 500)
BANDWIDTH_GBPS = 10 ** RNG.uniform(1, 3.5, 500)
SIZES = 10 ** RNG.uniform(2, 10, 500)


def test_roofline_is_the_max_of_its_two_terms_and_never_below_either():
    compute = cost.compute_ms(FLOPS, PEAK_GFLOPS)
    memory = cost.memory_ms(BYTES, BANDWIDTH_GBPS)
    roof = cost.roofline_ms(FLOPS, BYTES, PEAK_GFLOPS, BANDWIDTH_GBPS)
    np.testing.assert_array_equal(roof, np.maximum(compute, memory))
    assert np.all(roof >= compute) and np.all(roof >= memory)
    # units: 1 TFLOP at 1000 GFLOP/s is one second; 1 GB at 1 GB/s too
    assert cost.compute_ms(1e12, 1000.0) == pytest.approx(1000.0)
    assert cost.memory_ms(1e9, 1.0) == pytest.approx(1000.0)


def test_the_ridge_point_separates_memory_bound_from_compute_bound():
    intensity = cost.arithmetic_intensity(FLOPS, BYTES)
    ridge = cost.ridge_point(PEAK_GFLOPS, BANDWIDTH_GBPS)
    memory_bound = cost.memory_ms(BYTES, BANDWIDTH_GBPS) > cost.compute_ms(FLOPS, PEAK_GFLOPS)
    clear = np.abs(np.log(intensity / ridge)) > 1e-9  # away from the ridge itself (float ties)
    np.testing.assert_array_equal(memory_bound[clear], (intensity < ridge)[clear])


def test_more_peak_or_bandwidth_is_never_slower():
    base = cost.roofline_ms(FLOPS, BYTES, PEAK_GFLOPS, BANDWIDTH_GBPS)
    assert np.all(cost.roofline_ms(FLOPS, BYTES, PEAK_GFLOPS * 2, BANDWIDTH_GBPS) <= base)
    assert np.all(cost.roofline_ms(FLOPS, BYTES, PEAK_GFLOPS, BANDWIDTH_GBPS * 2) <= base)


def test_numbers_in_numbers_out():
    roof = cost.roofline_ms(2e9, 1e6, 1000.0, 100.0)
    assert isinstance(roof, float) and roof == pytest.approx(2.0)
    assert isinstance(cost.maximum(1.0, 2.0), float) and isinstance(cost.maximum(np.ones(2), 2.0), np.ndarray)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8, 64])
def test_ring_all_reduce_moves_2_p_minus_1_over_p_of_the_buffer(ranks):
    a, b = cost.collective_coefficients("ring", SIZES, ranks)
    np.testing.assert_allclose(b, 2 * (ranks - 1) / ranks * SIZES, rtol=1e-15)
    np.testing.assert_allclose(b, cost.ring_allreduce_bytes(SIZES, ranks), rtol=1e-15)
    assert np.all(a == 2 * (ranks - 1))
    # an all-reduce is a reduce-scatter then an all-gather
    rs = cost.collective_ms("reduce_scatter", SIZES, ranks, 0.01, 1e-9)
    ag = cost.collective_ms("allgather", SIZES, ranks, 0.01, 1e-9)
    np.testing.assert_allclose(cost.collective_ms("ring", SIZES, ranks, 0.01, 1e-9), rs + ag, rtol=1e-12)


@pytest.mark.parametrize("algorithm", cost.COLLECTIVES)
def test_a_faster_link_is_never_slower_and_one_rank_sends_nothing(algorithm):
    for ranks in (2, 4, 16):
        slow = cost.collective_ms(algorithm, SIZES, ranks, 0.02, 2e-9)
        assert np.all(cost.collective_ms(algorithm, SIZES, ranks, 0.02, 1e-9) <= slow)
        assert np.all(cost.collective_ms(algorithm, SIZES, ranks, 0.01, 2e-9) <= slow)
    if algorithm != "send_recv":
        assert np.all(cost.collective_ms(algorithm, SIZES, 1, 0.02, 2e-9) == 0)


def test_unknown_algorithm_and_zero_ranks_are_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        cost.collective_coefficients("butterfly", 1.0, 2)
    with pytest.raises(ValueError, match=">= 1"):
        cost.collective_coefficients("ring", 1.0, 0)


def test_hierarchical_reduce_scatter_is_the_flat_ring_on_one_node_and_over_nodes_alone():
    alpha_i, beta_i, alpha_o, beta_o = 0.005, 1e-9, 0.02, 1e-8
    for ranks in (2, 4, 8):
        one_node = cost.hierarchical_reduce_scatter_ms(SIZES, ranks, 1, alpha_i, beta_i, alpha_o, beta_o)
        np.testing.assert_allclose(one_node, cost.collective_ms("reduce_scatter", SIZES, ranks, alpha_i, beta_i),
                                   rtol=1e-12)
        one_per_node = cost.hierarchical_reduce_scatter_ms(SIZES, ranks, ranks, alpha_i, beta_i, alpha_o, beta_o)
        np.testing.assert_allclose(one_per_node,
                                   cost.collective_ms("reduce_scatter", SIZES, ranks, alpha_o, beta_o), rtol=1e-12)
        np.testing.assert_allclose(cost.hierarchical_allreduce_ms(SIZES, ranks, 1, alpha_i, beta_i, alpha_o, beta_o),
                                   cost.collective_ms("ring", SIZES, ranks, alpha_i, beta_i), rtol=1e-12)
        np.testing.assert_allclose(cost.hierarchical_all_to_all_ms(SIZES, ranks, 1, alpha_i, beta_i, alpha_o, beta_o),
                                   cost.collective_ms("all_to_all", SIZES, ranks, alpha_i, beta_i), rtol=1e-12)


def test_more_rails_are_never_slower_than_one_nic_and_never_faster_than_one_per_stream():
    rail_beta = 8e-9  # one 100 Gb/s NIC at full rate, ms per byte
    for devices in (1, 2, 4, 8):
        one_nic = cost.hierarchical_allreduce_ms(SIZES, 2 * devices, 2, 0.005, 1e-9, 0.02,
                                                 cost.stream_beta(cost.node_beta(rail_beta, 1, devices), devices))
        previous = one_nic
        for rails in (1, 2, 4, 8, 16):
            shard_beta = cost.stream_beta(cost.node_beta(rail_beta, rails, devices), devices)
            assert shard_beta >= rail_beta  # a stream never gets more than one NIC
            with_rails = cost.hierarchical_allreduce_ms(SIZES, 2 * devices, 2, 0.005, 1e-9, 0.02, shard_beta)
            assert np.all(with_rails <= one_nic * (1 + 1e-12))
            assert np.all(with_rails <= previous * (1 + 1e-12))
            previous = with_rails
        # rails beyond the node's streams buy nothing
        assert cost.node_beta(rail_beta, 16, devices) == cost.node_beta(rail_beta, devices, devices)


def test_send_is_one_message():
    assert cost.send_ms(1e6, 0.01, 1e-8) == pytest.approx(0.01 + 0.01)
    np.testing.assert_allclose(cost.send_ms(SIZES, 0.01, 1e-8), cost.collective_ms("send_recv", SIZES, 2, 0.01, 1e-8))
