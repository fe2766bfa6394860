"""Shared fixtures. Tests run on CPU; tests that need a GPU carry the `gpu` marker and skip without one."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device; torch sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Every test gets its own PERFMODEL_HOME, so the default SQLite store never touches the user's."""
    home = tmp_path_factory.mktemp("perfmodel-home")
    monkeypatch.setenv("PERFMODEL_HOME", str(home))
    monkeypatch.delenv("PERFMODEL_STORE_URL", raising=False)
    return home
