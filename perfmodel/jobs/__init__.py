"""Stage 1: what a job is (`JobSpec`) and how its model is built (`build_job`)."""

from perfmodel.jobs.spec import (
    GraphSource,
    HFConfigSource,
    JobSpec,
    Mode,
    ModuleSource,
    OnnxSource,
    OptimizerName,
    Precision,
    ZooSource,
)

__all__ = [
    "GraphSource",
    "HFConfigSource",
    "JobSpec",
    "Mode",
    "ModuleSource",
    "OnnxSource",
    "OptimizerName",
    "Precision",
    "ZooSource",
]
