"""Where and how a job runs: the accelerator, how its devices sit on nodes, the links between them, and the
parallelism. One pydantic model shared by the CLI and the HTTP service.

    PlacementSpec(accelerator="a100-sxm4-80gb", devices_per_node=(4, 4), global_batch_size=256,
                  parallelism=Parallelism(data=8))
    PlacementSpec.grid("t4", nodes=4, per_node=1, global_batch_size=64)   # spread: 4 nodes × 1 GPU

Invariants checked here: data × tensor × pipeline degrees = device count; the expert-parallel degree divides the
data-parallel one; the global batch splits evenly into data-parallel replicas and micro-batches; a tensor-parallel
group sits in one node (its degree divides every node's devices) or spans whole nodes (all nodes hold the same
number of devices, and the degree is a multiple of it: Megatron's TP 16 over two 8-GPU nodes).

The network: `inter_node_bandwidth_gbit_s` is in Gb/s (1e9 bit/s) over all the NICs of one node.
None (the default) takes the catalog's
`node_network_gbit_s` of the accelerator's typical server, or 100 Gb/s where the catalog has none.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from perfmodel.core.canonical import opt_in_flag
from perfmodel.core.renamed import upgrade_names

# intra-node links a placement can name instead of the catalog's; per-direction bandwidth is the comm model's job.
# "host": no GPU peer-to-peer, every transfer staged through host memory (NCCL_P2P_DISABLE=1, or a driver or VM
# without P2P), over the GPUs' own PCIe links
IntraNodeLink = Literal["nvlink1", "nvlink2", "nvlink3", "nvlink4", "nvlink5", "infinity-fabric", "pcie3", "pcie4",
                        "pcie5", "host"]


class Parallelism(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data: int = Field(default=1, ge=1, description="data-parallel replicas")
    tensor: int = Field(default=1, ge=1, description="tensor-parallel degree (Megatron-style; within a node, or "
                                                     "over whole nodes)")
    pipeline: int = Field(default=1, ge=1, description="pipeline stages")
    micro_batches: int = Field(default=1, ge=1, description="micro-batches per iteration per replica (1F1B)")
    expert: int = Field(default=1, ge=1, description="expert-parallel degree: ranks that split a mixture-of-experts "
                                                     "model's experts; divides `data` (1: experts replicated)")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="ZeRO stage; 3 = fully sharded (FSDP)")
    activation_checkpointing: bool = False
    gradient_bucket_copy: bool = opt_in_flag(
        "data parallelism all-reduces through buckets that keep a copy of every gradient for the whole run: torch's "
        "DistributedDataParallel with its default `gradient_as_bucket_view=False` (and the trainers that keep it: "
        "transformers', Lightning's, Accelerate's); default: false, buckets that are the gradients "
        "(`gradient_as_bucket_view=True`, apex's, Megatron-LM's and DeepSpeed's data parallelism): a placement is not "
        "refused for a copy the job may not keep")

    @property
    def devices(self) -> int:
        return self.data * self.tensor * self.pipeline

    @model_validator(mode="after")
    def _expert_divides_data(self) -> Parallelism:
        if self.data % self.expert:
            raise ValueError(f"expert: an expert-parallel degree of {self.expert} must divide the data-parallel "
                             f"degree {self.data}")
        return self


@functools.lru_cache(maxsize=1024)
def data_parallel(devices: int) -> Parallelism:
    """Data parallelism over `devices` (the default of a placement that names none): one frozen instance per
    degree, shared (a validation costs ~1 us, and every request that names no parallelism needs one)."""
    return Parallelism(data=devices)


MAX_DEVICES_PER_NODE = 72  # the largest single NVLink domain a node can be (GB200 NVL72)
MAX_REPLICA_BATCH = 2**31 - 1  # samples one replica runs per iteration (a job's batch size has the same bound)


class PlacementSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    accelerator: str = Field(description="catalog id or alias (`perfmodel hw list`)")
    devices_per_node: tuple[int, ...] = Field(default=(1,), min_length=1,
                                              description="devices on each node used, e.g. (4, 4) = 2 nodes × 4")
    intra_node_link: IntraNodeLink | None = Field(default=None, description="override of the catalog's link; "
                                                  "\"host\": no peer-to-peer, transfers staged through host memory")
    inter_node_bandwidth_gbit_s: float | None = Field(
        default=None, gt=0, description="network of one node over all its NICs, Gb/s (1e9 bit/s, not GB/s); "
                                        "default: the catalog's node_network_gbit_s, else 100")
    inter_node_latency_us: float = Field(default=5.0, ge=0, description="one-way network latency, µs")
    parallelism: Parallelism = Field(default_factory=Parallelism)
    global_batch_size: int = Field(ge=1, description="samples per iteration over all replicas")

    @classmethod
    def grid(cls, accelerator: str, *, nodes: int = 1, per_node: int = 1, **fields: Any) -> PlacementSpec:
        """`nodes` × `per_node` devices (data parallel over all of them unless `parallelism` is given)."""
        if nodes < 1 or per_node < 1:
            raise ValueError("nodes and per_node must be ≥ 1")
        fields.setdefault("parallelism", data_parallel(nodes * per_node))
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

    @field_validator("devices_per_node")
    @classmethod
    def _nodes_hold_devices(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(n < 1 for n in value):
            raise ValueError(f"every node needs ≥ 1 device, got {list(value)}")
        if max(value) > MAX_DEVICES_PER_NODE:
            raise ValueError(f"a node holds at most {MAX_DEVICES_PER_NODE} devices (the largest NVLink domain, GB200 "
                             f"NVL72), got {max(value):,}; more devices are more nodes, e.g. [8, 8]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PlacementSpec:
        p = self.parallelism
        if p.devices != self.devices:
            raise ValueError(f"parallelism: data {p.data} × tensor {p.tensor} × pipeline {p.pipeline} = "
                             f"{p.devices} devices, but the placement has {self.devices}")
        if p.tensor > 1 and any(n % p.tensor for n in self.devices_per_node):
            per_node = self.devices_per_node[0]
            if len(set(self.devices_per_node)) > 1 or p.tensor % per_node:
                raise ValueError(f"parallelism.tensor: a tensor-parallel group of {p.tensor} must sit in one node or "
                                 f"span whole nodes of equal size; nodes hold {list(self.devices_per_node)} devices")
        if self.per_replica_batch_size > MAX_REPLICA_BATCH:
            raise ValueError(f"global_batch_size: {self.global_batch_size:,} samples make "
                             f"{self.per_replica_batch_size:,} per replica, over the limit of {MAX_REPLICA_BATCH:,}")
        if self.global_batch_size % (p.data * p.micro_batches):
            raise ValueError(f"global_batch_size: {self.global_batch_size} does not split into {p.data} replicas × "
                             f"{p.micro_batches} micro-batches")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        """Inputs written before the renames of issue 15 (`perfmodel.core.renamed`) under today's names; a
        `parallelism` that names no `data` degree gets the one its devices leave (`_data_degree`)."""
        return _data_degree(upgrade_names(data))


def _data_degree(data: Any) -> Any:
    """A placement without `parallelism`, or whose `parallelism` is given without `data` (`{"tensor": 2}`,
    `{"zero_stage": 1}`), is data parallel over the devices the other degrees leave: 8 devices are 8 replicas, with
    tensor 2 they are 4, as the CLI's options make them. Anything malformed is left to validation, which names it."""
    if not isinstance(data, dict):
        return data
    parallelism, layout = data.get("parallelism", {}), data.get("devices_per_node", (1,))
    if not isinstance(parallelism, dict) or "data" in parallelism or not isinstance(layout, (list, tuple)):
        return data
    model = [parallelism.get("tensor", 1), parallelism.get("pipeline", 1)]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (*layout, *model)):
        return data
    devices, split = sum(layout), model[0] * model[1]
    if devices % split:
        return data
    return {**data, "parallelism": {**parallelism, "data": devices // split}}
