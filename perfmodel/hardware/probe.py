"""Measure this host as a `HardwareSpec`: a CPU entry for the catalog (`perfmodel hw probe [--save]`).

The CPU is named from what the OS prints, not assumed: `/proc/cpuinfo` (`model name`, `vendor_id`; `CPU
implementer` / `Model` on Arm), else `lscpu` (`Model name`, `Vendor ID`), else `platform`. Reading the device
(`read_cpu_identity`) is kept apart from parsing what it printed (`parse_cpuinfo`, `parse_lscpu`: pure functions of
the text), so the parsing is tested on sample outputs of other machines. The model name becomes the entry's alias
and the vendor its `vendor`; a virtual machine may print a generic name ("AMD EPYC"), which is then all we know.

Peak fp32 is the best GEMM throughput seen: for each size n in `gemm_sizes` (default 2048 only), the best of a few
timed batches of `torch.mm` on two n x n fp32 matrices (2·n³ FLOPs each; every batch does about as many FLOPs as one
2048³ GEMM, so small sizes are timed over many calls). Memory bandwidth is the best of a few `copy_` of a large fp32
tensor into another, counting the bytes read plus the bytes written. Both run with `threads` torch threads (default:
torch's current setting), which is restored afterwards.

Caveat (2-core VM, idle): n = 2048 reaches ~100 GFLOP/s, n = 512 (cache-resident) ~190. The models' GEMMs are mostly
small, so the 2048 figure is below what they reach (one idle run); `gemm_sizes=(512, 1024, 2048)` measures the
higher peak.

About 3 s on a 2-core machine at the defaults.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from perfmodel.core.units import BYTES_PER_GIB, BYTES_PER_MIB, GIGA
from perfmodel.hardware.spec import FRESH_MAP_BYTES, HardwareSpec

GEMM_SIZES = (2048,)
GEMM_BATCH_FLOPS = 2 * 2048**3  # FLOPs per timed batch, whatever the size
COPY_MIB = 256
REPEATS = 5
FP32_BYTES = 4

LSCPU_TIMEOUT_S = 5.0

# (substring of the CPU model or /proc/cpuinfo vendor_id, vendor), first match wins
_VENDORS = (
    ("intel", "Intel"), ("amd", "AMD"), ("hygon", "Hygon"), ("apple", "Apple"), ("ampere", "Ampere"),
    ("graviton", "AWS"), ("neoverse", "Arm"), ("arm", "Arm"), ("ibm", "IBM"), ("power", "IBM"),
)
# exact vendor ids: x86 `vendor_id` strings, and Arm `CPU implementer` codes (as /proc/cpuinfo prints them)
_VENDOR_IDS = {
    "genuineintel": "Intel", "authenticamd": "AMD", "hygongenuine": "Hygon", "centaurhauls": "Centaur",
    "shanghai": "Zhaoxin", "0x41": "Arm", "0x42": "Broadcom", "0x43": "Cavium", "0x46": "Fujitsu",
    "0x48": "HiSilicon", "0x4e": "NVIDIA", "0x50": "Ampere", "0x51": "Qualcomm", "0x61": "Apple", "0x6d": "Microsoft",
    "0xc0": "Ampere",
}
# keys naming the CPU model / vendor, in the order they are tried: x86 Linux, then Arm and others
_CPUINFO_MODEL_KEYS = ("model name", "Model", "cpu model", "cpu", "Processor")
_CPUINFO_VENDOR_KEYS = ("vendor_id", "CPU implementer", "vendor")
_LSCPU_MODEL_KEYS = ("Model name",)
_LSCPU_VENDOR_KEYS = ("Vendor ID",)


@dataclass(frozen=True)
class CpuIdentity:
    """What the OS says the CPU is: `model` as printed ("AMD EPYC 7763 64-Core Processor"), `vendor` ("AMD") and
    the raw `vendor_id` ("AuthenticAMD", or an Arm implementer code such as "0x41"); "" where unknown."""

    model: str = ""
    vendor: str = ""
    vendor_id: str = ""


def parse_cpuinfo(text: str) -> CpuIdentity:
    """The CPU named in the text of /proc/cpuinfo (first processor block that names it)."""
    return _identity(_key_values(text), _CPUINFO_MODEL_KEYS, _CPUINFO_VENDOR_KEYS)


def parse_lscpu(text: str) -> CpuIdentity:
    """The CPU named in the output of `lscpu`."""
    return _identity(_key_values(text), _LSCPU_MODEL_KEYS, _LSCPU_VENDOR_KEYS)


def read_cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuIdentity:
    """This host's CPU: /proc/cpuinfo, else `lscpu`, else what `platform` knows (model only)."""
    found = CpuIdentity()
    try:
        found = parse_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:
        pass
    if not (found.model and found.vendor):
        listed = _run_lscpu()
        found = CpuIdentity(model=found.model or listed.model, vendor=found.vendor or listed.vendor,
                            vendor_id=found.vendor_id or listed.vendor_id)
    if not found.model:
        model = platform.processor() or platform.machine()
        found = CpuIdentity(model=model, vendor=found.vendor or vendor_of(model), vendor_id=found.vendor_id)
    return found


