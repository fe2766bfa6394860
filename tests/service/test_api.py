"""API v1 through FastAPI's TestClient, on SQLite and PostgreSQL stores."""

from __future__ import annotations

import json

import pytest

from perfmodel.jobs.spec import JobSpec
from perfmodel.placement.spec import PlacementSpec
from perfmodel.predictor.placed import PlacementPredictor
from tests.service.conftest import READ_TOKEN, SMALL_JOB, WRITE_TOKEN, make_client, small_onnx

PREDICT_FIELDS = {"job_name", "job_id", "accelerator", "model_version", "iter_time_ms", "throughput_samples_per_s",
                  "interval_ms", "breakdown_ms", "peak_memory_bytes", "extrapolated", "extrapolation_reasons",
                  "devices", "nodes", "fits", "memory_capacity_bytes", "placement"}


def _register(client, spec=SMALL_JOB) -> str:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code in (200, 201), response.text
    return response.json()["job_id"]


def test_the_app_starts_the_capture_fork_server_when_asked(sqlite_url, models_dir):
    """`capture_prestart` (on by default) starts the fork server with the app, so the first registration does not
    wait for it. (Where another test of this process started it first, this only checks that it is up.)"""
    import time

    from perfmodel.graph import capture
    from service.settings import ServiceSettings

    settings = ServiceSettings(store_url=sqlite_url, models_dir=models_dir, sync_interval_s=0)
    assert settings.capture_prestart
    with make_client(settings) as opened:
        deadline = time.monotonic() + 120
        while capture._context is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert capture._context is not None
        assert opened.get("/healthz").json()["status"] == "ok"


def test_a_job_is_registered_once_and_can_be_read_and_deleted(client):
    first = client.post("/v1/jobs", json=SMALL_JOB)
    assert first.status_code == 201 and first.json()["created"] is True
    job_id = first.json()["job_id"]
    assert job_id == JobSpec.model_validate(SMALL_JOB).key()
    assert first.json()["graph"]["nodes"] > 10 and first.json()["graph"]["params"] > 0
    again = client.post("/v1/jobs", json=SMALL_JOB)
    assert again.status_code == 200 and again.json()["job_id"] == job_id and again.json()["created"] is False
    detail = client.get(f"/v1/jobs/{job_id}").json()
    assert detail["spec"]["source"] == SMALL_JOB["source"] and detail["calibration"]["observations"] == 0
    assert [j["job_id"] for j in client.get("/v1/jobs").json()["jobs"]] == [job_id]
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert client.get(f"/v1/jobs/{job_id}").status_code == 404
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 404


def test_a_zoo_job_posted_without_a_seq_len_is_the_one_its_reference_implementation_trains(client):
    lm = {"source": {"kind": "zoo", "name": "gavel-lm"}, "batch_size": 4}  # bptt 35, not 128
    posted = client.post("/v1/jobs", json=lm).json()
    assert posted["seq_len"] == 35
    assert client.post("/v1/jobs", json={**lm, "seq_len": 35}).json()["job_id"] == posted["job_id"]
    implicit = client.post("/v1/predict", json={"job": lm, "placement": {"accelerator": "t4"}}).json()
    assert implicit["job_id"] == posted["job_id"] and implicit["iter_time_ms"] > 0


def test_a_registered_job_survives_a_restart_without_capture(settings, monkeypatch):
    with make_client(settings) as client:
        job_id = _register(client)
    import perfmodel.graph.from_torch as from_torch

    monkeypatch.setattr(from_torch, "capture_graph", lambda *a, **k: pytest.fail("captured again"))
    with make_client(settings) as client:  # a new process: the graph comes from the store
        response = client.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "t4"}})
        assert response.status_code == 200, response.text
        assert response.json()["job_id"] == job_id


def test_predict_returns_the_fields_of_perfmodel_predict_and_matches_the_predictor(client, models_dir):
    job_id = _register(client)
    placement = {"accelerator": "a100-sxm4-80gb", "devices_per_node": [4, 4]}
    response = client.post("/v1/predict", json={"job": job_id, "placement": placement})
    assert response.status_code == 200, response.text
    body = response.json()
    assert PREDICT_FIELDS <= set(body)
    assert body["devices"] == 8 and body["nodes"] == 2 and body["calibrated"] is False
    assert body["placement"]["global_batch_size"] == 64  # the job's batch on each of 8 data-parallel replicas
    spec = JobSpec.model_validate(SMALL_JOB)
    expected = PlacementPredictor.load(models_dir).predict(
        spec, PlacementSpec.grid("a100-sxm4-80gb", nodes=2, per_node=4, global_batch_size=64))
    assert body["throughput_samples_per_s"] == pytest.approx(expected.throughput_samples_per_s, rel=1e-9)
    assert sum(body["breakdown_ms"].values()) == pytest.approx(body["iter_time_ms"], rel=1e-6)
    inline = client.post("/v1/predict", json={"job": SMALL_JOB, "placement": placement}).json()
    assert inline["throughput_samples_per_s"] == body["throughput_samples_per_s"]


