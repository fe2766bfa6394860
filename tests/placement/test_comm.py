"""The α-β collective model: formulas, invariants, fitting, the shipped link table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodel.core.accuracy import mape_pct
from perfmodel.hardware.catalog import get_accelerator
from perfmodel.placement.comm import (
    PCIE_EFFECTIVE_PER_DIR_GB_S,
    PCIE_X16_PER_DIR_GB_S,
    LinkModel,
    allgather_ms,
    allreduce_ms,
    fit_link,
    hierarchical_allreduce_ms,
    host_shared_beta,
    host_staged_link,
    link_for_accelerator,
    load_link_table,
    load_links,
    network_link,
    network_rails,
    node_network_link,
    pcie_effective_per_dir_gb_s,
    pcie_p2p_link,
    peer_to_peer_mode,
    predict,
    reduce_scatter_ms,
    ring_allreduce_ms,
    send_recv_ms,
    tree_allreduce_ms,
)
from perfmodel.settings import get_settings

DATASETS = get_settings().datasets_dir
VIDUR = DATASETS / "vidur"

LINK = LinkModel(alpha_ms=0.01, beta_ms_per_byte=1e-8, name="test", source="hand")  # 10 µs, 100 GB/s
SIZES = np.logspace(3, 10, 40)


def test_formulas_by_hand():
    s = 1_000_000
    assert send_recv_ms(LINK, s) == pytest.approx(0.01 + 0.01)
    # ring, p = 4: 6 α + 1.5 S β
    assert ring_allreduce_ms(LINK, s, 4) == pytest.approx(6 * 0.01 + 1.5 * 0.01)
    # tree, p = 8: 2·3 α + 2 S β; p = 5 rounds log2 up (3)
    assert tree_allreduce_ms(LINK, s, 8) == pytest.approx(6 * 0.01 + 0.02)
    assert tree_allreduce_ms(LINK, s, 5) == pytest.approx(6 * 0.01 + 0.02)
    assert allgather_ms(LINK, s, 4) == pytest.approx(3 * 0.01 + 0.75 * 0.01)
    assert reduce_scatter_ms(LINK, s, 4) == allgather_ms(LINK, s, 4)
    assert allreduce_ms(LINK, s, 4, "best") == pytest.approx(min(ring_allreduce_ms(LINK, s, 4),
                                                                 tree_allreduce_ms(LINK, s, 4)))
    # one rank: nothing to do
    assert ring_allreduce_ms(LINK, s, 1) == 0 and tree_allreduce_ms(LINK, s, 1) == 0
    # hierarchical 2 nodes x 4: RS + AG on 4 (2·(3α + 0.75 S βi)) + ring of S/4 over 2 nodes (2 αo + S/4 βo)
    inter = LinkModel(alpha_ms=0.05, beta_ms_per_byte=1e-7, name="net", source="hand")
    expected = 2 * (3 * 0.01 + 0.75 * s * 1e-8) + (2 * 0.05 + s / 4 * 1e-7)
    assert hierarchical_allreduce_ms(LINK, inter, s, 2, 4) == pytest.approx(expected)
    # one shared NIC per node: the whole S crosses it
    assert hierarchical_allreduce_ms(LINK, inter, s, 2, 4, rails=1) == pytest.approx(
        2 * (3 * 0.01 + 0.75 * s * 1e-8) + (2 * 0.05 + s * 1e-7))
    # degenerate shapes reduce to the ring
    assert hierarchical_allreduce_ms(LINK, inter, s, 1, 8) == pytest.approx(ring_allreduce_ms(LINK, s, 8))
    assert hierarchical_allreduce_ms(LINK, inter, s, 8, 1) == pytest.approx(ring_allreduce_ms(inter, s, 8))


def test_vectorised():
    out = ring_allreduce_ms(LINK, SIZES[:, None], np.array([2, 4, 8])[None, :])
    assert out.shape == (len(SIZES), 3)
    assert out[5, 1] == pytest.approx(float(ring_allreduce_ms(LINK, SIZES[5], 4)))


def test_bandwidth_units():
    assert LINK.bandwidth_per_dir_gb_s == pytest.approx(100.0)
    assert LINK.alpha_us == pytest.approx(10.0)
    with pytest.raises(ValueError):
        LinkModel(alpha_ms=-1, beta_ms_per_byte=1e-9, name="x", source="y")


@pytest.mark.parametrize("algorithm", ["ring", "tree", "best"])
@pytest.mark.parametrize("p", [2, 3, 4, 8, 16, 64])
def test_bigger_allreduce_never_cheaper(algorithm, p):
    times = allreduce_ms(LINK, SIZES, p, algorithm)
    assert np.all(np.diff(times) >= 0)


def test_more_ranks_never_cheaper_ring():
    ps = np.arange(1, 129)
    for s in (0, 1e3, 1e6, 1e9):
        times = ring_allreduce_ms(LINK, s, ps)
        assert np.all(np.diff(times) >= 0)
        alpha_part = ring_allreduce_ms(LinkModel(LINK.alpha_ms, 0.0, "a", "a"), s, ps)
        assert np.all(np.diff(alpha_part) > 0)


def test_hierarchical_not_faster_than_one_node():
    """With β_o ≥ β_i the β part is never below the flat ring's over n·g ranks on the intra link; in total it
    is never faster while α_o(n-1) + α_i(g-1) ≥ α_i(ng-1) (module docstring)."""
    intra = LINK
    for n in (2, 3, 4, 8):
        for g in (1, 2, 4, 8):
            p = n * g
            for beta_ratio in (1.0, 1.5, 10.0):
                beta_only_in = LinkModel(0.0, intra.beta_ms_per_byte, "i", "t")
                beta_only_out = LinkModel(0.0, intra.beta_ms_per_byte * beta_ratio, "o", "t")
                hier = hierarchical_allreduce_ms(beta_only_in, beta_only_out, SIZES, n, g)
                flat = ring_allreduce_ms(beta_only_in, SIZES, p)
                assert np.all(hier >= flat * (1 - 1e-12))
                # with a network α large enough, the whole time too
                alpha_out = intra.alpha_ms * max(1.0, (p - 1 - (g - 1)) / (n - 1))
                inter = LinkModel(alpha_out, intra.beta_ms_per_byte * beta_ratio, "o", "t")
                hier = hierarchical_allreduce_ms(intra, inter, SIZES, n, g)
                flat = ring_allreduce_ms(intra, SIZES, p)
                assert np.all(hier >= flat * (1 - 1e-12))
                # and with equal links it is the flat ring's β with fewer α steps
                if beta_ratio == 1.0:
                    same = hierarchical_allreduce_ms(beta_only_in, beta_only_in, SIZES, n, g)
                    np.testing.assert_allclose(same, ring_allreduce_ms(beta_only_in, SIZES, p), rtol=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "send_recv", "allgather"])
def test_fit_recovers_synthetic(algorithm):
    truth = LinkModel(alpha_ms=0.0123, beta_ms_per_byte=4.2e-9, name="t", source="t")
    s = np.repeat(np.logspace(3, 9, 30), 3)
    p = np.tile([2, 4, 8], 30)
    t = predict(truth, s, p, algorithm)
    fitted = fit_link(s, p, t, algorithm)
    assert fitted.alpha_ms == pytest.approx(truth.alpha_ms, rel=1e-9)
    assert fitted.beta_ms_per_byte == pytest.approx(truth.beta_ms_per_byte, rel=1e-9)
    assert mape_pct(predict(fitted, s, p, algorithm), t) < 1e-6


def test_fit_mixed_algorithms_and_nonnegative():
    truth = LinkModel(alpha_ms=0.002, beta_ms_per_byte=1e-8, name="t", source="t")
    s = np.logspace(3, 8, 20)
    algos = np.array(["ring", "send_recv"] * 10)
    t = predict(truth, s, 4, algos)
    fitted = fit_link(s, 4, t, algos)
    assert fitted.alpha_ms == pytest.approx(0.002) and fitted.beta_ms_per_byte == pytest.approx(1e-8)
    # time falling with size would need β < 0: clamped to 0, α carries it
    clamped = fit_link([1e3, 1e6, 1e9], 2, [3.0, 2.0, 1.0], "send_recv")
    assert clamped.beta_ms_per_byte == 0 and clamped.alpha_ms > 0
    with pytest.raises(ValueError):
        fit_link([1e3], 2, [0.0])


def test_links_json_shipped():
    table = load_link_table()
    links = load_links()
    assert len(links) == len(table) >= 5
    for entry in table:
        assert entry["rows"] > 0 and entry["source"] and entry["fit_mape_pct"] >= 0
        link = links[entry["name"]]
        assert link.beta_ms_per_byte > 0 and 0.1 < link.bandwidth_per_dir_gb_s < 1000
    assert {"nvswitch-a100-dgx", "net-a100-dgx", "nvswitch-a100-vtrain"} <= links.keys()
    # the DGX NVSwitch is far faster than the network between DGX nodes
    assert links["nvswitch-a100-dgx"].bandwidth_per_dir_gb_s > 10 * links["net-a100-dgx"].bandwidth_per_dir_gb_s


def test_link_from_spec():
    table = load_link_table()
    a100 = link_for_accelerator(get_accelerator("a100-sxm4-80gb"), table)
    h100 = link_for_accelerator(get_accelerator("h100-sxm5"), table)
    t4 = link_for_accelerator(get_accelerator("t4"), table)
    assert h100.bandwidth_per_dir_gb_s > a100.bandwidth_per_dir_gb_s > t4.bandwidth_per_dir_gb_s
    assert 50 < a100.bandwidth_per_dir_gb_s < 300 and 2 < t4.bandwidth_per_dir_gb_s < 15.75
    # the rule: β = 1/(nominal per direction × efficiency)
    fixed = link_for_accelerator(get_accelerator("a100-sxm4-80gb"), table, efficiency=0.5)
    assert fixed.bandwidth_per_dir_gb_s == pytest.approx(150.0)
    # no table: documented defaults
    assert link_for_accelerator(get_accelerator("t4"), []).bandwidth_per_dir_gb_s == pytest.approx(15.75 * 0.7)
    net = network_link(100, 5, efficiency=1.0)
    assert net.bandwidth_per_dir_gb_s == pytest.approx(12.5) and net.alpha_us == pytest.approx(5)
    assert math.isclose(float(send_recv_ms(net, 12.5e6)), 0.005 + 1.0)


@pytest.mark.skipif(not (VIDUR / "data" / "profiling" / "network").is_dir(),
                    reason=f"vidur network profiles not found under {VIDUR} (public dataset, not in the repo)")
def test_fit_on_vidur_rows():
    from perfmodel.importers.vidur import import_vidur

    files = ["data/profiling/network/a100_pairwise_nvlink/all_reduce.csv.gz",
             "data/profiling/network/a100_dgx/send_recv.csv.gz"]
    recs = list(import_vidur(VIDUR, files=files))
    pair = [r for r in recs if r.op_class == "allreduce" and r.world_size == 2]
    net = [r for r in recs if r.op_class == "send_recv" and r.nodes == 2]
    assert len(pair) > 100 and len(net) > 100
    for rows, algo, bound in ((pair, "ring", 10.0), (net, "send_recv", 5.0)):
        s = [r.message_bytes for r in rows]
        p = [r.world_size for r in rows]
        t = [r.latency_ms for r in rows]
        link = fit_link(s, p, t, algo)
        assert mape_pct(predict(link, s, p, algo), t) < bound
    # NVLink-bridged pair: 100-300 GB/s; DGX inter-node send/recv: 1-25 GB/s
    assert 100 < fit_link([r.message_bytes for r in pair], 2, [r.latency_ms for r in pair]).bandwidth_per_dir_gb_s < 300


# --- GPUs without peer-to-peer, the node's network ------------------------------------------------------------------

PHANTORA_MEMCPY = DATASETS / "phantora" / "tests" / "perfdb" / "l40s" / "memcpy.csv"


def test_peer_to_peer_comes_from_the_catalog_and_unknown_means_p2p_over_the_named_link():
    h100 = get_accelerator("h100-sxm5")
    assert peer_to_peer_mode(h100.model_copy(update={"peer_to_peer": None})) == "nvlink"
    assert peer_to_peer_mode(get_accelerator("t4").model_copy(update={"peer_to_peer": None})) == "pcie"
    assert peer_to_peer_mode(h100.model_copy(update={"peer_to_peer": "none"})) == "none"
    assert peer_to_peer_mode(get_accelerator("rtx-4090")) == get_accelerator("rtx-4090").peer_to_peer


@pytest.mark.parametrize("gen", [3, 4, 5])
def test_host_staged_transfers_run_at_the_pcie_rate_with_a_staging_latency_and_share_the_host(gen):
    spec = get_accelerator("rtx-4090").model_copy(update={"pcie_gen": gen})
    staged = host_staged_link(spec)
    assert staged.bandwidth_per_dir_gb_s == pytest.approx(PCIE_EFFECTIVE_PER_DIR_GB_S[gen])
    assert 25 <= staged.alpha_us <= 50  # staging, against ~5-10 us peer to peer
    assert staged.bandwidth_per_dir_gb_s < PCIE_X16_PER_DIR_GB_S[gen]  # effective below the x16 line rate
    p2p = pcie_p2p_link(spec)
    assert p2p.alpha_us < staged.alpha_us
    # g GPUs through one host: each gets 1/g of it
    for g in (1, 2, 4, 8):
        assert float(host_shared_beta(staged.beta_ms_per_byte, g)) == pytest.approx(g * staged.beta_ms_per_byte)
    # doubling beyond the table
    assert pcie_effective_per_dir_gb_s(6) == pytest.approx(2 * pcie_effective_per_dir_gb_s(5), rel=0.05)


def test_a_node_never_gets_more_than_its_network_and_one_device_gets_one_rail():
    whole = node_network_link(3200, 5, rails=8, devices=8, efficiency=1.0)
    assert whole.bandwidth_per_dir_gb_s == pytest.approx(400.0)  # 3200 Gb/s = 400 GB/s for the node
    assert node_network_link(3200, 5, rails=8, devices=16,
                             efficiency=1.0).bandwidth_per_dir_gb_s == pytest.approx(400.0)
    assert node_network_link(3200, 5, rails=8, devices=1, efficiency=1.0).bandwidth_per_dir_gb_s == pytest.approx(50.0)
    assert node_network_link(100, 5, devices=4, efficiency=1.0).bandwidth_per_dir_gb_s == pytest.approx(12.5)  # one NIC
    rng = np.random.default_rng(3)
    for gbit, rails, devices in zip(rng.uniform(1, 4000, 50), rng.integers(1, 9, 50), rng.integers(1, 17, 50)):
        link = node_network_link(float(gbit), 5, rails=int(rails), devices=int(devices), efficiency=1.0)
        assert link.bandwidth_per_dir_gb_s <= gbit / 8 * (1 + 1e-12)
        more = node_network_link(float(gbit) * 2, 5, rails=int(rails), devices=int(devices), efficiency=1.0)
        assert more.bandwidth_per_dir_gb_s > link.bandwidth_per_dir_gb_s


@pytest.mark.skipif(not PHANTORA_MEMCPY.is_file(),
                    reason=f"phantora memcpy table not found at {PHANTORA_MEMCPY} (public dataset, not in the repo)")
def test_phantora_l40s_memcpy_checks_the_pcie_gen4_rate():
    """Host<->device copies on an L40S (PCIe gen4) vs size: α-β fit. Measured ~13 GB/s, half the table's pinned
    gen4 rate (pageable copies); never above it, and well above the gen3 figure's half."""
    import pandas as pd

    frame = pd.read_csv(PHANTORA_MEMCPY)
    for kind in ("HostToDevice", "DeviceToHost"):
        rows = frame[(frame.kind == kind) & (frame.nanos > 0)]
        seconds = rows.nanos.to_numpy(float) * 1e-9
        link = fit_link(rows.size_bytes.to_numpy(float), 2, seconds * 1e3, "send_recv", name=kind)
        assert mape_pct(predict(link, rows.size_bytes.to_numpy(float), 2, "send_recv"), seconds * 1e3) < 15
        assert 10 < link.bandwidth_per_dir_gb_s <= PCIE_EFFECTIVE_PER_DIR_GB_S[4] and link.alpha_us < 5


def test_the_rails_a_network_implies():
    assert network_rails(3200, 8) == 8  # 8 x 400 Gb/s, one per GPU
    assert network_rails(400, 8) == 4  # 4 x 100 (DGX-1)
    assert network_rails(100, 8) == 1 and network_rails(10, 4) == 1  # one NIC the GPUs share
    assert network_rails(3200, None) == 1  # devices per node unknown: one pipe
    for gbit in (10, 100, 400, 1600, 3200, 6400):
        for devices in (1, 2, 4, 8):
            rails = network_rails(gbit, devices)
            assert 1 <= rails <= devices and (rails == 1 or gbit / rails >= 100)
