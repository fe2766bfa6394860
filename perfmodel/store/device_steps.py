"""Whole training steps `perfmodel hw bench` timed on a device, kept under PERFMODEL_HOME/device-steps/<device>.json
with the graph each was predicted from. Every prediction engine of that home reads them as reference evidence of
the device (`perfmodel.calibration.fleet`): jobs nobody observed are corrected by what the device showed on these.
A file is written whole (atomically): a crash mid-write leaves the previous one."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from perfmodel.core.atomic import write_text_atomically
from perfmodel.core.errors import PerfmodelError
from perfmodel.jobs.spec import JobSpec

DIRECTORY = "device-steps"


class DeviceStep(BaseModel):
    """One job's training step timed on one device: the median of its timed repeats."""

    model_config = ConfigDict(frozen=True)

    accelerator: str
    spec: JobSpec
    graph_json: str = Field(repr=False)
    measured_ms: float = Field(gt=0)
    repeats: int = Field(ge=1)
    cv: float | None = None
    measured_at: datetime
    torch_version: str = ""


class DeviceSteps(BaseModel):
    model_config = ConfigDict(frozen=True)

    accelerator: str
    steps: tuple[DeviceStep, ...]


def steps_dir(home: Path | None = None) -> Path:
    from perfmodel.settings import get_settings

    return (home or get_settings().home) / DIRECTORY


def save_device_steps(accelerator: str, steps: tuple[DeviceStep, ...], home: Path | None = None) -> Path:
    """Replace the steps kept for `accelerator`."""
    path = steps_dir(home) / f"{accelerator}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, DeviceSteps(accelerator=accelerator, steps=steps).model_dump_json())
    return path


def delete_device_steps(accelerator: str, home: Path | None = None) -> bool:
    path = steps_dir(home) / f"{accelerator}.json"
    if not path.exists():
        return False
    path.unlink()
    return True


def signature(home: Path | None = None) -> tuple[tuple[str, int], ...]:
    """What changes when any kept file does (names and modification times): cheap."""
    directory = steps_dir(home)
    if not directory.is_dir():
        return ()
    return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in directory.glob("*.json")))


def load_device_steps(home: Path | None = None) -> list[DeviceStep]:
    """Every kept step, of every device."""
    directory = steps_dir(home)
    out: list[DeviceStep] = []
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            out.extend(DeviceSteps.model_validate_json(path.read_text()).steps)
        except ValueError as exc:
            raise PerfmodelError(f"{path} is not a device-steps file of this perfmodel ({exc}); delete it or run "
                                 f"`perfmodel hw bench` again") from None
    return out
