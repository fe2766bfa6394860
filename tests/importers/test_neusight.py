"""NeuSight: real rows of the per-GPU sweeps and of the test set, as op records with the right shapes."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.importers import ImportStats, import_neusight
from perfmodel.importers.neusight import neusight_files

T4_BMM = "data/dataset/train/collect/bmm/p2.1.0/Tesla T4.csv.gz"


def _records(root, catalog, *files, stats=None):
    return list(import_neusight(root, catalog=catalog, files=files, stats=stats))


def test_bmm_rows_as_published(neusight_root, catalog):
    records = _records(neusight_root, catalog, T4_BMM)
    upstream = pd.read_csv(neusight_root / T4_BMM)
    assert len(records) == len(upstream) > 17_000
    first = records[0]  # the PROVENANCE example row
    assert first.model_dump(include={"source", "source_file", "source_row", "device", "op_class", "op_name",
                                     "dtype", "phase", "batch", "m", "n", "k"}) == {
        "source": "neusight", "source_file": T4_BMM, "source_row": 0, "device": "test-t4", "op_class": "bmm",
        "op_name": "bmm", "dtype": "fp32", "phase": "forward", "batch": 13, "m": 27, "n": 15, "k": 29}
    assert first.latency_ms == 0.035466667264699936  # milliseconds as published (CUDA events), not converted
    assert first.extra == {"split": "train", "kernel_name": "volta_sgemm_64x64_nn", "warps_per_sm": 0.65,
                           "blocks_per_sm": 0.325, "grid": [1, 1, 13], "block": [64, 1, 1],
                           "torch_version": "2.1.0", "cudnn_version": 8902, "cuda_version": "cu121"}
    assert [r.latency_ms for r in records] == upstream["Latency"].tolist()
    assert first.gemm_flops() == 2 * 13 * 27 * 15 * 29


def test_linear_conv_elementwise_and_norm_shapes(neusight_root, catalog):
    files = ["data/dataset/train/collect/linear/p2.1.0/Tesla P4.csv.gz",
             "data/dataset/train/collect/conv/p2.1.0/Tesla T4.csv.gz",
             "data/dataset/train/collect/gelu/p2.1.0/Tesla T4.csv.gz",
             "data/dataset/train/collect/ln/p2.1.0/Tesla T4.csv.gz"]
    by_file = {}
    for record in _records(neusight_root, catalog, *files):
        by_file.setdefault(record.source_file, []).append(record)
    linear = by_file[files[0]][0]
    assert (linear.op_class, linear.device, linear.batch) == ("linear", "test-p4", 1)
    assert None not in (linear.m, linear.n, linear.k)
    conv = by_file[files[1]][0]  # conv,2.7097...,Tesla T4,...,B 38, Cin 893, Cout 326, kernel 3, size 5, 1, 1
    assert conv.model_dump(include={"op_class", "batch", "in_channels", "out_channels", "kernel_size",
                                    "kernel_height", "kernel_width", "input_size", "input_height", "input_width",
                                    "stride", "stride_height", "padding", "padding_width"}) == {
        "op_class": "conv2d", "batch": 38, "in_channels": 893, "out_channels": 326, "kernel_size": 3,
        "kernel_height": 3, "kernel_width": 3, "input_size": 5, "input_height": 5, "input_width": 5, "stride": 1,
        "stride_height": 1, "padding": 1, "padding_width": 1}
    assert conv.latency_ms == pytest.approx(2.7097493012746177)
    assert len(conv.extra["kernels"]) == 4 and conv.extra["kernels"][0].startswith("cudnn::winograd_nonfused")
    gelu = by_file[files[2]][0]
    assert (gelu.op_class, gelu.op_name, gelu.batch, gelu.hidden, gelu.m) == ("elementwise", "gelu", 127, 168, None)
    assert "(" not in gelu.extra["kernel_name"].rsplit(">", 1)[-1]  # the parameter list is dropped
    ln = by_file[files[3]][0]
    assert (ln.op_class, ln.op_name, ln.batch, ln.hidden) == ("layernorm", "ln", 60, 272)


def test_test_set_rows_are_marked_and_amd_rows_carry_their_torch(neusight_root, catalog):
    stats = ImportStats()
    records = _records(neusight_root, catalog, "data/dataset/test/softmax.csv",
                       "data/dataset_amd/train/collect/softmax/p2.4.1/AMD Instinct MI210.csv.gz", stats=stats)
    test_rows = [r for r in records if r.source_file.startswith("data/dataset/test/")]
    assert test_rows and all(r.extra["split"] == "test" and r.extra["large"] is True for r in test_rows)
    assert {r.device for r in test_rows} == {"test-t4", "test-p4", "test-v100-pcie", "test-p100", "test-a100-40"}
    amd = [r for r in records if r.device == "test-mi210"]
    assert len(amd) == 1750 and amd[0].extra["torch_version"] == "2.4.1" and amd[0].op_class == "softmax"
    assert stats.unknown_devices == {}
    assert stats.records[("data/dataset/test/softmax.csv", "softmax")] == len(test_rows)


def test_rows_of_devices_the_catalog_lacks_are_skipped_and_counted(neusight_root, catalog):
    del catalog["test-t4"]
    stats = ImportStats()
    assert _records(neusight_root, catalog, T4_BMM, stats=stats) == []
    assert stats.unknown_devices == {"Tesla T4": len(pd.read_csv(neusight_root / T4_BMM))}
    assert stats.files == [T4_BMM] and stats.total == 0


def test_the_files_read(neusight_root):
    files = neusight_files(neusight_root)
    assert T4_BMM in files and "data/dataset/test/bmm.csv.gz" in files
    assert not any(f.startswith("label/") for f in files)  # whole-model latencies are not op records
    assert "data/dataset/train/ln.csv" not in files  # a re-measured subset of the collect/ sweeps


def test_a_folder_that_is_not_neusight_is_a_user_error(tmp_path, neusight_root):
    with pytest.raises(PerfmodelError, match="no neusight dataset at .*: no such folder"):
        import_neusight(tmp_path / "nowhere")
    with pytest.raises(PerfmodelError, match="does not look like the neusight dataset"):
        import_neusight(tmp_path)
    with pytest.raises(PerfmodelError, match="is not one of the dataset's data files"):
        import_neusight(neusight_root, files=["label/x.csv"])