def test_a_parallelism_without_a_data_degree_is_data_parallel_over_the_devices_the_others_leave(client):
    """`{"tensor": 2}` on 8 devices is 4 replicas and `{"zero_stage": 1}` 8, as the CLI's options make them (it was
    a 422: data 1 x tensor 1 = 1 device, but the placement has 8)."""
    cases = {"zero_stage": ({"zero_stage": 1}, 8, 1), "tensor": ({"tensor": 2}, 4, 2),
             "checkpointing": ({"activation_checkpointing": True}, 8, 1)}
    for name, (given, data, tensor) in cases.items():
        placement = {"accelerator": "a100-sxm4-80gb", "devices_per_node": [8], "parallelism": given}
        response = client.post("/v1/predict", json={"job": SMALL_JOB, "placement": placement})
        assert response.status_code == 200, (name, response.text)
        parallelism = response.json()["placement"]["parallelism"]
        assert parallelism["data"] == data and parallelism["tensor"] == tensor, name
        assert all(parallelism[k] == v for k, v in given.items()), name
    uneven = {"accelerator": "a100-sxm4-80gb", "devices_per_node": [8], "parallelism": {"tensor": 3}}
    refused = client.post("/v1/predict", json={"job": SMALL_JOB, "placement": uneven})
    assert refused.status_code == 422 and "parallelism" in refused.text


def test_an_ir_job_from_a_client_machine_is_predicted_without_capture(client, small_ir, monkeypatch):
    import perfmodel.graph.from_torch as from_torch

    monkeypatch.setattr(from_torch, "capture_graph", lambda *a, **k: pytest.fail("an IR job was captured"))
    spec = {"source": {"kind": "ir", "graph": small_ir}, "batch_size": 8}
    registered = client.post("/v1/jobs", json=spec)
    assert registered.status_code == 201 and registered.json()["source_kind"] == "ir"
    job_id = registered.json()["job_id"]
    ok = client.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "t4"}})
    assert ok.status_code == 200 and ok.json()["job_name"] == "ir:mlp-recommender"
    other_batch = client.post("/v1/predict", json={"job": job_id,
                                                   "placement": {"accelerator": "t4", "global_batch_size": 4}})
    assert other_batch.status_code == 422 and "captured at batch 8" in other_batch.text
    assert client.get(f"/v1/jobs/{job_id}").json()["spec"]["source"]["graph"].startswith("(left out")


def test_an_onnx_upload_is_checked_and_registered(client, tmp_path):
    path = small_onnx(tmp_path / "mlp.onnx")
    with path.open("rb") as file:
        response = client.post("/v1/jobs", data={"batch_size": "16"}, files={"file": ("mlp.onnx", file)})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == "ir:mlp" and body["mode"] == "inference" and body["graph"]["source"] == "onnx"
    assert body["graph"]["flops_fwd"] == 2 * 16 * 32 * 64 + 16 * 64 + 2 * 16 * 64 * 10  # MatMul, Relu, MatMul
    with path.open("rb") as file:  # the same upload is the same job
        assert client.post("/v1/jobs", data={"batch_size": "16"},
                           files={"file": ("mlp.onnx", file)}).json()["job_id"] == body["job_id"]
    garbage = client.post("/v1/jobs", data={"batch_size": "16"}, files={"file": ("x.onnx", b"not a model")})
    assert garbage.status_code == 422 and garbage.json()["detail"][0]["loc"] == ["body", "file"]
    assert "/tmp" not in garbage.text  # the server's temporary path is not shown
    no_batch = client.post("/v1/jobs", files={"file": ("mlp.onnx", path.read_bytes())})
    assert no_batch.status_code == 422 and no_batch.json()["detail"][0]["loc"] == ["body", "batch_size"]
    train = client.post("/v1/jobs", data={"batch_size": "2", "mode": "train"},  # training jobs from ONNX too
                        files={"file": ("mlp.onnx", path.read_bytes())})
    assert train.status_code == 201 and train.json()["graph"]["mode"] == "train", train.text


def test_onnx_with_external_data_needs_its_data(client, tmp_path):
    import onnx

    path = small_onnx(tmp_path / "mlp.onnx")
    model = onnx.load(str(path))
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    response = client.post("/v1/jobs", data={"batch_size": "4"},
                           files={"file": ("ext.onnx", (tmp_path / "ext.onnx").read_bytes())})
    assert response.status_code == 422 and "external data" in response.text  # without its data file
    assert response.json()["detail"][0]["loc"] == ["body", "data"]
    both = client.post("/v1/jobs", data={"batch_size": "4"},
                       files=[("file", ("ext.onnx", (tmp_path / "ext.onnx").read_bytes())),
                              ("data", ("weights.bin", (tmp_path / "weights.bin").read_bytes()))])
    assert both.status_code == 201, both.text


