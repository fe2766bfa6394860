"""phantora: PyTorch calls keyed by their exact shapes become op-schema rows by a table of op names."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest

from perfmodel.core.errors import PerfmodelError
from perfmodel.importers import ImportStats, get_importer, import_phantora
from perfmodel.importers.phantora import Tensor, parse_key
from perfmodel.store import ProfileStore
from tests.importers.conftest import make_spec

COMPUTE = "tests/perfdb/l40s/compute.csv"
# (key as the upstream file writes it, nanos): one of each kind the mapping distinguishes
ROWS = [
    ('{"Add":[["bf16",[1,64,1024,1024]],["bf16",[1,1,1024,1024]]]}', 409411),  # broadcast mask: addu
    ('{"Add":{"R":[2,[["bf16",[1024,1,4096]]]]}}', 4768),  # two full tensors: add
    ('{"BAddBMM":[["bf16",[16,1024,1024]],["bf16",[16,1024,128]],["bf16",[16,128,1024]]]}', 46304),
    ('{"BMM":[["bf16",[32,1024,2880]],["bf16",[32,2880,5760]]]}', 4294399),
    ('{"ConvDType":[["bf16",[1024,4096]],"f32"]}', 5000),
    ('{"Dropout":[["bf16",[1,32,1024,1024]],0,true]}', 0),
    ('{"ForeachAddCDiv_":[{"R":[3,[["f32",[4096]]]]},100]}', 7000),
    ('{"Linear":[["bf16",[1,1024,2880]],["bf16",[4096,2880]],["bf16",[4096]]]}', 104257),
    ('{"Linear":[["bf16",[2,1024,2048]],["bf16",[256,2048]],null]}', 15520),
    ('{"MatMul":[["bf16",[1,32,1024,128]],["bf16",[1,32,128,1024]]]}', 87936),  # batched: bmm
    ('{"MatMul":[["bf16",[1024,1,4096]],["bf16",[4096,6144]]]}', 250658),  # a 2-D weight: linear
    ('{"MM":[["bf16",[4096,1024]],["bf16",[1024,14336]]]}', 529443),
    ('{"Mul":[["bf16",[1,32,1024,1024]],["f64",[]]]}', 208961),  # by a scalar: mulu
    ('{"Mul":[{"dtype":"ComplexFloat","shape":[2,8192,16,8]},{"dtype":"ComplexFloat","shape":[1,8192,1,8]}]}',
     9088),
    ('{"MulScalar":["f32",[1,1024,4096]]}', 8000),
    ('{"Pow":["f32",[1,1024,4096]]}', 8033),
    ('{"SDPA":{"causal":true,"gqa":false,"k":["bf16",[2,16,1024,128]],"q":["bf16",[2,16,1024,128]],'
     '"v":["bf16",[2,16,1024,128]]}}', 64704),
    ('{"Softmax":[["bf16",[1024,4]],1]}', 1216),
    ('{"SoftmaxBackward":[["f32",[1,16,1024,1024]],["f32",[1,16,1024,1024]],-1]}', 489732),
    ('{"Sum":["f32",[1024,1,32000]]}', 207970),
    ('{"ZerosLike":["f32",[4096]]}', 896),
]


@pytest.fixture
def tiny(tmp_path):
    root = tmp_path / "phantora"
    path = root / COMPUTE
    path.parent.mkdir(parents=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["key", "nanos"])
        writer.writerows(ROWS)
    (root / "tests/perfdb/l40s/memcpy.csv").write_text("kind,size_bytes,nanos\nHostToDevice,2,1000\n")
    return root


@pytest.fixture
def devices():
    return {"test-l40s": make_spec("test-l40s", ("NVIDIA L40S",))}


def test_the_file_is_quoted_json_as_upstream(tiny):
    first = (tiny / COMPUTE).read_text().splitlines()[1]
    assert first == '"{""Add"":[[""bf16"",[1,64,1024,1024]],[""bf16"",[1,1,1024,1024]]]}",409411'
    op, args = parse_key('{"Add_":{"R":[2,[["bf16",[128,2048]]]]}}')
    assert (op, args) == ("Add_", [Tensor("bf16", (128, 2048)), Tensor("bf16", (128, 2048))])
    with pytest.raises(ValueError):
        parse_key('{"A":1,"B":2}')


def test_each_call_maps_by_the_table(tiny, devices):
    stats = ImportStats()
    records = {json.loads(ROWS[r.source_row][0]).popitem()[0] + f"#{r.source_row}": r
               for r in import_phantora(tiny, catalog=devices, stats=stats)}
    shapes = {name: (r.op_class, r.op_name, r.dtype, r.phase, r.batch, r.m, r.k, r.n, r.hidden)
              for name, r in records.items()}
    assert shapes == {
        "Add#0": ("elementwise", "addu", "bf16", "forward", 64 * 1024, None, None, None, 1024),
        "Add#1": ("elementwise", "add", "bf16", "forward", 1024, None, None, None, 4096),
        "BAddBMM#2": ("bmm", "bmm", "bf16", "forward", 16, 1024, 128, 1024, None),
        "BMM#3": ("bmm", "bmm", "bf16", "forward", 32, 1024, 2880, 5760, None),
        "Linear#7": ("linear", "linear", "bf16", "forward", 1, 1024, 2880, 4096, None),
        "Linear#8": ("linear", "linear", "bf16", "forward", 1, 2048, 2048, 256, None),
        "MatMul#9": ("bmm", "bmm", "bf16", "forward", 32, 1024, 128, 1024, None),
        "MatMul#10": ("linear", "linear", "bf16", "forward", 1, 1024, 4096, 6144, None),
        "MM#11": ("linear", "linear", "bf16", "forward", 1, 4096, 1024, 14336, None),
        "Mul#12": ("elementwise", "mulu", "bf16", "forward", 32 * 1024, None, None, None, 1024),
        "MulScalar#14": ("elementwise", "mulu", "fp32", "forward", 1024, None, None, None, 4096),
        "Pow#15": ("elementwise", "powu", "fp32", "forward", 1024, None, None, None, 4096),
        "Softmax#17": ("softmax", "softmax", "bf16", "forward", 1024, None, None, None, 4),
        "SoftmaxBackward#18": ("softmax", "softmax", "fp32", "backward", 16 * 1024, None, None, None, 1024)}
    assert records["Linear#7"].extra["bias"] is True and records["Linear#8"].extra["bias"] is False
    assert records["Add#0"].extra["operands"] == [[1, 64, 1024, 1024], [1, 1, 1024, 1024]]
    assert records["BMM#3"].latency_ms == pytest.approx(4.294399)  # ns -> ms
    assert {r.device for r in records.values()} == {"test-l40s"}
    assert dict(stats.skipped) == {
        "dtype cast (ConvDType)": 1, "dropout (random mask)": 1, "optimizer step (Foreach*)": 1,
        "no bf16/fp16/fp32 tensor (integer, bool, f64 or complex)": 1, "fused attention (SDPA: no op class)": 1,
        "reduction (Sum)": 1, "fill (ZerosLike)": 1}
    assert stats.total == len(records) == len(ROWS) - sum(stats.skipped.values())


def test_unknown_gpus_and_bad_folders(tiny, tmp_path):
    stats = ImportStats()
    assert list(import_phantora(tiny, catalog={}, stats=stats)) == []
    assert stats.unknown_devices == {"NVIDIA L40S": len(ROWS)}
    with pytest.raises(PerfmodelError, match="does not look like the phantora dataset"):
        import_phantora(tmp_path)
    assert get_importer("Phantora") is import_phantora


def test_importing_again_adds_nothing(tiny, devices, tmp_path):
    with ProfileStore(f"sqlite:///{tmp_path / 'store.db'}") as store:
        added = store.add_op_measurements(import_phantora(tiny, catalog=devices))
        assert added == store.count_op_measurements(source="phantora") == 14
        assert store.add_op_measurements(import_phantora(tiny, catalog=devices)) == 0
        assert store.count_op_measurements(source="phantora", phase="backward") == 1


def test_the_real_dataset(phantora_root):
    stats = ImportStats()
    records = list(import_phantora(phantora_root, stats=stats))  # the shipped catalog: L40S is in it
    assert stats.total + sum(stats.skipped.values()) == 594 and not stats.unknown_devices
    by_class = Counter(r.op_class for r in records)
    assert by_class["linear"] > 50 and by_class["bmm"] > 10 and by_class["elementwise"] > 50
    assert by_class["softmax"] > 5
    assert {r.device for r in records} == {"l40s"}
    # the 128 GEMM-type calls of the PROVENANCE (MM, MatMul, BMM, BAddBMM, Linear) are all here
    gemms = [r for r in records if r.op_class in ("linear", "bmm")]
    assert len(gemms) == 128
    # L40S: 362 dense bf16 tensor TFLOPS; every GEMM runs below it and the large ones above 5 % of it
    for r in gemms:
        tflops = r.gemm_flops() / (r.latency_ms * 1e-3) / 1e12
        assert tflops < 400, (r.extra["op"], r.extra["tensors"], tflops)
        if r.gemm_flops() > 5e10:
            assert tflops > 18, (r.extra["op"], r.extra["tensors"], tflops)
