"""Calibration by what running jobs report back: a job by its own observations (`job`), and every job by what the
fleet observed on the same accelerator, its chip, and the job elsewhere (`fleet`)."""

from perfmodel.calibration.job import (
    Calibration,
    Excluded,
    ObservationRefused,
    ObservedPoint,
    calibrate,
    ceiling_samples_per_s,
    check_observation,
    leave_one_out,
    recency_weights,
    weighted_median,
)

__all__ = ["Calibration", "Excluded", "ObservationRefused", "ObservedPoint", "calibrate", "ceiling_samples_per_s",
           "check_observation", "leave_one_out", "recency_weights", "weighted_median"]
