"""The placement model's invariants, on random jobs and placements (no predictor needed)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from perfmodel.placement.iteration import (
    ComputeArrays,
    IterationParams,
    PlacementArrays,
    ShardCompute,
    ddp_last_bucket_bytes,
    expected_max_normal,
    iteration_breakdown,
    load_params,
    replica_jitter,
)

RNG = np.random.default_rng(7)
N = 400
PARAMS = [IterationParams(), load_params(), IterationParams(dp_overlap=1.0, multi_device_overhead_ms=3.0,
                                                            tp_sync_ms=0.1, layer_overhead_ms=1.0, dp_jitter=0.2)]


def computes(n: int = N, *, batch_scale: np.ndarray | None = None, params_scale: float = 1.0) -> ComputeArrays:
    """Random jobs; compute affine in the micro-batch (a fixed part + a part per sample), as real kernels are."""
    scale = np.ones(n) if batch_scale is None else batch_scale
    fixed = RNG.uniform(0.1, 5, n)
    per_sample = RNG.uniform(1, 100, n)
    fwd = fixed + per_sample * scale
    return ComputeArrays(forward_ms=fwd, backward_ms=2 * fwd, optimizer_ms=RNG.uniform(0, 5, n),
                         overhead_ms=RNG.uniform(0, 2, n), params=RNG.uniform(1e6, 1e9, n) * params_scale,
                         gradient_bytes_per_param=np.full(n, 4.0), layers=RNG.integers(1, 48, n).astype(float),
                         layer_activation_bytes=RNG.uniform(1e5, 1e8, n) * scale,
                         last_bucket_bytes=RNG.choice([0.0, 1.0], n) * RNG.uniform(1e6, 2e9, n) * params_scale)


def placements(n: int = N, *, data: np.ndarray, nodes: np.ndarray, tensor=None, pipeline=None,
               micro_batches=None) -> PlacementArrays:
    ones = np.ones(n)
    return PlacementArrays(tensor=ones if tensor is None else tensor, pipeline=ones if pipeline is None else pipeline,
                           data=data.astype(float), micro_batches=ones if micro_batches is None else micro_batches,
                           zero_stage=np.zeros(n), checkpointing=np.zeros(n), nodes=nodes.astype(float),
                           intra_alpha_ms=np.full(n, 0.005), intra_beta_ms_per_byte=np.full(n, 1e-8),
                           inter_alpha_ms=np.full(n, 0.02), inter_beta_ms_per_byte=np.full(n, 1e-7))


def with_compute(c: ComputeArrays, **changes: np.ndarray) -> ComputeArrays:
    return ComputeArrays(**{**vars(c), **changes})


@pytest.mark.parametrize("params", PARAMS)
def test_the_iteration_is_the_explicit_sum_of_its_parts(params):
    c = computes()
    p = placements(data=RNG.integers(1, 9, N), nodes=np.ones(N))
    out = iteration_breakdown(c, p, params)
    parts = ["forward", "backward", "optimizer", "communication", "pipeline_bubble", "overhead"]
    np.testing.assert_allclose(out["iter_time_ms"], sum(out[k] for k in parts))
    np.testing.assert_allclose(out["communication"], out["tensor_parallel_ms"] + out["pipeline_p2p_ms"]
                               + out["data_parallel_ms"] + out["data_parallel_wait_ms"])
    assert all(np.all(out[k] >= 0) for k in parts)


def test_the_wait_for_the_slowest_replica_grows_with_the_replicas_and_is_its_share_of_compute():
    c = computes(6)
    jitter = IterationParams(dp_jitter=0.05)
    data = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 64.0])
    out = iteration_breakdown(c, placements(6, data=data, nodes=np.ones(6)), jitter)
    wait = out["data_parallel_wait_ms"]
    assert wait[0] == 0 and np.all(np.diff(wait / (out["forward"] + out["backward"])) > 0)
    np.testing.assert_allclose(wait, 0.05 * expected_max_normal(data) * (out["forward"] + out["backward"]))
    assert expected_max_normal(2.0) == pytest.approx(0.564, abs=0.03)  # E[max of 2] = 1/sqrt(pi)
    assert expected_max_normal(8.0) == pytest.approx(1.424, abs=0.03) and expected_max_normal(1.0) == 0.0
    without = iteration_breakdown(c, placements(6, data=data, nodes=np.ones(6)), IterationParams())
    np.testing.assert_allclose(out["iter_time_ms"], without["iter_time_ms"] + wait)
    one = iteration_breakdown(with_compute(c, gradient_bytes_per_param=np.zeros(6)),  # inference: nothing to wait for
                              placements(6, data=data, nodes=np.ones(6)), jitter)
    assert np.all(one["data_parallel_wait_ms"] == 0)


def test_each_kind_of_job_waits_by_its_own_replica_jitter():
    """A job whose steps vary waits by `dp_jitter_varying`, one whose steps do not by `dp_jitter_steady`, one of
    unknown kind (-1, the default) by `dp_jitter`; a kind whose jitter is unset falls back to `dp_jitter`. One pair
    as floats answers as the same pair in an array."""
    params = IterationParams(dp_jitter=0.09, dp_jitter_steady=0.01, dp_jitter_varying=0.15)
    c = with_compute(computes(3), steps_vary=np.array([1.0, 0.0, -1.0]))
    out = iteration_breakdown(c, placements(3, data=np.full(3, 8.0), nodes=np.ones(3)), params)
    share = out["data_parallel_wait_ms"] / (out["forward"] + out["backward"]) / expected_max_normal(8.0)
    np.testing.assert_allclose(share, [0.15, 0.01, 0.09])
    assert replica_jitter(np.array([1.0, 0.0, -1.0]), IterationParams(dp_jitter=0.09)).tolist() == [0.09] * 3
    assert [replica_jitter(v, params) for v in (1.0, 0.0, -1.0)] == [0.15, 0.01, 0.09]
    one = ComputeArrays(**{f.name: float(np.broadcast_to(getattr(c, f.name), (3,))[0]) for f in fields(ComputeArrays)})
    p = placements(1, data=np.full(1, 8.0), nodes=np.ones(1))
    single = iteration_breakdown(one, PlacementArrays(**{f.name: float(np.broadcast_to(getattr(p, f.name), (1,))[0])
                                                          for f in fields(PlacementArrays)}), params)
    assert single["data_parallel_wait_ms"] == pytest.approx(out["data_parallel_wait_ms"][0])


def test_one_device_is_the_device_compute():
    c = computes()
    p = placements(data=np.ones(N), nodes=np.ones(N))
    out = iteration_breakdown(c, p, load_params())
    np.testing.assert_allclose(out["iter_time_ms"], c.forward_ms + c.backward_ms + c.optimizer_ms + c.overhead_ms)
    assert np.all(out["communication"] == 0)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("devices", [2, 4, 8, 16])
def test_more_devices_never_beat_linear_scaling(params, devices):
    """Strong scaling: the global batch split over `devices` replicas is never more than `devices` times faster;
    weak scaling: the same per-device batch on more devices never iterates faster than on one."""
    for per_node in (1, 2, 4, 8):
        if devices % per_node:
            continue
        nodes = np.full(N, devices // per_node)
        state = np.random.default_rng(11)  # the same jobs, whole (`full`) and with 1/devices of the batch
        fixed, per_sample = state.uniform(0.1, 5, N), state.uniform(1, 100, N)
        base = dict(optimizer_ms=np.zeros(N), overhead_ms=np.zeros(N), params=np.full(N, 3e8),
                    gradient_bytes_per_param=np.full(N, 4.0), layers=np.full(N, 12.0),
                    layer_activation_bytes=np.full(N, 1e6))
        full = ComputeArrays(forward_ms=fixed + per_sample, backward_ms=2 * (fixed + per_sample), **base)
        shard = ComputeArrays(forward_ms=fixed + per_sample / devices, backward_ms=2 * (fixed + per_sample / devices),
                              **base)
        t1 = iteration_breakdown(full, placements(data=np.ones(N), nodes=np.ones(N)), params)["iter_time_ms"]
        tn = iteration_breakdown(shard, placements(data=np.full(N, devices), nodes=nodes), params)["iter_time_ms"]
        assert np.all(tn * devices >= t1 - 1e-9)  # throughput(n) <= n x throughput(1)
        weak = iteration_breakdown(full, placements(data=np.full(N, devices), nodes=nodes), params)["iter_time_ms"]
        assert np.all(weak >= t1 - 1e-9)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("devices,per_node", [(2, 1), (4, 1), (4, 2), (8, 2), (8, 4), (16, 4), (16, 8)])
def test_a_spread_placement_is_never_faster_than_a_consolidated_one(params, devices, per_node):
    c = computes()
    consolidated = iteration_breakdown(c, placements(data=np.full(N, devices), nodes=np.ones(N)), params)
    spread = iteration_breakdown(c, placements(data=np.full(N, devices), nodes=np.full(N, devices // per_node)),
                                 params)
    assert np.all(spread["iter_time_ms"] >= consolidated["iter_time_ms"] - 1e-9)


@pytest.mark.parametrize("params", PARAMS)
def test_a_bigger_all_reduce_is_never_cheaper(params):
    c = computes()
    for nodes in (1, 2, 4):
        p = placements(data=np.full(N, 8), nodes=np.full(N, nodes))
        small = iteration_breakdown(c, p, params)
        big = iteration_breakdown(with_compute(c, params=c.params * 3), p, params)
        assert np.all(big["data_parallel_ms"] >= small["data_parallel_ms"] - 1e-12)
        assert np.all(big["iter_time_ms"] >= small["iter_time_ms"] - 1e-9)


def test_pipeline_bubble_follows_1f1b():
    c = computes()
    m = np.full(N, 8.0)
    p = placements(data=np.ones(N), nodes=np.ones(N), pipeline=np.full(N, 4.0), micro_batches=m)
    out = iteration_breakdown(c, p, IterationParams())
    stage = (c.forward_ms + c.backward_ms) / 4
    host = c.overhead_ms / 4  # a stage exposes at least its share of one device's host dispatch
    np.testing.assert_allclose(out["pipeline_bubble"], 3 * (stage + host))
    np.testing.assert_allclose(out["forward"] + out["backward"], 8 * stage)
    np.testing.assert_allclose(out["overhead"], 8 * host)


def test_shard_compute_stacks_into_arrays():
    one = ShardCompute(1.0, 2.0, 0.5, 0.1, 1000, 4, 12, 4096)
    arrays = ComputeArrays.stack([one, one])
    assert arrays.params.tolist() == [1000, 1000] and arrays.layers.tolist() == [12, 12]


def test_a_pair_made_from_its_floats_equals_the_dataclass_made_field_by_field():
    from dataclasses import fields

    values = tuple(float(i + 1) for i in range(len(fields(PlacementArrays))))
    made = PlacementArrays.of_floats(values)
    assert made == PlacementArrays(*values) and vars(made) == vars(PlacementArrays(*values))
    with pytest.raises(ValueError, match="fields of PlacementArrays"):
        PlacementArrays.of_floats(values[:-1])


def test_ddps_last_buckets_hold_the_models_first_parameters():
    """DDP fills buckets from the last parameters (1 MiB first, 25 MiB after, the crossing tensor included): what it
    all-reduces after backward ends is its last buckets, a large input embedding included whole."""
    mib = 2**20
    # a language model: a 125 MiB embedding first, then 24 layers of 12 MiB each, a small head
    lm = [125 * mib // 4] + [12 * mib // 4] * 24 + [mib // 8]
    tail = ddp_last_bucket_bytes(lm, 4)
    assert 125 * mib <= tail <= 125 * mib + 2 * 25 * mib
    # a ResNet: small first layers, so the tail is about one bucket
    resnet = [9408, 128] + [2 * mib // 4] * 40 + [8 * mib // 4]
    assert 25 * mib <= ddp_last_bucket_bytes(resnet, 4) <= 2 * 25 * mib + 2 * mib
    # never more than all the gradients, nothing without parameters, and it scales with the gradient's bytes
    assert ddp_last_bucket_bytes(lm, 4) <= sum(lm) * 4
    assert ddp_last_bucket_bytes([0, 0], 4) == 0
    assert ddp_last_bucket_bytes(lm, 2) <= ddp_last_bucket_bytes(lm, 4)


def test_a_larger_tail_bucket_exposes_more_data_parallel_communication_never_less():
    c = with_compute(computes(), last_bucket_bytes=np.zeros(N))  # unknown: one bucket of DDP's default cap
    p = placements(data=np.full(N, 8), nodes=np.ones(N))
    base = iteration_breakdown(c, p, load_params())
    bigger = iteration_breakdown(with_compute(c, last_bucket_bytes=np.full(N, 5e8)), p, load_params())
    assert np.all(bigger["communication"] >= base["communication"] - 1e-9)
    assert np.any(bigger["communication"] > base["communication"])