def test_the_matrix_covers_jobs_by_placements_and_gavel(client):
    small = _register(client)
    bigger = _register(client, {**SMALL_JOB, "batch_size": 32})
    grid = {"accelerators": ["t4", "A100-SXM4-80GB", "cpu"], "device_counts": [1, 2, 4], "spread": True}
    response = client.post("/v1/predict/matrix", json={"jobs": [small, bigger], "grid": grid})
    assert response.status_code == 200, response.text
    body = response.json()
    columns = [(p["accelerator"], p["devices"], p["nodes"]) for p in body["placements"]]
    assert columns == [("t4", 1, 1), ("t4", 2, 1), ("t4", 2, 2), ("t4", 4, 1), ("t4", 4, 4),
                       ("a100-sxm4-80gb", 1, 1), ("a100-sxm4-80gb", 2, 1), ("a100-sxm4-80gb", 2, 2),
                       ("a100-sxm4-80gb", 4, 1), ("a100-sxm4-80gb", 4, 4), ("cpu", 1, 1)]  # no multi-device CPU
    assert len(body["throughput_samples_per_s"]) == 2 and all(len(r) == 11 for r in body["throughput_samples_per_s"])
    single = client.post("/v1/predict", json={"job": bigger, "placement": {"accelerator": "t4",
                                                                            "devices_per_node": [1, 1]}}).json()
    assert body["throughput_samples_per_s"][1][2] == pytest.approx(single["throughput_samples_per_s"])
    gavel = client.post("/v1/predict/matrix", json={
        "jobs": [small, bigger], "grid": {**grid, "accelerators": ["t4", "a100", "cpu"]}, "layout": "gavel",
        "job_types": ["Small (batch size 8)", "Big (batch size 32)"], "worker_types": {"a100": "A100-SXM4-80GB"},
        "colocation": True}).json()
    assert gavel["unit"] == "steps/s" and gavel["worker_types"]["a100"] == "a100-sxm4-80gb"
    throughputs = gavel["throughputs"]
    assert set(throughputs) == {"t4", "t4_unconsolidated", "a100", "a100_unconsolidated", "cpu",
                                "cpu_unconsolidated"}
    key = str(("Big (batch size 32)", 2))  # steps/s: samples/s over the per-worker batch
    assert throughputs["t4"][key]["null"] == pytest.approx(body["throughput_samples_per_s"][1][1] / 32)
    assert throughputs["t4_unconsolidated"][key]["null"] == pytest.approx(body["throughput_samples_per_s"][1][2] / 32)
    this, other = throughputs["a100"][key][str(("Small (batch size 8)", 2))]
    assert 0 < this <= throughputs["a100"][key]["null"] and 0 < other
    assert gavel["job_types"]["Small (batch size 8)"] == small
    explicit = client.post("/v1/predict/matrix", json={"jobs": [small], "detail": True, "placements": [
        {"accelerator": "t4"}, {"accelerator": "v100-sxm2-32gb", "devices_per_node": [2]}]}).json()
    assert explicit["predictions"][0][1]["devices"] == 2
    cpu_pair = client.post("/v1/predict/matrix", json={"jobs": [small], "placements": [
        {"accelerator": "cpu", "devices_per_node": [2]}]})
    assert cpu_pair.status_code == 422 and "need a GPU" in cpu_pair.text


def test_the_matrix_grid_fills_catalog_nodes_and_takes_the_network(client):
    job = _register(client)
    grid = {"accelerators": ["h100-sxm5"], "device_counts": [8, 16]}
    default = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": grid}).json()
    node_devices = PlacementPredictor.load().hardware("h100-sxm5").node_devices or 16
    assert [(p["devices"], p["nodes"]) for p in default["placements"]] == [(8, 1), (16, 16 // node_devices)]
    slow = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": {
        **grid, "inter_node_bandwidth_gbit_s": 10, "inter_node_latency_us": 50}}).json()
    assert slow["placements"][1]["placement"]["inter_node_bandwidth_gbit_s"] == 10
    assert slow["iter_time_ms"][0][0] == pytest.approx(default["iter_time_ms"][0][0])  # one node
    if default["placements"][1]["nodes"] > 1:
        assert slow["iter_time_ms"][0][1] > default["iter_time_ms"][0][1]
    staged = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": {**grid, "intra_node_link": "host"}})
    assert staged.json()["placements"][0]["placement"]["intra_node_link"] == "host"
    assert staged.json()["iter_time_ms"][0][0] > default["iter_time_ms"][0][0]  # no NVLink: staged through the host
    for field, value in (("inter_node_bandwidth_gbit_s", 0), ("inter_node_latency_us", -1),
                         ("intra_node_link", "nvlink9")):
        bad = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": {**grid, field: value}})
        assert bad.status_code == 422
        assert any(d["loc"][:3] == ["body", "grid", field] for d in bad.json()["detail"]), bad.text


def test_the_matrix_agrees_with_single_predictions_and_gavel_zeroes_what_does_not_fit(client):
    small = _register(client)
    huge = _register(client, {**SMALL_JOB, "batch_size": 2**20})  # activations beyond a T4's 16 GB (38 GB)
    placements = [{"accelerator": "t4"}, {"accelerator": "a100-sxm4-80gb", "devices_per_node": [4]}]
    body = client.post("/v1/predict/matrix", json={"jobs": [small, huge], "placements": placements,
                                                   "detail": True}).json()
    for i, job in enumerate((small, huge)):
        for j, placement in enumerate(placements):
            single = client.post("/v1/predict", json={"job": job, "placement": placement}).json()
            assert body["fits"][i][j] == single["fits"] == body["predictions"][i][j]["fits"]
            assert body["throughput_samples_per_s"][i][j] == pytest.approx(single["throughput_samples_per_s"])
    assert body["fits"][0][0] and not body["fits"][1][0]
    gavel = client.post("/v1/predict/matrix", json={"jobs": [small, huge], "placements": placements,
                                                    "layout": "gavel", "colocation": True}).json()["throughputs"]
    huge_t4 = gavel["t4"][str(("mlp-recommender (batch size 1048576)", 1))]
    assert huge_t4["null"] == 0.0 and huge_t4[str(("mlp-recommender (batch size 8)", 1))] == [0.0, 0.0]
    assert gavel["t4"][str(("mlp-recommender (batch size 8)", 1))]["null"] > 0


