"""Where and how a job runs: the accelerator, how its devices sit on nodes, the links between them, and the
parallelism. One pydantic model shared by the CLI and the HTTP service.

    PlacementSpec(accelerator="a100-sxm4-80gb", devices_per_node=(4, 4), global_batch_size=256,
                  parallelism=Parallelism(data=8))
    PlacementSpec.grid("t4", nodes=4, per_node=1, global_batch_size=64)   # spread: 4 nodes × 1 GPU

Invariants checked here: data × tensor × pipeline degrees = device count; the global batch splits evenly into
data-parallel replicas and micro-batches; a tensor-parallel group fits in one node (cross-node tensor parallelism
is refused: no one runs it, and the comm model would have to guess).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# intra-node links a placement can name instead of the catalog's; per-direction bandwidth is the comm model's job
IntraNodeLink = Literal["nvlink1", "nvlink2", "nvlink3", "nvlink4", "nvlink5", "infinity-fabric", "pcie3", "pcie4",
                        "pcie5"]


class Parallelism(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data: int = Field(default=1, ge=1, description="data-parallel replicas")
    tensor: int = Field(default=1, ge=1, description="tensor-parallel degree (Megatron-style, within a node)")
    pipeline: int = Field(default=1, ge=1, description="pipeline stages")
    micro_batches: int = Field(default=1, ge=1, description="micro-batches per iteration per replica (1F1B)")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="ZeRO stage; 3 = fully sharded (FSDP)")
    activation_checkpointing: bool = False

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline


class PlacementSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    accelerator: str = Field(description="catalog id or alias (`perfmodel hw list`)")
    devices_per_node: tuple[int, ...] = Field(default=(1,), min_length=1,
                                              description="devices on each node used, e.g. (4, 4) = 2 nodes × 4")
    intra_node_link: IntraNodeLink | None = Field(default=None, description="override of the catalog's link")
    inter_node_bandwidth_gbps: float = Field(default=100.0, gt=0, description="network per node, Gb/s (1e9 bit/s)")
    inter_node_latency_us: float = Field(default=5.0, ge=0, description="one-way network latency, µs")
    parallelism: Parallelism = Field(default_factory=Parallelism)
    global_batch_size: int = Field(ge=1, description="samples per iteration over all replicas")

    @classmethod
    def grid(cls, accelerator: str, *, nodes: int = 1, per_node: int = 1, **fields) -> PlacementSpec:
        """`nodes` × `per_node` devices (data parallel over all of them unless `parallelism` is given)."""
        if nodes < 1 or per_node < 1:
            raise ValueError("nodes and per_node must be ≥ 1")
        fields.setdefault("parallelism", Parallelism(data=nodes * per_node))
        return cls(accelerator=accelerator, devices_per_node=(per_node,) * nodes, **fields)

    @property
    def devices(self) -> int:
        return sum(self.devices_per_node)

    @property
    def nodes(self) -> int:
        return len(self.devices_per_node)

    @property
    def consolidated(self) -> bool:
        return self.nodes == 1

    @property
    def per_replica_batch_size(self) -> int:
        return self.global_batch_size // self.parallelism.data

    @property
    def micro_batch_size(self) -> int:
        return self.per_replica_batch_size // self.parallelism.micro_batches

    @model_validator(mode="after")
    def _consistent(self) -> PlacementSpec:
        p = self.parallelism
        if any(n < 1 for n in self.devices_per_node):
            raise ValueError(f"devices_per_node: every node needs ≥ 1 device, got {list(self.devices_per_node)}")
        if p.devices != self.devices:
            raise ValueError(f"parallelism: data {p.data} × tensor {p.tensor} × pipeline {p.pipeline} = "
                             f"{p.devices} devices, but the placement has {self.devices}")
        if p.tensor > 1 and any(n % p.tensor for n in self.devices_per_node):
            raise ValueError(f"parallelism.tensor: a tensor-parallel group of {p.tensor} must sit in one node; "
                             f"nodes hold {list(self.devices_per_node)} devices")
        if self.global_batch_size % (p.data * p.micro_batches):
            raise ValueError(f"global_batch_size: {self.global_batch_size} does not split into {p.data} replicas × "
                             f"{p.micro_batches} micro-batches")
        return self
