"""Unit conversions, in one place. Names carry their units: `iter_time_ms`, `bytes_read`,
`memory_bandwidth_gb_s` (GB/s: bytes), `node_network_gbit_s` (Gb/s: bits); docs/development.md, "Naming", lists them.
"""

from __future__ import annotations

MS_PER_S = 1e3
US_PER_MS = 1e3
NS_PER_MS = 1e6


def s_to_ms(seconds: float) -> float:
    return seconds * MS_PER_S


def us_to_ms(us: float) -> float:
    return us / US_PER_MS


def ns_to_ms(ns: float) -> float:
    return ns / NS_PER_MS


BITS_PER_BYTE = 8
GIGA = 1e9  # GFLOP/s, GB/s (1e9 bytes/s), Gb/s (1e9 bit/s) -> per second
# device memory is counted in binary units: an "80GB" GPU holds 80 x 2^30 bytes (nvidia-smi: 81,920 MiB)
BYTES_PER_GIB = 2**30
BYTES_PER_MIB = 2**20


def gib_to_bytes(gib: float) -> int:
    """A memory size in GiB (2^30 bytes: the "GB" of a GPU's spec sheet) in bytes."""
    return int(gib * BYTES_PER_GIB)


def gbit_s_to_gb_s(gbit_s: float) -> float:
    """A rate in Gb/s (1e9 bit/s) in GB/s (1e9 bytes/s)."""
    return gbit_s / BITS_PER_BYTE


def samples_per_s(batch_size: int, iter_time_ms: float) -> float:
    return batch_size * MS_PER_S / iter_time_ms


def human_count(n: float) -> str:
    """1234567 -> '1.23M' (FLOPs, parameters)."""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def human_bytes(n: float) -> str:
    """Binary units: 1536 -> '1.5 KiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
