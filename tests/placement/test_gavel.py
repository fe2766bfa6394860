"""The Gavel grid shared by `perfmodel export gavel` and the service: layouts of a scale factor, job-type names and
the two matrices built from a throughput table."""

import pytest

from perfmodel.placement.gavel import gavel_layout, gavel_matrices, grid_layouts, job_type_key, job_type_names


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


def test_matrices_put_each_placement_where_gavel_reads_it():
    columns = [("t4", (1,), True), ("t4", (2,), True), ("t4", (1, 1), False), ("v100", (1, 1), True)]
    throughput = [[10.0, 19.0, 15.0, 30.0], [1.0, 0.0, 1.5, 2.0]]
    matrices = gavel_matrices(["a (batch size 1)", "b (batch size 2)"], columns, throughput)
    a1, a2 = job_type_key("a (batch size 1)", 1), job_type_key("a (batch size 1)", 2)
    assert matrices["consolidated"][a1] == {"t4": 10.0} == matrices["spread"][a1]  # one device: both
    assert matrices["consolidated"][a2] == {"t4": 19.0, "v100": 30.0}
    # v100's nodes hold one device each: its consolidated placement is also the spread one
    assert matrices["spread"][a2] == {"t4": 15.0, "v100": 30.0}
    assert matrices["consolidated"][job_type_key("b (batch size 2)", 2)]["t4"] == 0.0  # does not fit


def test_matrices_agree_with_the_row_layout():
    columns = [("t4", (1,), True), ("t4", (4,), True), ("t4", (1, 1, 1, 1), False)]
    throughput = [[5.0, 18.0, 12.0]]
    rows = [("j", "t4", 1, True, 5.0), ("j", "t4", 4, True, 18.0), ("j", "t4", 4, False, 12.0)]
    assert gavel_matrices(["j"], columns, throughput) == gavel_layout(rows)
