"""The α-β (latency-bandwidth, Hockney) cost model of collectives, fitted to public NCCL measurements.

The formulas live in `perfmodel.core.cost` (one home, shared with the placement model `iteration`); this module
prices them on a `LinkModel`, fits links to measurements, and builds links from spec sheets and networks.

A link type is two numbers: α, the fixed cost of one message step (ms), and β, the time per byte on the link
(ms/byte; 1/β is the effective bandwidth per direction). With S the bytes each rank contributes (the whole
buffer, not a shard) and p ranks, the standard algorithm costs (Thakur, Rabenseifner & Gropp 2005; Patarasuk &
Yuan 2009; NCCL's own docs/tuning model, "busbw" = 2(p-1)/p · S / t for all-reduce) are:

    send/recv (one message)          T = α + S·β
    ring reduce-scatter / all-gather T = (p-1)·α + (p-1)/p · S·β
    ring all-reduce                  T = 2(p-1)·α + 2(p-1)/p · S·β           (reduce-scatter then all-gather)
    tree all-reduce                  T = 2·⌈log2 p⌉·α + 2·S·β                (pipelined reduce up a binary tree,
                                                                              then broadcast down; NCCL's double
                                                                              binary tree: each tree carries S/2,
                                                                              an interior rank receives from two
                                                                              children, so ~S per phase per rank)
    hierarchical all-reduce, n nodes of g devices (intra link i, inter link o, r NIC rails per node, r = g default):
        T = [(g-1)·α_i + (g-1)/g · S·β_i]                      intra-node reduce-scatter (each GPU owns S/g)
          + [2(n-1)·α_o + 2(n-1)/n · (S/g)·β_o · g/r]          inter-node ring all-reduce of each S/g shard, the g
                                                                 shards in parallel over r rails
          + [(g-1)·α_i + (g-1)/g · S·β_i]                      intra-node all-gather

With g = 1 the hierarchical cost is the ring over n nodes; with n = 1 it is the ring over g devices. Its β part
equals the flat ring's over p = n·g ranks when β_o = β_i (and r = g): (g-1)/g + (n-1)/(n·g) = (ng-1)/(ng).
So with β_o ≥ β_i it is never cheaper in β than the same p ranks on one node; in α it has 2(n+g-2) steps against
the flat ring's 2(ng-1) (that is what it is for), so it is never cheaper overall only while
α_o·(n-1) + α_i·(g-1) ≥ α_i·(ng-1).

Fitting (`fit_link`): T = a·α + b·β is linear in (α, β) with a, b from the algorithm's formula, so α, β ≥ 0 come
from non-negative least squares on the relative residuals (each row divided by its measured time), which weighs
a 2 KB message and a 1 GB message alike.

Links for hardware with no fit (`link_for_accelerator`, `network_link`): see those functions' docstrings.
Fitted links are in `links.json` next to this module (written by `bench/collectives.py --write`, read by
`load_links`), each with its data source, row count and fit MAPE.

How two GPUs of one node talk (`HardwareSpec.peer_to_peer`, `peer_to_peer_mode`):

- "nvlink": the NVLink / NVSwitch / Infinity Fabric link of `link_for_accelerator`.
- "pcie": PCIe peer-to-peer: the PCIe link of the spec's generation (`link_for_accelerator` on a PCIe-only copy of
  the spec: nominal x16 rate × the efficiency fitted on the PCIe all-reduce rows of links.json), no host
  bottleneck (the GPUs DMA into each other through the PCIe switch or root complex).
- "none" (GeForce cards since the RTX 4090, and any GPU whose driver disables P2P): NCCL stages every transfer
  through host memory (SHM transport): device -> host over the sender's PCIe link, host -> device over the
  receiver's. `host_staged_link` prices one such transfer alone: β = 1 / PCIE_EFFECTIVE_PER_DIR_GB_S[pcie_gen] (the
  chunks of the two hops are pipelined, so one hop's rate, not half of it), α = HOST_STAGED_ALPHA_US (staging and
  the CPU proxy's hand-off per step, against ~5-10 µs for P2P). The host's root complex and memory are one
  bottleneck: with g GPUs of a node transferring at once (every rank of a ring does), they share it, so each
  gets PCIE_EFFECTIVE_PER_DIR_GB_S / g: β_eff(g) = g·β (`host_shared_beta`). The placement model applies this with
  g = the devices of the node, and compares with the same devices in one node (g = all of them).
  Overlap: NCCL's host-staged transport runs on copy engines and a CPU proxy thread and contends with the
  backward kernels for PCIe and host memory, so DDP hides less of the gradient all-reduce behind backward: the
  fitted overlap fraction is multiplied by NO_P2P_OVERLAP_SCALE (0.5, an assumption: no public measurement of
  it here). The network path of such GPUs is host-staged too (no GPUDirect RDMA on GeForce) and is left as
  `network_link` prices it.
- None (unknown): GPUs are assumed to have P2P; the link is the one `interconnect` names (as "nvlink" or "pcie").

PCIE_EFFECTIVE_PER_DIR_GB_S (one direction, x16, pinned host memory, what CUDA's bandwidthTest typically reaches):
gen3 13, gen4 25, gen5 50 GB/s. Check against the public data (phantora, L40S, PCIe gen4, host<->device memcpy
times vs size, 2 B to 4.45 GB): fitted α 0.34 µs / 13.5 GB/s host->device, 1.0 µs / 13.3 GB/s device->host
(large copies 13.0-13.2 GB/s): half the table's gen4 figure, as pageable-memory copies (what frameworks issue)
typically run; NCCL's staging buffers are pinned, so the table keeps the pinned rates.

The network (`node_network_link`): a node's network is `node_network_gbit_s` Gb/s over all its NICs
(`HardwareSpec`, or the placement's `inter_node_bandwidth_gbit_s`; DEFAULT_NODE_NETWORK_GBIT_S when neither says),
split over `network_rails` NICs: one per GPU of the typical server (`node_devices`) where the network is fast
enough for rails of at least MIN_RAIL_GBIT_S each (3200 Gb/s on 8 GPUs: 8 x 400; 400 on 8: 4 x 100, as a DGX-1),
else fewer (100 Gb/s or 10 GbE: one NIC the node's GPUs share). g devices of a node use min(g, rails) rails, so all
of a node's devices together never get more than the node's network, and one device per node gets one rail. The
placement model prices a node's inter-node traffic (all its groups' shards at once) against it. The rule is one,
`core.cost.node_beta` / `stream_beta`: `hierarchical_allreduce_ms` applies it to one collective alone on its nodes
(its g shards over min(g, r) rails), the placement model to every device of a node sending at once.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from perfmodel.core import cost
from perfmodel.core.renamed import upgrade_names
from perfmodel.core.units import gbit_s_to_gb_s, us_to_ms
from perfmodel.hardware.spec import HardwareSpec

ALGORITHMS = ("ring", "tree", "send_recv", "allgather", "reduce_scatter")
LINKS_FILE = "links.json"
LINKS_SCHEMA_VERSION = 1

# PCIe x16 usable bandwidth per direction, GB/s (8 GT/s 128b/130b x16 = 15.75 for gen3; doubling per generation)
PCIE_X16_PER_DIR_GB_S = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0, 7: 242.0}
# used only when links.json has no fitted link of the family to take a value from
DEFAULT_EFFICIENCY = 0.7
DEFAULT_ALPHA_MS = 0.01
DEFAULT_NETWORK_EFFICIENCY = 0.8
DEFAULT_NODE_NETWORK_GBIT_S = 100.0  # a node's network when neither the catalog nor the placement says
MIN_RAIL_GBIT_S = 100.0  # per-GPU NIC rails are at least this fast; slower networks are NICs the GPUs share

# host<->device DMA over a PCIe x16 link, one direction, pinned memory, GB/s by generation (module docstring)
PCIE_EFFECTIVE_PER_DIR_GB_S = {3: 13.0, 4: 25.0, 5: 50.0}
HOST_STAGED_DEFAULT_GEN = 3  # a GPU whose PCIe generation the catalog lacks: the slowest the table knows
HOST_STAGED_ALPHA_US = 30.0  # per message step when staged through host memory (~25-50 µs; P2P ~5-10 µs)
NO_P2P_OVERLAP_SCALE = 0.5  # host-staged collectives hide half as much behind backward (an assumption)
PeerToPeer = Literal["nvlink", "pcie", "none"]

ArrayLike = float | int | Sequence[float] | np.ndarray


@dataclass(frozen=True)
class LinkModel:
    """One link type: α (ms per message step) and β (ms per byte per direction)."""

    alpha_ms: float
    beta_ms_per_byte: float
    name: str
    source: str

    def __post_init__(self) -> None:
        if not (self.alpha_ms >= 0 and math.isfinite(self.alpha_ms)):
            raise ValueError(f"alpha_ms must be finite and >= 0, got {self.alpha_ms}")
        if not (self.beta_ms_per_byte >= 0 and math.isfinite(self.beta_ms_per_byte)):
            raise ValueError(f"beta_ms_per_byte must be finite and >= 0, got {self.beta_ms_per_byte}")

    @property
    def bandwidth_per_dir_gb_s(self) -> float:
        """Effective bandwidth per direction, GB/s (1e9 bytes/s): 1/β."""
        return math.inf if self.beta_ms_per_byte == 0 else 1e-6 / self.beta_ms_per_byte

    @property
    def alpha_us(self) -> float:
        return self.alpha_ms * 1e3

    def at_latency(self, latency_us: float) -> LinkModel:
        """This link with α = `latency_us` (a network's one-way latency; its β and name unchanged)."""
        alpha_ms = us_to_ms(latency_us)
        if alpha_ms == self.alpha_ms:
            return self
        return LinkModel(alpha_ms=alpha_ms, beta_ms_per_byte=self.beta_ms_per_byte, name=self.name,
                         source=self.source)


# --- costs ----------------------------------------------------------------------------------------------------------

def _check_ranks(p: np.ndarray) -> None:
    if np.any(p < 1):
        raise ValueError("world size must be >= 1")


def coefficients(algorithm: str, message_bytes: ArrayLike, world_size: ArrayLike = 2) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) with T = a·α + b·β for `algorithm` (`perfmodel.core.cost.collective_coefficients`)."""
    return cost.collective_coefficients(algorithm, message_bytes, world_size)


def collective_ms(link: LinkModel, algorithm: str, message_bytes: ArrayLike, world_size: ArrayLike = 2) -> np.ndarray:
    """Time (ms) of one collective of `message_bytes` over `world_size` ranks on `link`."""
    return cost.collective_ms(algorithm, message_bytes, world_size, link.alpha_ms, link.beta_ms_per_byte)


def send_recv_ms(link: LinkModel, message_bytes: ArrayLike) -> np.ndarray:
    """α + S·β."""
    return collective_ms(link, "send_recv", message_bytes)


def ring_allreduce_ms(link: LinkModel, message_bytes: ArrayLike, world_size: ArrayLike) -> np.ndarray:
    """2(p-1)·α + 2(p-1)/p·S·β."""
    return collective_ms(link, "ring", message_bytes, world_size)


def tree_allreduce_ms(link: LinkModel, message_bytes: ArrayLike, world_size: ArrayLike) -> np.ndarray:
    """2⌈log2 p⌉·α + 2·S·β (0 for p = 1)."""
    return collective_ms(link, "tree", message_bytes, world_size)


def allgather_ms(link: LinkModel, message_bytes: ArrayLike, world_size: ArrayLike) -> np.ndarray:
    """(p-1)·α + (p-1)/p·S·β, S the gathered (whole) buffer."""
    return collective_ms(link, "allgather", message_bytes, world_size)


def reduce_scatter_ms(link: LinkModel, message_bytes: ArrayLike, world_size: ArrayLike) -> np.ndarray:
    """(p-1)·α + (p-1)/p·S·β, S the buffer each rank reduces (its output is S/p)."""
    return collective_ms(link, "reduce_scatter", message_bytes, world_size)


def allreduce_ms(link: LinkModel, message_bytes: ArrayLike, world_size: ArrayLike,
                 algorithm: str = "ring") -> np.ndarray:
    """All-reduce by `algorithm`: "ring", "tree", or "best" (the cheaper of the two per element, as NCCL's tuner
    picks)."""
    if algorithm == "best":
        best: np.ndarray = np.minimum(ring_allreduce_ms(link, message_bytes, world_size),
                                      tree_allreduce_ms(link, message_bytes, world_size))
        return best
    if algorithm not in ("ring", "tree"):
        raise ValueError(f"all-reduce algorithm must be ring, tree or best, got {algorithm!r}")
    return collective_ms(link, algorithm, message_bytes, world_size)


def hierarchical_allreduce_ms(intra: LinkModel, inter: LinkModel, message_bytes: ArrayLike, nodes: ArrayLike,
                              devices_per_node: ArrayLike, rails: ArrayLike | None = None) -> np.ndarray:
    """Intra-node reduce-scatter + inter-node ring all-reduce of S/g (g shards in parallel over `rails` NICs per
    node, default one per device) + intra-node all-gather. See the module docstring."""
    s = np.asarray(message_bytes, dtype=float)
    n = np.asarray(nodes, dtype=float)
    g = np.asarray(devices_per_node, dtype=float)
    _check_ranks(n)
    _check_ranks(g)
    r = g if rails is None else np.asarray(rails, dtype=float)
    _check_ranks(r)
    # the g shards of one collective alone on the node, over min(g, r) rails (the one rails rule of core.cost)
    shard_beta = cost.stream_beta(cost.node_beta(inter.beta_ms_per_byte, r, g), g)
    total: np.ndarray = cost.hierarchical_allreduce_ms(s, n * g, n, intra.alpha_ms, intra.beta_ms_per_byte,
                                                       inter.alpha_ms, shard_beta)
    return total


# --- fitting --------------------------------------------------------------------------------------------------------

def _nnls2(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ||x·c - y||² over c ≥ 0 for a two-column x (exact: the unconstrained optimum, else the best
    one-column fit, else zero)."""
    candidates = []
    solution, *_ = np.linalg.lstsq(x, y, rcond=None)
    if np.all(solution >= 0):
        candidates.append(solution)
    for j in range(2):
        col = x[:, j]
        denom = float(col @ col)
        c = np.zeros(2)
        if denom > 0:
            c[j] = max(0.0, float(col @ y) / denom)
        candidates.append(c)
    return min(candidates, key=lambda c: float(np.sum((x @ c - y) ** 2)))