def physical_cores() -> int:
    """Physical cores (psutil), falling back to logical CPUs."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
    except ImportError:
        cores = None
    return int(cores or os.cpu_count() or 1)


def probe_host(threads: int | None = None, *, gemm_sizes: tuple[int, ...] = GEMM_SIZES, copy_mib: int = COPY_MIB,
               repeats: int = REPEATS) -> HardwareSpec:
    """This host as the catalog's `cpu` entry, measured with `threads` torch threads (default: torch's own)."""
    import torch

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used_threads = torch.get_num_threads()
        gflops = max(gemm_gflops(n, repeats) for n in gemm_sizes)
        bandwidth = copy_bandwidth_gb_s(copy_mib, repeats)
        first_touch = first_touch_gb_s(repeats=repeats)
    finally:
        torch.set_num_threads(previous_threads)
    cpu = read_cpu_identity()
    date = datetime.now(timezone.utc).date().isoformat()
    return HardwareSpec(
        name="cpu",
        kind="cpu",
        vendor=cpu.vendor,
        aliases=(cpu.model,) if cpu.model and cpu.model.lower() != "cpu" else (),
        peak_fp32_gflops=round(gflops, 1),
        memory_bandwidth_gb_s=round(bandwidth, 2),
        memory_gb=round(host_memory_gb(), 2),
        compute_units=physical_cores(),
        threads=used_threads,
        first_touch_gb_s=round(first_touch, 2) if first_touch is not None else None,
        l2_cache_mb=l2_cache_mib(),
        source=f"perfmodel hw probe on {socket.gethostname()} {date}, torch {torch.__version__}",
    )


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `run`, after one untimed warm-up call."""
    run()
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_gflops(n: int, repeats: int = REPEATS) -> float:
    """fp32 GEMM throughput at size n, in GFLOP/s: 2·n³ FLOPs per `torch.mm(a, b, out=c)`, best timed batch of
    calls (a batch holds about `GEMM_BATCH_FLOPS`, so small sizes are timed over many calls)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator)
    b = torch.randn(n, n, generator=generator)
    c = torch.empty(n, n)
    calls = max(1, round(GEMM_BATCH_FLOPS / (2 * n**3)))

    def batch() -> None:
        for _ in range(calls):
            torch.mm(a, b, out=c)

    return 2 * n**3 * calls / best_seconds(batch, repeats) / GIGA


def copy_bandwidth_gb_s(mib: int = COPY_MIB, repeats: int = REPEATS) -> float:
    """Memory bandwidth of `dst.copy_(src)` on `mib` MiB fp32 tensors: (read + written bytes) / best time, GB/s."""
    import torch

    numel = mib * BYTES_PER_MIB // FP32_BYTES
    src = torch.ones(numel)
    dst = torch.zeros(numel)  # written once already, so the timed copies do not page-fault
    seconds = best_seconds(lambda: dst.copy_(src), repeats)
    return 2 * numel * FP32_BYTES / seconds / GIGA


FIRST_TOUCH_MIB = 64  # the new tensor `first_touch_gb_s` times: past `FRESH_MAP_BYTES`, so mapped afresh each time
# a new tensor whose pages cost less than this share of filling an existing one is taken as free
FIRST_TOUCH_FLOOR_SHARE = 0.1
FIRST_TOUCH_TIMEOUT_S = 120.0  # the child interpreter: importing torch and timing a few tensors


def first_touch_gb_s(mib: int = FIRST_TOUCH_MIB, repeats: int = REPEATS) -> float | None:
    """The rate (GB/s) at which a new process on this host faults in the pages of a new tensor of `mib` MiB (past
    `FRESH_MAP_BYTES`: mapped afresh every time; `first_touch_rate` of `time_first_touch` in a child interpreter).
    A fresh process, because a long-running one may serve such a tensor from heap it grew earlier (in `hw bench`
    after its sweep: 97 GB/s, where a new process met 2.4-3.1 GB/s on the same host), while a training process
    faults them in (T5-small's step did). None when new memory costs nothing measurable, or the child failed."""
    import json
    import sys

    if mib * BYTES_PER_MIB <= FRESH_MAP_BYTES:
        raise ValueError(f"a tensor of {mib} MiB may reuse freed heap: time one above {FRESH_MAP_BYTES} bytes")
    code = (f"import json; from perfmodel.hardware.probe import time_first_touch; "
            f"print(json.dumps(time_first_touch({int(mib)}, {int(repeats)})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=FIRST_TOUCH_TIMEOUT_S, check=True)
        extra_s, fill_s = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return first_touch_rate(extra_s, fill_s, mib * BYTES_PER_MIB)


def time_first_touch(mib: int, repeats: int) -> tuple[list[float], list[float]]:
    """(seconds each new `mib` MiB fp32 tensor took to create and fill beyond filling an existing one, seconds of
    that fill), `repeats` times, in this process."""
    import torch

    numel = mib * BYTES_PER_MIB // FP32_BYTES
    existing = torch.zeros(numel)
    extra_s, fill_s = [], []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        torch.empty(numel).fill_(1.0)
        fresh = time.perf_counter() - start
        start = time.perf_counter()
        existing.fill_(1.0)
        filled = time.perf_counter() - start
        extra_s.append(fresh - filled)
        fill_s.append(filled)
    return extra_s, fill_s


def first_touch_rate(extra_s: list[float], fill_s: list[float], tensor_bytes: int) -> float | None:
    """GB/s of new memory from `time_first_touch`'s timings: the tensor's bytes over the median extra time; None
    when that is under `FIRST_TOUCH_FLOOR_SHARE` of the median fill (nothing measurable)."""
    import statistics

    extra, fill = statistics.median(extra_s), statistics.median(fill_s)
    if extra <= FIRST_TOUCH_FLOOR_SHARE * fill:
        return None
    return tensor_bytes / extra / GIGA


def host_memory_gb() -> float:
    """Host RAM in binary GB (GiB), as `HardwareSpec.memory_gb` counts memory."""
    try:
        import psutil

        return psutil.virtual_memory().total / BYTES_PER_GIB
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / BYTES_PER_GIB


def vendor_of(cpu_model: str, vendor_id: str = "") -> str:
    """The CPU vendor: from an exact vendor id ('GenuineIntel', Arm implementer '0x41'), else from the model name
    ('AMD EPYC 7763' -> 'AMD'), else from words in the vendor id, else ''."""
    exact = _VENDOR_IDS.get(vendor_id.strip().lower())
    if exact:
        return exact
    for text in (cpu_model, vendor_id):
        lowered = text.lower()
        for key, vendor in _VENDORS:
            if key in lowered:
                return vendor
    return ""


def _key_values(text: str) -> list[tuple[str, str]]:
    """`key: value` lines, in order (keys stripped; values stripped; lines without a value dropped)."""
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


def _identity(pairs: list[tuple[str, str]], model_keys: tuple[str, ...], vendor_keys: tuple[str, ...]) -> CpuIdentity:
    first: dict[str, str] = {}
    for key, value in pairs:
        first.setdefault(key, value)
    model = next((first[k] for k in model_keys if k in first and not first[k].isdigit()), "")
    vendor_id = next((first[k] for k in vendor_keys if k in first), "")
    return CpuIdentity(model=model, vendor=vendor_of(model, vendor_id), vendor_id=vendor_id)


def _run_lscpu() -> CpuIdentity:
    """`lscpu`'s answer, or nothing when it is missing or fails (LC_ALL=C keeps its field names in English)."""
    if shutil.which("lscpu") is None:
        return CpuIdentity()
    try:
        result = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=LSCPU_TIMEOUT_S, check=True,
                                env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return CpuIdentity()
    return parse_lscpu(result.stdout)


def l2_cache_mib(cpu_root: Path = Path("/sys/devices/system/cpu")) -> float | None:
    """Total L2 cache of the host in MiB (each distinct L2 instance counted once), from sysfs; None if unknown."""
    seen: dict[str, int] = {}
    for index in cpu_root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "level").read_text().strip() != "2" or (index / "type").read_text().strip() == "Instruction":
                continue
            shared = (index / "shared_cpu_list").read_text().strip()
            seen[shared] = _parse_size_bytes((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
    return round(sum(seen.values()) / BYTES_PER_MIB, 2) if seen else None


def _parse_size_bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    suffix = text[-1:].upper()
    return int(text[:-1]) * units[suffix] if suffix in units else int(text)
