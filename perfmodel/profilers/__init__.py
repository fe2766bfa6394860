"""Profilers: measure a job on a device (environment, iteration timing, per-op and ONNX Runtime per-node profiles).

Entry point: `perfmodel.profilers.run.profile_job`. The records they produce are in `perfmodel.records`;
op timings measured by others (public GPU benchmarks, see `perfmodel.importers`) are `OpMeasurement`s in
`perfmodel.profilers.external`.
"""
