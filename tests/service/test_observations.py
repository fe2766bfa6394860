"""Observations that cannot poison a job, read back and deleted; an IR registered at the wrong batch refused."""

from __future__ import annotations

import math

import pytest

from tests.service.conftest import SMALL_JOB


@pytest.fixture
def job(client) -> str:
    response = client.post("/v1/jobs", json=SMALL_JOB)
    assert response.status_code in (200, 201), response.text
    return response.json()["job_id"]


def _observe(client, job: str, value: float, placement=None):
    return client.post("/v1/observations", json={"job": job, "placement": placement or {"accelerator": "t4"},
                                                  "throughput_samples_per_s": value})


def test_a_throughput_beyond_physics_or_absurdly_low_is_refused_and_not_stored(client, job):
    raw = client.post("/v1/predict", json={"job": job, "placement": {"accelerator": "t4"}}).json()
    for value in (1e12, raw["throughput_samples_per_s"] * 1e-4):
        refused = _observe(client, job, value)
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"] == ["body", "throughput_samples_per_s"]
    after = client.post("/v1/predict", json={"job": job, "placement": {"accelerator": "t4"}}).json()
    assert after["calibrated"] is False and after["throughput_samples_per_s"] == raw["throughput_samples_per_s"]
    assert client.get(f"/v1/jobs/{job}").json()["calibration"]["observations"] == 0


def test_an_observation_is_read_back_and_deleting_it_recalibrates_the_job(client, job):
    t4 = {"job": job, "placement": {"accelerator": "t4"}}
    raw = client.post("/v1/predict", json=t4).json()["throughput_samples_per_s"]
    kept = _observe(client, job, raw * 0.8).json()
    wrong = _observe(client, job, raw * 0.4).json()
    # the recency-weighted median of two points a moment apart: halfway between them (in log), not the newer
    assert client.post("/v1/predict", json=t4).json()["calibration_factor"] == pytest.approx(math.sqrt(0.8 * 0.4),
                                                                                              rel=1e-3)
    read = client.get(f"/v1/observations/{wrong['observation_id']}")
    assert read.status_code == 200 and read.json()["job_id"] == job
    assert read.json()["throughput_samples_per_s"] == pytest.approx(raw * 0.4)
    deleted = client.delete(f"/v1/observations/{wrong['observation_id']}")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["calibration"]["observations"] == 1
    assert client.post("/v1/predict", json=t4).json()["calibration_factor"] == pytest.approx(0.8)
    assert client.get(f"/v1/observations/{wrong['observation_id']}").status_code == 404
    assert client.delete(f"/v1/observations/{wrong['observation_id']}").status_code == 404
    assert client.get(f"/v1/observations/{kept['observation_id']}").status_code == 200


def test_an_outlier_is_excluded_and_the_report_says_why(client, job):
    t4 = {"job": job, "placement": {"accelerator": "t4"}}
    raw = client.post("/v1/predict", json=t4).json()["throughput_samples_per_s"]
    for ratio in (0.80, 0.82, 0.78, 0.81):
        assert _observe(client, job, raw * ratio).status_code == 201
    outlier = _observe(client, job, raw * 0.05).json()  # 20x below the model: allowed, but far from the rest
    assert outlier["excluded"] and "outlier" in outlier["excluded"]
    report = client.get(f"/v1/jobs/{job}").json()["calibration"]
    assert [e["id"] for e in report["excluded"]] == [outlier["observation_id"]]
    assert report["by_accelerator"][0]["calibration_factor"] == pytest.approx(0.805, abs=0.01)


def test_an_ir_registered_at_another_batch_than_it_was_captured_at_is_refused(client, small_ir):
    right = client.post("/v1/jobs", json={"source": {"kind": "ir", "graph": small_ir}, "batch_size": 8})
    assert right.status_code == 201, right.text
    wrong = client.post("/v1/jobs", json={"source": {"kind": "ir", "graph": small_ir}, "batch_size": 16})
    assert wrong.status_code == 422
    detail = wrong.json()["detail"][0]
    assert detail["loc"] == ["body", "batch_size"] and "captured at batch 8" in detail["msg"]
    inline = client.post("/v1/predict", json={"job": {"source": {"kind": "ir", "graph": small_ir}, "batch_size": 16},
                                              "placement": {"accelerator": "t4"}})
    assert inline.status_code == 422 and inline.json()["detail"][0]["loc"] == ["body", "job", "batch_size"]


def test_an_inline_job_spec_is_refused_saying_to_register_it_first(client):
    """Observations are of registered jobs: a job spec in `job` is a 422 at `job` that says to POST /v1/jobs."""
    refused = _observe(client, SMALL_JOB, 100.0)
    assert refused.status_code == 422, refused.text
    error = refused.json()["detail"][0]
    assert error["loc"] == ["body", "job"]
    assert "registered job" in error["msg"] and "POST /v1/jobs" in error["msg"] and "job_id" in error["msg"]


def test_a_malformed_job_id_says_what_a_job_id_is(client):
    """"deadbeef" got "String should match pattern '^[0-9a-f]{24}$'"; the answer says where a job id comes from."""
    for route, body in (("/v1/predict", {"job": "deadbeef", "placement": {"accelerator": "t4"}}),
                        ("/v1/observations", {"job": "deadbeef", "placement": {"accelerator": "t4"},
                                              "throughput_samples_per_s": 5.0})):
        response = client.post(route, json=body)
        assert response.status_code == 422, route
        detail = response.json()["detail"][0]
        assert detail["loc"] == ["body", "job"] and "POST /v1/jobs" in detail["msg"] and "deadbeef" in detail["msg"]


