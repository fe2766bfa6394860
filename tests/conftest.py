"""Shared fixtures. Tests run on CPU; tests that need a GPU carry the `gpu` marker and skip without one.

Store URLs: `store_url` is parametrised over a fresh SQLite file and an emptied PostgreSQL database; `postgres_url`
is the latter alone. PostgreSQL comes from PERFMODEL_TEST_POSTGRES_URL, which `scripts/with-postgres.sh` (and so
`make test` and CI) sets after starting a throwaway server; without it those tests skip and say why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_ENV = "PERFMODEL_TEST_POSTGRES_URL"
POSTGRES_SKIP_REASON_ENV = "PERFMODEL_TEST_POSTGRES_SKIP_REASON"  # set by scripts/with-postgres.sh when it fails


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


def _empty_postgres(url: str) -> None:
    """Drop everything in the database's public schema (perfmodel tables and anything a test added)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("SET LOCAL lock_timeout = '30s'"))  # a leaked open transaction fails, not hangs
            connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of an emptied PostgreSQL database (emptied again afterwards); skips, saying why, without one."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        reason = os.environ.get(POSTGRES_SKIP_REASON_ENV) or (
            "run the tests through scripts/with-postgres.sh (make test does) to start a throwaway server"
        )
        pytest.skip(f"{POSTGRES_ENV} not set: {reason}")
    _empty_postgres(url)
    yield url
    _empty_postgres(url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'perfmodel.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh store URL: a SQLite file, and an emptied PostgreSQL database (see `postgres_url`)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")
