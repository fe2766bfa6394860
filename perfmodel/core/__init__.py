"""The core layer: what every stage shares and nothing above it may be imported by it.

- `units`: unit conversions (the only place a factor of 1e3 or 2**30 is written);
- `errors`: the exception types and their exit codes / HTTP statuses;
- `ir`, `opkinds`: the graph IR schema (nodes, tensors, totals) and the op-kind vocabulary;
- `accuracy`: prediction error (APE, MAPE);
- `cost`: the analytic cost formulas (roofline; α-β collectives with the one NIC-rails rule);
- `lru`: a thread-safe bounded cache;
- `atomic`: write a file so that a crash leaves the old one or the new one, never part of one.

The layers above, in data-flow order, are written as import-linter contracts in pyproject.toml.
"""