def fit_link(message_bytes: ArrayLike, world_size: ArrayLike, latency_ms: ArrayLike,
             algorithm: str | Sequence[str] = "ring", *, name: str = "fitted", source: str = "fit") -> LinkModel:
    """α, β ≥ 0 minimising Σ ((a·α + b·β - t) / t)² over the rows (one link type), with (a, b) the coefficients of
    `algorithm` (one for all rows, or one per row, e.g. all-reduce and send/recv rows of the same link)."""
    s = np.asarray(message_bytes, dtype=float).ravel()
    t = np.asarray(latency_ms, dtype=float).ravel()
    p = np.broadcast_to(np.asarray(world_size, dtype=float), s.shape).ravel()
    if s.size == 0 or s.shape != t.shape:
        raise ValueError("need equally long, non-empty message_bytes and latency_ms")
    if np.any(~np.isfinite(t)) or np.any(t <= 0) or np.any(s < 0):
        raise ValueError("latencies must be finite and > 0, message sizes >= 0")
    algos = np.broadcast_to(np.asarray(algorithm, dtype=object), s.shape)
    a = np.empty_like(s)
    b = np.empty_like(s)
    for algo in set(algos.tolist()):
        mask = algos == algo
        a[mask], b[mask] = coefficients(str(algo), s[mask], p[mask])
    x = np.column_stack([a / t, b / t])
    alpha, beta = _nnls2(x, np.ones_like(t))
    return LinkModel(alpha_ms=float(alpha), beta_ms_per_byte=float(beta), name=name, source=source)


