"""Where a profile is taken: device, host and library versions (`Environment`)."""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
from importlib import metadata
from pathlib import Path

import torch

import perfmodel
from perfmodel.hardware.probe import physical_cores
from perfmodel.records import Environment
from perfmodel.torch_device import resolve_device

_SMI_TIMEOUT_S = 5.0


def capture_environment(device: str | torch.device = "cpu") -> Environment:
    """Describe `device` (resolved with `resolve_device`) and this host. Cheap: no device work is done."""
    device = resolve_device(device)
    cpu_model = cpu_model_name()
    on_gpu = device.type == "cuda"
    return Environment(
        device=str(device),
        device_type=device.type,
        device_name=torch.cuda.get_device_name(device) if on_gpu else cpu_model,
        device_count=torch.cuda.device_count() if on_gpu else 1,
        cpu_model=cpu_model,
        cpu_cores=physical_cores(),
        threads=torch.get_num_threads(),
        host=socket.gethostname(),
        os=platform.platform(),
        python_version=platform.python_version(),
        torch_version=torch.__version__,
        onnxruntime_version=_distribution_version("onnxruntime", "onnxruntime-gpu", "onnxruntime-rocm"),
        cuda_version=torch.version.cuda,
        hip_version=torch.version.hip,
        driver_version=gpu_driver_version() if on_gpu else None,
        perfmodel_version=perfmodel.__version__,
    )


def cpu_model_name() -> str:
    """The CPU model as /proc/cpuinfo names it (Linux), else what `platform` knows, else the machine type."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def gpu_driver_version() -> str | None:
    """The GPU driver version from nvidia-smi (CUDA) or rocm-smi (ROCm), when the tool exists; else None."""
    if torch.version.hip:
        return _run_tool(["rocm-smi", "--showdriverversion", "--csv"], last_field=True)
    return _run_tool(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def _run_tool(command: list[str], last_field: bool = False) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[-1]
    return line.rsplit(",", 1)[-1].strip() if last_field else line


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


__all__ = ["capture_environment", "cpu_model_name", "gpu_driver_version"]
