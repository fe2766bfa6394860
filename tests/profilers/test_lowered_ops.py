"""Real ops the sweep runs as themselves: their rows are a job's rows, their kernels run on this CPU for real."""

from __future__ import annotations

import pytest
import torch

from perfmodel.core.errors import PerfmodelError
from perfmodel.hardware.catalog import load_catalog
from perfmodel.lowering.ops import op_work
from perfmodel.profilers.lowered_ops import REAL_OPS, build_kernel, lowered_rows, swept_tensors
from perfmodel.profilers.microbench import BenchShape, build_op, candidate_grid, shapes_frame, time_op


def test_a_depthwise_convolution_is_three_rows_of_its_true_flops():
    n, c, h = 2, 24, 14
    rows = lowered_rows("dwconv3x3s2", (n, c, h, h))
    assert [r.part for r in rows] == ["fwd", "dX", "dW"]  # its input needs a gradient, as inside a network
    shapes = [dict(r.shape) for r in rows]
    assert all(s["batch"] == n * c and s["in_channels"] == s["out_channels"] == 1 for s in shapes)
    frame = shapes_frame([BenchShape(r.op_class, r.op_name, "fp32", **dict(r.shape)) for r in rows], "cpu")
    out = (h + 2 - 3) // 2 + 1
    assert len(frame) == 3
    assert (op_work(frame).flops == 2 * n * c * out * out * 3 * 3).all()  # 2 · N·C·H'·W' · k²


def test_a_batch_norm_is_channels_rows_over_the_rest():
    rows = lowered_rows("batch_norm", (4, 64, 7, 7))
    assert [(r.op_class, r.part) for r in rows] == [("layernorm", "fwd"), ("layernorm", "grad")]
    assert all(dict(r.shape)["batch"] == 64 and dict(r.shape)["hidden"] == 4 * 7 * 7 for r in rows)


def test_a_max_pool_is_its_memory_rows_under_its_own_names():
    rows = lowered_rows("max_pool3x3s2", (2, 16, 28, 28))
    assert [(r.op_class, r.op_name, r.part) for r in rows] == [("elementwise", "maxpool", "fwd"),
                                                                ("elementwise", "maxpoolu", "grad")]


@pytest.mark.parametrize("name", ["dwconv5x5", "batch_norm", "max_pool3x3s2"])
def test_every_row_of_a_real_op_has_a_kernel_that_runs_here(name):
    tensor = (2, 8, 10, 10)
    for row in lowered_rows(name, tensor):
        run = build_kernel(name, row.part, tensor, torch.float32, "cpu")
        out = run()
        if row.part == "fwd":
            out = out[0] if isinstance(out, tuple) else out
            assert out.shape[:2] == tensor[:2] and out.requires_grad  # recorded for autograd, as in training
        else:
            grads = out
            assert all(g is not None and torch.isfinite(g).all() for g in grads)
            expected = {"dX": [tensor], "dW": [(8, 1, 5, 5)],
                        "grad": [tensor, (8,), (8,)] if name == "batch_norm" else [tensor]}[row.part]
            assert [tuple(g.shape) for g in grads] == expected
        assert run() is not None  # the kept graph runs again


def test_real_op_rows_join_their_class_in_the_grid_and_time_on_this_cpu():
    catalog = load_catalog()
    grid = candidate_grid(catalog["cpu"])
    real = [s for s in grid if s.real_op is not None]
    assert {s.op_class for s in real} == {"conv2d", "layernorm", "elementwise"}
    assert {s.real_op for s in real} == set(REAL_OPS)
    assert len({s.key for s in grid}) == len(grid)  # a real op's parts and inputs are in the key
    assert all(set(s.fields()) == set(grid[0].fields()) for s in real)  # rows: no real-op columns
    gpu_grid = candidate_grid(catalog["a100-pcie-40gb"])
    assert not [s for s in gpu_grid if s.dtype == "tf32" and s.real_op is not None]  # TF32 changes no such kernel
    assert {s.tensor[0] for s in gpu_grid if s.real_op} == {n for n, *_ in swept_tensors("batch_norm", True)}
    small = min((s for s in real if s.part == "dW"), key=lambda s: s.tensor[0] * s.tensor[1] * s.tensor[2] ** 2)
    samples, timer = time_op(build_op(small, "cpu"), "cpu", warmup=1, repeats=3)
    assert timer == "perf_counter" and len(samples) == 3 and min(samples) > 0


def test_unknown_real_ops_and_parts_are_refused():
    with pytest.raises(PerfmodelError, match="dwconv3x3"):
        lowered_rows("dwconv9x9", (1, 8, 8, 8))
    with pytest.raises(PerfmodelError, match="parts: fwd, grad"):
        build_kernel("batch_norm", "dX", (1, 8, 8, 8), torch.float32, "cpu")


def test_a_saved_run_names_the_real_op_of_each_row(sqlite_url, monkeypatch):
    """`bench/hw_bench.py --save-run` keeps, with each swept row, the real op it was timed as (null for the
    others), so that `--replay --without-real-ops` can leave those rows out."""
    from pathlib import Path

    from perfmodel.profilers.bench_rows import timing_rows
    from perfmodel.profilers.microbench import Timing
    from perfmodel.store import ProfileStore

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "bench"))
    import hw_bench

    tensor = (1, 32, 112, 112)
    real = [BenchShape(r.op_class, r.op_name, "fp32", **dict(r.shape), real_op="batch_norm", part=r.part,
                       tensor=tensor) for r in lowered_rows("batch_norm", tensor)]
    dense = BenchShape("layernorm", "ln", "fp32", batch=8, hidden=256)
    timings = [Timing(s, (0.5 + i,), 1, "perf_counter") for i, s in enumerate([dense, *real])]
    rows = timing_rows(timings, "cpu", "run-a", {}, {})
    assert rows[1].extra["real_op"] == "batch_norm" and rows[1].extra["tensor"] == list(tensor)
    assert "real_op" not in rows[0].extra
    with ProfileStore(sqlite_url) as store:
        store.add_op_measurements(rows)
    saved = hw_bench.swept_rows(sqlite_url)
    assert [r["real_op"] for r in saved] == [None, "batch_norm", "batch_norm"]
    assert [r["latency_ms"] for r in saved] == [0.5, 1.5, 2.5]
    assert saved[1]["batch"] == 32 and saved[1]["hidden"] == 112 * 112  # the job's row: C rows over N·H·W


def test_a_half_math_runs_as_mixed_precision_training_does():
    """bf16 here (fp16 on a GPU): the op runs under autocast, its parameters and their gradients stay fp32."""
    tensor = (2, 8, 10, 10)
    assert build_kernel("dwconv3x3", "fwd", tensor, torch.bfloat16, "cpu")().dtype == torch.bfloat16
    assert build_kernel("dwconv3x3", "dW", tensor, torch.bfloat16, "cpu")()[0].dtype == torch.float32
    grads = build_kernel("batch_norm", "grad", tensor, torch.bfloat16, "cpu")()
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float32, torch.float32]
