import pytest
from pydantic import ValidationError

from perfmodel.placement.spec import Parallelism, PlacementSpec


def test_grid_is_data_parallel_over_every_device():
    spec = PlacementSpec.grid("t4", nodes=4, per_node=2, global_batch_size=64)
    assert spec.devices == 8 and spec.nodes == 4 and not spec.consolidated
    assert spec.parallelism.data == 8 and spec.per_replica_batch_size == 8 == spec.micro_batch_size


def test_consolidated_tensor_and_pipeline_split():
    spec = PlacementSpec(accelerator="a100-sxm4-80gb", devices_per_node=(8,), global_batch_size=32,
                         parallelism=Parallelism(data=2, tensor=2, pipeline=2, micro_batches=4))
    assert spec.consolidated and spec.per_replica_batch_size == 16 and spec.micro_batch_size == 4


@pytest.mark.parametrize("fields, field", [
    ({"devices_per_node": (4,), "parallelism": Parallelism(data=2)}, "parallelism"),
    ({"devices_per_node": (4, 2), "parallelism": Parallelism(data=1, tensor=6)}, "parallelism.tensor"),
    ({"devices_per_node": (2,), "parallelism": Parallelism(data=2), "global_batch_size": 3}, "global_batch_size"),
    ({"devices_per_node": (0, 2)}, "devices_per_node"),
    ({"inter_node_bandwidth_gbit_s": 0}, "inter_node_bandwidth_gbit_s"),
    ({"intra_node_link": "nvlink9"}, "intra_node_link"),
])
def test_inconsistent_placements_name_the_field_at_fault(fields, field):
    with pytest.raises(ValidationError) as info:
        PlacementSpec(**{"accelerator": "t4", "global_batch_size": 8, **fields})
    assert field.split(".")[0] in str(info.value)


def test_frozen_and_no_unknown_fields():
    spec = PlacementSpec.grid("t4", global_batch_size=8)
    with pytest.raises(ValidationError):
        spec.model_copy(update={}).__class__(accelerator="t4", global_batch_size=8, gpus=4)
    with pytest.raises(ValidationError):
        spec.global_batch_size = 16


def test_a_tensor_parallel_group_may_span_whole_nodes():
    megatron = PlacementSpec(accelerator="h100-sxm5", devices_per_node=(8, 8), global_batch_size=4,
                             parallelism=Parallelism(data=1, tensor=16))
    assert megatron.devices == 16 and megatron.nodes == 2
    PlacementSpec(accelerator="h100-sxm5", devices_per_node=(4, 4, 4, 4), global_batch_size=4,
                  parallelism=Parallelism(data=2, tensor=8))
    for layout, tensor in (((8, 4), 12), ((6, 6), 4), ((8, 8, 8), 12)):
        with pytest.raises(ValidationError, match="parallelism.tensor|parallelism"):
            PlacementSpec(accelerator="h100-sxm5", devices_per_node=layout, global_batch_size=sum(layout) // tensor,
                          parallelism=Parallelism(data=sum(layout) // tensor, tensor=tensor))


def test_expert_parallelism_divides_data_parallelism():
    spec = PlacementSpec(accelerator="h100-sxm5", devices_per_node=(8,), global_batch_size=8,
                         parallelism=Parallelism(data=8, expert=4))
    assert spec.parallelism.expert == 4 and spec.parallelism.devices == 8
    with pytest.raises(ValidationError, match="expert"):
        Parallelism(data=6, expert=4)


def test_the_network_defaults_to_the_catalog_and_is_in_gbit_per_s():
    spec = PlacementSpec.grid("h100-sxm5", nodes=2, per_node=8, global_batch_size=16)
    assert spec.inter_node_bandwidth_gbit_s is None
    assert "Gb/s" in PlacementSpec.model_fields["inter_node_bandwidth_gbit_s"].description
    given = PlacementSpec.grid("t4", nodes=2, global_batch_size=2, inter_node_bandwidth_gbit_s=25)
    assert given.inter_node_bandwidth_gbit_s == 25


def test_a_parallelism_naming_no_data_degree_gets_the_one_the_devices_leave():
    def placed(parallelism):
        return PlacementSpec.model_validate({"accelerator": "h100-sxm5", "devices_per_node": [8, 8],
                                             "global_batch_size": 64, "parallelism": parallelism}).parallelism

    assert placed({"tensor": 4}).data == 4 and placed({"tensor": 2, "pipeline": 2}).data == 4
    assert placed({"zero_stage": 3}).data == 16
    assert placed({"data": 16}).data == 16  # given: kept
    with pytest.raises(ValidationError, match="parallelism"):
        placed({"tensor": 3})  # 16 devices do not split into groups of 3
    with pytest.raises(ValidationError, match="parallelism"):
        placed({"data": 4})  # given and inconsistent: refused, not overridden


def test_a_placement_naming_no_parallelism_is_data_parallel_over_every_device():
    spec = PlacementSpec(accelerator="a100-sxm4-80gb", devices_per_node=(8, 8), global_batch_size=128)
    assert spec.parallelism.data == 16 and spec.per_replica_batch_size == 8
    assert PlacementSpec(accelerator="t4", global_batch_size=8).parallelism.data == 1