def test_colocation_answers_each_jobs_share_within_physics_and_refuses_pairs_that_do_not_fit(client):
    small = _register(client)
    bigger = _register(client, {**SMALL_JOB, "batch_size": 32})
    by_mode = {}
    for sharing in ("time-slicing", "mps"):
        response = client.post("/v1/predict/colocation", json={
            "jobs": [small, bigger], "placement": {"accelerator": "t4"}, "sharing": sharing})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["sharing"] == sharing and body["jobs"] == [small, bigger] and body["fits"] is True
        # two processes, two CUDA contexts: the pair may use one job's capacity less one more context
        assert body["memory_capacity_bytes"] == body["isolated"][0]["memory_capacity_bytes"] - 2**30
        for shared, alone, (low, high), slowdown, isolated in zip(
                body["throughput_samples_per_s"], body["isolated_throughput_samples_per_s"],
                body["interval_samples_per_s"], body["slowdown"], body["isolated"]):
            assert 0 < shared <= alone * (1 + 1e-9) and low <= shared <= high
            # the sharing model's own error widens the isolated interval (over the slowdown), never above alone's top
            low_ms, high_ms = isolated["interval_ms"]
            top = alone * isolated["iter_time_ms"] / low_ms
            assert low < alone * isolated["iter_time_ms"] / high_ms / slowdown and high <= top * (1 + 1e-9)
        assert body["combined_device_share"] <= 1 + 1e-9
        assert all(s >= 1 for s in body["slowdown"])
        assert all(1 / 40 <= fill <= 1 for fill in body["sm_fill"])  # a T4 has 40 SMs
        assert all(0 < share <= 1 for share in body["bandwidth_share"])
        by_mode[sharing] = body
    # under MPS the two jobs' kernels run at once on the SMs each holds: no job keeps less than while taking turns,
    # and where their fills and bandwidth shares add up to at most the device, each keeps its speed alone
    mps, turns = by_mode["mps"], by_mode["time-slicing"]
    assert mps["sm_fill"] == turns["sm_fill"] and mps["bandwidth_share"] == turns["bandwidth_share"]
    for together, taking_turns in zip(mps["throughput_samples_per_s"], turns["throughput_samples_per_s"]):
        assert together >= taking_turns * (1 - 1e-9)
    if sum(mps["sm_fill"]) <= 1 and sum(mps["bandwidth_share"]) <= 1:
        assert mps["slowdown"] == pytest.approx([1.0, 1.0])
    huge = _register(client, {**SMALL_JOB, "batch_size": 3 * 2**19})  # 27 GiB a device: alone it fits a 40 GB A100
    pair = client.post("/v1/predict/colocation", json={"jobs": [huge, huge],
                                                       "placement": {"accelerator": "a100-sxm4-40gb"}})
    assert pair.status_code == 422 and pair.json()["detail"][0]["loc"][-1] == "jobs"
    assert "do not fit together" in pair.json()["detail"][0]["msg"]
    one = client.post("/v1/predict/colocation", json={"jobs": [small], "placement": {"accelerator": "t4"}})
    assert one.status_code == 422


def test_observations_calibrate_later_predictions_and_show_the_error_before_and_after(client):
    job_id = _register(client)
    t4 = {"accelerator": "t4"}
    raw = client.post("/v1/predict", json={"job": job_id, "placement": t4}).json()["throughput_samples_per_s"]
    observed = [raw * 0.5, raw * 0.6, raw * 0.55]
    for value in observed:
        response = client.post("/v1/observations",
                               json={"job": job_id, "placement": t4, "throughput_samples_per_s": value})
        assert response.status_code == 201, response.text
        assert response.json()["calibrated"] is True and "calibrated" in response.json()["message"]
    assert response.json()["predicted_throughput_samples_per_s"] == pytest.approx(raw)
    factor = sorted(v / raw for v in observed)[1]  # the (recency-weighted) median: 3 points of about one age
    after = client.post("/v1/predict", json={"job": job_id, "placement": t4}).json()
    assert after["calibrated"] is True and after["observations"] == 3
    assert after["calibration_factor"] == pytest.approx(factor)
    assert after["throughput_samples_per_s"] == pytest.approx(raw * factor)
    assert after["uncalibrated_throughput_samples_per_s"] == pytest.approx(raw)
    other = client.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "v100-sxm2-32gb"}}).json()
    # the job's own observations on a T4 carry to a V100 through the fleet's job effect, shrunk toward the model
    assert other["calibrated"] is True and other["calibration"]["level"] == "job"
    assert other["calibration"]["sources"] == {"job": {"observations": 3, "jobs": 1}}
    assert factor < other["calibration_factor"] < 1
    assert other["throughput_samples_per_s"] == pytest.approx(
        other["uncalibrated_throughput_samples_per_s"] * other["calibration_factor"])
    report = client.get(f"/v1/jobs/{job_id}").json()["calibration"]
    assert report["observations"] == 3 and report["by_accelerator"][0]["accelerator"] == "t4"
    assert report["mape_uncalibrated_pct"] == pytest.approx(100 * sum(abs(raw - v) / v for v in observed) / 3)
    assert report["mape_calibrated_pct"] < report["mape_uncalibrated_pct"] / 3
    matrix = client.post("/v1/predict/matrix", json={"jobs": [job_id], "placements": [t4]}).json()
    assert matrix["calibrated"] == [[True]] and matrix["throughput_samples_per_s"][0][0] == pytest.approx(raw * factor)
    assert client.post("/v1/observations", json={"job": "0" * 24, "placement": t4,
                                                 "throughput_samples_per_s": 1.0}).status_code == 404


