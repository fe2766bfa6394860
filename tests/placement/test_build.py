"""`placement_from_options`: the PlacementSpec `perfmodel predict`'s options describe."""

import pytest
from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError
from perfmodel.placement.build import parse_layout, placement_from_options


def test_data_parallel_over_what_tensor_and_pipeline_leave():
    spec = placement_from_options("t4", None, batch_size=8, nodes=2, per_node=4, tp=2, micro_batches=3)
    assert spec.devices_per_node == (4, 4)
    assert spec.parallelism.data == 4 and spec.parallelism.tensor == 2
    assert spec.global_batch_size == 8 * 4 * 3  # the batch on every replica and micro-batch


def test_an_uneven_layout_and_a_given_global_batch():
    spec = placement_from_options("t4", 100, devices_per_node="4,4,2")
    assert spec.devices_per_node == (4, 4, 2) and spec.parallelism.data == 10 and spec.global_batch_size == 100
    assert parse_layout("1,2") == (1, 2)


@pytest.mark.parametrize("options,fragment", [
    (dict(devices_per_node="4,x"), "--devices-per-node"),
    (dict(per_node=4, tp=3), "--tp 3 x --pp 1"),
    (dict(per_node=4, ep=3), "--ep 3"),
])
def test_inconsistent_options_name_the_option(options, fragment):
    with pytest.raises(PerfmodelError, match=fragment):
        placement_from_options("t4", None, **options)


def test_a_choice_outside_its_field_is_named_by_pydantic():
    with pytest.raises(ValidationError, match="zero_stage"):
        placement_from_options("t4", None, per_node=2, zero=5)
