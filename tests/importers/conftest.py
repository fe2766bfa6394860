"""Importer fixtures: the public datasets (read in place from shared/datasets beside the repo; tests skip without
them) and hardware catalogs that do not depend on the shipped one: test entries whose aliases are the device
names the datasets use, given to the importers directly or written to the local catalog (PERFMODEL_HOME)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from perfmodel.hardware.catalog import save_local
from perfmodel.hardware.spec import HardwareSpec
from perfmodel.settings import get_settings

DATASETS = get_settings().datasets_dir

# test catalog id -> the names the datasets give the device
TEST_DEVICES: dict[str, tuple[str, ...]] = {
    "test-t4": ("Tesla T4", "NV_T4"),
    "test-p4": ("Tesla P4",),
    "test-v100-pcie": ("Tesla V100-PCIE-32GB",),
    "test-v100-sxm2": ("NV_V100",),
    "test-p100": ("Tesla P100-PCIE-16GB", "NV_P100"),
    "test-a100-40": ("NVIDIA A100-PCIE-40GB",),
    "test-a100-80-pcie": ("NVIDIA A100 80GB PCIe",),
    "test-a100-80-sxm": ("NVIDIA A100-SXM4-80GB",),
    "test-a40": ("NVIDIA A40",),
    "test-mi210": ("AMD Instinct MI210",),
    "test-1080ti": ("NV_1080Ti",),
}


def make_spec(name: str, aliases: tuple[str, ...]) -> HardwareSpec:
    return HardwareSpec(name=name, kind="gpu", vendor="test", aliases=aliases, peak_fp32_gflops=8000,
                        memory_bandwidth_gb_s=300, memory_gb=16, compute_units=40, source="test fixture")


def dataset(name: str) -> Path:
    """A dataset folder, or skip the test when this checkout has none beside it (a fresh clone)."""
    path = DATASETS / name
    if not path.is_dir():
        pytest.skip(f"public dataset {name!r} not found at {path} (set PERFMODEL_DATASETS_DIR, or put shared/datasets "
                    "beside the checkout)")
    return path


@pytest.fixture
def catalog() -> dict[str, HardwareSpec]:
    """A catalog of the test devices only, for importers called directly."""
    return {name: make_spec(name, aliases) for name, aliases in TEST_DEVICES.items()}


@pytest.fixture
def local_catalog() -> Callable[..., None]:
    """Write test devices to this test's local catalog ($PERFMODEL_HOME/hardware.json, a fresh folder per test),
    where their aliases win over any shipped entry's: `local_catalog()` for all, or `local_catalog("test-t4")`."""

    def write(*names: str) -> None:
        for name in names or TEST_DEVICES:
            save_local(make_spec(name, TEST_DEVICES[name]))

    return write


@pytest.fixture
def neusight_root() -> Path:
    return dataset("neusight")


@pytest.fixture
def vidur_root() -> Path:
    return dataset("vidur")


@pytest.fixture
def deepbench_root() -> Path:
    return dataset("deepbench")


@pytest.fixture
def llmservingsim_root() -> Path:
    return dataset("llmservingsim")


@pytest.fixture
def phantora_root() -> Path:
    return dataset("phantora")
