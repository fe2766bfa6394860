"""perfmodel: predict the throughput a deep-learning job reaches on a placement.

Stages (each a package, depending only on the ones before it):
jobs (job spec, model builders) -> graph (IR) -> profilers -> store -> features -> regressors -> registry ->
predictor -> cli / service.
"""

__version__ = "0.1.0"
