"""`perfmodel hw list` / `hw show` on the shipped catalog, and what `hw bench` says it kept."""

import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.hardware.catalog import load_catalog

runner = CliRunner()


@pytest.fixture(autouse=True)
def _free_new_memory(monkeypatch):
    """`hw bench` on a CPU times how fast new memory is; here it is free unless a test says otherwise."""
    from perfmodel.hardware import probe

    monkeypatch.setattr(probe, "first_touch_gb_s", lambda: None)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_hw_list_table_and_json():
    result = run("hw", "list")
    assert result.exit_code == 0, result.output
    for fragment in ("fp32 TFLOP/s", "fp16/bf16 TFLOP/s", "bandwidth GB/s", "h100-sxm5", "mi300x", "cpu"):
        assert fragment in result.stdout
    result = run("hw", "list", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert sum(row["kind"] == "gpu" for row in rows) >= 20


def test_hw_show_resolves_torch_names_and_prints_every_field():
    result = run("hw", "show", "NVIDIA H100 80GB HBM3")
    assert result.exit_code == 0, result.output
    spec = json.loads(result.stdout)
    assert spec["name"] == "h100-sxm5" and spec["peak_tf32_gflops"] > 0 and "interconnect" in spec
    result = run("hw", "show", "nvidia h100")  # the bare name's default, brand words or not
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "h100-sxm5"
    result = run("hw", "show", "nvidia h10")
    assert result.exit_code == 2 and "did you mean" in result.output and "NVIDIA H100 PCIe" in result.output


def test_hw_show_of_an_ambiguous_name_lists_the_candidates():
    result = run("hw", "show", "RTX 6000")
    assert result.exit_code == 2
    for candidate in ("quadro-rtx-6000", "rtx-6000-ada", "rtx-pro-6000-blackwell-server"):
        assert candidate in result.output
    result = run("hw", "show", "RTXPRO6000")  # llmservingsim's folder: the card it measured
    assert result.exit_code == 0 and json.loads(result.stdout)["name"] == "rtx-pro-6000-blackwell-server"


@pytest.mark.parametrize("adapt", [False, True])
def test_hw_bench_says_once_whether_the_adaptation_is_applied(monkeypatch, adapt):
    """Whole steps judge the op-sweep adaptation: the output says once whether it is applied, with the held-out
    errors, and names the folder only when the adaptation stays there (the sweep and the steps are stand-ins)."""
    from perfmodel.evaluation import bench, device_steps, training
    from perfmodel.evaluation.device_steps import Verdict
    from perfmodel.regressors.adaptation import adaptations_dir
    from perfmodel.store import device_steps as stored_steps

    folder = adaptations_dir() / "cpu"

    def fit_adaptation(device, store, catalog, progress):
        folder.mkdir(parents=True)
        progress(f"adapted xgb-device-ops/v3 to {device} (linear 3 rows): {folder}")
        return SimpleNamespace(rows_per_class={"linear": 3})

    mape = {(False, False): 20.0, (True, False): 12.5 if adapt else 160.0, (False, True): 18.0, (True, True): 15.0}
    monkeypatch.setattr(bench, "bench_device", lambda *args, **kwargs: SimpleNamespace(
        summary=lambda: "timed 3 shapes", device="cpu", catalog={"cpu": load_catalog()["cpu"]}))
    monkeypatch.setattr(training, "fit_adaptation", fit_adaptation)
    monkeypatch.setattr(device_steps, "time_steps", lambda *args: ["step"] * 3)
    monkeypatch.setattr(device_steps, "predictors_for", lambda *args: {})
    monkeypatch.setattr(device_steps, "judge", lambda *args: Verdict(mape, adapt=adapt, calibrate=False))
    monkeypatch.setattr(stored_steps, "delete_device_steps", lambda device: False)
    result = run("hw", "bench", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert result.output.count("op-sweep adaptation:") == 1
    if adapt:
        assert "op-sweep adaptation: applied (it beat the model as shipped on held-out steps: 12.5 % vs 20.0 % " \
               "MAPE)" in result.output
        assert f"adapted xgb-device-ops/v3 to cpu (linear 3 rows): {folder}" in result.output and folder.is_dir()
    else:
        assert "op-sweep adaptation: not applied (it did not beat the model as shipped on held-out steps: 160.0 % " \
               "vs 20.0 % MAPE)" in result.output
        assert str(folder) not in result.output and not folder.exists()


def test_hw_bench_says_when_the_model_as_shipped_is_within_its_own_error(monkeypatch):
    """Steps the model as shipped already answers within its own held-out error: neither the adaptation nor the
    calibration is applied, and the output says why (the sweep and the steps are stand-ins)."""
    from perfmodel.evaluation import bench, device_steps, training
    from perfmodel.evaluation.device_steps import Verdict, within_bound_pct
    from perfmodel.store import device_steps as stored_steps

    mape = {(False, False): 11.0, (True, False): 99.1, (False, True): 8.7, (True, True): 25.9}
    monkeypatch.setattr(bench, "bench_device", lambda *args, **kwargs: SimpleNamespace(
        summary=lambda: "timed 3 shapes", device="cpu", catalog={"cpu": load_catalog()["cpu"]}))
    monkeypatch.setattr(training, "fit_adaptation", lambda *args: SimpleNamespace(rows_per_class={"linear": 3}))
    monkeypatch.setattr(device_steps, "time_steps", lambda *args: ["step"] * 8)
    monkeypatch.setattr(device_steps, "predictors_for", lambda *args: {})
    seen = []

    def judge(steps, hardware, predictors, own_mape_pct):
        seen.append(own_mape_pct)
        within = within_bound_pct(own_mape_pct, len(steps))
        return Verdict(mape, False, False, within_pct=within, steps=len(steps))

    monkeypatch.setattr(device_steps, "judge", judge)
    monkeypatch.setattr(stored_steps, "delete_device_steps", lambda device: True)
    result = run("hw", "bench", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert seen == [pytest.approx(device_steps.own_held_out_mape_pct("cpu"))]
    bound = within_bound_pct(device_steps.own_held_out_mape_pct("cpu"), 8)
    said = f"answers these steps within its own held-out error (at most {bound:.1f} % MAPE over 8 steps"
    assert said in result.output
    assert "op-sweep adaptation: not applied (the model as shipped answers the steps within its own held-out " \
           "error)" in result.output
    assert "dropped the steps kept before for cpu: the model as shipped answers them within its own held-out " \
           "error" in result.output


def test_hw_bench_records_how_fast_new_memory_is_and_says_when_it_is_slow(monkeypatch):
    """`hw bench` on a CPU records the rate at which the host faults in new large tensors' pages in its catalog entry
    (every later prediction charges them) and says so when it is slow; a fast or free one is recorded silently (the
    sweep and the rate are stand-ins, no whole steps)."""
    from perfmodel.cli.hw import SLOW_FIRST_TOUCH_GB_S, first_touch_notice
    from perfmodel.evaluation import bench
    from perfmodel.hardware import probe

    assert first_touch_notice(None) is None and first_touch_notice(SLOW_FIRST_TOUCH_GB_S) is None
    notice = first_touch_notice(2.0)
    assert notice is not None and "32 MiB or more at 2.0 GB/s (34 ms for 64 MiB" in notice
    monkeypatch.setattr(bench, "bench_device", lambda *args, **kwargs: SimpleNamespace(
        summary=lambda: "timed 3 shapes", device="cpu", catalog={"cpu": load_catalog()["cpu"]}))
    for rate, shown in ((2.0, True), (None, False), (40.0, False)):
        monkeypatch.setattr(probe, "first_touch_gb_s", lambda rate=rate: rate)
        result = run("hw", "bench", "--device", "cpu", "--no-adapt", "--no-steps")
        assert result.exit_code == 0, result.output
        assert ("new memory: this host faults in" in result.output) is shown, (rate, result.output)
        assert load_catalog()["cpu"].first_touch_gb_s == rate