def test_accelerators_and_models(client, models_dir):
    accelerators = client.get("/v1/accelerators").json()
    names = {a["name"] for a in accelerators}
    assert {"t4", "a100-sxm4-80gb", "v100-sxm2-32gb", "cpu"} <= names and len(accelerators) >= 39
    models = client.get("/v1/models").json()
    promoted = json.loads((models_dir / "promoted.json").read_text())  # the registry's promoted model per role
    assert models["serving"] == promoted and set(promoted) == {"cpu-step", "device-ops", "whole-step"}
    assert {m["model"] for m in models["models"] if m["serving"]} == set(promoted.values())


def _add_version(models_dir, name: str, version: str, *, break_artifact: bool) -> None:
    import shutil

    source = models_dir / name / "v1"
    target = models_dir / name / version
    shutil.copytree(source, target)
    if break_artifact:
        (target / "model.ubj").write_text("{ this is not an xgboost model")


def test_promotion_is_a_hot_swap_and_a_broken_model_is_refused(client, models_dir):
    job_id = _register(client)
    cpu = {"job": job_id, "placement": {"accelerator": "cpu"}}
    before = client.post("/v1/predict", json=cpu).json()
    _add_version(models_dir, "xgb-ops", "v2", break_artifact=True)
    refused = client.post("/v1/models/xgb-ops/v2/promote")
    assert refused.status_code == 409 and "xgb-ops/v2" in refused.json()["detail"]
    assert "still serving" in refused.json()["detail"]
    assert json.loads((models_dir / "promoted.json").read_text())["cpu-step"] == "xgb-ops/v1"
    assert client.post("/v1/predict", json=cpu).json()["model_version"] == before["model_version"] == "xgb-ops/v1"
    _add_version(models_dir, "xgb-ops", "v3", break_artifact=False)
    promoted = client.post("/v1/models/xgb-ops/v3/promote")
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["serving"]["cpu-step"] == "xgb-ops/v3"
    assert promoted.json()["previous"]["cpu-step"] == "xgb-ops/v1"
    assert client.post("/v1/predict", json=cpu).json()["model_version"] == "xgb-ops/v3"
    assert json.loads((models_dir / "promoted.json").read_text())["cpu-step"] == "xgb-ops/v3"
    events = client.get("/v1/models").json()["events"]
    assert [(e["action"], e["model_version"]) for e in events] == [("promoted", "xgb-ops/v3"),
                                                                    ("refused", "xgb-ops/v2")]
    assert client.post("/v1/models/nope/v9/promote").status_code == 404


def test_health_readiness_and_metrics(client):
    job_id = _register(client)
    assert client.get("/healthz").json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["model_versions"]["cpu-step"] == "xgb-ops/v1"
    for _ in range(3):
        client.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "t4"}})
    client.post("/v1/predict/matrix", json={"jobs": [job_id], "grid": {"accelerators": ["t4"],
                                                                        "device_counts": [1, 2]}})
    text = client.get("/metrics").text
    assert 'perfmodel_http_requests_total{method="POST",route="/v1/predict",status="200"} 3.0' in text
    assert 'perfmodel_http_request_duration_seconds_bucket{le="0.005",method="POST",route="/v1/predict"}' in text
    assert 'perfmodel_predictions_total{endpoint="predict"} 3.0' in text
    assert 'perfmodel_predictions_total{endpoint="matrix"} 2.0' in text
    assert 'perfmodel_model_info{role="cpu-step",version="xgb-ops/v1"} 1.0' in text
    assert f"/v1/jobs/{job_id}" not in text  # routes are labelled by template, not by raw path


