"""Custom accelerators over HTTP: POST a spec sheet (token), GET it back, 409 on a catalog name, 422 naming the
field, and a prediction for it flagged extrapolated with the reason; a second worker on the store sees it."""

from __future__ import annotations

import pytest

from perfmodel.hardware.custom import CUSTOM_REASON
from tests.service.conftest import SMALL_JOB, WRITE_TOKEN, make_client

SHEET = {"name": "acme-x1", "kind": "gpu", "vendor": "ACME", "aliases": ["ACME X1"],
         "peak_fp32_gflops": "60 TFLOP/s", "peak_bf16_gflops": "800 TFLOP/s", "memory_bandwidth_gb_s": "3 TB/s",
         "memory_gb": 96, "compute_units": 120, "source": "ACME X1 datasheet rev 2"}


@pytest.fixture
def writer(secured):
    with make_client(secured, WRITE_TOKEN) as opened:
        yield opened


def test_a_spec_sheet_is_stored_shown_and_predicted_extrapolated(writer, secured):
    created = writer.post("/v1/accelerators", json=SHEET)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["custom"] is True and body["memory_bandwidth_gb_s"] == 3000.0 and body["peak_fp32_gflops"] == 60000.0
    assert body["source"].startswith("custom accelerator: ")
    again = writer.post("/v1/accelerators", json=SHEET)
    assert again.status_code == 200 and again.json()["name"] == "acme-x1"
    shown = writer.get("/v1/accelerators/ACME X1")  # an alias resolves
    assert shown.status_code == 200 and shown.json()["name"] == "acme-x1" and shown.json()["custom"] is True
    assert "acme-x1" in {entry["name"] for entry in writer.get("/v1/accelerators").json()}
    shipped = writer.get("/v1/accelerators/h100-sxm5")
    assert shipped.status_code == 200 and shipped.json()["custom"] is False
    assert writer.get("/v1/accelerators/no-such-gpu").status_code == 404

    predicted = writer.post("/v1/predict", json={"job": SMALL_JOB, "placement": {"accelerator": "acme-x1"}})
    assert predicted.status_code == 200, predicted.text
    prediction = predicted.json()
    assert prediction["accelerator"] == "acme-x1" and prediction["iter_time_ms"] > 0
    assert prediction["extrapolated"] is True and CUSTOM_REASON in prediction["extrapolation_reasons"]

    with make_client(secured, WRITE_TOKEN) as other:  # another worker on the same store
        assert other.get("/v1/accelerators/acme-x1").json()["name"] == "acme-x1"


def test_writes_need_the_token(secured):
    with make_client(secured) as anonymous:
        assert anonymous.post("/v1/accelerators", json=SHEET).status_code == 401


def test_a_catalog_name_is_a_clash(writer):
    clash = writer.post("/v1/accelerators", json={**SHEET, "name": "my-gpu", "aliases": ["H100"]})
    assert clash.status_code == 409 and "h100-sxm5" in clash.json()["detail"]
    assert writer.post("/v1/accelerators", json={**SHEET, "name": "A100-SXM4-80GB"}).status_code == 409
    writer.post("/v1/accelerators", json=SHEET)
    changed = writer.post("/v1/accelerators", json={**SHEET, "memory_gb": 192})
    assert changed.status_code == 409 and "other figures" in changed.json()["detail"]


@pytest.mark.parametrize(("change", "field"), [
    ({"memory_bandwidth_gb_s": "3 TFLOP/s"}, "memory_bandwidth_gb_s"),  # a unit of another quantity
    ({"memory_gb": None}, "memory_gb"),  # what a GPU prediction needs
    ({"compute_units": -4}, "compute_units"),
    ({"peak_fp32_gflops": 1e15}, "peak_fp32_gflops"),  # beyond any real part
    ({"kind": "cpu"}, "kind"),
    ({"clock_ghz": 2}, "clock_ghz"),  # not a field
])
def test_a_bad_sheet_is_a_422_naming_the_field(writer, change, field):
    response = writer.post("/v1/accelerators", json={**SHEET, **change})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", field]


def test_yaml_sheets_are_accepted(writer):
    text = "\n".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in SHEET.items() if k != "aliases")
    response = writer.post("/v1/accelerators", content=text, headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201, response.text
    assert writer.post("/v1/accelerators", content="[1, 2", headers={"Content-Type": "application/yaml"}
                       ).status_code == 422


def test_the_list_flags_custom_accelerators_as_one_accelerator_does(writer):
    """Each entry of `GET /v1/accelerators` carries `custom`, the same flag `GET /v1/accelerators/{id}` answers."""
    assert writer.post("/v1/accelerators", json=SHEET).status_code == 201
    listed = {entry["name"]: entry for entry in writer.get("/v1/accelerators").json()}
    assert listed["acme-x1"]["custom"] is True and listed["h100-sxm5"]["custom"] is False
    assert all(isinstance(entry["custom"], bool) for entry in listed.values())
    for name in ("acme-x1", "h100-sxm5"):
        assert writer.get(f"/v1/accelerators/{name}").json()["custom"] is listed[name]["custom"]


def test_a_misspelled_field_is_named_in_the_422_with_the_missing_ones(writer):
    """An unknown field is named (with the close known field) even when required fields are missing too."""
    sheet = {k: v for k, v in SHEET.items() if k not in ("memory_bandwidth_gb_s", "compute_units")}
    response = writer.post("/v1/accelerators", json={**sheet, "memory_bandwidth": 3000})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "memory_bandwidth"]
    assert "did you mean memory_bandwidth_gb_s?" in error["msg"] and "compute_units (missing)" in error["msg"]
