"""`placement_from_options`: the PlacementSpec `perfmodel predict`'s options describe."""

import pytest

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


@pytest.mark.parametrize("options,message", [
    (dict(tp=0), "--tp must be >= 1, got 0"),
    (dict(per_node=8, tp=0), "--tp must be >= 1, got 0"),
    (dict(tp=-2), "--tp must be >= 1, got -2"),
    (dict(pp=0), "--pp must be >= 1, got 0"),
    (dict(ep=0), "--ep must be >= 1, got 0"),
    (dict(micro_batches=0), "--micro-batches must be >= 1, got 0"),
    (dict(nodes=0), "--nodes must be >= 1, got 0"),
    (dict(per_node=-1), "--per-node must be >= 1, got -1"),
    (dict(batch_size=0), "-b/--batch-size must be >= 1, got 0"),
])
def test_a_degree_or_count_below_one_names_its_option(options, message):
    with pytest.raises(PerfmodelError) as caught:
        placement_from_options("t4", None, **options)
    assert str(caught.value) == message


def test_the_batch_is_named_as_the_user_gave_it():
    with pytest.raises(PerfmodelError, match=r"^-b/--batch-size 1,000,000,000,000 is over the limit of "
                                             r"2,147,483,647 samples per replica$"):
        placement_from_options("t4", None, batch_size=10**12)
    with pytest.raises(PerfmodelError, match=r"^-b/--batch-size 2,000,000,000 x --micro-batches 2 is over"):
        placement_from_options("t4", None, batch_size=2 * 10**9, micro_batches=2)
    with pytest.raises(PerfmodelError, match=r"^--global-batch-size 7 does not split into 2 data-parallel "
                                             r"replica\(s\) x 1 micro-batch\(es\)$"):
        placement_from_options("t4", 7, per_node=2)
    with pytest.raises(PerfmodelError, match=r"^--global-batch-size must be >= 1, got 0$"):
        placement_from_options("t4", 0)
    with pytest.raises(PerfmodelError, match=r"^--global-batch-size: 10,000,000,000 samples make 10,000,000,000 "
                                             r"per replica, over the limit"):
        placement_from_options("t4", 10**10)


@pytest.mark.parametrize("options,message", [
    (dict(per_node=2, zero=5), "--zero: Input should be 0, 1, 2 or 3 (got 5)"),
    (dict(intra_link="nvlink9"), "--intra-link: Input should be 'nvlink1', "),
    (dict(nodes=2, inter_node_gbit_s=-1.0), "--inter-node-gbit-s: Input should be greater than 0 (got -1.0)"),
    (dict(devices_per_node="4,0"), "--devices-per-node: every node needs ≥ 1 device, got [4, 0]"),
    (dict(per_node=100), "--per-node: a node holds at most 72 devices"),
    (dict(devices_per_node="3,3", tp=2), "--tp: a tensor-parallel group of 2 must sit in one node"),
])
def test_what_pydantic_refuses_is_named_by_its_option_without_its_wrapper(options, message):
    with pytest.raises(PerfmodelError) as caught:
        placement_from_options("t4", None, **options)
    assert str(caught.value).startswith(message) and "Value error" not in str(caught.value)