@pytest.mark.parametrize("body,loc", [
    ({"job": SMALL_JOB, "placement": {"accelerator": "t4", "global_batch_size": 0}},
     ["body", "placement", "global_batch_size"]),
    ({"job": {**SMALL_JOB, "batch_size": -1}, "placement": {"accelerator": "t4"}}, ["body", "job", "batch_size"]),
    ({"job": "not-an-id", "placement": {"accelerator": "t4"}}, ["body", "job"]),
    ({"job": SMALL_JOB, "placement": {"accelerator": "warp-core-9000"}}, ["body", "placement", "accelerator"]),
    ({"job": SMALL_JOB, "placement": {"accelerator": "t4", "devices_per_node": [2], "global_batch_size": 3}},
     ["body", "placement", "global_batch_size"]),
    ({"job": {"source": {"kind": "zoo", "name": "resnet-9000"}, "batch_size": 1}, "placement": {"accelerator": "t4"}},
     ["body", "job"]),
    ({"placement": {"accelerator": "t4"}}, ["body", "job"]),
    ({"job": SMALL_JOB, "placement": {"accelerator": "t4", "devices_per_node": [2, 0]}},
     ["body", "placement", "devices_per_node"]),
])
def test_validation_errors_are_422_naming_the_field(client, body, loc):
    response = client.post("/v1/predict", json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(d["loc"][:len(loc)] == loc for d in detail), detail
    assert all(d["msg"] for d in detail)


def test_user_code_and_server_paths_are_refused(client):
    for source, word in (({"kind": "module", "path": "evil.py:make"}, "never imports or runs user code"),
                         ({"kind": "onnx", "path": "/etc/passwd"}, "reads no file a client names")):
        for path, body in (("/v1/jobs", {"source": source, "batch_size": 1}),
                           ("/v1/predict", {"job": {"source": source, "batch_size": 1},
                                            "placement": {"accelerator": "t4"}})):
            response = client.post(path, json=body)
            assert response.status_code == 422 and word in response.text, response.text


def test_malformed_requests_are_4xx(client):
    assert client.post("/v1/predict", content=b"{not json", headers={"content-type": "application/json"}
                       ).status_code == 422
    assert client.post("/v1/jobs", content=b"\x00\xff", headers={"content-type": "application/json"}
                       ).status_code == 422
    assert client.post("/v1/jobs", content=b"--x\r\n", headers={"content-type": "multipart/form-data; boundary=x"}
                       ).status_code in (400, 422)
    assert client.get("/v1/jobs/ZZZ").status_code == 422
    assert client.post("/v1/predict/matrix", json={"jobs": [SMALL_JOB]}).status_code == 422
    hf = {"source": {"kind": "hf_config", "config": {"model_type": "bert", "hidden_size": -5}}, "batch_size": 1}
    assert client.post("/v1/jobs", json=hf).status_code == 422


def test_tokens_guard_writes_and_optionally_reads(secured):
    with make_client(secured) as anonymous:
        assert anonymous.post("/v1/jobs", json=SMALL_JOB).status_code == 401
        assert anonymous.post("/v1/models/xgb-ops/v1/promote").status_code == 401
        assert anonymous.get("/v1/accelerators").status_code == 200  # reads are open by default
        assert anonymous.get("/healthz").json()["writes"] == "token"
    with make_client(secured, token=READ_TOKEN) as reader:
        assert reader.post("/v1/jobs", json=SMALL_JOB).status_code == 401
    with make_client(secured, token=WRITE_TOKEN) as writer:
        job_id = _register(writer)
        raw = writer.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "t4"}}).json()
        observed = writer.post("/v1/observations", json={"job": job_id, "placement": {"accelerator": "t4"},
                                                         "throughput_samples_per_s": raw["throughput_samples_per_s"]})
        assert observed.status_code == 201, observed.text
    closed = secured.model_copy(update={"read_requires_token": True})
    with make_client(closed) as anonymous:
        assert anonymous.get("/v1/accelerators").status_code == 401
        assert anonymous.get("/healthz").status_code == 200  # probes stay open
    with make_client(closed, token=READ_TOKEN) as reader:
        assert reader.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "t4"}}).status_code == 200


def test_request_size_limits(settings, tmp_path):
    small = settings.model_copy(update={"max_request_bytes": 4096, "max_onnx_bytes": 8192})
    with make_client(small) as client:
        big_ir = {"source": {"kind": "ir", "graph": {"pad": "x" * 10_000}}, "batch_size": 1}
        assert client.post("/v1/jobs", json=big_ir).status_code == 413
        big_file = client.post("/v1/jobs", data={"batch_size": "1"}, files={"file": ("m.onnx", b"0" * 200_000)})
        assert big_file.status_code == 413
        model = small_onnx(tmp_path / "m.onnx", hidden=32).read_bytes()
        assert 4096 < len(model) < 8192
        onnx_ok = client.post("/v1/jobs", data={"batch_size": "2"}, files={"file": ("m.onnx", model)})
        assert onnx_ok.status_code == 201  # a 5 KB model passes the 8 KB upload limit, not the 4 KB JSON one
        over = client.post("/v1/jobs", data={"batch_size": "2"},  # the limit holds for the file itself: 11 KB
                           files={"file": ("m.onnx", small_onnx(tmp_path / "big.onnx").read_bytes())})
        assert over.status_code == 413

        def chunks():
            yield b'{"source": {"kind": "zoo", "name": "'
            yield b"x" * 8000
            yield b'"}, "batch_size": 1}'

        chunked = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413


