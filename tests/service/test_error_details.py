"""Errors name what is at fault: a path parameter by its name in `loc`, and an unknown accelerator asked by name
with the catalog's close names (or, for an ambiguous name, its parts), as a prediction naming it gets."""

from __future__ import annotations

import pytest

from tests.service.conftest import SMALL_JOB


@pytest.mark.parametrize(("path", "loc"), [
    ("/v1/jobs/deadbeef", ["path", "job_id"]),
    ("/v1/jobs/ZZZ", ["path", "job_id"]),
    ("/v1/observations/0", ["path", "observation_id"]),
    ("/v1/observations/x", ["path", "observation_id"]),
])
def test_a_bad_path_parameter_is_a_422_naming_it(client, path, loc):
    response = client.get(path)
    assert response.status_code == 422, response.text
    assert [error["loc"] for error in response.json()["detail"]] == [loc]


def test_a_bad_job_id_in_a_body_still_names_the_field(client):
    response = client.post("/v1/predict", json={"job": "deadbeef", "placement": {"accelerator": "t4"}})
    assert response.status_code == 422
    assert [error["loc"] for error in response.json()["detail"]] == [["body", "job"]]


@pytest.mark.parametrize(("name", "choices"), [
    ("k8O", ["k80"]),
    ("Tesla P10", ["NVIDIA Tesla P100", "Tesla P100 SXM2"]),
])
def test_an_unknown_accelerator_is_a_404_naming_the_close_choices_as_a_prediction_does(client, name, choices):
    response = client.get(f"/v1/accelerators/{name}")
    assert response.status_code == 404, response.text
    detail = response.json()["detail"]
    assert "did you mean" in detail and all(choice in detail for choice in choices)
    predicted = client.post("/v1/predict", json={"job": SMALL_JOB, "placement": {"accelerator": name}})
    assert predicted.status_code == 422
    assert predicted.json()["detail"][0]["msg"].endswith(detail.partition("did you mean")[2])


def test_an_ambiguous_accelerator_lists_its_parts_and_a_name_far_from_any_says_where_to_look(client):
    ambiguous = client.get("/v1/accelerators/P100")
    assert ambiguous.status_code == 422
    message = ambiguous.json()["detail"][0]["msg"]
    assert all(part in message for part in ("p100-pcie-16gb", "p100-pcie-12gb", "p100-sxm2-16gb"))
    assert ambiguous.json()["detail"][0]["loc"] == ["path", "accelerator_id"]
    unknown = client.get("/v1/accelerators/zzzzqqq")
    assert unknown.status_code == 404 and "GET /v1/accelerators" in unknown.json()["detail"]


def test_a_zoo_name_may_be_any_library_classifier_and_an_unknown_one_names_the_close_ones(client):
    """A torchvision or timm image classifier is a zoo model by its library name; a name no library has is a 422 at
    `source.name` listing the close names of the zoo and both libraries."""
    unknown = client.post("/v1/jobs", json={"source": {"kind": "zoo", "name": "vit_b_17"}, "batch_size": 2})
    assert unknown.status_code == 422, unknown.text
    error = unknown.json()["detail"][0]
    assert error["loc"] == ["body", "source", "name"] and "did you mean: vit_b_16" in error["msg"]
    known = client.post("/v1/predict", json={"job": {"source": {"kind": "zoo", "name": "mnasnet0_5"}, "batch_size": 2},
                                             "placement": {"accelerator": "t4"}})
    assert known.status_code == 200, known.text
    assert known.json()["job_name"] == "mnasnet0_5" and known.json()["throughput_samples_per_s"] > 0
