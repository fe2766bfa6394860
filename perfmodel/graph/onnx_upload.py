"""An uploaded ONNX model with its external data, assembled in a private folder, checked and turned into a graph.

`torch.onnx.export(model, args, "model.onnx", dynamo=True)` (the default exporter of current PyTorch) writes the
weights to a side file, `model.onnx.data`, that the model names by a relative `location`. An upload is either
- the model plus its data files as separate parts (multipart: `file` = model.onnx, `data` = model.onnx.data, ...),
  each saved under its own base name; or
- one zip holding the model (exactly one `.onnx`) and its data files, in the same folder of the archive.

The size limit applies to the TOTAL: every part's bytes, and a zip's uncompressed members (counted while they are
written, so a zip bomb stops at the limit). Every `location` the model names must be a plain file name among the
uploaded files (no folders, no `..`) holding the bytes the model reads from it (offset + length: a truncated
upload is refused); `onnx.checker.check_model(path)` then runs on the assembled model (by path:
it follows the external data) before `perfmodel.graph.from_onnx` builds the graph. Nothing in the model is run.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph

COPY_CHUNK_BYTES = 1 << 20
MAX_ZIP_MEMBERS = 1024
MAX_DATA_FILES = 64  # external data files sent as separate parts (more: zip them)
MODEL_FIELD = "file"
DATA_FIELD = "data"


class UploadError(PerfmodelError):
    """An upload that is not a model with its data; `field` names the form field (HTTP 422)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


class UploadTooLarge(UploadError):
    """The upload's total size is over the limit (HTTP 413)."""


@dataclass(frozen=True)
class UploadedFile:
    """One uploaded part: its form field, the file name the client gave, and its content (read from the start)."""

    field: str
    filename: str
    content: BinaryIO


class _Budget:
    """Bytes left of the total limit; `take` raises once the parts written exceed it."""

    def __init__(self, max_total_bytes: int):
        self.max_total_bytes = max_total_bytes
        self.used = 0

    def take(self, n: int, field: str) -> None:
        self.used += n
        if self.used > self.max_total_bytes:
            raise UploadTooLarge(field, f"the upload is over {self.max_total_bytes} bytes in total (model and "
                                        f"external data together)")


def _copy(source: BinaryIO, target: Path, budget: _Budget, field: str) -> None:
    with target.open("wb") as out:
        while chunk := source.read(COPY_CHUNK_BYTES):
            budget.take(len(chunk), field)
            out.write(chunk)


def _plain_name(filename: str, field: str) -> str:
    """The base name of an uploaded file; refused if it has none."""
    name = PurePosixPath(filename.replace("\\", "/")).name
    if name in ("", ".", ".."):
        raise UploadError(field, f"file name {filename!r} is not a file name")
    return name


def assemble(files: Sequence[UploadedFile], folder: Path, *, max_total_bytes: int) -> Path:
    """Write the upload into `folder` (the model and its data side by side); returns the model's path."""
    if not files:
        raise UploadError(MODEL_FIELD, "an ONNX model file is required (multipart field `file`)")
    budget = _Budget(max_total_bytes)
    models = [f for f in files if f.field == MODEL_FIELD]
    if len(models) != 1:
        raise UploadError(MODEL_FIELD, f"exactly one model file is expected, got {len(models)}")
    model, data = models[0], [f for f in files if f.field != MODEL_FIELD]
    if _is_zip(model.content):
        if data:
            raise UploadError(DATA_FIELD, "a zip holds the model and its data: send no other file with it")
        return _extract(model.content, folder, budget)
    seen: set[str] = set()
    for part in (model, *data):
        name = _plain_name(part.filename or ("model.onnx" if part is model else ""), part.field)
        if name in seen:
            raise UploadError(part.field, f"two uploaded files are named {name!r}")
        seen.add(name)
        part.content.seek(0)
        _copy(part.content, folder / name, budget, part.field)
    path = folder / _plain_name(model.filename or "model.onnx", MODEL_FIELD)
    return path


def _is_zip(content: BinaryIO) -> bool:
    content.seek(0)
    magic = content.read(4)
    content.seek(0)
    return magic == b"PK\x03\x04"


