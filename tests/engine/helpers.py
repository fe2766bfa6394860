"""Cheap real parts for engine tests: a one-node graph per batch size, and a per-device model that prices a graph
by its FLOPs at a fixed rate (what the bounded-cache test needs to drive 50,000 distinct jobs in seconds)."""

from __future__ import annotations

from perfmodel.core.ir import Graph, GraphTotals, Node, TensorMeta
from perfmodel.core.opkinds import OpKind
from perfmodel.predictor.predict import Prediction

HIDDEN = 64
FLOP_PER_MS = 1e9  # the fixed-rate model: 1 TFLOP/s


def tiny_graph(batch_size: int) -> Graph:
    """One linear layer (HIDDEN x HIDDEN) at `batch_size`: the smallest graph every model accepts."""
    flops = 2 * batch_size * HIDDEN * HIDDEN
    node = Node(id="n0", op="aten.addmm.default", kind=OpKind.linear,
                input_tensors=(TensorMeta(shape=(batch_size, HIDDEN), dtype="float32"),),
                output_tensors=(TensorMeta(shape=(batch_size, HIDDEN), dtype="float32"),),
                flops_fwd=flops, flops_bwd=2 * flops, bytes_read_fwd=4 * (batch_size + HIDDEN) * HIDDEN,
                bytes_written_fwd=4 * batch_size * HIDDEN, params=HIDDEN * HIDDEN, module="fc")
    totals = GraphTotals.from_nodes([node], params=HIDDEN * HIDDEN, param_bytes=4 * HIDDEN * HIDDEN,
                                    activation_bytes=4 * batch_size * HIDDEN)
    return Graph(name="tiny", source="torch.export", nodes=(node,), totals=totals,
                 inputs=(TensorMeta(shape=(batch_size, HIDDEN), dtype="float32"),))


class FixedRateDevice:
    """A single-device model: forward/backward at FLOP_PER_MS, no optimizer or overhead."""

    model_version = "fixed-rate/v1"
    regressor = None  # no per-device measurements of its own

    def predict(self, spec, accelerator: str, *, graph: Graph) -> Prediction:
        forward = graph.totals.flops_fwd / FLOP_PER_MS
        backward = graph.totals.flops_bwd / FLOP_PER_MS
        total = forward + backward
        return Prediction(job_name=spec.name, job_id=spec.key(), accelerator=accelerator,
                          model_version=self.model_version,
                          iter_time_ms=total, throughput_samples_per_s=spec.batch_size * 1e3 / total,
                          interval_ms=(total * 0.9, total * 1.1), peak_memory_bytes=0, extrapolated=False,
                          breakdown_ms={"forward": forward, "backward": backward, "optimizer": 0.0, "overhead": 0.0})
