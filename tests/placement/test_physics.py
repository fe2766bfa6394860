"""Physical invariants of the placement model, as properties over seeded random draws: random jobs (compute,
parameters, MoE or dense), GPUs from the catalog (their real links: NVLink, PCIe P2P, host-staged), parallel
layouts (tensor, pipeline, data, expert degrees, ZeRO stage, checkpointing, micro-batches), node layouts and
networks. The compute is a random stub (`ShardCompute`); the links and layouts are what `PlacementPredictor` builds.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from perfmodel.hardware.catalog import load_catalog
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.placement.comm import peer_to_peer_mode
from perfmodel.placement.iteration import (
    ComputeArrays,
    IterationParams,
    PlacementArrays,
    ShardCompute,
    iteration_breakdown,
    load_params,
)
from perfmodel.placement.spec import Parallelism, PlacementSpec
from perfmodel.predictor.placed import placement_links, placement_row

PARTS = ("forward", "backward", "optimizer", "communication", "pipeline_bubble", "overhead")
COMMS = ("tensor_parallel_ms", "expert_parallel_ms", "pipeline_p2p_ms", "data_parallel_ms", "data_parallel_wait_ms")
PARAMS = [IterationParams(), load_params(),
          IterationParams(dp_overlap=1.0, overhead_ms=2.0, multi_device_overhead_ms=3.0, tp_penalty=0.05,
                          tp_sync_ms=0.1, layer_overhead_ms=1.0, compute_scale=0.7, dp_jitter=0.2,
                          dp_jitter_steady=0.01, dp_jitter_varying=0.3)]
DRAWS = 600
CATALOG = load_catalog()
GPUS = sorted(name for name, spec in CATALOG.items() if spec.kind == "gpu")
EPS = 1e-9


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def draw_placement(rng: np.random.Generator, gpu: str) -> PlacementSpec:
    """A random valid placement: a node layout, then tensor (in a node or over whole nodes), pipeline, data and
    expert degrees that fill it."""
    nodes = int(rng.choice([1, 1, 2, 3, 4]))
    if rng.random() < 0.2 and nodes > 1:
        layout = tuple(int(x) for x in rng.choice([1, 2, 4], size=nodes))  # uneven nodes
    else:
        layout = (int(rng.choice([1, 2, 4, 8])),) * nodes
    devices = sum(layout)
    uniform = len(set(layout)) == 1
    tensors = [t for t in divisors(devices) if all(n % t == 0 for n in layout)
               or (uniform and t % layout[0] == 0)]
    t = int(rng.choice(tensors))
    p = int(rng.choice(divisors(devices // t)))
    d = devices // (t * p)
    e = int(rng.choice(divisors(d)))
    m = int(rng.choice([1, 2, 4]))
    network = rng.choice([None, 10.0, 100.0, 400.0, 3200.0])
    return PlacementSpec(
        accelerator=gpu, devices_per_node=layout, global_batch_size=d * m,
        inter_node_bandwidth_gbit_s=None if network is None else float(network),
        inter_node_latency_us=float(rng.choice([0.0, 5.0, 50.0])),
        parallelism=Parallelism(data=d, tensor=t, pipeline=p, expert=e, micro_batches=m,
                                zero_stage=int(rng.integers(0, 4)), activation_checkpointing=bool(rng.random() < .3)))


def draw_computes(rng: np.random.Generator, n: int) -> ComputeArrays:
    """Random jobs: compute of one micro-batch, parameters, blocks; half of them mixture-of-experts."""
    fwd = rng.uniform(0.05, 200, n)
    params = 10 ** rng.uniform(5, 10, n)
    moe = rng.random(n) < 0.5
    return ComputeArrays(
        forward_ms=fwd, backward_ms=fwd * rng.uniform(1.5, 2.5, n), optimizer_ms=rng.uniform(0, 50, n),
        overhead_ms=rng.uniform(0, 5, n), params=params, gradient_bytes_per_param=rng.choice([2.0, 4.0], n),
        layers=rng.integers(1, 96, n).astype(float), layer_activation_bytes=10 ** rng.uniform(3, 9, n),
        moe_layers=np.where(moe, rng.integers(1, 48, n), 0).astype(float),
        moe_dispatch_bytes=np.where(moe, 10 ** rng.uniform(3, 9, n), 0.0),
        expert_params=np.where(moe, params * rng.uniform(0.1, 0.95, n), 0.0),
        host_forward_ms=rng.uniform(0, 20, n), host_backward_ms=rng.uniform(0, 40, n),
        last_bucket_bytes=rng.choice([0.0, 1.0], n) * params * rng.uniform(0.01, 0.5, n),
        steps_vary=rng.choice([-1.0, 0.0, 1.0], n))


def arrays(placements: list[PlacementSpec]) -> PlacementArrays:
    rows = [placement_row(p, placement_links(p, CATALOG[p.accelerator])) for p in placements]
    return PlacementArrays(*np.array(rows, dtype=float).T)


def breakdown(c: ComputeArrays, placements: list[PlacementSpec], params: IterationParams) -> dict[str, np.ndarray]:
    return iteration_breakdown(c, arrays(placements), params)


def edit(spec: PlacementSpec, **parallelism) -> PlacementSpec:
    return spec.model_copy(update={"parallelism": spec.parallelism.model_copy(update=parallelism)})


@pytest.fixture(scope="module")
def draws() -> tuple[ComputeArrays, list[PlacementSpec]]:
    rng = np.random.default_rng(2024)
    placements = [draw_placement(rng, str(rng.choice(GPUS))) for _ in range(DRAWS)]
    return draw_computes(rng, DRAWS), placements


def test_the_draws_cover_the_cases_the_properties_are_about(draws):
    _, placements = draws
    par = [p.parallelism for p in placements]
    modes = {peer_to_peer_mode(CATALOG[p.accelerator]) for p in placements}
    assert modes == {"nvlink", "pcie", "none"}
    assert sum(p.nodes > 1 for p in placements) > DRAWS / 3
    assert any(x.tensor > p.devices_per_node[0] for x, p in zip(par, placements))  # tensor parallel over nodes
    assert {x.zero_stage for x in par} == {0, 1, 2, 3}
    assert sum(x.expert > 1 for x in par) > 30 and sum(x.pipeline > 1 for x in par) > 100


@pytest.mark.parametrize("params", PARAMS)
def test_the_iteration_is_the_sum_of_its_parts(draws, params):
    c, placements = draws
    out = breakdown(c, placements, params)
    np.testing.assert_allclose(out["iter_time_ms"], sum(out[k] for k in PARTS), rtol=1e-12)
    np.testing.assert_allclose(out["communication"], sum(out[k] for k in COMMS), rtol=1e-12)
    for key in PARTS + COMMS:
        assert np.all(np.isfinite(out[key])) and np.all(out[key] >= 0), key


@pytest.mark.parametrize("params", PARAMS)
def test_n_devices_never_beat_n_times_one_device(draws, params):
    """At the same micro-batch (and micro-batches per iteration), a device of a placement with tensor and pipeline
    degrees t, p does at least 1/(t·p) of one device's iteration: throughput(n) <= n × throughput(1), whatever the
    parallelism, ZeRO stage, experts and links."""
    c, placements = draws
    alone = [PlacementSpec(accelerator=p.accelerator, global_batch_size=p.parallelism.micro_batches,
                           parallelism=Parallelism(micro_batches=p.parallelism.micro_batches,
                                                   activation_checkpointing=p.parallelism.activation_checkpointing))
             for p in placements]
    many = breakdown(c, placements, params)
    one = breakdown(c, alone, params)
    split = np.array([p.parallelism.tensor * p.parallelism.pipeline for p in placements], dtype=float)
    assert np.all(many["iter_time_ms"] >= one["iter_time_ms"] / split * (1 - 1e-12))
    devices = np.array([p.devices for p in placements], dtype=float)
    samples = np.array([p.global_batch_size for p in placements], dtype=float)
    single_samples = np.array([p.global_batch_size for p in alone], dtype=float)
    assert np.all(samples / many["iter_time_ms"] <= devices * single_samples / one["iter_time_ms"] * (1 + 1e-12))


@pytest.mark.parametrize("params", PARAMS)
def test_a_spread_placement_is_never_faster_than_the_same_devices_in_one_node(draws, params):
    c, placements = draws
    together = [p.model_copy(update={"devices_per_node": (p.devices,)}) for p in placements]
    spread = breakdown(c, placements, params)
    consolidated = breakdown(c, together, params)
    assert np.all(spread["iter_time_ms"] >= consolidated["iter_time_ms"] * (1 - 1e-12))
    for key in COMMS:
        assert np.all(spread[key] >= consolidated[key] * (1 - 1e-12) - EPS), key


@pytest.mark.parametrize("params", PARAMS)
def test_zero_never_communicates_less_than_plain_data_parallelism(draws, params):
    c, placements = draws
    zero0 = breakdown(c, [edit(p, zero_stage=0) for p in placements], params)
    for stage in (1, 2, 3):
        zero = breakdown(c, [edit(p, zero_stage=stage) for p in placements], params)
        assert np.all(zero["data_parallel_ms"] >= zero0["data_parallel_ms"] * (1 - 1e-12) - EPS), stage
    zero3 = breakdown(c, [edit(p, zero_stage=3) for p in placements], params)
    data = np.array([p.parallelism.data for p in placements])
    assert np.all(zero3["data_parallel_ms"][data > 1] > 0)


@pytest.mark.parametrize("params", PARAMS)
def test_inference_has_no_gradient_communication_and_no_optimizer(draws, params):
    c, placements = draws
    out = breakdown(replace(c, gradient_bytes_per_param=np.zeros(DRAWS)), placements, params)
    assert np.all(out["data_parallel_ms"] == 0) and np.all(out["optimizer"] == 0)
    trained = breakdown(c, placements, params)
    assert np.all(out["communication"] <= trained["communication"])  # forward-only TP, EP, PP traffic
    assert np.all(out["iter_time_ms"] <= trained["iter_time_ms"])


@pytest.mark.parametrize("params", PARAMS)
def test_more_network_bandwidth_or_less_latency_is_never_slower(draws, params):
    c, placements = draws
    base = breakdown(c, placements, params)
    catalog_or_given = [p.inter_node_bandwidth_gbit_s or CATALOG[p.accelerator].node_network_gbit_s or 100.0
                        for p in placements]
    faster = [p.model_copy(update={"inter_node_bandwidth_gbit_s": gbit * 4}) for p, gbit in
              zip(placements, catalog_or_given)]
    closer = [p.model_copy(update={"inter_node_latency_us": p.inter_node_latency_us / 10}) for p in placements]
    for better in (faster, closer):
        out = breakdown(c, better, params)
        assert np.all(out["iter_time_ms"] <= base["iter_time_ms"] * (1 + 1e-12))
    spread = np.array([p.nodes > 1 for p in placements])
    out = breakdown(c, faster, params)
    assert np.any(out["iter_time_ms"][spread] < base["iter_time_ms"][spread])  # the network matters somewhere


@pytest.mark.parametrize("params", PARAMS)
def test_faster_links_anywhere_are_never_slower(draws, params):
    c, placements = draws
    p = arrays(placements)
    base = iteration_breakdown(c, p, params)["iter_time_ms"]
    for name in ("intra_alpha_ms", "intra_beta_ms_per_byte", "inter_alpha_ms", "inter_beta_ms_per_byte"):
        quicker = replace(p, **{name: getattr(p, name) * 0.3})
        assert np.all(iteration_breakdown(c, quicker, params)["iter_time_ms"] <= base * (1 + 1e-12)), name


@pytest.mark.parametrize("params", PARAMS)
def test_expert_parallel_degree_one_is_the_dense_model_exactly(draws, params):
    c, placements = draws
    dense_c = replace(c, moe_layers=np.zeros(DRAWS), moe_dispatch_bytes=np.zeros(DRAWS), expert_params=np.zeros(DRAWS))
    one = [edit(p, expert=1) for p in placements]
    moe = breakdown(c, one, params)
    dense = breakdown(dense_c, one, params)
    for key in PARTS + COMMS + ("iter_time_ms",):
        np.testing.assert_array_equal(moe[key], dense[key])
    with_experts = breakdown(c, placements, params)
    split = np.array([p.parallelism.expert > 1 for p in placements]) & (c.moe_layers > 0)
    assert np.all(with_experts["expert_parallel_ms"][split] > 0)
    assert np.all(with_experts["expert_parallel_ms"][~split] == 0)


def test_one_pair_in_floats_is_the_same_model_as_the_arrays(draws):
    c, placements = draws
    p = arrays(placements)
    out = iteration_breakdown(c, p, PARAMS[2])
    for i in range(0, DRAWS, 7):
        ci = ComputeArrays(**{f.name: float(getattr(c, f.name)[i]) for f in fields(ComputeArrays)})
        pi = PlacementArrays(**{f.name: float(np.asarray(getattr(p, f.name))[i]) for f in fields(PlacementArrays)})
        alone = iteration_breakdown(ci, pi, PARAMS[2])
        for key, value in alone.items():
            assert isinstance(value, float), key
            assert value == pytest.approx(float(out[key][i]), rel=1e-12, abs=1e-12), key


def test_gpus_without_peer_to_peer_scale_worse_and_share_the_host(draws):
    """The same placements on a P2P and on a host-staged copy of each GPU: staging is never faster, and its
    per-GPU bandwidth falls with the devices of the node."""
    c, placements = draws
    staged_catalog = {name: spec.model_copy(update={"peer_to_peer": "none"}) for name, spec in CATALOG.items()}
    p2p_catalog = {name: spec.model_copy(update={"peer_to_peer": "pcie"}) for name, spec in CATALOG.items()}

    def with_catalog(catalog: dict[str, HardwareSpec]) -> dict[str, np.ndarray]:
        rows = [placement_row(p, placement_links(p, catalog[p.accelerator])) for p in placements]
        return iteration_breakdown(c, PlacementArrays(*np.array(rows, dtype=float).T), load_params())

    staged, p2p = with_catalog(staged_catalog), with_catalog(p2p_catalog)
    assert np.all(staged["iter_time_ms"] >= p2p["iter_time_ms"] * (1 - 1e-12))
    one_node = np.array([p.devices > 1 and p.nodes == 1 for p in placements])
    slower = staged["communication"][one_node] > p2p["communication"][one_node]
    assert slower.mean() > 0.95  # the rest: nothing left to communicate but hidden buckets of a tiny model

    # one node of g host-staged GPUs all-reducing the same gradients: the time per byte grows with g (shared host),
    # while with P2P it stays at 2(g-1)/g of one link's
    job = ComputeArrays.stack([ShardCompute(1.0, 2.0, 0.0, 0.0, 10**9, 4, 24, 10**6)])
    def all_reduce(catalog, g):
        spec = PlacementSpec.grid("rtx-4090", per_node=g, global_batch_size=g)
        row = placement_row(spec, placement_links(spec, catalog["rtx-4090"]))
        return iteration_breakdown(job, PlacementArrays(*np.array([row]).T), IterationParams(dp_overlap=0.0))[
            "data_parallel_ms"][0]
    staged_ms = [all_reduce(staged_catalog, g) for g in (2, 4, 8)]
    p2p_ms = [all_reduce(p2p_catalog, g) for g in (2, 4, 8)]
    assert staged_ms[0] < staged_ms[1] < staged_ms[2]
    assert staged_ms[2] / staged_ms[0] > 3  # 2(g-1)/g · g: 7 / 1
    assert p2p_ms[2] / p2p_ms[0] < 2  # 2(g-1)/g: 1.75 / 1


def test_a_placement_naming_the_host_link_is_the_gpu_without_peer_to_peer_and_never_faster(draws):
    """`intra_node_link: host` (NCCL_P2P_DISABLE=1 on any GPU): the same links as a copy of the GPU whose catalog
    says it has no peer-to-peer, and never faster than the GPU's own link."""
    c, placements = draws
    staged_catalog = {name: spec.model_copy(update={"peer_to_peer": "none"}) for name, spec in CATALOG.items()}
    multi = [p for p in placements if CATALOG[p.accelerator].kind == "gpu"]
    host = [p.model_copy(update={"intra_node_link": "host"}) for p in multi]
    for named, p in zip(host, multi):
        assert placement_links(named, CATALOG[p.accelerator]) == placement_links(p, staged_catalog[p.accelerator])
    index = [placements.index(p) for p in multi]
    sub = ComputeArrays(**{f.name: np.asarray(getattr(c, f.name))[index] for f in fields(ComputeArrays)})

    def breakdown(specs: list[PlacementSpec]) -> dict[str, np.ndarray]:
        rows = [placement_row(p, placement_links(p, CATALOG[p.accelerator])) for p in specs]
        return iteration_breakdown(sub, PlacementArrays(*np.array(rows, dtype=float).T), load_params())

    assert np.all(breakdown(host)["iter_time_ms"] >= breakdown(multi)["iter_time_ms"] * (1 - 1e-12))


def test_every_component_has_the_shape_of_the_pairs_even_when_no_pair_uses_it():
    one_job = ComputeArrays.stack([ShardCompute(1.0, 2.0, 0.5, 0.1, 10**6, 4, 12, 4096)])
    jobs = ComputeArrays(**{f.name: np.repeat(np.asarray(getattr(one_job, f.name))[:, None], 3, axis=1)
                            for f in fields(ComputeArrays)})  # (1, 3), as matrix_arrays builds them
    jobs = ComputeArrays(**{k: np.concatenate([v, v]) for k, v in vars(jobs).items()})  # (2 jobs, 3 placements)
    alone = arrays([PlacementSpec(accelerator="t4", global_batch_size=1)] * 3)
    out = iteration_breakdown(jobs, PlacementArrays(**{k: np.asarray(v)[None, :] for k, v in vars(alone).items()}),
                              load_params())
    assert all(np.shape(v) == (2, 3) for v in out.values())
    assert np.all(out["data_parallel_ms"] == 0) and np.all(out["expert_parallel_ms"] == 0)
