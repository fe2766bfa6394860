"""The hot path: a `POST /v1/predict` body answered before is served from memory, never stale, never past auth."""

from __future__ import annotations

import json

from service.settings import ServiceSettings, hash_token
from tests.service.conftest import READ_TOKEN, SMALL_JOB, WRITE_TOKEN, make_client


def _body(job: str) -> bytes:
    return json.dumps({"job": job, "placement": {"accelerator": "t4", "devices_per_node": [2]}}).encode()


def _predict(client, body: bytes, token: str | None = None):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    return client.post("/v1/predict", content=body, headers=headers)


def test_the_same_body_again_is_served_from_memory_and_a_new_observation_refreshes_it(client):
    job = client.post("/v1/jobs", json=SMALL_JOB).json()["job_id"]
    body = _body(job)
    first = _predict(client, body)
    assert first.status_code == 200, first.text
    engine = client.app.state.service.engine
    responses = client.app.state.service.responses
    assert responses.peek((engine.response_token(job), body)) is None  # asked once: only its hash is remembered
    assert _predict(client, body).content == first.content
    kept = responses.peek((engine.response_token(job), body))
    assert kept is not None and kept[0] == first.content  # asked again: kept, encoded, under the job's current token
    assert _predict(client, body).content == first.content
    raw = first.json()["throughput_samples_per_s"]
    observed = client.post("/v1/observations", json={"job": job, "placement": json.loads(body)["placement"],
                                                     "throughput_samples_per_s": raw * 0.5})
    assert observed.status_code == 201, observed.text
    again = _predict(client, body).json()  # the token changed: recomputed, calibrated
    assert again["calibrated"] is True and again["throughput_samples_per_s"] < raw * 0.9


def test_a_kept_answer_still_needs_read_access(store_url, models_dir):
    settings = ServiceSettings(store_url=store_url, models_dir=models_dir, sync_interval_s=0, read_requires_token=True,
                               token_sha256=hash_token(WRITE_TOKEN), read_token_sha256=hash_token(READ_TOKEN))
    with make_client(settings) as client:
        job = client.post("/v1/jobs", json=SMALL_JOB, headers={"Authorization": f"Bearer {WRITE_TOKEN}"})
        body = _body(job.json()["job_id"])
        assert _predict(client, body, READ_TOKEN).status_code == 200
        assert _predict(client, body, READ_TOKEN).status_code == 200
        assert _predict(client, body).status_code == 401
        assert _predict(client, body, "wrong").status_code == 401


def test_a_new_body_of_a_job_in_memory_is_answered_as_the_route_would(client):
    job = client.post("/v1/jobs", json=SMALL_JOB).json()["job_id"]
    assert _predict(client, _body(job)).status_code == 200  # the job's compute on the t4, made once
    state = client.app.state.service
    for latency in (3.5, 7.25):  # new bodies: another network each
        placement = {"accelerator": "t4", "devices_per_node": [2], "inter_node_latency_us": latency}
        answer = _predict(client, json.dumps({"job": job, "placement": placement}).encode())
        assert answer.status_code == 200, answer.text
        from service.routers.common import encode_json
        from service.schemas import PlacementIn

        want = state.engine.predict(job, PlacementIn(**placement))  # the route's blocking path
        assert answer.content == encode_json(want)  # every field, in the same order
    bad = _predict(client, json.dumps({"job": job, "placement": {"accelerator": "t4", "devices_per_node": "two"}})
                   .encode())
    assert bad.status_code == 422 and "devices_per_node" in bad.text  # the app's error, the field at fault
    unknown = _predict(client, json.dumps({"job": job, "placement": {"accelerator": "no-such-gpu"}}).encode())
    assert unknown.status_code == 422 and "accelerator" in unknown.text
