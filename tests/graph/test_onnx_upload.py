"""Uploads of an ONNX model with external data: a real `torch.onnx.export(..., dynamo=True)` export (weights in
`model.onnx.data`), sent as separate parts or one zip; the limit applies to the total; missing or escaping data,
bad zips and broken models are refused naming the field."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from perfmodel.graph.onnx_upload import UploadedFile, UploadError, UploadTooLarge, graph_of_upload

LIMIT = 1 << 20


def _part(field: str, path: Path, name: str | None = None) -> UploadedFile:
    return UploadedFile(field=field, filename=name or path.name, content=io.BytesIO(path.read_bytes()))


def _zip(entries: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    buffer.seek(0)
    return buffer


def test_model_and_data_as_parts(exported_mlp_onnx):
    data = exported_mlp_onnx.with_name("mlp.onnx.data")
    parts = [_part("file", exported_mlp_onnx), _part("data", data)]
    graph = graph_of_upload(parts, max_total_bytes=LIMIT, batch_size=4)
    assert graph.name == "mlp" and graph.totals.params == 32 * 64 + 64 + 64 * 10 + 10
    assert graph.inputs[0].shape == (4, 32) and graph.totals.flops_fwd > 0
    train = graph_of_upload(parts, max_total_bytes=LIMIT, batch_size=4, mode="train")
    assert train.mode == "train" and train.totals.flops_bwd > train.totals.flops_fwd


def test_model_and_data_as_one_zip(exported_mlp_onnx):
    archive = _zip({"export/mlp.onnx": exported_mlp_onnx.read_bytes(),
                    "export/mlp.onnx.data": exported_mlp_onnx.with_name("mlp.onnx.data").read_bytes()})
    graph = graph_of_upload([UploadedFile("file", "mlp.zip", archive)], max_total_bytes=LIMIT)
    assert graph.inputs[0].shape == (4, 32) and graph.totals.params == 32 * 64 + 64 + 64 * 10 + 10  # static


def test_the_limit_is_on_the_total(exported_mlp_onnx):
    data = exported_mlp_onnx.with_name("mlp.onnx.data")
    model_bytes, data_bytes = exported_mlp_onnx.stat().st_size, data.stat().st_size
    assert model_bytes < data_bytes  # each part alone fits the limit below, both together do not
    with pytest.raises(UploadTooLarge):
        graph_of_upload([_part("file", exported_mlp_onnx), _part("data", data)], max_total_bytes=data_bytes + 10)
    bomb = _zip({"mlp.onnx": exported_mlp_onnx.read_bytes(), "mlp.onnx.data": b"\0" * (4 * LIMIT)})
    with pytest.raises(UploadTooLarge):
        graph_of_upload([UploadedFile("file", "bomb.zip", bomb)], max_total_bytes=LIMIT)


def test_missing_or_escaping_data_is_refused(exported_mlp_onnx):
    with pytest.raises(UploadError, match="mlp.onnx.data.*not uploaded") as caught:
        graph_of_upload([_part("file", exported_mlp_onnx)], max_total_bytes=LIMIT)
    assert caught.value.field == "data"
    escaping = _zip({"a/mlp.onnx": exported_mlp_onnx.read_bytes(), "b/../../mlp.onnx.data": b"x"})
    with pytest.raises(UploadError, match="not next to the model"):
        graph_of_upload([UploadedFile("file", "m.zip", escaping)], max_total_bytes=LIMIT)
    with pytest.raises(UploadError, match="exactly one .onnx"):
        graph_of_upload([UploadedFile("file", "m.zip", _zip({"x.txt": b"x"}))], max_total_bytes=LIMIT)


def test_truncated_data_and_broken_models_are_refused(exported_mlp_onnx):
    data = exported_mlp_onnx.with_name("mlp.onnx.data").read_bytes()
    parts = [_part("file", exported_mlp_onnx), UploadedFile("data", "mlp.onnx.data", io.BytesIO(data[:100]))]
    with pytest.raises(UploadError, match="truncated") as caught:
        graph_of_upload(parts, max_total_bytes=LIMIT)
    assert caught.value.field == "data"
    with pytest.raises(UploadError, match="not a readable ONNX model") as caught:
        graph_of_upload([UploadedFile("file", "m.onnx", io.BytesIO(b"not onnx"))], max_total_bytes=LIMIT)
    assert caught.value.field == "file"
