"""Lowering: from the graph IR to kernel rows, and the work of a kernel row.

- `ops`: the kernel-row schema in the op-class vocabulary of the cross-device per-op regressor (NeuSight's op
  classes: bmm, linear, conv2d, elementwise, softmax, layernorm; `SHAPE_COLUMNS`), the FLOPs and bytes of a row
  (`op_work`), and its roofline on a catalog device (`op_roofline_ms`, the formula in `perfmodel.core.cost`);
- `rows`: IR node -> kernel rows, forward and backward (`graph_op_rows`), and the row constructors every other row
  builder uses (`vector_row`, `linear_row`, `bmm_row`, `memory_row`).

A layer of its own, above `graph` and `hardware` and below `profilers`: the microbenchmark, the importers, the
features and the predictors all speak this schema, and it imports nothing above it.
"""
