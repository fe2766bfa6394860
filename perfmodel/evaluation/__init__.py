"""Stage 5: how good the regressors are on families they never saw (family-grouped k-fold), as a report."""

from perfmodel.evaluation.crossval import (
    ErrorMetrics,
    EvaluationResult,
    HeldOutPrediction,
    RegressorFactory,
    error_metrics,
    evaluate,
)
from perfmodel.evaluation.report import write_report

__all__ = ["ErrorMetrics", "EvaluationResult", "HeldOutPrediction", "RegressorFactory", "error_metrics", "evaluate",
           "write_report"]
