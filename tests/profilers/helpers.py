"""Specs shared by the profiler tests."""

from __future__ import annotations

from pathlib import Path

from perfmodel.jobs.spec import JobSpec

USER_MODELS = Path(__file__).with_name("user_models.py")


def user_spec(name: str, batch_size: int = 4, **run) -> JobSpec:
    return JobSpec.from_options(module=f"{USER_MODELS}:{name}", batch_size=batch_size, **run)


def zoo_spec(name: str, batch_size: int, **run) -> JobSpec:
    return JobSpec.from_options(zoo=name, batch_size=batch_size, **run)
