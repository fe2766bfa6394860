"""DeepBench (baidu-research/DeepBench, Apache-2.0): GEMM, convolution, RNN and all-reduce kernel times.

Read: the tidy extracts of the dataset's spreadsheets, `tidy/deepbench_<section>.csv` (one row per benchmark row
of every results sheet; see the dataset's PROVENANCE.md): dense matrix multiplication, convolution, recurrent
layers (vanilla, LSTM, GRU) and all-reduce. Times are the sheets' milliseconds.

Not read: sparse matrix multiplication (inference sheets only, sparse kernels), and the raw sheets under
`results/` (the tidy files hold the same rows, with the sheet and row they came from in `extra`).

Mapping:
- precision: "Float" -> fp32; "16 bit inputs, 16 bit multiplication, 32 bit addition" (V100, T4 tensor cores)
  and "16 bit inputs, 32 bit multiplication, 32 bit addition" (P100 "pseudo FP16") -> fp16, the exact wording
  kept in extra["precision"]; the inference sheets ("GEMM, Conv: Int8 multiplication, 32 bit accumulation /
  Sparse Ops, RNN: single precision") -> int8 for GEMM and conv, fp32 for RNNs.
- GEMM: C (M x N) = A (M x K) @ B (K x N), batch 1, transposes in extra.
- conv: W, H input width and height; C channels; N batch; K filters; R, S filter height and width; pad_h, pad_w;
  vertical and horizontal stride (column names vary between sheets; all spellings are read). One record per time
  the sheet gives: Forward -> forward, "wrt Inputs" -> backward_data, "wrt Parameters" -> backward_weight.
- RNN: hidden units (or "Input" in the inference LSTM sheets, where input and hidden widths are equal), N batch,
  Timesteps; forward, backward (one time for both gradients: older AMD and P100 fp16 sheets), backward_data and
  backward_weight. A sheet's "Total Time" is used only when it gives no finer time (phase "total").
- all-reduce: "Size # floats" fp32 values (message_bytes = 4 x floats) over "# chips / accelerator cards" GPUs
  (or "# nodes" processes for the Xeon Phi), the mean time; the algorithm (NCCL single process / MPI, OSU, Baidu
  ring) in extra. The sheets do not say how many GPUs a node held, so `nodes` is left empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from perfmodel.importers.common import (
    DatasetImporter,
    DeviceResolver,
    ImportStats,
    compact,
    first,
    integer,
    number,
    read_csv,
    relative,
    rows,
)
from perfmodel.profilers.external import OpMeasurement

SOURCE: Final = "deepbench"
FP32_BYTES = 4  # the all-reduce sizes are counts of fp32 values

# DeepBench's device labels -> torch device names of the GPU, from each results file's Specs sheet: e.g. V100
# "NVIDIA DGX-1" (so SXM2), P100 in an ASUS X99 workstation (so PCIe). The label itself is looked up first (the
# catalog may list it as an alias, e.g. NV_V100), then these names in order.
DEVICES: dict[str, tuple[str, ...]] = {
    "NV_M40": ("Tesla M40", "Tesla M40 24GB"),
    "NV_TitanX": ("GeForce GTX TITAN X", "NVIDIA GeForce GTX TITAN X"),  # Maxwell
    "NV_TitanX_Pascal": ("TITAN X (Pascal)", "NVIDIA TITAN X (Pascal)"),
    "NV_TitanXp": ("TITAN Xp", "NVIDIA TITAN Xp"),
    "NV_1080Ti": ("GeForce GTX 1080 Ti", "NVIDIA GeForce GTX 1080 Ti"),
    "NV_P100": ("Tesla P100-PCIE-16GB", "Tesla P100-PCIE-12GB"),
    "NV_V100": ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
    "NV_T4": ("Tesla T4",),
    "AMD_MI25": ("Radeon Instinct MI25", "AMD Radeon Instinct MI25"),
    "AMD_VegaFE": ("Radeon Vega Frontier Edition", "AMD Radeon Vega Frontier Edition"),
    "IA_KNL7250": ("Intel Xeon Phi 7250",),  # a CPU: not in a GPU catalog
}

GEMM_FILE = "tidy/deepbench_dense_matrix_multiplication"
CONV_FILE = "tidy/deepbench_convolution"
RNN_FILES = {"tidy/deepbench_recurrent_layers_vanilla": "vanilla_rnn",
             "tidy/deepbench_recurrent_layers_lstm": "lstm",
             "tidy/deepbench_recurrent_layers_gru": "gru"}
ALLREDUCE_FILE = "tidy/deepbench_all_reduce"
FILE_PATTERNS = (GEMM_FILE, CONV_FILE, *RNN_FILES, ALLREDUCE_FILE)
MARKERS = tuple(f"{name}{suffix}" for name in FILE_PATTERNS for suffix in (".csv", ".csv.gz"))

CONV_TIMES = (("forward", ("Forward (msec)",)),
              ("backward_data", ("wrt Inputs (msec)",)),
              ("backward_weight", ("wrt Parameters (msec)",)),
              ("total", ("Total Time (msec)", "Total Time")))
RNN_TIMES = (("forward", ("Time Forward (msec)",)),
             ("backward", ("Time Backward (msec)",)),
             ("backward_data", ("Time Backward wrt Inputs (msec)", "Time Backward wrt inputs (msec)")),
             ("backward_weight", ("Time Backward wrt Weights (msec)", "Time Backward wrt weights (msec)")),
             ("total", ("Total Time",)))


def _records(root: Path, paths: list[Path], stats: ImportStats, resolve: DeviceResolver) -> Iterator[OpMeasurement]:
    for path in paths:
        name = relative(root, path)
        stem = name.removesuffix(".gz").removesuffix(".csv")
        stats.files.append(name)
        frame = read_csv(path)
        for index, row in rows(frame):
            label = str(row.get("device"))
            device = resolve(label, *DEVICES.get(label, ()))  # a catalog alias of the label itself decides first
            if device is None:
                stats.unknown_devices[label] += 1
                continue
            if stem == GEMM_FILE:
                records = _gemm(row)
            elif stem == CONV_FILE:
                records = _conv(row)
            elif stem == ALLREDUCE_FILE:
                records = _allreduce(row)
            else:
                records = _rnn(row, RNN_FILES[stem])
            found = False
            for values in records:
                if values is None:
                    stats.skipped["unknown precision"] += 1
                    found = True
                    break
                found = True
                yield stats.count(OpMeasurement(source=SOURCE, source_file=name, source_row=index, device=device,
                                                **values))
            if not found:
                stats.skipped["no latency"] += 1


def _dtype(row: dict[str, Any], rnn: bool = False) -> str | None:
    precision = str(row.get("precision"))
    if precision == "Float":
        return "fp32"
    if precision.startswith("16 bit inputs"):
        return "fp16"
    if "Int8" in precision:  # inference sheets: int8 GEMM and conv, fp32 ("single precision") RNNs
        return "fp32" if rnn else "int8"
    return None


def _origin(row: dict[str, Any]) -> dict[str, Any]:
    """Where the row came from upstream, and what the sheet says about it."""
    return {"bench": row.get("bench"), "sheet": row.get("sheet"), "source_csv": row.get("source_csv"),
            "sheet_row": integer(row.get("row")), "precision": row.get("precision"),
            "app": row.get("app") if isinstance(row.get("app"), str) else None}


def _gemm(row: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
    latency = number(row.get("Time (msec)"))
    if latency is None or latency <= 0:
        return
    dtype = _dtype(row)
    if dtype is None:
        yield None
        return
    yield {"op_class": "gemm", "op_name": "gemm", "dtype": dtype, "phase": "forward", "batch": 1,
           "m": integer(row.get("M")), "n": integer(row.get("N")), "k": integer(row.get("K")),
           "latency_ms": latency,
           "extra": compact({**_origin(row), "transpose_a": row.get("A Transpose"),
                             "transpose_b": row.get("B Transpose"), "tflops": number(row.get("TERAFLOPS")),
                             "padded_kernels": integer(row.get("Padded Kernels"))})}


def _square(height: int | None, width: int | None) -> int | None:
    return height if height is not None and height == width else None


def _conv(row: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
    times = _times(row, CONV_TIMES)
    if not times:
        return
    dtype = _dtype(row)
    if dtype is None:
        yield None
        return
    height, width = first(row, "H", "H (input)"), first(row, "W", "W (input - time)")
    kernel_h = first(row, "R", "R (Filter height)", "R (filter height)")
    kernel_w = first(row, "S", "S (Filter width)", "S (Fitler width)", "S (filter width)")
    stride_h = first(row, "Vertical stride", "Vertical Stride")
    stride_w = first(row, "Horizontal stride", "Horizontal Stride")
    pad_h, pad_w = integer(row.get("pad_h")), integer(row.get("pad_w"))
    shape = {"batch": first(row, "N", "N (batch size)"), "in_channels": first(row, "C", "C (channels)"),
             "out_channels": first(row, "K", "K (number of filters)"),
             "input_height": height, "input_width": width, "input_size": _square(height, width),
             "kernel_height": kernel_h, "kernel_width": kernel_w, "kernel_size": _square(kernel_h, kernel_w),
             "stride_height": stride_h, "stride_width": stride_w, "stride": _square(stride_h, stride_w),
             "padding_height": pad_h, "padding_width": pad_w, "padding": _square(pad_h, pad_w)}
    extra = compact({**_origin(row), "forward_algorithm": row.get("Forward Algorithm"),
                     "padded_kernels": integer(row.get("Padded Kernels"))})
    for phase, latency in times:
        yield {"op_class": "conv2d", "op_name": "conv2d", "dtype": dtype, "phase": phase, "latency_ms": latency,
               "extra": extra, **shape}


def _rnn(row: dict[str, Any], kind: str) -> Iterator[dict[str, Any] | None]:
    times = _times(row, RNN_TIMES)
    if not times:
        return
    dtype = _dtype(row, rnn=True)
    if dtype is None:
        yield None
        return
    hidden = first(row, "Hidden Units", "Hidden units")
    extra = _origin(row)
    if hidden is None and integer(row.get("Input")) is not None:
        hidden = integer(row.get("Input"))
        extra["size_column"] = "Input"
    shape = {"batch": integer(row.get("N")), "hidden": hidden, "seq_len": integer(row.get("Timesteps"))}
    for phase, latency in times:
        yield {"op_class": "rnn", "op_name": kind, "dtype": dtype, "phase": phase, "latency_ms": latency,
               "extra": compact(extra), **shape}


def _times(row: dict[str, Any], columns: tuple[tuple[str, tuple[str, ...]], ...]) -> list[tuple[str, float]]:
    """(phase, ms) for each time the row gives; the total only when it gives no finer one."""
    found = []
    for phase, names in columns:
        latency = first(row, *names, parse=number)
        if latency is not None and latency > 0:
            found.append((phase, latency))
    finer = [(phase, latency) for phase, latency in found if phase != "total"]
    return finer or found


def _allreduce(row: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
    latency = number(row.get("Mean All Reduce Time (msec)"))
    if latency is None or latency <= 0:
        return
    floats = integer(row.get("Size # floats"))
    cards, processes = integer(row.get("# chips / accelerator cards")), integer(row.get("# nodes (1 process per node)"))
    yield {"op_class": "allreduce", "op_name": "all_reduce", "dtype": "fp32", "phase": "forward",
           "message_bytes": None if floats is None else FP32_BYTES * floats, "world_size": cards or processes,
           "nodes": processes if cards is None else None, "latency_ms": latency,
           "extra": compact({**_origin(row), "algorithm": str(row.get("Selected Algorithm") or "").strip() or None,
                             "std_ms": number(row.get("Std Dev All Reduce Time (msec)")),
                             "gbytes_per_s": number(row.get("Gigabytes/sec"))})}


import_deepbench = DatasetImporter(SOURCE, MARKERS, FILE_PATTERNS,
                                   "expected tidy/deepbench_<section>.csv (the tidy extracts)", _records)
deepbench_files = import_deepbench.files_in
