"""The prediction engine: one object that the service and the CLI both answer with (see `engine.py`).

    engine = PredictionEngine.open(EngineConfig(models_dir=...), store=JobStore(url))
    engine.predict_cached(job_id, placement)        # None unless everything is in memory (event-loop safe)
    engine.predict(job_id, placement)               # blocking: store, capture, per-op model, calibration
"""

from perfmodel.engine.engine import (
    EngineConfig,
    JobEntry,
    PredictionEngine,
    SamePlacement,
    fleet_priors_from,
    ir_batch,
)
from perfmodel.engine.errors import FieldError, NotFound, Refused
from perfmodel.engine.graphs import CaptureError, GraphCache, SingleFlight, capture

__all__ = ["CaptureError", "EngineConfig", "FieldError", "GraphCache", "JobEntry", "NotFound", "PredictionEngine",
           "Refused", "SamePlacement", "SingleFlight", "capture", "fleet_priors_from", "ir_batch"]