def _extract(content: BinaryIO, folder: Path, budget: _Budget) -> Path:
    """The zip's files into `folder`, flattened to the folder of its one `.onnx` (others are refused)."""
    try:
        archive = zipfile.ZipFile(content)
    except zipfile.BadZipFile as exc:
        raise UploadError(MODEL_FIELD, f"not a readable zip ({exc})") from None
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        if len(members) > MAX_ZIP_MEMBERS:
            raise UploadError(MODEL_FIELD, f"the zip holds {len(members)} files (at most {MAX_ZIP_MEMBERS})")
        models = [m for m in members if m.filename.lower().endswith(".onnx")]
        if len(models) != 1:
            raise UploadError(MODEL_FIELD, f"the zip must hold exactly one .onnx model, it holds {len(models)}")
        base = PurePosixPath(models[0].filename).parent
        for member in members:
            path = PurePosixPath(member.filename)
            if path.is_absolute() or ".." in path.parts or path.parent != base:
                raise UploadError(MODEL_FIELD, f"zip member {member.filename!r} is not next to the model "
                                               f"{models[0].filename!r}: keep the model and its data in one folder")
            if (member.external_attr >> 16) & 0o170000 == 0o120000:
                raise UploadError(MODEL_FIELD, f"zip member {member.filename!r} is a symbolic link")
            with archive.open(member) as source:
                _copy(source, folder / path.name, budget, MODEL_FIELD)  # type: ignore[arg-type]
        return folder / PurePosixPath(models[0].filename).name


def check_assembled(path: Path, uploaded: set[str] | None = None) -> None:
    """Every external data `location` of the model is a plain name of a file next to it, and `onnx.checker`
    passes on the model by path."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UploadError(MODEL_FIELD, f"{path.name} is not a readable ONNX model ({first})") from None
    present = uploaded if uploaded is not None else {p.name for p in path.parent.iterdir() if p.is_file()}
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        name = PurePosixPath(location.replace("\\", "/"))
        if name.is_absolute() or len(name.parts) != 1 or name.name in ("", ".", ".."):
            raise UploadError(DATA_FIELD, f"the model's weights point at {location!r}: external data must be a "
                                          f"file next to the model")
        if name.name not in present:
            raise UploadError(DATA_FIELD, f"the model keeps weights in external data {location!r}, which was not "
                                          f"uploaded: send it as multipart field `{DATA_FIELD}` (or zip the model "
                                          f"with it)")
        info = {e.key: e.value for e in tensor.external_data}
        end = int(info.get("offset") or 0) + int(info.get("length") or 0)
        size = (path.parent / name.name).stat().st_size
        if end > size:
            raise UploadError(DATA_FIELD, f"{location!r} holds {size} bytes but the model reads {tensor.name!r} up "
                                          f"to byte {end}: the data file is truncated or not this model's")
    try:
        onnx.checker.check_model(str(path))  # by path: follows the external data, works past 2 GB
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UploadError(MODEL_FIELD, f"{path.name} is not a valid ONNX model ({first})") from None


def graph_of_upload(files: Sequence[UploadedFile], *, max_total_bytes: int, batch_size: int | None = None,
                    seq_len: int | None = None, mode: str = "inference", name: str | None = None) -> Graph:
    """The graph of an uploaded model (with its external data), assembled in a private temporary folder that is
    removed afterwards. Errors name the form field: `UploadError` (422), `UploadTooLarge` (413)."""
    from perfmodel.graph.from_onnx import graph_from_onnx

    folder = Path(tempfile.mkdtemp(prefix="perfmodel-upload-"))
    try:
        path = assemble(files, folder, max_total_bytes=max_total_bytes)
        check_assembled(path)
        try:
            graph = graph_from_onnx(path, batch_size=batch_size, seq_len=seq_len, mode=mode,
                                    name=name or path.stem or "model")
        except PerfmodelError as exc:
            raise UploadError(MODEL_FIELD, " ".join(str(exc).replace(str(path), path.name).split())) from None
        return graph
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def uploaded_files(form_items: Sequence[tuple[str, Any]]) -> list[UploadedFile]:
    """The file parts of a parsed multipart form (`(field, value)` pairs; values with `filename` and `file`, as
    Starlette's `UploadFile`): the model under `file`, its data under `data`; other file fields are refused."""
    out = []
    for field, value in form_items:
        if isinstance(value, str):
            continue
        if field not in (MODEL_FIELD, DATA_FIELD):
            raise UploadError(field, f"unexpected file field {field!r}: send the model as `{MODEL_FIELD}` and its "
                                     f"external data as `{DATA_FIELD}`")
        out.append(UploadedFile(field=field, filename=value.filename or "", content=value.file))
    return out
