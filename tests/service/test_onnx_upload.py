"""`POST /v1/jobs` with an ONNX model and its external data (what `torch.onnx.export(..., dynamo=True)` writes):
as multipart parts `file` + `data`, or one zip; training jobs from ONNX; the size limit on the total."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from service.settings import ServiceSettings
from tests.service.conftest import make_client


def _files(exported_mlp_onnx: Path) -> list[tuple[str, tuple[str, bytes]]]:
    return [("file", ("mlp.onnx", exported_mlp_onnx.read_bytes())),
            ("data", ("mlp.onnx.data", exported_mlp_onnx.with_name("mlp.onnx.data").read_bytes()))]


def test_model_with_external_data_registers_for_inference_and_training(client, exported_mlp_onnx):
    inference = client.post("/v1/jobs", data={"batch_size": "4", "mode": "inference"}, files=_files(exported_mlp_onnx))
    assert inference.status_code == 201, inference.text
    assert inference.json()["graph"]["params"] == 32 * 64 + 64 + 64 * 10 + 10
    train = client.post("/v1/jobs", data={"batch_size": "4", "mode": "train", "optimizer": "adamw"},
                        files=_files(exported_mlp_onnx))
    assert train.status_code == 201, train.text
    body = train.json()
    assert body["mode"] == "train" and body["graph"]["mode"] == "train"
    assert body["graph"]["flops_bwd"] > body["graph"]["flops_fwd"] > 0
    predicted = client.post("/v1/predict", json={"job": body["job_id"], "placement": {"accelerator": "h100"}})
    assert predicted.status_code == 200, predicted.text
    assert predicted.json()["breakdown_ms"]["backward"] > 0 and predicted.json()["breakdown_ms"]["optimizer"] > 0


def test_one_zip_holds_model_and_data(client, exported_mlp_onnx):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.write(exported_mlp_onnx, "mlp/mlp.onnx")
        archive.write(exported_mlp_onnx.with_name("mlp.onnx.data"), "mlp/mlp.onnx.data")
    response = client.post("/v1/jobs", data={"batch_size": "4"}, files={"file": ("mlp.zip", buffer.getvalue())})
    assert response.status_code == 201, response.text
    assert response.json()["graph"]["params"] == 2762


def test_missing_data_names_the_field(client, exported_mlp_onnx):
    response = client.post("/v1/jobs", data={"batch_size": "4"},
                           files={"file": ("mlp.onnx", exported_mlp_onnx.read_bytes())})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "data"] and "mlp.onnx.data" in response.text


def test_the_limit_is_on_model_and_data_together(store_url, models_dir, exported_mlp_onnx):
    data_bytes = exported_mlp_onnx.with_name("mlp.onnx.data").stat().st_size
    assert exported_mlp_onnx.stat().st_size < data_bytes
    settings = ServiceSettings(store_url=store_url, models_dir=models_dir, sync_interval_s=0,
                               max_onnx_bytes=max(data_bytes + 16, 1024))
    with make_client(settings) as small:
        response = small.post("/v1/jobs", data={"batch_size": "4"}, files=_files(exported_mlp_onnx))
    assert response.status_code == 413, response.text