def predict(link: LinkModel, message_bytes: ArrayLike, world_size: ArrayLike,
            algorithm: str | Sequence[str] = "ring") -> np.ndarray:
    """`collective_ms` with one algorithm per row allowed (as `fit_link` takes them)."""
    s = np.asarray(message_bytes, dtype=float).ravel()
    p = np.broadcast_to(np.asarray(world_size, dtype=float), s.shape).ravel()
    algos = np.broadcast_to(np.asarray(algorithm, dtype=object), s.shape)
    out = np.empty_like(s)
    for algo in set(algos.tolist()):
        mask = algos == algo
        out[mask] = collective_ms(link, str(algo), s[mask], p[mask])
    return out


# --- the fitted table -----------------------------------------------------------------------------------------------

def links_path() -> Path:
    """Where `links.json` lives (next to this module)."""
    return Path(str(resources.files("perfmodel.placement").joinpath(LINKS_FILE)))


def load_link_table(path: Path | str | None = None) -> list[dict[str, Any]]:
    """The entries of links.json (each: name, alpha_ms, beta_ms_per_byte, source, rows, fit_mape_pct, ...); read
    once per file version (path and modification time), a fresh copy each call."""
    file = Path(path or links_path())
    return [dict(entry) for entry in _read_link_table(str(file), file.stat().st_mtime_ns)]


