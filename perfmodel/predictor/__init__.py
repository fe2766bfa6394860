"""Stage: answer "how fast does job X run on accelerator Y" from the graph alone, with a registered model."""

from perfmodel.predictor.gpu_iteration import DevicePredictor
from perfmodel.predictor.predict import Prediction, Predictor

__all__ = ["DevicePredictor", "Prediction", "Predictor"]