def test_a_report_while_sharing_calibrates_the_jobs_shared_answers_not_its_answers_alone(client, job):
    other = client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16}).json()["job_id"]
    pair = {"jobs": [job, other], "placement": {"accelerator": "t4"}}
    before = client.post("/v1/predict/colocation", json=pair).json()
    alone = client.post("/v1/predict", json={"job": job, "placement": {"accelerator": "t4"}}).json()
    assert [c["level"] for c in before["calibration"]] == ["none", "none"]
    report = client.post("/v1/observations", json={
        "job": job, "placement": {"accelerator": "t4"}, "colocated_with": other,
        "throughput_samples_per_s": before["throughput_samples_per_s"][0] * 0.5})
    assert report.status_code == 201, report.text
    assert report.json()["colocated_with"] == other and report.json()["calibrated"] is True
    after = client.post("/v1/predict/colocation", json=pair).json()
    assert after["calibration"][0]["level"] == "job" and after["calibration"][0]["observations"] == 1
    assert after["throughput_samples_per_s"][0] < before["throughput_samples_per_s"][0] * 0.6
    assert after["throughput_samples_per_s"][1] == pytest.approx(before["throughput_samples_per_s"][1])
    again = client.post("/v1/predict", json={"job": job, "placement": {"accelerator": "t4"}}).json()
    assert again["calibrated"] is False and again["throughput_samples_per_s"] == alone["throughput_samples_per_s"]
    stored = client.get(f"/v1/observations/{report.json()['observation_id']}").json()
    assert (stored["colocated_with"], stored["sharing"]) == (other, "time-slicing")
    detail = client.get(f"/v1/jobs/{job}").json()["calibration"]
    assert detail["observations"] == 0  # its reports alone: none
    assert detail["sharing"] == [{"accelerator": "t4", "sharing": "time-slicing", "level": "job",
                                  "factor": pytest.approx(after["calibration"][0]["factor"]), "observations": 1,
                                  "partners": 1}]
    # Gavel's file of the pair carries it too
    gavel = client.post("/v1/predict/matrix", json={"jobs": [job, other], "layout": "gavel", "colocation": True,
                                                     "grid": {"accelerators": ["t4"], "device_counts": [1],
                                                              "spread": False},
                                                     "job_types": ["a", "b"]}).json()
    this, _ = gavel["throughputs"]["t4"]["('a', 1)"]["('b', 1)"]
    assert this * 8 == pytest.approx(after["throughput_samples_per_s"][0])
    assert client.delete(f"/v1/observations/{report.json()['observation_id']}").status_code == 200
    undone = client.post("/v1/predict/colocation", json=pair).json()
    assert undone["throughput_samples_per_s"] == pytest.approx(before["throughput_samples_per_s"])


def test_a_report_while_sharing_with_no_such_job_or_a_mode_without_a_partner_is_refused(client, job):
    for body, loc in (({"colocated_with": "0" * 24}, ["body", "colocated_with"]),
                      ({"colocated_with": "nope"}, ["body", "colocated_with"]),
                      ({"sharing": "mps"}, ["body", "sharing"])):
        refused = client.post("/v1/observations", json={"job": job, "placement": {"accelerator": "t4"},
                                                        "throughput_samples_per_s": 100.0, **body})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"] == loc, refused.text
    assert client.get(f"/v1/jobs/{job}").json()["calibration"]["observations"] == 0


def test_a_report_while_sharing_with_a_job_it_cannot_fit_beside_is_refused_at_colocated_with(client):
    big = client.post("/v1/jobs", json={"source": {"kind": "zoo", "name": "resnet50"}, "batch_size": 96}).json()
    t4 = {"accelerator": "t4"}
    alone = client.post("/v1/predict", json={"job": big["job_id"], "placement": t4}).json()
    assert alone["fits"] and 2 * alone["peak_memory_bytes"] > alone["memory_capacity_bytes"]
    refused = client.post("/v1/observations", json={"job": big["job_id"], "placement": t4,
                                                    "colocated_with": big["job_id"],
                                                    "throughput_samples_per_s": 10.0})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "colocated_with"]
    assert "do not fit together" in refused.json()["detail"][0]["msg"]


def test_the_calibration_report_gives_the_factor_that_applies_with_the_jobs_isolated_reports(client, job):
    other = client.post("/v1/jobs", json={**SMALL_JOB, "batch_size": 16}).json()["job_id"]
    t4 = {"accelerator": "t4"}
    alone = client.post("/v1/predict", json={"job": job, "placement": t4}).json()["throughput_samples_per_s"]
    assert _observe(client, job, alone * 0.9).status_code == 201  # its isolated answer on the T4 is its own
    pair = {"jobs": [job, other], "placement": t4}
    shared = client.post("/v1/predict/colocation", json=pair).json()["throughput_samples_per_s"][0]
    client.post("/v1/observations", json={"job": job, "placement": t4, "colocated_with": other,
                                          "throughput_samples_per_s": shared * 0.5})
    applied = client.post("/v1/predict/colocation", json=pair).json()["calibration"][0]
    [reported] = client.get(f"/v1/jobs/{job}").json()["calibration"]["sharing"]
    assert reported["factor"] == pytest.approx(applied["factor"]) and applied["level"] == "job"
    assert applied["factor"] == pytest.approx(0.5 ** (1 / 1.5))  # the heavier prior: its isolated answer is known
