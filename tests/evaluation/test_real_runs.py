"""Whole-job runs into the learned whole-step stage: merging repeats into samples/s, the scaling ratio, `perfmodel
retrain --roles whole-step` on a real SQLite store of synthetic whole-job runs (composed through the real serving
path), the served prediction it changes, and the GPU accuracy report with its plots."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from perfmodel.evaluation.gpu_report import MARKERS, MODES, GpuAccuracy, headline, write_gpu_report
from perfmodel.evaluation.real_runs import (
    IMPOSSIBLE_BELOW_ROOFLINE,
    THRASH_ABOVE_SMALLER_BATCH,
    RealRun,
    composed_frame,
    on_own_software,
    physically_possible,
    real_runs,
    recomposed_without_p2p,
    repeat_spread,
    scaling_ratio_errors,
    slower_than_one_gpu,
    steady_steps,
    thrash_ratio,
    with_software,
)
from perfmodel.evaluation.retrain import RetrainSettings, retrain
from perfmodel.importers.lambda_runs import WholeJobRun
from perfmodel.jobs.spec import Precision
from perfmodel.jobs.zoo import ZOO
from perfmodel.predictor.placed import PlacementPredictor
from perfmodel.store.jobs import JobStore
from tests.conftest import copy_shipped_models

GPUS = ("a100-sxm4-80gb", "v100-sxm2-16gb", "rtx-3090", "rtx-a6000", "quadro-rtx-8000")
TRUE_FACTOR = 1.4  # the synthetic runs are this much slower than the composed prediction


def frame_of(rows: list[dict]) -> pd.DataFrame:
    base = {"source": "lambda", "devices": 1, "precision": "tf32", "unit": "tokens/s", "suite": "v0"}
    return pd.DataFrame([{**base, **row} for row in rows])


def test_repeats_merge_into_their_median_in_samples_per_second():
    per_sample = ZOO["gnmt"].items(ZOO["gnmt"].reference_seq_len or 128)
    runs = real_runs(frame_of([
        {"model": "gnmt", "accelerator": "a10", "batch_size": 128.0, "global_batch_size": 128,
         "throughput_items_per_s": t} for t in (90_000.0, 100_000.0, 200_000.0)]
        + [{"model": "gnmt", "accelerator": None, "batch_size": 128.0, "global_batch_size": 128,
            "throughput_items_per_s": 1.0},  # a GPU the catalog lacks: left out
           {"model": "resnet-unknown", "accelerator": "a10", "batch_size": 8.0, "global_batch_size": 8,
            "throughput_items_per_s": 1.0}]))  # not a zoo model: left out
    assert len(runs) == 1
    run = runs[0]
    assert run.repeats == 3 and run.family == "gnmt"
    assert run.measured_samples_per_s == pytest.approx(100_000.0 / per_sample)
    assert run.measured_ms == pytest.approx(128 / run.measured_samples_per_s * 1e3)


def test_a_configuration_knows_its_pytorch_version_where_its_repeats_name_one_and_agree():
    rows = [{"model": "gnmt", "accelerator": "a10", "batch_size": b, "global_batch_size": int(b),
             "throughput_items_per_s": 1e5, "pytorch_version": v}
            for b, v in ((128.0, "1.13.0a0+d0d6b1f"), (128.0, None), (256.0, "1.4.0a0+a5b4d78"),
                         (256.0, "1.9.0a0+df837d0"), (512.0, None))]
    runs = {r.batch_size: r for r in real_runs(frame_of(rows))}
    assert runs[128].pytorch_version == "1.13" and runs[128].repeats == 2  # an unnamed repeat takes the named one's
    assert runs[256].pytorch_version == "" and runs[512].pytorch_version == ""  # they disagree; none named
    assert real_runs(frame_of(rows[:1]).drop(columns="pytorch_version"))[0].pytorch_version == ""
    # a frame composed before the column has it filled from the runs
    composed = pd.DataFrame([dataclasses.asdict(r) for r in runs.values()]).drop(columns="pytorch_version")
    assert list(with_software(composed, list(runs.values())).pytorch_version) == [r.pytorch_version
                                                                                  for r in runs.values()]
    # and a frame composed before a run's version was known gets it; one the runs do not name keeps its own
    stale = composed.assign(pytorch_version=["", "1.9", "1.7"])
    assert list(with_software(stale, list(runs.values())).pytorch_version) == ["1.13", "1.9", "1.7"]
    # each run answered on its own version: the stage's offset of it, none where unknown
    frame = pd.DataFrame({"key": [f"k{i}" for i in range(3)], "model": ["gnmt"] * 3})

    class Stage:
        def software_offset(self, versions):
            return np.array([{"1.4": np.log(2.0)}.get(v, 0.0) for v in versions])

    predicted = pd.DataFrame({"key": ["k0", "k1", "k2"], "predicted_ms": [10.0] * 3, "low_ms": [8.0] * 3,
                              "high_ms": [12.0] * 3})
    own = on_own_software(predicted, frame.assign(pytorch_version=["1.4", "1.13", None]), Stage())
    np.testing.assert_allclose(own.predicted_ms, [20.0, 10.0, 10.0])
    np.testing.assert_allclose(own.low_ms, [16.0, 8.0, 8.0]) and np.testing.assert_allclose(own.high_ms, [24, 12, 12])
    assert on_own_software(predicted, frame, Stage()) is predicted  # no versions: as served


def test_the_scaling_ratio_pairs_each_multi_gpu_run_with_its_one_gpu_twin():
    rows = [dict(model="m", accelerator="g", precision="tf32", batch_size=8, suite="v0", family="f", chip="c",
                 devices=n, global_batch_size=8 * n, measured_ms=ms, pred=pred)
            for n, ms, pred in ((1, 10.0, 10.0), (4, 12.5, 10.0), (8, 20.0, 10.0))]
    ratios = scaling_ratio_errors(pd.DataFrame(rows), "pred").set_index("devices")
    assert ratios.loc[4, "measured_ratio"] == pytest.approx(3.2) and ratios.loc[4, "predicted_ratio"] == 4.0
    assert ratios.loc[8, "ape"] == pytest.approx(abs(8 / 4 - 1))


def test_a_run_without_gradient_sync_is_one_replica_and_has_no_scaling_ratio():
    runs = real_runs(frame_of([
        {"model": "transformer-xl-base", "accelerator": "rtx-3090", "devices": n, "batch_size": 4.0,
         "global_batch_size": 4 * n, "throughput_items_per_s": 1000.0 * n, "gradient_sync": n == 1}
        for n in (1, 8)]))
    one, eight = sorted(runs, key=lambda r: r.devices)
    assert one.gradient_sync and not eight.gradient_sync
    assert eight.measured_ms == pytest.approx(one.measured_ms)  # each replica steps as fast as one GPU alone
    placement = eight.placement()
    assert placement.devices_per_node == (1,) and placement.parallelism.data == 1
    assert placement.global_batch_size == 4 and one.placement() == placement
    rows = [dict(model="m", accelerator="g", precision="tf32", batch_size=8, suite="v0", family="f", chip="c",
                 devices=n, global_batch_size=8 * n, measured_ms=10.0, pred=10.0, gradient_sync=sync)
            for n, sync in ((1, True), (4, True), (8, False))]
    assert list(scaling_ratio_errors(pd.DataFrame(rows), "pred").devices) == [4]


def test_a_measured_step_far_below_the_roofline_of_its_work_is_not_a_training_step():
    """One device's roofline is 40 ms (composed 100 ms, roofline 0.4 of it): a step of 0.25 x 40 ms or more may be
    a real one (the graph's counts can be off), one under it is a logging artefact."""
    floor_ms = 100.0 * 0.4
    frame = pd.DataFrame({"single_ms": 100.0, "roofline_over_composed": 0.4,
                          "measured_ms": [floor_ms * 2, floor_ms * 0.6, IMPOSSIBLE_BELOW_ROOFLINE * floor_ms,
                                          IMPOSSIBLE_BELOW_ROOFLINE * floor_ms * 0.99, 0.5]})
    assert physically_possible(frame).tolist() == [True, True, True, False, False]


def test_a_step_far_slower_per_sample_than_a_smaller_batch_of_the_same_job_is_not_a_steady_step():
    """WaveGlow's batch 10 on one GPU takes 8x the time per sample of its batch 5 (a GPU at the edge of its memory):
    left out, with a note; a batch only somewhat slower per sample, the same batch on other GPU counts or in another
    math, and the smallest batch of a job are kept; a logging artefact below the roofline is left out too."""
    rows = [  # model, accelerator, precision, devices, batch, measured_ms
        ("waveglow", "rtx-a4000", "tf32", 1, 5, 1600.0), ("waveglow", "rtx-a4000", "tf32", 1, 10, 25600.0),
        ("waveglow", "rtx-a4000", "tf32", 1, 8, 2560.0 * 1.5),  # 1.5x per sample: kept
        ("waveglow", "rtx-a4000", "tf32", 2, 10, 3300.0),  # no smaller batch on 2 GPUs: kept
        ("waveglow", "rtx-a4000", "amp", 1, 10, 1000.0),
        ("ncf", "a100-sxm4-80gb", "amp", 8, 1000, 0.001)]  # under the roofline
    frame = pd.DataFrame(rows, columns=["model", "accelerator", "precision", "devices", "batch_size", "measured_ms"])
    frame = frame.assign(suite="v0", single_ms=100.0, roofline_over_composed=0.4, communication_ms=1.0,
                         global_batch_size=frame.batch_size * frame.devices)
    ratio = thrash_ratio(frame)
    assert ratio[1] == pytest.approx(8.0) and ratio[2] == pytest.approx(1.5)
    assert ratio[[0, 3, 4, 5]].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert ratio[1] > THRASH_ABOVE_SMALLER_BATCH > ratio[2]
    steady, notes = steady_steps(frame)
    assert steady.tolist() == [True, False, True, True, True, False]
    assert len(notes) == 2 and "8.0x the time per sample" in " ".join(notes) and "roofline" in notes[0]


def test_a_data_parallel_run_slower_than_one_gpu_is_left_out_unless_its_all_reduce_explains_it():
    """One GPU steps in 200 ms at batch 8 (40 samples/s). On 4 GPUs: 800 ms (40 samples/s, not below one GPU) and
    900 ms with a 1 ms all-reduce are at or above one GPU's throughput, or below it with nothing to explain it (left
    out); 900 ms with a 700 ms all-reduce (over 3 x 200 ms) is a link too slow for the job (kept); a run in
    another suite, one without a one-GPU twin, and one without gradient synchronisation are kept."""
    rows = [  # devices, suite, measured_ms, communication_ms, gradient_sync, batch
        (1, "v1", 200.0, 0.0, True, 8), (4, "v1", 800.0, 1.0, True, 8), (4, "v1", 900.0, 1.0, True, 8),
        (4, "v1", 900.0, 700.0, True, 8), (4, "v0", 900.0, 1.0, True, 8), (2, "v1", 900.0, 1.0, True, 16),
        (8, "v1", 1800.0, 1.0, False, 8)]
    frame = pd.DataFrame(rows, columns=["devices", "suite", "measured_ms", "communication_ms", "gradient_sync",
                                        "batch_size"])
    frame = frame.assign(model="gnmt", accelerator="a100-sxm4-40gb", precision="tf32",
                         global_batch_size=frame.batch_size * frame.devices, single_ms=200.0,
                         roofline_over_composed=0.4)
    assert slower_than_one_gpu(frame).tolist() == [False, False, True, False, False, False, False]
    steady, notes = steady_steps(frame)
    assert steady.tolist() == [True, True, False, True, True, True, True]
    assert len(notes) == 1 and "slower than one GPU" in notes[0] and "4 x a100-sxm4-40gb" in notes[0]


def test_a_suite_recomposed_without_peer_to_peer_pays_the_host_staged_all_reduce_and_nothing_else_changes():
    runs = real_runs(frame_of([
        {"model": "ncf", "accelerator": "a100-sxm4-80gb", "devices": n, "batch_size": 65536.0,
         "global_batch_size": 65536 * n, "throughput_items_per_s": 1e7 * n, "suite": suite, "unit": "samples/s"}
        for n, suite in ((1, "v1"), (8, "v1"), (1, "v0"), (8, "v0"))]))
    predictor = PlacementPredictor.load(None)
    frame = composed_frame(runs, predictor)
    again = recomposed_without_p2p(frame, runs, predictor, "v1")
    changed = again.placement_ms.to_numpy() != frame.placement_ms.to_numpy()
    assert changed.tolist() == [(r.devices, r.suite) == (8, "v1") for r in frame.itertuples()]
    assert (again.placement_ms[changed] > frame.placement_ms[changed]).all()  # host memory is slower than NVLink
    assert (again.communication_ms[changed] > frame.communication_ms[changed]).all()
    assert again.compute_ms.tolist() == pytest.approx(frame.compute_ms.tolist())
    assert predictor.whole_step is not None and predictor.params.dp_jitter > 0  # the predictor is left as it was


def _run(model: str, accelerator: str, precision: str, batch: int, items_per_s: float, i: int) -> WholeJobRun:
    return WholeJobRun(
        source="lambda", source_id=f"synthetic/{model}/{accelerator}/{precision}/{i}", suite="v0", config="c",
        host=None, variant=None, gpu_name=accelerator, arch="Ampere", accelerator=accelerator, devices=1, nodes=1,
        source_model=model, model=model, source_precision="FP32", amp_in_log=None, precision=Precision(precision),
        batch_size=float(batch), global_batch_size=batch, batch_source="log", throughput=items_per_s,
        unit=ZOO[model].unit, metric="synthetic", status="ok", date=None, pytorch_version=None, cuda_version=None)


@pytest.mark.slow
def test_retrain_learns_the_stage_from_stored_runs_and_the_service_path_applies_it(tmp_path):
    """Synthetic runs TRUE_FACTOR slower than composed, of two cheap zoo families on five GPUs (and one that is no
    steady step, left out and said so): the whole-step role is promoted, the served prediction moves toward the
    runs."""
    models = copy_shipped_models(tmp_path / "models")
    composer = PlacementPredictor.load(models)
    jobs = [("ncf", 4096), ("transformer-xl-base", 1)]  # the two cheapest to compose (one capture each)
    candidates = [RealRun("lambda", m, ZOO[m].family, gpu, 1, "tf32", b, b, 1.0, ZOO[m].unit, 1.0, 1, "v0")
                  for m, b in jobs for gpu in GPUS]
    composed = composed_frame(candidates, composer).set_index("key")
    records = []
    for i, run in enumerate(candidates):
        row = composed.loc[f"lambda:{run.model}:{run.accelerator}:1:{run.precision}:{run.batch_size}:"
                           f"{run.batch_size}:v0"]
        entry = ZOO[run.model]
        samples_per_s = run.batch_size / (row.single_ms * TRUE_FACTOR) * 1e3
        records.append(_run(run.model, run.accelerator, run.precision, run.batch_size,
                            samples_per_s * entry.items(entry.reference_seq_len or 128), i))
    # and a GPU at the edge of its memory: NCF at twice the batch, 8x the time per sample (no steady step)
    first = records[0]
    records.append(_run(first.model, first.accelerator, "tf32", 2 * int(first.batch_size), first.throughput / 8,
                        len(records)))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with JobStore(url) as store:
        store.add_whole_job_measurements(records)
    # two families: one held out, five runs (fewer than a champion is replaced on by default)
    said: list[str] = []
    result = retrain(url, models, RetrainSettings(roles=("whole-step",), holdout_fraction=0.5, min_compared_rows=5,
                                                  min_compared_groups=1), progress=said.append)
    assert result.error is None, result.error
    assert [line for line in said if "left out" in line] == [
        f"whole-step: left out: ncf on 1 x {first.accelerator} (tf32, batch 8192): 8.0x the time per sample of a "
        "smaller batch of it (a GPU at the edge of its memory, not a steady training step)"]
    [outcome] = result.roles
    assert outcome.decision == "promoted", outcome.reason
    served = PlacementPredictor.load(models)
    assert served.whole_step is not None and served.model_versions["whole-step"] == outcome.promoted
    run = candidates[0]
    spec, placement = run.spec(ZOO[run.model].reference_seq_len or 128), run.placement()
    corrected = served.predict(spec, placement)
    assert corrected.composed_iter_time_ms is not None
    assert corrected.iter_time_ms / corrected.composed_iter_time_ms == pytest.approx(TRUE_FACTOR, rel=0.15)


def test_retrain_with_a_gpu_report_and_no_stored_runs_says_so(tmp_path):
    models = copy_shipped_models(tmp_path / "models")
    said: list[str] = []
    result = retrain(f"sqlite:///{tmp_path / 'store.db'}", models,
                     RetrainSettings(roles=("whole-step",), gpu_report_dir=tmp_path / "report"), progress=said.append)
    assert result.error is None and result.roles[0].reason == "no training data in the store"
    assert any("no whole-job runs" in line for line in said) and not (tmp_path / "report").exists()


def test_the_report_of_perfect_predictions_says_so(tmp_path):
    rng = np.random.default_rng(0)
    rows = [dict(source="lambda", model=f"m{i % 3}", family=f"f{i % 3}", accelerator=GPUS[i % 5], chip=f"c{i % 5}",
                 devices=n, precision=("tf32", "amp", "fp16-master")[i % 3], batch_size=8, global_batch_size=8 * n,
                 suite="v0",
                 measured_ms=ms * (1 if n == 1 else 1.2), placement_ms=ms, predicted_ms=ms * (1 if n == 1 else 1.2),
                 low_ms=ms * 0.9, high_ms=ms * 1.3)
            for i, ms in enumerate(rng.uniform(5, 50, 30)) for n in (1, 2)]
    frame = pd.DataFrame(rows)
    result = GpuAccuracy(frame, {"family": frame, "chip": frame}, ["synthetic"])
    figures = headline(frame)
    assert figures["mape_1gpu"] == 0.0 and figures["mape_multi"] == pytest.approx(0.0)
    assert figures["coverage"] == 1.0 and figures["scaling_ratio_mape"] == pytest.approx(0.0)
    paths = write_gpu_report(result, tmp_path / "r")
    text = paths["report"].read_text()
    assert "one GPU 0.0% MAPE" in text and "![gpu-accuracy-chip-by-gpu.png]" in text
    assert all(path.stat().st_size > 1000 for name, path in paths.items() if name.endswith(".png"))
    assert set(MARKERS) == set(MODES) and len(set(MARKERS.values())) == len(MARKERS)  # every math drawn apart
    assert "FP16, fp32 master weights (apex O2)" in text  # the mode table names each recipe


def test_the_replica_jitter_is_the_one_with_the_least_mean_ratio_error_and_recovers_a_known_wait():
    """`fit_dp_jitter` minimises the mean APE of the n-GPU / 1-GPU ratio (what the bench reports): on runs made
    with a known jitter it finds it, and on noisy runs whose ratios scale worse in a tail it is the grid's jitter
    with the least mean error."""
    from perfmodel.evaluation.real_runs import JITTER_GRID, fit_dp_jitter, jitter_ratio_ape
    from perfmodel.placement.iteration import expected_max_normal

    rng = np.random.default_rng(0)
    devices = rng.choice([2, 4, 8], 200)
    one = rng.uniform(50, 500, 200)
    rows = pd.DataFrame({"one_ms": one, "base_ms": one * rng.uniform(1.0, 1.1, 200),
                         "per_jitter_ms": [expected_max_normal(float(d)) for d in devices] * one})
    rows["measured_ratio"] = (rows.base_ms + 0.06 * rows.per_jitter_ms) / rows.one_ms
    assert fit_dp_jitter(rows) == pytest.approx(0.06, abs=JITTER_GRID[1])
    noisy = rows.assign(measured_ratio=rows.measured_ratio * np.exp(np.abs(rng.normal(0.0, 0.15, 200))))
    fitted = fit_dp_jitter(noisy)
    assert fitted > 0.06 + JITTER_GRID[1]  # runs slower than the wait explains pull it up
    means = [np.mean(jitter_ratio_ape(noisy, s)) for s in JITTER_GRID]
    assert np.mean(jitter_ratio_ape(noisy, fitted)) == pytest.approx(min(means))
    assert fit_dp_jitter(rows.iloc[:0]) == 0.0


def test_each_kind_of_step_gets_the_replica_jitter_of_its_own_runs():
    """`fit_replica_jitters`: runs of models whose steps vary made with a wait of 0.15, of models whose steps do
    not with 0.01: each kind's jitter is found on its own runs, the one for a job of unknown kind on all of them,
    and `row_jitters` gives each run its kind's; a frame without runs of a kind leaves that one unset."""
    from perfmodel.evaluation.real_runs import JITTER_GRID, fit_replica_jitters, row_jitters
    from perfmodel.placement.iteration import expected_max_normal

    rng = np.random.default_rng(1)
    kinds = rng.choice([0.0, 1.0], 300)
    one = rng.uniform(50, 500, 300)
    per_jitter = np.array([expected_max_normal(float(d)) for d in rng.choice([2, 4, 8], 300)]) * one
    rows = pd.DataFrame({"one_ms": one, "base_ms": one, "per_jitter_ms": per_jitter, "steps_vary": kinds})
    rows["measured_ratio"] = (rows.base_ms + np.where(kinds > 0, 0.15, 0.01) * rows.per_jitter_ms) / rows.one_ms
    jitters = fit_replica_jitters(rows)
    assert jitters["dp_jitter_varying"] == pytest.approx(0.15, abs=JITTER_GRID[1])
    assert jitters["dp_jitter_steady"] == pytest.approx(0.01, abs=JITTER_GRID[1])
    assert jitters["dp_jitter_steady"] <= jitters["dp_jitter"] <= jitters["dp_jitter_varying"]
    np.testing.assert_allclose(row_jitters(rows, jitters), np.where(kinds > 0, jitters["dp_jitter_varying"],
                                                                    jitters["dp_jitter_steady"]))
    unknown = rows.assign(steps_vary=-1.0)
    assert set(row_jitters(unknown, jitters)) == {jitters["dp_jitter"]}
    only_varying = fit_replica_jitters(rows[kinds > 0])
    assert only_varying["dp_jitter_steady"] is None
    assert set(row_jitters(rows[kinds == 0], only_varying)) == {only_varying["dp_jitter"]}


def test_the_repeat_spread_scores_each_repeat_by_the_others_of_its_configuration_and_suite():
    """Three logs of one configuration at 100, 100 and 200 items/s: each is answered by the geometric mean of the
    other two (141.4, 141.4, 100), as a throughput; a configuration measured once, a failed run and the same GPU
    with NVLink bridges are not repeats of it; another suite's run is one only across software."""
    base = _run("gnmt", "a100-sxm4-80gb", "tf32", 128, 100.0, 0)
    runs = [base, dataclasses.replace(base, source_id="b"), dataclasses.replace(base, source_id="c", throughput=200.0),
            dataclasses.replace(base, source_id="d", batch_size=256.0, global_batch_size=256),
            dataclasses.replace(base, source_id="e", status="out of memory", throughput=None),
            dataclasses.replace(base, source_id="f", variant="NVLink bridge; test round trt", throughput=400.0),
            dataclasses.replace(base, source_id="g", devices=2, global_batch_size=256, throughput=180.0),
            dataclasses.replace(base, source_id="h", devices=2, global_batch_size=256, throughput=180.0,
                                suite="v1")]
    spread = repeat_spread(runs)
    expected = np.mean([200 ** 0.5 / 10 - 1, 200 ** 0.5 / 10 - 1, 1 - 100 / 200])
    same = spread["same_software"]
    assert same["one_gpu_runs"] == 3 and same["one_gpu_mape_pct"] == pytest.approx(100 * expected)
    assert same["one_gpu_median_ape_pct"] == pytest.approx(100 * (200 ** 0.5 / 10 - 1))
    assert same["multi_gpu_runs"] == 0 and np.isnan(same["multi_gpu_mape_pct"])
    across = spread["any_software"]
    assert across["one_gpu_runs"] == 3 and across["multi_gpu_runs"] == 2
    assert across["multi_gpu_mape_pct"] == pytest.approx(0.0)
