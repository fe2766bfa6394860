"""`perfmodel hw bench`: the candidate grid and its order, timings on this CPU for real, rows, resume, the CLI."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from perfmodel.core.errors import DeviceError
from perfmodel.hardware.catalog import load_catalog
from perfmodel.profilers.bench_rows import SOURCE, done_keys, software_versions, timing_rows
from perfmodel.profilers.microbench import (
    BENCH_CLASSES,
    BenchShape,
    bench_maths,
    build_op,
    candidate_grid,
    order_candidates,
    run_sweep,
    time_op,
    torch_device_of,
)
from perfmodel.store import ProfileStore
from perfmodel.store.rows import measurement_uid

TINY = [BenchShape("bmm", "bmm", "fp32", batch=2, m=16, n=16, k=16),
        BenchShape("linear", "linear", "fp32", batch=1, m=8, n=16, k=32),
        BenchShape("conv2d", "conv2d", "fp32", batch=1, in_channels=3, out_channels=4, input_size=8, kernel_size=3,
                   stride=1, padding=1),
        BenchShape("elementwise", "gelu", "fp32", batch=4, hidden=64),
        BenchShape("softmax", "softmax", "fp32", batch=4, hidden=64),
        BenchShape("layernorm", "ln", "fp32", batch=4, hidden=64)]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_maths_follow_the_catalog(catalog):
    assert bench_maths(catalog["cpu"]) == ("fp32",)
    assert set(bench_maths(catalog["a100-pcie-40gb"])) == {"fp32", "fp16", "bf16", "tf32"}
    assert "tf32" not in bench_maths(catalog["v100-pcie-32gb"]) and "bf16" not in bench_maths(catalog["v100-pcie-32gb"])
    grid = candidate_grid(catalog["a100-pcie-40gb"])
    assert {s.op_class for s in grid if s.dtype == "tf32"} == {"bmm", "linear", "conv2d"}
    assert {s.op_class for s in grid} == set(BENCH_CLASSES)
    assert len({s.key for s in grid}) == len(grid)  # keys identify shapes


def test_bench_shapes_are_kernel_rows_priced_by_the_one_roofline(catalog):
    from perfmodel.core import cost
    from perfmodel.lowering.ops import SHAPE_COLUMNS, device_peaks, op_work
    from perfmodel.profilers.microbench import BENCH_FIELDS, roofline_by_key, shapes_frame

    assert set(BENCH_FIELDS) == set(SHAPE_COLUMNS)
    spec = catalog["a100-pcie-40gb"]
    frame = shapes_frame(TINY, spec.name)
    work = op_work(frame)
    peak, bandwidth = device_peaks(frame, catalog)
    expected = cost.roofline_ms(work.flops, work.bytes_read + work.bytes_written, peak, bandwidth)
    by_key = roofline_by_key(TINY, spec, catalog)
    assert [by_key[s.key] for s in TINY] == expected.tolist()


def test_order_interleaves_classes_and_drops_slow_shapes(catalog):
    spec = catalog["cpu"]
    grid = candidate_grid(spec)
    ordered = order_candidates(grid, spec, catalog, max_op_ms=20.0)
    assert len({s.key for s in ordered}) == len(ordered) < len(grid)  # a subset, no repeats
    assert {s.op_class for s in ordered[:len(BENCH_CLASSES)]} == set(BENCH_CLASSES)  # any short budget sees all
    # farthest-first: the first few shapes of a class span a wide range of work
    from perfmodel.lowering.ops import op_work
    from perfmodel.profilers.microbench import shapes_frame

    bmm = [s for s in ordered if s.op_class == "bmm"][:4]
    flops = op_work(shapes_frame(bmm, "cpu")).flops
    assert flops.max() / flops.min() > 100


def test_time_op_and_a_real_sweep_on_this_cpu(sqlite_url):
    samples, timer = time_op(build_op(TINY[0], "cpu"), "cpu", warmup=1, repeats=4)
    assert timer == "perf_counter" and len(samples) == 4 and all(s > 0 for s in samples)
    batches = []
    result = run_sweep(TINY, "cpu", budget_s=5.0, warmup=1, repeats=3, on_batch=batches.append, batch_size=4)
    assert len(result.timings) == len(TINY) and result.left == 0 and not result.failed
    assert [len(b) for b in batches] == [4, 2]
    rows = timing_rows(result.timings, "cpu", "run-a", software_versions(), {"model": "test"})
    assert {r.op_class for r in rows} == set(BENCH_CLASSES)
    assert all(r.source == SOURCE and r.latency_ms > 0 and r.extra["timer"] == "perf_counter" for r in rows)
    with ProfileStore(sqlite_url) as store:
        assert store.add_op_measurements(rows) == len(rows)
        assert store.add_op_measurements(rows) == 0  # same run, same shapes: nothing new
        stored = store.op_measurements(source=SOURCE, device="cpu")
    assert done_keys(stored, "run-a", "cpu") == {s.key for s in TINY}
    assert done_keys(stored, "run-b", "cpu") == set()
    # resumed: every shape already done is skipped, nothing is timed
    again = run_sweep(TINY, "cpu", budget_s=5.0, done=done_keys(stored, "run-a", "cpu"))
    assert again.skipped_done == len(TINY) and not again.timings


def test_rows_identity_is_run_device_and_shape():
    from perfmodel.profilers.microbench import Timing

    timing = Timing(TINY[0], (1.0, 2.0, 30.0), 1, "perf_counter")
    a = timing_rows([timing], "cpu", "r1", {}, {})[0]
    b = timing_rows([Timing(TINY[0], (5.0,), 1, "perf_counter")], "cpu", "r1", {}, {})[0]
    c = timing_rows([timing], "cpu", "r2", {}, {})[0]
    assert a.latency_ms == 1.0 and a.extra["samples_ms"] == [1.0, 2.0, 30.0]  # CPU: the fastest call
    assert Timing(TINY[0], (1.0, 2.0, 30.0), 1, "cuda-events").latency_ms == 2.0  # GPU: the median
    assert measurement_uid(a) == measurement_uid(b) != measurement_uid(c)


def test_budget_stops_the_sweep():
    result = run_sweep(TINY * 50, "cpu", budget_s=0.0)
    assert not result.timings and result.left == len(TINY) * 50


def test_device_names():
    assert torch_device_of("cpu") == "cpu" and torch_device_of("cuda") == "cuda:0"
    assert torch_device_of("cuda:3") == "cuda:3" and torch_device_of("rocm") == "cuda:0"
    with pytest.raises(DeviceError):
        torch_device_of("tpu")


def test_cli_bench_stores_resumes_and_adapts(sqlite_url, _isolated_home):
    from perfmodel.cli.main import app

    runner = CliRunner()
    args = ["hw", "bench", "--device", "cpu", "--budget-s", "6", "--store", sqlite_url, "--run-id", "t",
            "--classes", "linear,softmax", "--max-op-ms", "2", "--no-steps"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "rows stored" in first.output and "adapted" in first.output
    with ProfileStore(sqlite_url) as store:
        n = store.count_op_measurements(source=SOURCE, device="cpu")
    assert n >= 2
    assert (_isolated_home / "adaptations" / "cpu" / "manifest.json").exists()
    second = runner.invoke(app, [*args, "--no-adapt"])
    assert second.exit_code == 0, second.output
    assert f"{n} already stored" in second.output
    bad = runner.invoke(app, ["hw", "bench", "--device", "cpu", "--classes", "fft", "--store", sqlite_url])
    assert bad.exit_code == 2 and "fft" in bad.output
    refit = runner.invoke(app, ["adapt", "--device", "cpu", "--store", sqlite_url])
    assert refit.exit_code == 0 and "adapted" in refit.output, refit.output
    none = runner.invoke(app, ["adapt", "--device", "t4", "--store", sqlite_url])
    assert none.exit_code == 2 and "no measured ops of 't4'" in none.output


def test_any_cpu_is_benched_as_the_catalogs_cpu(sqlite_url, _isolated_home, monkeypatch):
    """The shipped `cpu` entry is the host the CPU models were measured on. On another CPU, `hw bench --device cpu`
    still benches it as `cpu` (what it learns is what `--accelerator cpu` answers with on this host), keeps the
    entry as shipped (the CPU step model knows no other spec sheet) but for the rate of new memory it measures on
    this host, and records the host's model in each row."""
    from perfmodel.cli.main import app
    from perfmodel.hardware import probe
    from perfmodel.hardware.catalog import get_accelerator
    from perfmodel.profilers.microbench import probe_device

    other = probe.CpuIdentity(model="Example Other CPU 9000", vendor="Intel", vendor_id="GenuineIntel")
    monkeypatch.setattr(probe, "read_cpu_identity", lambda *args, **kwargs: other)
    shipped = load_catalog()["cpu"]
    probed = probe_device("cpu", load_catalog())
    assert not probed.new_entry and probed.spec == shipped and probed.properties["model"] == other.model

    result = CliRunner().invoke(app, ["hw", "bench", "--device", "cpu", "--budget-s", "3", "--store", sqlite_url,
                                      "--classes", "linear", "--max-op-ms", "2", "--no-steps"])
    assert result.exit_code == 0, result.output
    benched = get_accelerator("cpu", load_catalog())
    assert benched.model_copy(update={"first_touch_gb_s": shipped.first_touch_gb_s}) == shipped
    assert benched.first_touch_gb_s is None or benched.first_touch_gb_s > 0
    with ProfileStore(sqlite_url) as store:
        rows = store.op_measurements(source=SOURCE, device="cpu")
    assert len(rows) >= 1 and "Example Other CPU 9000" in str(rows.iloc[0].to_dict())


