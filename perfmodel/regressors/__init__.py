"""Regressors: learned (and analytic) predictors of iteration time from graph IR and hardware features.

`REGRESSORS` maps each name to the "module:Class" that implements it; classes are imported on first use, so a
missing or broken regressor module never breaks `import perfmodel.regressors`.

    cls = regressor_class("xgb-ops")          # unknown names raise UnknownNameError with close matches
    model = cls(seed=0).fit(samples)
    model.save(directory)
    load_regressor(directory).predict(samples)  # dispatches on the manifest's `regressor` key
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from perfmodel.core.errors import UnknownNameError
from perfmodel.regressors.base import IterationPrediction, Regressor

__all__ = ["ITERATION_REGRESSORS", "REGRESSORS", "IterationPrediction", "Regressor", "load_regressor",
           "regressor_class"]

REGRESSORS: dict[str, str] = {
    "roofline": "perfmodel.regressors.roofline:RooflineRegressor",
    "xgb-ops": "perfmodel.regressors.xgb_ops:XGBOpsRegressor",
    "xgb-graph": "perfmodel.regressors.xgb_graph:XGBGraphRegressor",
    "gnn": "perfmodel.regressors.gnn:GNNRegressor",
    "xgb-device-ops": "perfmodel.regressors.device_ops:DeviceOpRegressor",  # per op, any accelerator (DataFrame in)
    # the learned whole-step stage over a composed prediction's features (DataFrame in)
    "xgb-whole-step": "perfmodel.regressors.whole_step:WholeStepRegressor",
    # the same stage over the job's graph too (a GNN, DNNPerf-style; graphs and feature frame in)
    "gnn-whole-step": "perfmodel.regressors.whole_step_gnn:WholeStepGNN",
    # the same stage as a spec-sheet device effect and a level per measured model (DataFrame in, `job` column)
    "device-whole-step": "perfmodel.regressors.whole_step_device:DeviceStepRegressor",
}


# the regressors that learn iteration time from `Sample`s (`perfmodel train` / `evaluate`); the others take ops
ITERATION_REGRESSORS = ("roofline", "xgb-ops", "xgb-graph", "gnn")


def regressor_class(name: str, *, iteration: bool = False) -> Any:
    """The class registered as `name` (imported now); `iteration`: only those of `ITERATION_REGRESSORS`."""
    known = ITERATION_REGRESSORS if iteration else tuple(REGRESSORS)
    if name not in known:
        raise UnknownNameError("regressor", name, known)
    module_name, _, class_name = REGRESSORS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def load_regressor(directory: str | Path) -> Any:
    """The fitted regressor saved in `directory`, of the class its manifest names."""
    from perfmodel.regressors.manifest import Manifest

    manifest = Manifest.read(directory)
    return regressor_class(manifest.regressor).load(Path(directory))
