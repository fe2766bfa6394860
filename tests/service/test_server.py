"""A real `perfmodel serve` (uvicorn, loopback, free port) in a subprocess, driven by `perfmodel.client.Client`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from perfmodel.client import Client, ServiceError
from service.launch import LocalServer
from service.settings import hash_token
from tests.service.conftest import SMALL_JOB, small_onnx

TOKEN = "integration-token"


@pytest.fixture
def server(tmp_path: Path, models_dir: Path, sqlite_url: str):
    env = {"PERFMODEL_STORE_URL": sqlite_url, "PERFMODEL_MODELS_DIR": str(models_dir),
           "PERFMODEL_TOKEN_SHA256": hash_token(TOKEN)}
    try:
        running = LocalServer(env, log_path=tmp_path / "server.log").start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield running.url
    finally:
        running.stop()


@pytest.mark.slow  # starts a real server and captures in it
def test_a_scheduler_talks_to_a_real_server_with_the_client(server, tmp_path):
    with Client(server, token=TOKEN) as pm, Client(server) as anonymous:
        assert pm.ready() and pm.health()["writes"] == "token"
        job = pm.register_job(zoo="mlp-recommender", batch_size=8)
        assert job["created"] and pm.register_job(SMALL_JOB)["job_id"] == job["job_id"]
        with pytest.raises(ServiceError) as denied:
            anonymous.register_job(zoo="mlp-recommender", batch_size=4)
        assert denied.value.status_code == 401
        onnx_job = pm.register_onnx(small_onnx(tmp_path / "mlp.onnx"), batch_size=4)
        assert onnx_job["source_kind"] == "ir"
        single = anonymous.predict(job["job_id"], {"accelerator": "t4"})
        assert single["throughput_samples_per_s"] > 0 and single["calibrated"] is False
        matrix = pm.matrix([job["job_id"], onnx_job["job_id"]],
                           grid={"accelerators": ["t4", "a100-sxm4-80gb"], "device_counts": [1, 4]})
        assert len(matrix["throughput_samples_per_s"]) == 2 and len(matrix["placements"]) == 4
        assert matrix["throughput_samples_per_s"][0][0] == pytest.approx(single["throughput_samples_per_s"])
        gavel = pm.matrix([job["job_id"]], grid={"accelerators": ["t4"], "device_counts": [1, 2]}, layout="gavel")
        assert gavel["throughputs"]["t4"][str(("mlp-recommender (batch size 8)", 2))]["null"] > 0
        observed = pm.observe(job["job_id"], {"accelerator": "t4"},
                              throughput_samples_per_s=single["throughput_samples_per_s"] * 0.8)
        assert observed["calibration_factor"] == pytest.approx(0.8)
        assert pm.predict(job["job_id"], {"accelerator": "t4"})["calibrated"] is True
        assert pm.job(job["job_id"])["calibration"]["observations"] == 1
        assert any(a["name"] == "t4" for a in pm.accelerators())
        assert pm.models()["serving"]["cpu-step"] == "xgb-ops/v1"
        with pytest.raises(ServiceError) as bad:
            pm.predict(job["job_id"], {"accelerator": "t4", "global_batch_size": 0})
        assert bad.value.status_code == 422 and "global_batch_size" in str(bad.value)
        metrics = httpx.get(f"{server}/metrics").text
        assert 'route="/v1/predict",status="200"' in metrics
        pm.delete_job(job["job_id"])
        assert [j["job_id"] for j in pm.jobs()] == [onnx_job["job_id"]]


def test_register_job_refuses_a_bare_name_before_sending():
    """`register_job("resnet50", ...)` says to pass zoo="resnet50" instead of sending a body the service can only
    call "not an object" (nothing listens at this address: a request would be a connection error)."""
    with Client("http://127.0.0.1:9") as pm, pytest.raises(TypeError, match=r"zoo='resnet50'"):
        pm.register_job("resnet50", batch_size=32)


@pytest.mark.slow  # starts a real server
def test_the_client_predicts_colocation_and_gavel_matrices_with_their_options(server):
    """`colocation` posts POST /v1/predict/colocation; `matrix` passes job_types, worker_types, colocation and
    sharing through to Gavel's layout; `observe` passes a report made while sharing."""
    with Client(server, token=TOKEN) as pm:
        job = pm.register_job(SMALL_JOB)["job_id"]
        other = pm.register_job(zoo="mlp-recommender", batch_size=16)["job_id"]
        shared = pm.colocation([job, other], {"accelerator": "a100-sxm4-80gb"}, sharing="mps")
        assert shared["sharing"] == "mps" and shared["jobs"] == [job, other]
        assert all(t > 0 for t in shared["throughput_samples_per_s"]) and all(s >= 1 for s in shared["slowdown"])
        gavel = pm.matrix([job, other], grid={"accelerators": ["v100"], "device_counts": [1]}, layout="gavel",
                          job_types=["small", "large"], worker_types={"v100": "v100-sxm2-16gb"}, colocation=True,
                          sharing="time-slicing")
        assert gavel["job_types"] == {"small": job, "large": other}
        assert gavel["worker_types"] == {"v100": "v100-sxm2-16gb"}
        pair = gavel["throughputs"]["v100"]["('small', 1)"]["('large', 1)"]
        assert len(pair) == 2 and all(steps > 0 for steps in pair)
        # a report of the small job while sharing, through the client: its answers while sharing follow it
        report = pm.observe(job, {"accelerator": "a100-sxm4-80gb"}, colocated_with=other, sharing="mps",
                            throughput_samples_per_s=shared["throughput_samples_per_s"][0] * 0.5)
        assert report["colocated_with"] == other and report["sharing"] == "mps"
        after = pm.colocation([job, other], {"accelerator": "a100-sxm4-80gb"}, sharing="mps")
        assert after["calibration"][0]["level"] == "job" and after["calibration"][1]["level"] == "none"
        assert after["throughput_samples_per_s"][0] < shared["throughput_samples_per_s"][0] * 0.6
