"""The Gavel grid shared by `perfmodel export gavel` and the service: layouts of a scale factor, job-type names, and
Gavel's throughputs file, read back the way Gavel's scheduler reads it and checked against the structure of Gavel's
own measured K80/P100 file."""

import ast
import json
from pathlib import Path

import pytest

from perfmodel.placement.gavel import gavel_file, grid_layouts, job_type_names
from perfmodel.settings import get_settings


@pytest.mark.parametrize("devices,per_node,spread,expected", [
    (1, 8, True, [((1,), True)]),  # one device: one placement
    (4, 8, True, [((4,), True), ((1, 1, 1, 1), False)]),
    (16, 8, True, [((8, 8), True), ((1,) * 16, False)]),
    (10, 4, False, [((4, 4, 2), True)]),
    (3, None, True, [((3,), True), ((1, 1, 1), False)]),  # no node size known: one node
    (2, 1, True, [((1, 1), True)]),  # one-device nodes: consolidated is already spread
])
def test_grid_layouts_pack_full_nodes_and_spread_one_per_node(devices, per_node, spread, expected):
    layouts = grid_layouts(devices, per_node, spread=spread)
    assert layouts == expected
    assert all(sum(layout) == devices for layout, _ in layouts)


def test_grid_layouts_refuse_no_devices():
    with pytest.raises(ValueError, match="devices"):
        grid_layouts(0, 8)


def test_job_types_name_model_and_batch_and_disambiguate_clashes():
    names = job_type_names([("a1", "resnet50", 32), ("b2", "resnet50", 64), ("c3", "resnet50", 32)])
    assert names == ["resnet50 (batch size 32) [a1]", "resnet50 (batch size 64)", "resnet50 (batch size 32) [c3]"]
    assert job_type_names([("a1", "bert", 8), ("a1", "bert", 8)]) == ["bert (batch size 8)"] * 2  # one job twice


def read_like_gavel(raw: dict) -> dict:
    """Gavel's `read_all_throughputs_json_v2` (scheduler/utils.py): worker type -> job type tuple -> "null" or the
    other job's tuple -> throughput, the keys evaluated as Python tuples."""
    parsed: dict = {}
    for worker_type, table in raw.items():
        parsed[worker_type] = {}
        for job_type_str, entries in table.items():
            key = ast.literal_eval(job_type_str)
            assert isinstance(key, tuple) and len(key) == 2 and key not in parsed[worker_type]
            parsed[worker_type][key] = {("null" if other == "null" else ast.literal_eval(other)): value
                                        for other, value in entries.items()}
    return parsed


COLUMNS = [("t4", (1,), True), ("t4", (2,), True), ("t4", (1, 1), False), ("v100", (1, 1), True)]
STEPS = [[10.0, 19.0, 15.0, 30.0], [1.0, 0.0, 1.5, 2.0]]
JOBS = ["A3C", "ResNet-50 (batch size 64)"]


def test_the_file_puts_each_placement_where_gavel_reads_it():
    parsed = read_like_gavel(json.loads(json.dumps(gavel_file(JOBS, COLUMNS, STEPS))))
    assert set(parsed) == {"t4", "t4_unconsolidated", "v100", "v100_unconsolidated"}
    assert parsed["t4"][("A3C", 1)] == {"null": 10.0} == parsed["t4_unconsolidated"][("A3C", 1)]  # one device: both
    assert parsed["t4"][("A3C", 2)] == {"null": 19.0} and parsed["t4_unconsolidated"][("A3C", 2)] == {"null": 15.0}
    # v100's nodes hold one device each: its consolidated placement is also the unconsolidated one
    assert parsed["v100"][("A3C", 2)] == parsed["v100_unconsolidated"][("A3C", 2)] == {"null": 30.0}
    assert parsed["t4"][("ResNet-50 (batch size 64)", 2)]["null"] == 0.0  # does not fit


def test_pairs_are_filed_under_both_jobs_at_their_scale_factor():
    pairs = {(0, 1, 0): (6.0, 0.7), (1, 0, 0): (0.7, 6.0), (0, 0, 0): (5.0, 5.0), (1, 1, 0): (0.5, 0.5)}
    parsed = read_like_gavel(gavel_file(JOBS, COLUMNS, STEPS, pairs))
    a3c, resnet = ("A3C", 1), ("ResNet-50 (batch size 64)", 1)
    assert parsed["t4"][a3c] == {"null": 10.0, a3c: [5.0, 5.0], resnet: [6.0, 0.7]}
    assert parsed["t4"][resnet][a3c] == [0.7, 6.0]
    assert set(parsed["t4"][("A3C", 2)]) == {"null"}  # no pair asked there


@pytest.fixture(scope="module")
def measured() -> dict:
    path = Path(get_settings().datasets_dir) / "gavel" / "physical_cluster_throughputs.k80_p100.json"
    if not path.is_file():
        pytest.skip(f"Gavel's measured file is not at {path} (PERFMODEL_DATASETS_DIR)")
    return json.loads(path.read_text())


def test_the_shipped_measured_file_has_the_structure_this_writes(measured):
    ours = read_like_gavel(gavel_file(JOBS, COLUMNS, STEPS, {(0, 1, 0): (6.0, 0.7), (1, 0, 0): (0.7, 6.0)}))
    theirs = read_like_gavel(measured)
    assert set(theirs) == {"k80", "p100", "k80_unconsolidated", "p100_unconsolidated"}
    for parsed in (ours, theirs):
        assert {w for w in parsed if w.endswith("_unconsolidated")}
        for worker_type, table in parsed.items():
            consolidated = worker_type.removesuffix("_unconsolidated")
            assert consolidated in parsed  # every unconsolidated worker type has its consolidated one
            for (job_type, scale_factor), entries in table.items():
                assert isinstance(job_type, str) and isinstance(scale_factor, int) and scale_factor >= 1
                assert isinstance(entries["null"], float)
                for other, value in entries.items():
                    if other != "null":
                        assert other[1] == scale_factor  # pairs share the scale factor
                        assert isinstance(value, list) and len(value) == 2
    assert all((job_type, 1) in theirs[w] for w in theirs for job_type, _ in theirs[w])
    # one device is both consolidated and not (Gavel measured each separately; ours is one prediction)
    assert all(ours[w][key]["null"] == ours[w.removesuffix("_unconsolidated")][key]["null"]
               for w in ours if w.endswith("_unconsolidated") for key in ours[w] if key[1] == 1)
