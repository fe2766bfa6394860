"""Peak memory of one device from the graph alone: weights + gradients + optimizer state + activations +
workspace (explicit sum). Issue 5 refines it for sharding (tensor/pipeline/ZeRO) and checkpointing."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.graph.ir import Graph
from perfmodel.jobs.spec import JobSpec, Mode, OptimizerName

# optimizer state tensors per parameter: SGD momentum buffer; Adam/AdamW first and second moments
OPTIMIZER_STATES = {OptimizerName.sgd: 1, OptimizerName.adam: 2, OptimizerName.adamw: 2}
WORKSPACE_FRACTION = 0.05  # allocator fragmentation and library workspaces, of the rest


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    workspace_bytes: int

    @property
    def peak_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.workspace_bytes)


def estimate_memory(spec: JobSpec, graph: Graph) -> MemoryEstimate:
    weights = graph.totals.param_bytes
    if spec.mode == Mode.train:
        gradients = weights
        optimizer = weights * OPTIMIZER_STATES[spec.optimizer]
        activations = graph.totals.activation_bytes  # every compute output is kept for backward (upper bound)
    else:
        gradients = optimizer = 0
        # inference frees each activation after its consumers ran: the two largest live tensors bound it
        outputs = sorted((sum(t.numel for t in n.output_tensors) * 4 for n in graph.nodes), reverse=True)
        activations = sum(outputs[:2])
    rest = weights + gradients + optimizer + activations
    return MemoryEstimate(weights, gradients, optimizer, activations, int(rest * WORKSPACE_FRACTION))
