"""NeuSight (sitar-lab/NeuSight, ASPLOS'25, MIT): fp32 per-op latency sweeps with shapes and launch geometry.

Read (paths relative to the dataset root, see its PROVENANCE-upstream.md):

- `data/dataset/train/collect/<op>/p<torch>/<GPU>.csv[.gz]`: one sweep per op per NVIDIA GPU (PyTorch 2.1);
- `data/dataset_amd/train/collect/<op>/p<torch>/<GPU>.csv[.gz]`: element-wise, ln and softmax on AMD MI100/MI210;
- `data/dataset/test/{bmm,linear,elem,ln,softmax}.csv[.gz]`: real-transformer shapes (`extra["split"] == "test"`).

Not read: `data/dataset*/train/{elem,ln,softmax}.csv` (NeuSight's merged training subsets: every shape in them is
in the per-GPU `collect/` sweeps, re-measured), `label/` (whole-model latencies, not op records), configs and
summaries. Latencies are CUDA-event milliseconds of the forward op.

Shapes: bmm is (B, M, K) @ (B, K, N); linear is x (M, K) times weight (N, K) transposed, B = 1; conv is a square
NCHW conv (B, Input_Channel, Input_Size^2) with Output_Channel filters of Kernel_Szie^2 (sic), Stride, Padding;
element-wise, ln and softmax act on a (B, H) tensor (ln and softmax over H).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from perfmodel.importers.common import (
    DatasetImporter,
    DeviceResolver,
    ImportStats,
    compact,
    integer,
    number,
    read_csv,
    relative,
    rows,
)
from perfmodel.lowering.ops import NEUSIGHT_OP_CLASS, NEUSIGHT_SHAPE_SOURCES
from perfmodel.profilers.external import OpMeasurement

SOURCE: Final = "neusight"
# a square conv row's fields -> the measurement's height/width field prefix
SQUARE_CONV_FIELDS = {"input_size": "input", "kernel_size": "kernel", "stride": "stride", "padding": "padding"}


FILE_PATTERNS = (
    "data/dataset/train/collect/*/*/*",
    "data/dataset_amd/train/collect/*/*/*",
    "data/dataset/test/*",
)
MARKERS = ("data/dataset/train/collect", "data/dataset_amd/train/collect", "data/dataset/test")


def _records(root: Path, paths: list[Path], stats: ImportStats, resolve: DeviceResolver) -> Iterator[OpMeasurement]:
    for path in paths:
        name = relative(root, path)
        stats.files.append(name)
        split = "test" if "/test/" in name else "train"
        version_dir = path.parent.name if split == "train" else None  # p2.1.0: the torch version it ran on
        frame = read_csv(path)
        if "OPName" not in frame.columns or "Latency" not in frame.columns or "Device" not in frame.columns:
            stats.skipped[f"{name}: not a NeuSight op table"] += len(frame)
            continue
        for index, row in rows(frame):
            device_name = str(row["Device"])
            device = resolve(device_name)
            if device is None:
                stats.unknown_devices[device_name] += 1
                continue
            record = _record(name, index, row, device, split, version_dir, stats)
            if record is not None:
                yield stats.count(record)


def _record(name: str, index: int, row: dict[str, Any], device: str, split: str, version_dir: str | None,
            stats: ImportStats) -> OpMeasurement | None:
    op = str(row["OPName"])
    op_class = NEUSIGHT_OP_CLASS.get(op)
    if op_class is None:
        stats.skipped[f"unknown NeuSight op {op!r}"] += 1
        return None
    latency = number(row["Latency"])
    if latency is None or latency <= 0:
        stats.skipped["no latency"] += 1
        return None
    shape: dict[str, Any] = {column: integer(next((row[name] for name in names if name in row), None))
                             for column, names in NEUSIGHT_SHAPE_SOURCES[op_class].items()}
    if op_class == "conv2d":  # square: the measurement's height and width fields too
        for column, prefix in SQUARE_CONV_FIELDS.items():
            shape[f"{prefix}_height"] = shape[f"{prefix}_width"] = shape[column]
    kernel_name = kernel_signature(row.get("Kernel Name"))
    kernels = [kernel_signature(k) for k in str(row.get("Kernels") or "").split(";") if k and k != "nan"]
    torch_version = row.get("Torch Version") or version_dir
    extra = compact({
        "split": split,
        "large": row["large"] if isinstance(row.get("large"), bool) else None,  # NeuSight's large-size samples
        "kernel_name": kernel_name,
        "kernels": kernels if len(kernels) > 1 else None,  # every kernel the op launched, when it was several
        "warps_per_sm": number(row.get("Warps per SM")),
        "blocks_per_sm": number(row.get("Blocks per SM")),
        "grid": _triple(row, "Grid"),
        "block": _triple(row, "Block"),
        "torch_version": str(torch_version).removeprefix("p") if isinstance(torch_version, str) else None,
        "cudnn_version": integer(row.get("CUDNN Version")),
        "cuda_version": row.get("CUDA Version") if isinstance(row.get("CUDA Version"), str) else None,
    })
    return OpMeasurement(source=SOURCE, source_file=name, source_row=index, device=device, op_class=op_class,
                         op_name=op, dtype="fp32", phase="forward", latency_ms=latency, extra=extra, **shape)


@functools.lru_cache(maxsize=4096)  # a few hundred distinct kernels over hundreds of thousands of rows
def kernel_signature(name: object) -> str | None:
    """A demangled kernel name without its parameter list (which repeats its template arguments) and `void`."""
    if not isinstance(name, str) or not name:
        return None
    name = name.strip().removeprefix("void ")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i].rstrip() or name
    return name


def _triple(row: dict[str, Any], prefix: str) -> list[int] | None:
    values = [integer(row.get(f"{prefix} {axis}")) for axis in "xyz"]
    return None if None in values else values  # type: ignore[return-value]


import_neusight = DatasetImporter(SOURCE, MARKERS, FILE_PATTERNS,
                                  "expected data/dataset/train/collect/<op>/p<torch>/<GPU>.csv.gz", _records)
neusight_files = import_neusight.files_in
