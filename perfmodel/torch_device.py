"""Device names -> `torch.device`, one code path for CPU, CUDA and ROCm (ROCm builds of torch use the cuda API)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from perfmodel.core.errors import DeviceError

if TYPE_CHECKING:  # torch is imported when a device is resolved, not with this module
    import torch


def resolve_device(name: str | Any = "cpu") -> torch.device:
    """'cpu', 'cuda', 'cuda:N' (also 'rocm', 'rocm:N', 'gpu') -> a torch.device that exists here, else DeviceError."""
    import torch

    if isinstance(name, torch.device):
        name = str(name)
    text = str(name).strip().lower()
    for alias in ("rocm", "gpu", "hip"):
        if text == alias or text.startswith(alias + ":"):
            text = "cuda" + text[len(alias):]
    if text == "meta":
        return torch.device("meta")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise DeviceError(f"unknown device {name!r}: use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f"device type {device.type!r} is not supported: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {name!r} requested but torch sees no CUDA/ROCm device on this machine")
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        raise DeviceError(f"device {name!r} requested but only {count} CUDA/ROCm device(s) exist")
    return torch.device("cuda", index)


def synchronize(device: Any) -> None:
    """Wait for queued work on `device` (no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


KINETO_QUIET_LEVEL = "6"  # above every level kineto logs at (its profiler_start / profiler_stop lines included)


def quiet_profiler_logs() -> None:
    """Keep the profiler library's own log lines (kineto's "USDT: ... profiler_start" on stderr at every profile)
    out of the user's output, unless the user set KINETO_LOG_LEVEL. Kineto reads it when a profiler first starts."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)