def test_openapi_documents_every_route(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path, method in (("/v1/jobs", "post"), ("/v1/jobs/{job_id}", "get"), ("/v1/jobs/{job_id}", "delete"),
                         ("/v1/predict", "post"), ("/v1/predict/matrix", "post"), ("/v1/observations", "post"),
                         ("/v1/accelerators", "get"), ("/v1/models", "get"),
                         ("/v1/models/{version}/promote", "post"), ("/healthz", "get"), ("/readyz", "get"),
                         ("/metrics", "get")):
        assert method in paths[path], (path, method)
    register = paths["/v1/jobs"]["post"]["requestBody"]["content"]
    assert set(register) == {"application/json", "multipart/form-data"}
    assert "ApiJobSpec" in schema["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_the_grid_has_a_batch_axis_and_new_batches_cost_no_capture(client):
    job = client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16}).json()["job_id"]
    engine = client.app.state.service.engine
    captures = engine.stats()["captures"]
    grid = {"accelerators": ["t4"], "device_counts": [1, 4], "batch_sizes": [3, 8, 100]}
    body = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": grid}).json()
    columns = [(p["devices"], p["global_batch_size"]) for p in body["placements"]]
    assert columns == [(1, 3), (1, 8), (1, 100), (4, 12), (4, 32), (4, 400)]
    assert engine.stats()["captures"] == captures  # registration captured two batches: the rest is arithmetic
    for (devices, global_batch), throughput in zip(columns, body["throughput_samples_per_s"][0]):
        single = client.post("/v1/predict", json={"job": job, "placement": {
            "accelerator": "t4", "devices_per_node": [devices], "global_batch_size": global_batch}}).json()
        assert throughput == pytest.approx(single["throughput_samples_per_s"])
    global_axis = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": {
        "accelerators": ["t4"], "device_counts": [1, 4], "global_batch_sizes": [8, 10]}}).json()
    assert [(p["devices"], p["global_batch_size"]) for p in global_axis["placements"]] == [(1, 8), (1, 10), (4, 8)]
    both = client.post("/v1/predict/matrix", json={"jobs": [job], "grid": {
        "accelerators": ["t4"], "batch_sizes": [8], "global_batch_sizes": [8]}})
    assert both.status_code == 422


def test_the_same_model_in_another_float32_math_or_optimizer_is_its_own_job_without_a_capture(client):
    """A scheduler asking whether a registered job would run faster in TF32 or with AMP, or with Adam, registers
    those twins: each is its own job with its own answer, and none captures the model again."""
    job = client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16}).json()
    engine = client.app.state.service.engine
    captures = engine.stats()["captures"]
    twins = [client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16, **u}).json()
             for u in ({"precision": "tf32"}, {"precision": "amp"}, {"optimizer": "adam"})]
    assert engine.stats()["captures"] == captures
    assert len({j["job_id"] for j in (job, *twins)}) == 4 and twins[1]["precision"] == "amp"
    answers = [client.post("/v1/predict", json={"job": j["job_id"], "placement": {"accelerator": "a100"}}).json()
               for j in (job, *twins)]
    assert [a["job_id"] for a in answers] == [j["job_id"] for j in (job, *twins)]
    assert len({a["composed_iter_time_ms"] for a in answers[:3]}) == 3  # each priced in its own math
    fp32, tf32 = answers[0]["iter_time_ms"], answers[1]["iter_time_ms"]
    # and never answered faster in fp32 than in TF32 (the stage may leave them equal, to the rounding of the
    # placement model's explicit sum of their parts)
    assert fp32 >= tf32 * (1 - 1e-12)
    half = client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16, "precision": "fp16"})  # another graph
    assert half.status_code == 201 and engine.stats()["captures"] > captures


def test_a_channels_last_job_is_registered_as_its_own_job_and_says_so(client):
    """`channels_last` is a job setting over HTTP: its own id, said back, and a faster AMP step on a tensor-core
    GPU than the same job in PyTorch's default layout."""
    job = {"source": {"kind": "zoo", "name": "resnet18"}, "batch_size": 16, "precision": "amp"}
    plain = client.post("/v1/jobs", json=job).json()
    converted = client.post("/v1/jobs", json={**job, "channels_last": True}).json()
    assert plain["channels_last"] is False and converted["channels_last"] is True
    assert converted["job_id"] != plain["job_id"]
    answers = [client.post("/v1/predict", json={"job": j["job_id"], "placement": {"accelerator": "a100"}}).json()
               for j in (plain, converted)]
    assert answers[1]["iter_time_ms"] < answers[0]["iter_time_ms"]
    assert client.post("/v1/jobs", json={**job, "channels_last": "sometimes"}).status_code == 422


def test_a_fused_optimizer_job_is_its_own_job_without_a_capture_and_steps_faster(client):
    """`fused_optimizer` over HTTP: its own id on the same graph (no capture), said back, a shorter optimizer
    step and no more memory; a value that is not a boolean is refused naming the field."""
    job = {**SMALL_JOB, "batch_size": 16, "optimizer": "adamw"}
    plain = client.post("/v1/jobs", json=job).json()
    engine = client.app.state.service.engine
    captures = engine.stats()["captures"]
    fused = client.post("/v1/jobs", json={**job, "fused_optimizer": True}).json()
    assert engine.stats()["captures"] == captures
    assert plain["fused_optimizer"] is False and fused["fused_optimizer"] is True
    assert fused["job_id"] != plain["job_id"]
    answers = [client.post("/v1/predict", json={"job": j["job_id"], "placement": {"accelerator": "h100-sxm5"}}).json()
               for j in (plain, fused)]
    assert answers[1]["breakdown_ms"]["optimizer"] < answers[0]["breakdown_ms"]["optimizer"]
    assert answers[1]["iter_time_ms"] <= answers[0]["iter_time_ms"]
    assert answers[1]["peak_memory_bytes"] <= answers[0]["peak_memory_bytes"]
    refused = client.post("/v1/jobs", json={**job, "fused_optimizer": "sometimes"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "fused_optimizer"


def test_a_placement_says_its_data_parallelism_keeps_a_bucket_copy_of_the_gradients(client):
    """`parallelism.gradient_bucket_copy` over HTTP: torch DDP's default buckets cost memory, not time; said back
    only when true; a value that is not a boolean is refused naming the field."""
    job = client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16, "optimizer": "adamw"}).json()["job_id"]
    placement = {"accelerator": "a100", "devices_per_node": [4]}
    lean = client.post("/v1/predict", json={"job": job, "placement": placement}).json()
    copy = client.post("/v1/predict", json={"job": job, "placement": {
        **placement, "parallelism": {"data": 4, "gradient_bucket_copy": True}}}).json()
    assert copy["peak_memory_bytes"] > lean["peak_memory_bytes"] and copy["iter_time_ms"] == lean["iter_time_ms"]
    assert copy["placement"]["parallelism"]["gradient_bucket_copy"] is True
    assert "gradient_bucket_copy" not in lean["placement"]["parallelism"]
    refused = client.post("/v1/predict", json={"job": job, "placement": {
        **placement, "parallelism": {"data": 4, "gradient_bucket_copy": "sometimes"}}})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "gradient_bucket_copy"