@functools.lru_cache(maxsize=8)
def _read_link_table(path: str, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("schema_version") != LINKS_SCHEMA_VERSION:
        raise ValueError(f"links file schema_version {data.get('schema_version')!r} is not "
                         f"{LINKS_SCHEMA_VERSION}")
    return tuple(upgrade_names(entry) for entry in data["links"])


def load_links(path: Path | str | None = None) -> dict[str, LinkModel]:
    """The fitted links by name."""
    return {e["name"]: LinkModel(alpha_ms=e["alpha_ms"], beta_ms_per_byte=e["beta_ms_per_byte"], name=e["name"],
                                 source=e["source"])
            for e in load_link_table(path)}


def dump_link_table(entries: Sequence[Mapping[str, Any]]) -> str:
    """links.json text for `entries` (the format `load_link_table` reads)."""
    return json.dumps({"schema_version": LINKS_SCHEMA_VERSION, "links": list(entries)}, indent=2) + "\n"


# --- links from a spec sheet ----------------------------------------------------------------------------------------

def interconnect_family(interconnect: str | None) -> str | None:
    """"nvlink" (nvlink1..5 and the bridges), "pcie", "infinity-fabric", or None."""
    if not interconnect:
        return None
    name = interconnect.lower()
    if name.startswith("nvlink"):
        return "nvlink"
    if name.startswith("pcie"):
        return "pcie"
    if name.startswith("infinity"):
        return "infinity-fabric"
    return name


def nominal_intra_per_dir_gb_s(spec: HardwareSpec) -> float | None:
    """Per-direction GPU-to-GPU bandwidth on the datasheet, GB/s: half the quoted bidirectional interconnect
    bandwidth, or a PCIe x16 link of the spec's generation for PCIe-only parts."""
    if spec.interconnect_bidir_gb_s:
        return spec.interconnect_bidir_gb_s / 2
    if spec.pcie_gen:
        return PCIE_X16_PER_DIR_GB_S.get(spec.pcie_gen)
    return None


def link_for_accelerator(spec: HardwareSpec, table: Sequence[Mapping[str, Any]] | None = None, *,
                         efficiency: float | None = None) -> LinkModel:
    """The intra-node link of `spec`'s GPUs, from the spec alone.

    Rule: β = 1 / (B · e), B = `nominal_intra_per_dir_gb_s(spec)` (per direction); e and α come from the fitted
    intra-node all-reduce links of the same interconnect family in `table` (links.json by default; entries with
    "use_for_spec": true): e = the median of their fitted bandwidth / nominal bandwidth, α = the median of their α.
    With no such link: every usable intra-node link's median, else DEFAULT_EFFICIENCY / DEFAULT_ALPHA_MS.
    `efficiency` overrides e.
    """
    nominal = nominal_intra_per_dir_gb_s(spec)
    if nominal is None:
        raise ValueError(f"{spec.name}: no interconnect bandwidth or PCIe generation in the spec")
    family = interconnect_family(spec.interconnect) or "pcie"
    entries = [e for e in (load_link_table() if table is None else table)
               if e.get("use_for_spec") and e.get("scope") == "intra" and e.get("nominal_per_dir_gb_s")]
    same = [e for e in entries if e.get("family") == family] or entries
    if same:
        ratio = float(np.median([e["bandwidth_per_dir_gb_s"] / e["nominal_per_dir_gb_s"] for e in same]))
        alpha = float(np.median([e["alpha_ms"] for e in same]))
        basis = ",".join(sorted(e["name"] for e in same))
    else:
        ratio, alpha, basis = DEFAULT_EFFICIENCY, DEFAULT_ALPHA_MS, "defaults"
    e = efficiency if efficiency is not None else ratio
    if not e > 0:
        raise ValueError("efficiency must be > 0")
    return LinkModel(alpha_ms=alpha, beta_ms_per_byte=1e-6 / (nominal * e), name=f"{family}-{spec.name}",
                     source=f"spec:{spec.name} ({nominal:g} GB/s/dir x {e:.2f}; alpha from {basis})")


def network_link(gbit_s: float, latency_us: float, *, efficiency: float = DEFAULT_NETWORK_EFFICIENCY,
                 name: str | None = None) -> LinkModel:
    """An inter-node link from its line rate (Gb/s, per NIC, per direction) and one-way latency (µs):
    β = 8 / (gbit_s · efficiency) ns per byte, α = latency. The default efficiency (0.8) is what NCCL typically
    reaches on InfiniBand/RoCE with GPUDirect RDMA; the vidur cloud/DGX measurements reach far less (see
    links.json), so pass a lower one for TCP sockets."""
    if not (gbit_s > 0 and efficiency > 0 and latency_us >= 0):
        raise ValueError("gbit_s and efficiency must be > 0, latency_us >= 0")
    gb_s = gbit_s_to_gb_s(gbit_s) * efficiency
    return LinkModel(alpha_ms=us_to_ms(latency_us), beta_ms_per_byte=1e-6 / gb_s,
                     name=name or f"network-{gbit_s:g}gbit_s", source=f"spec:{gbit_s:g} Gb/s x {efficiency:g}")


# --- GPUs without peer-to-peer, and the node's network -------------------------------------------------------------

def peer_to_peer_mode(spec: HardwareSpec) -> PeerToPeer:
    """How two GPUs of one node of `spec` exchange data: the catalog's `peer_to_peer`, or, when it is unknown,
    P2P over the link `interconnect` names ("nvlink" for NVLink / Infinity Fabric parts, else "pcie")."""
    if spec.peer_to_peer is not None:
        return spec.peer_to_peer
    family = interconnect_family(spec.interconnect)
    return "nvlink" if family in ("nvlink", "infinity-fabric") else "pcie"


def pcie_p2p_link(spec: HardwareSpec, table: Sequence[Mapping[str, Any]] | None = None) -> LinkModel:
    """PCIe peer-to-peer between two GPUs of `spec`: `link_for_accelerator` of its PCIe generation (x16)."""
    pcie = spec.model_copy(update={"interconnect": "pcie", "interconnect_bidir_gb_s": None,
                                   "pcie_gen": spec.pcie_gen or HOST_STAGED_DEFAULT_GEN})
    return link_for_accelerator(pcie, table)


def pcie_effective_per_dir_gb_s(gen: int) -> float:
    """PCIE_EFFECTIVE_PER_DIR_GB_S[gen]; generations outside the table double per generation from gen 3's rate."""
    return PCIE_EFFECTIVE_PER_DIR_GB_S.get(gen, PCIE_EFFECTIVE_PER_DIR_GB_S[3] * 2.0 ** (gen - 3))


def host_staged_link(spec: HardwareSpec) -> LinkModel:
    """One transfer between two GPUs of `spec` staged through host memory, alone on the host (see the module
    docstring): β = 1 / PCIE_EFFECTIVE_PER_DIR_GB_S[pcie_gen], α = HOST_STAGED_ALPHA_US. `host_shared_beta` shares
    it."""
    gen = spec.pcie_gen or HOST_STAGED_DEFAULT_GEN
    per_dir_gb_s = pcie_effective_per_dir_gb_s(gen)
    return LinkModel(alpha_ms=HOST_STAGED_ALPHA_US * 1e-3, beta_ms_per_byte=1e-6 / per_dir_gb_s,
                     name=f"host-staged-pcie{gen}-{spec.name}",
                     source=f"spec:{spec.name} (no P2P: PCIe gen{gen} {per_dir_gb_s:g} GB/s/dir via host memory, "
                            f"{HOST_STAGED_ALPHA_US:g} us per step)")


def host_shared_beta(beta_ms_per_byte: ArrayLike, devices_on_node: ArrayLike) -> np.ndarray:
    """β of each of `devices_on_node` GPUs transferring at once through one host: g·β (PCIE_EFFECTIVE_PER_DIR_GB_S /
    g)."""
    beta: np.ndarray = np.asarray(beta_ms_per_byte, dtype=float) * np.maximum(np.asarray(devices_on_node, dtype=float),
                                                                               1.0)
    return beta


def network_rails(node_gbit_s: float, node_devices: int | None) -> int:
    """NICs a node's network implies: one per device of the typical node (`node_devices`) at most, each at least
    MIN_RAIL_GBIT_S, at least one."""
    return int(max(1, min(node_devices or 1, node_gbit_s // MIN_RAIL_GBIT_S)))


def node_network_link(node_gbit_s: float, latency_us: float, *, rails: int = 1, devices: int = 1,
                      efficiency: float = DEFAULT_NETWORK_EFFICIENCY) -> LinkModel:
    """What `devices` GPUs of one node get of its network together: `node_gbit_s` (Gb/s over all NICs) split
    over `rails` NICs (`network_link` of one NIC's rate), min(devices, rails) of them usable (`core.cost.node_beta`)."""
    if rails < 1 or devices < 1:
        raise ValueError("rails and devices must be >= 1")
    rail = network_link(node_gbit_s / rails, latency_us, efficiency=efficiency)
    beta = float(cost.node_beta(rail.beta_ms_per_byte, rails, devices))  # the one rails rule (core.cost)
    return LinkModel(alpha_ms=rail.alpha_ms, beta_ms_per_byte=beta,
                     name=f"network-{node_gbit_s:g}gbit-{min(devices, rails)}of{rails}rails",
                     source=f"spec:{node_gbit_s:g} Gb/s over {rails} rail(s), {min(devices, rails)} used, "
                            f"x {efficiency:g}")
