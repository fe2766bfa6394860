"""The analytic cost formulas, in one place: the roofline of a kernel and the α-β cost of a collective.

Every function takes plain numbers or numpy arrays (broadcast together) and returns the same kind: floats in,
floats out (one prediction, no numpy call overhead); arrays in, arrays out. Hardware enters as numbers only (peak
GFLOP/s, bandwidth GB/s = 1e9 bytes/s, α in ms, β in ms per byte), so every layer can use them.

Roofline (Williams, Waterman & Patterson 2009):

    compute time  = FLOPs / peak                       memory time = bytes moved / bandwidth
    roofline time = max(compute time, memory time)     (never below either term)
    arithmetic intensity = FLOPs / bytes;  ridge point = peak / bandwidth (FLOP/byte): an op whose intensity is
    below the ridge is memory-bound on that device.

α-β (Hockney) collectives, S the bytes each rank contributes (the whole buffer, not a shard), p ranks, a link of
α ms per message step and β ms per byte per direction: T = a·α + b·β with (a, b) = `collective_coefficients`
(Thakur, Rabenseifner & Gropp 2005; NCCL's busbw = 2(p-1)/p · S / t for all-reduce):

    send_recv                        a = 1             b = S
    ring reduce-scatter / all-gather a = p-1           b = (p-1)/p · S
    ring all-reduce                  a = 2(p-1)        b = 2(p-1)/p · S      (reduce-scatter then all-gather)
    tree all-reduce                  a = 2⌈log2 p⌉     b = 2·S (0 for p = 1; NCCL's double binary tree)
    pairwise all-to-all              a = p-1           b = (p-1)/p · S

Across nodes (n nodes of g = p/n ranks of the group) a collective runs hierarchically: the intra-node phase on the
g members of each node, and the inter-node phase of each node's traffic over its network:

    reduce-scatter  (g-1)·(α_i + S/g·β_i) + (n-1)·(α_o + S/(g·n)·β_s)     (an all-reduce is two of them)
    all-to-all      (g-1)·(α_i + S/p·β_i) + (n-1)·(α_o + S/n·β_s)

NIC rails, one rule (`node_beta`, `stream_beta`): a node has `rails` NICs of β_rail each; d of its devices
transferring at once use min(d, rails) of them, so the node's usable network is β_node = β_rail / min(d, rails);
`streams` transfers leaving the node at once share it: each sees β_s = streams · β_node. One collective alone on
a node has streams = d = g (its g shards over min(g, rails) rails: β_s = β_rail · g / min(g, rails)); the
placement model prices all the node's groups at once (streams = the node's devices).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from perfmodel.core.units import GIGA, MS_PER_S

Collective = Literal["ring", "tree", "send_recv", "allgather", "reduce_scatter", "all_to_all"]
COLLECTIVES: tuple[Collective, ...] = ("ring", "tree", "send_recv", "allgather", "reduce_scatter", "all_to_all")

Values = Any  # a float, an int or an ndarray: the functions below work on any of them


def maximum(a: Values, b: Values) -> Values:
    """max(a, b) elementwise: numpy's for arrays, Python's for numbers (one pair: no numpy overhead; two floats,
    the placement model's float path, without even a call of `max`: same result, NaN included)."""
    if a.__class__ is float and b.__class__ is float:
        return b if b > a else a  # max(a, b)
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def minimum(a: Values, b: Values) -> Values:
    """min(a, b) elementwise, as `maximum`."""
    if a.__class__ is float and b.__class__ is float:
        return b if b < a else a  # min(a, b)
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


# --- roofline -------------------------------------------------------------------------------------------------------

def compute_ms(flops: Values, peak_gflops: Values) -> Values:
    """FLOPs at the peak: FLOPs / (peak GFLOP/s · 1e9) in ms."""
    return flops / (peak_gflops * GIGA) * MS_PER_S


def memory_ms(bytes_moved: Values, bandwidth_gb_s: Values) -> Values:
    """Bytes at the bandwidth: bytes / (GB/s · 1e9) in ms."""
    return bytes_moved / (bandwidth_gb_s * GIGA) * MS_PER_S


def roofline_ms(flops: Values, bytes_moved: Values, peak_gflops: Values, bandwidth_gb_s: Values) -> Values:
    """max(compute time at peak, memory time at bandwidth), ms."""
    return maximum(compute_ms(flops, peak_gflops), memory_ms(bytes_moved, bandwidth_gb_s))


def arithmetic_intensity(flops: Values, bytes_moved: Values) -> Values:
    """FLOPs per byte moved (bytes floored at 1, so a kernel that moves nothing is finite)."""
    return flops / maximum(bytes_moved, 1)


def ridge_point(peak_gflops: Values, bandwidth_gb_s: Values) -> Values:
    """The intensity (FLOP/byte) where compute time equals memory time on a device: peak / bandwidth."""
    return (peak_gflops * GIGA) / (bandwidth_gb_s * GIGA)


# --- α-β collectives ------------------------------------------------------------------------------------------------

def _check_ranks(ranks: Values, what: str = "world size") -> None:
    if np.any(np.asarray(ranks) < 1):
        raise ValueError(f"{what} must be >= 1")


def collective_coefficients(algorithm: str, message_bytes: Values,
                            ranks: Values = 2) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) with T = a·α + b·β for `algorithm` (see the module docstring), as arrays broadcast together."""
    s = np.asarray(message_bytes, dtype=float)
    p = np.asarray(ranks, dtype=float)
    _check_ranks(p)
    s, p = np.broadcast_arrays(s, p)
    if algorithm == "ring":
        return 2 * (p - 1), 2 * (p - 1) / p * s
    if algorithm in ("allgather", "reduce_scatter", "all_to_all"):
        return p - 1, (p - 1) / p * s
    if algorithm == "tree":
        steps = np.ceil(np.log2(p))
        return 2 * steps, np.where(p > 1, 2 * s, 0.0)
    if algorithm == "send_recv":
        return np.ones_like(s), s.copy()
    raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {COLLECTIVES}")


def collective_ms(algorithm: str, message_bytes: Values, ranks: Values, alpha_ms: Values,
                  beta_ms_per_byte: Values) -> np.ndarray:
    """Time (ms) of one collective of `message_bytes` over `ranks` ranks on one link (α, β)."""
    a, b = collective_coefficients(algorithm, message_bytes, ranks)
    out: np.ndarray = a * alpha_ms + b * beta_ms_per_byte
    return out


def ring_step_ms(steps: Values, step_bytes: Values, alpha_ms: Values, beta_ms_per_byte: Values) -> Values:
    """`steps` message steps of `step_bytes` each: steps · (α + bytes · β). A ring reduce-scatter of S over p
    ranks is p-1 steps of S/p; numbers or arrays (the placement model's fast path for one pair)."""
    return steps * (alpha_ms + step_bytes * beta_ms_per_byte)


def node_beta(rail_beta_ms_per_byte: Values, rails: Values, devices: Values) -> Values:
    """β of a node's usable network when `devices` of its devices transfer: min(devices, rails) NICs of
    `rail_beta_ms_per_byte` each (module docstring: the one NIC-rails rule)."""
    return rail_beta_ms_per_byte / minimum(rails, devices)


def stream_beta(node_beta_ms_per_byte: Values, streams: Values) -> Values:
    """β each of `streams` transfers sees when they leave a node at once over its network (β_node)."""
    return node_beta_ms_per_byte * streams


def hierarchical_reduce_scatter_ms(message_bytes: Values, ranks: Values, nodes: Values, intra_alpha_ms: Values,
                                   intra_beta_ms_per_byte: Values, inter_alpha_ms: Values,
                                   inter_stream_beta_ms_per_byte: Values) -> Values:
    """A ring reduce-scatter (or all-gather) of S bytes per rank over `ranks` ranks on `nodes` nodes: the intra-node
    ring on each node's g = ranks/nodes members, then the inter-node ring of each member's S/g shard (each shard a
    stream at `inter_stream_beta_ms_per_byte`). One node: the flat ring."""
    g = ranks / nodes
    intra = ring_step_ms(g - 1, message_bytes / g, intra_alpha_ms, intra_beta_ms_per_byte)
    inter = ring_step_ms(nodes - 1, message_bytes / g / nodes, inter_alpha_ms, inter_stream_beta_ms_per_byte)
    return intra + inter


def hierarchical_allreduce_ms(message_bytes: Values, ranks: Values, nodes: Values, intra_alpha_ms: Values,
                              intra_beta_ms_per_byte: Values, inter_alpha_ms: Values,
                              inter_stream_beta_ms_per_byte: Values) -> Values:
    """Reduce-scatter then all-gather, both hierarchical: 2 × `hierarchical_reduce_scatter_ms`."""
    return 2 * hierarchical_reduce_scatter_ms(message_bytes, ranks, nodes, intra_alpha_ms, intra_beta_ms_per_byte,
                                              inter_alpha_ms, inter_stream_beta_ms_per_byte)


def hierarchical_all_to_all_ms(message_bytes: Values, ranks: Values, nodes: Values, intra_alpha_ms: Values,
                               intra_beta_ms_per_byte: Values, inter_alpha_ms: Values,
                               inter_stream_beta_ms_per_byte: Values) -> Values:
    """Pairwise all-to-all of S bytes per rank: S/p to each of the g-1 ranks of its node, and the (n-1)/n of S
    that leaves the node (a stream per rank at `inter_stream_beta_ms_per_byte`). One node: p-1 steps of S/p."""
    g = ranks / nodes
    intra = ring_step_ms(g - 1, message_bytes / ranks, intra_alpha_ms, intra_beta_ms_per_byte)
    inter = ring_step_ms(nodes - 1, message_bytes / nodes, inter_alpha_ms, inter_stream_beta_ms_per_byte)
    return intra + inter


def send_ms(message_bytes: Values, alpha_ms: Values, beta_ms_per_byte: Values) -> Values:
    """One message: α + S·β."""
    return alpha_ms + message_bytes * beta_ms_per_byte


def ring_allreduce_bytes(message_bytes: Values, ranks: Values) -> Values:
    """Bytes each rank sends (and receives) in a ring all-reduce: 2(p-1)/p · S."""
    return 2 * (ranks - 1) / ranks * message_bytes


__all__ = [
    "COLLECTIVES", "Collective", "arithmetic_intensity", "collective_coefficients", "collective_ms",
    "compute_ms", "hierarchical_all_to_all_ms", "hierarchical_allreduce_ms", "hierarchical_reduce_scatter_ms",
    "maximum", "memory_ms", "minimum", "node_beta", "ridge_point", "ring_allreduce_bytes", "ring_step_ms",
    "roofline_ms", "send_ms", "stream_beta",
]