@pytest.mark.parametrize(("path", "body", "loc"), [
    ("/v1/predict", {"job": "SPEC", "placement": {"accelerator": "p100"}}, ["body", "placement", "accelerator"]),
    ("/v1/predict/colocation", {"jobs": ["SPEC", "SPEC"], "placement": {"accelerator": "v100-sxm9"}},
     ["body", "placement", "accelerator"]),
    ("/v1/predict/matrix", {"jobs": ["SPEC"], "placements": [{"accelerator": "t4"}, {"accelerator": "p100"}]},
     ["body", "placements", 1, "accelerator"]),
    ("/v1/predict/matrix", {"jobs": ["SPEC"], "grid": {"accelerators": ["t4", "k81"]}},
     ["body", "grid", "accelerators", 1]),
    ("/v1/predict/matrix", {"jobs": ["SPEC"], "grid": {"accelerators": ["p100"]}, "layout": "gavel",
                            "worker_types": {"p100": "p100"}}, ["body", "worker_types", "p100"]),
    ("/v1/predict/matrix", {"jobs": ["SPEC"], "placements": [{"accelerator": "t4"}], "layout": "gavel",
                            "worker_types": {"t4": "t5"}}, ["body", "worker_types", "t4"]),
])
def test_an_unknown_or_ambiguous_accelerator_is_refused_before_the_job_is_captured(client, path, body, loc):
    """A misspelt accelerator is a 422 at its field, and costs the server no capture of the request's new job."""
    engine = client.app.state.service.engine
    captures = engine.stats()["captures"]
    spec = {**SMALL_JOB, "batch_size": 13}  # a job the server has never seen
    body = {k: ([spec if j == "SPEC" else j for j in v] if k == "jobs" else spec if v == "SPEC" else v)
            for k, v in body.items()}
    answer = client.post(path, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == loc
    assert engine.stats()["captures"] == captures


def test_a_job_whose_reports_run_far_slower_than_its_device_time_is_answered_host_bound(client):
    job_id = _register(client)
    t4 = {"accelerator": "t4"}
    before = client.post("/v1/predict", json={"job": job_id, "placement": t4}).json()
    assert before["host_bound_likely"] is False and before["host_bound_reason"] is None
    observed = before["throughput_samples_per_s"] * 0.2  # five times the predicted step: over twice its device time
    assert client.post("/v1/observations", json={"job": job_id, "placement": t4,
                                                 "throughput_samples_per_s": observed}).status_code == 201
    after = client.post("/v1/predict", json={"job": job_id, "placement": t4}).json()
    assert after["calibration"]["level"] == "job"
    assert after["host_bound_likely"] is True and "own reports on t4" in after["host_bound_reason"]
    # on another GPU too: a host that bounds the job on the T4 bounds it more on a faster device
    elsewhere = client.post("/v1/predict", json={"job": job_id, "placement": {"accelerator": "a10"}}).json()
    assert elsewhere["host_bound_likely"] is True and "own reports on t4" in elsewhere["host_bound_reason"]
    other = _register(client, {**SMALL_JOB, "batch_size": 16})
    assert client.post("/v1/predict", json={"job": other, "placement": t4}).json()["host_bound_likely"] is False


def test_a_jobs_pytorch_version_is_its_own_job_said_back_and_refused_naming_the_field_when_not_one(client):
    """`pytorch_version` over HTTP: said back (null: the newest), its own id, an older one answered slower; Gavel's
    zoo jobs say 1.4 without being told; a version that is not major.minor is a 422 at the field."""
    job = {"source": {"kind": "zoo", "name": "resnet18"}, "batch_size": 16, "precision": "amp"}
    newest = client.post("/v1/jobs", json=job).json()
    older = client.post("/v1/jobs", json={**job, "pytorch_version": "1.4.0"}).json()
    assert newest["pytorch_version"] is None and older["pytorch_version"] == "1.4"
    assert older["job_id"] != newest["job_id"]
    answers = [client.post("/v1/predict", json={"job": j["job_id"], "placement": {"accelerator": "a100"}}).json()
               for j in (newest, older)]
    assert answers[1]["iter_time_ms"] > answers[0]["iter_time_ms"]
    gavel = client.post("/v1/jobs", json={"source": {"kind": "zoo", "name": "gavel-recommendation"},
                                          "batch_size": 64}).json()
    assert gavel["pytorch_version"] == "1.4"
    bad = client.post("/v1/jobs", json={**job, "pytorch_version": "latest"})
    assert bad.status_code == 422 and any("pytorch_version" in e["loc"] for e in bad.json()["detail"])
