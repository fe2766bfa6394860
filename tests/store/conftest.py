"""Store fixtures: realistic `Profile`s built from the records directly, and a `store` opened on each `store_url`
(a SQLite file and, where a server runs, PostgreSQL: see tests/conftest.py).

Tests reach the builders through the `factory` fixture (`factory.profile(...)`). They are deterministic (fixed
timestamps), so a test and a subprocess build equal profiles; the kill test's child loads this file with `runpy`.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from perfmodel.core.opkinds import OpKind
from perfmodel.jobs.spec import HFConfigSource, JobSpec, Mode, OptimizerName, Precision, ZooSource
from perfmodel.records import (
    Environment,
    IterationStats,
    OnnxNodeRecord,
    OnnxProfile,
    OpProfile,
    OpRecord,
    Outcome,
    Profile,
)
from perfmodel.store import ProfileStore

BASE_TIME = datetime(2025, 3, 14, 9, 26, 53, 589793, tzinfo=timezone.utc)

_OP_CYCLE = [  # (name, kind, input shapes, phase) of a small MLP step, repeated
    ("aten::addmm", OpKind.linear, ((32, 1024), (32, 4096), (4096, 1024)), "forward"),
    ("aten::gelu", OpKind.activation, ((32, 4096),), "forward"),
    ("aten::native_layer_norm", OpKind.layernorm, ((32, 4096), (4096,), (4096,)), "forward"),
    ("aten::mm", OpKind.linear, ((4096, 32), (32, 1024)), "backward"),
    ("aten::gelu_backward", OpKind.activation, ((32, 4096), (32, 4096)), "backward"),
    ("aten::_foreach_add_", OpKind.optimizer, (), "optimizer"),
    ("aten::copy_", OpKind.copy, ((32, 1024), (32, 1024)), "other"),
]


def cpu_environment(device_name: str = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz") -> Environment:
    return Environment(
        device="cpu",
        device_type="cpu",
        device_name=device_name,
        device_count=1,
        cpu_model=device_name,
        cpu_cores=2,
        threads=2,
        host="bench-01",
        os="Linux-6.1.0-x86_64-with-glibc2.36",
        python_version="3.11.7",
        torch_version="2.4.1+cpu",
        onnxruntime_version="1.19.2",
        perfmodel_version="0.1.0",
        captured_at=BASE_TIME - timedelta(seconds=5),
    )


def cuda_environment(device_name: str = "NVIDIA A100-SXM4-80GB") -> Environment:
    return Environment(
        device="cuda:0",
        device_type="cuda",
        device_name=device_name,
        device_count=8,
        cpu_model="AMD EPYC 7763 64-Core Processor",
        cpu_cores=128,
        threads=16,
        host="gpu-node-07",
        os="Linux-5.15.0-x86_64-with-glibc2.35",
        python_version="3.11.7",
        torch_version="2.4.1+cu121",
        cuda_version="12.1",
        driver_version="535.104.05",
        perfmodel_version="0.1.0",
        captured_at=datetime(2025, 3, 14, 11, 0, 0, tzinfo=timezone(timedelta(hours=2))),
    )


def make_ops(n_ops: int) -> OpProfile:
    ops = []
    for i in range(n_ops):
        name, kind, shapes, phase = _OP_CYCLE[i % len(_OP_CYCLE)]
        ops.append(
            OpRecord(
                seq=i,
                phase=phase,
                name=name,
                kind=kind,
                input_shapes=shapes,
                self_time_ms=0.0137 + i * 1e-6 + 0.1 / 3,
                ir_node=f"blocks.{i // len(_OP_CYCLE)}.{name.split('::')[1]}" if phase == "forward" else None,
            )
        )
    total = sum(op.self_time_ms for op in ops)
    return OpProfile(steps=3, iter_time_ms=total / 0.91 if ops else 1.0, ops=tuple(ops),
                     coverage=0.91 if ops else 0.0, matched_fraction=0.8732)


def make_onnx(n_nodes: int) -> OnnxProfile:
    nodes = tuple(
        OnnxNodeRecord(
            graph_optimization="disabled" if i % 2 else "enabled",
            node_name=f"/blocks.{i}/fc/Gemm",
            op_type="Gemm" if i % 3 else "Relu",
            kind=OpKind.linear if i % 3 else OpKind.activation,
            provider="CPUExecutionProvider",
            time_ms=0.25 + i / 7,
            input_shapes=((32, 1024), (4096, 1024), (4096,)) if i % 3 else ((32, 4096),),
            output_shapes=((32, 4096),),
        )
        for i in range(n_nodes)
    )
    return OnnxProfile(provider="CPUExecutionProvider", runs=20, iter_time_ms_disabled=4.817,
                       iter_time_ms_enabled=3.9021, nodes=nodes)


def make_iteration(batch_size: int, outcome: Outcome = Outcome.ok) -> IterationStats:
    if outcome is Outcome.oom:
        return IterationStats(outcome=outcome, warmup=2, repeats=0, batch_size=batch_size,
                              peak_memory_bytes=85_899_345_920,
                              error="CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total)")
    samples = (41.23, 40.981, 41.0007, 42.5, 40.1 + 1e-9)
    median = sorted(samples)[len(samples) // 2]
    return IterationStats(
        outcome=outcome,
        warmup=3,
        repeats=len(samples),
        batch_size=batch_size,
        samples_ms=samples,
        iter_time_ms_median=median,
        iter_time_ms_p10=40.45,
        iter_time_ms_p90=41.9,
        iter_time_ms_mean=sum(samples) / len(samples),
        iter_time_cv=0.01823,
        throughput_samples_per_s=batch_size * 1000 / median,
        peak_memory_bytes=3_221_225_472,
    )


def make_profile(
    *,
    name: str = "resnet50",
    batch_size: int = 32,
    environment: Environment | None = None,
    outcome: Outcome | None = Outcome.ok,
    n_ops: int | None = 40,
    n_onnx: int | None = None,
    created_at: datetime = BASE_TIME,
    family: str = "resnet",
) -> Profile:
    """A zoo-job profile; None for `outcome`, `n_ops` or `n_onnx` leaves that part out."""
    job = JobSpec(source=ZooSource(name=name), batch_size=batch_size, precision=Precision.amp,
                  optimizer=OptimizerName.adamw)
    return Profile(
        job=job,
        job_id=job.key(),
        family=family,
        environment=environment or cpu_environment(),
        iteration=None if outcome is None else make_iteration(batch_size, outcome),
        ops=None if n_ops is None else make_ops(n_ops),
        onnx=None if n_onnx is None else make_onnx(n_onnx),
        created_at=created_at,
    )


def make_hf_profile() -> Profile:
    """An inference run of an HF config on a GPU, with a nested config and a non-UTC created_at."""
    config = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "layer_norm_eps": 1e-12,
              "architectures": ["BertForMaskedLM"], "id2label": {"0": "A", "1": "B"}, "torch_dtype": None}
    job = JobSpec(source=HFConfigSource(config=config, task="masked-lm"), batch_size=8, seq_len=512,
                  precision=Precision.bf16, mode=Mode.inference)
    return Profile(
        job=job,
        job_id=job.key(),
        family="bert",
        environment=cuda_environment(),
        iteration=make_iteration(8),
        ops=make_ops(25),
        onnx=make_onnx(12),
        created_at=datetime(2025, 3, 15, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=-7))),
    )


@pytest.fixture
def factory() -> SimpleNamespace:
    return SimpleNamespace(profile=make_profile, hf_profile=make_hf_profile, cpu_environment=cpu_environment,
                           cuda_environment=cuda_environment)


@pytest.fixture
def store(store_url: str) -> Iterator[ProfileStore]:
    with ProfileStore(store_url) as opened:
        yield opened