@pytest.mark.gpu
def test_a_real_sweep_on_the_gpu(catalog):
    from perfmodel.profilers.microbench import probe_device

    probed = probe_device("cuda", catalog)
    result = run_sweep([BenchShape("bmm", "bmm", "fp16", batch=4, m=256, n=256, k=256), *TINY], probed.torch_device,
                       budget_s=10.0)
    assert len(result.timings) == len(TINY) + 1
    assert all(t.timer == "cuda-events" and t.median_ms > 0 for t in result.timings)


def test_stalled_cpu_timings_are_taken_again_then_left_out():
    from perfmodel.profilers.microbench import STALL_RETRIES, Timing, stalled

    assert stalled(Timing(TINY[3], (32.0, 30.0, 31.0), 1, "perf_counter"), roofline_ms=0.0001)
    assert not stalled(Timing(TINY[3], (0.002,), 1, "perf_counter"), roofline_ms=0.0001)  # tiny but fast
    assert not stalled(Timing(TINY[3], (32.0,), 1, "cuda-events"), roofline_ms=0.0001)  # device time: trusted
    slow = BenchShape("bmm", "bmm", "fp32", batch=8, m=512, n=512, k=512)  # 2 GFLOP: over 1 ms on any 2-core host
    result = run_sweep([TINY[0], slow], "cpu", budget_s=30.0, warmup=1, repeats=3,
                       roofline_ms={TINY[0].key: 0.001, slow.key: 1e-6})  # pretend `slow` should take 1 ns
    assert [t.shape for t in result.timings] == [TINY[0]]
    assert len(result.failed) == 1 and "stalled" in result.failed[0] and STALL_RETRIES >= 1
