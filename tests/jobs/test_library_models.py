"""Image classifiers of torchvision and timm as zoo models by their library names (perfmodel.jobs.library_models)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from pydantic import ValidationError

from perfmodel.compat import ensure_torchvision
from perfmodel.core.errors import UnknownNameError
from perfmodel.graph.from_torch import capture_graph
from perfmodel.jobs.library_models import (
    LIBRARY_FILE,
    installed_library_models,
    installed_versions,
    library_models,
    shipped_versions,
)
from perfmodel.jobs.spec import ZOO_NAME_MAX_CHARS, JobSpec, ZooSource
from perfmodel.jobs.zoo import ZOO, InputKind, find_entry, get_entry, items_of


def test_the_shipped_names_are_the_installed_libraries():
    """library_models.json is what the installed torchvision and timm build, where they are the versions it was
    written from (`python -m perfmodel.jobs.library_models --write` rewrites it for others)."""
    if installed_versions() != shipped_versions():
        pytest.skip(f"library_models.json was written from {shipped_versions()}; installed: {installed_versions()}")
    assert json.loads(LIBRARY_FILE.read_text()) == installed_library_models()


def test_a_name_resolves_to_the_table_then_torchvision_then_timm():
    assert find_entry("resnet50") is ZOO["resnet50"]  # the table's own, though both libraries have one
    vit = get_entry("vit_b_16")  # the family of the table's ViTs (timm's), one architecture whatever the library
    assert (vit.library, vit.family, vit.inputs, vit.image_size) == ("torchvision", "vit", InputKind.image, 224)
    assert get_entry("swin_t").family == ZOO["swin_tiny_patch4_window7_224"].family
    assert get_entry("levit_128").family == "levit"  # a module no table model comes from: its own name
    assert get_entry("efficientnet_v2_s").image_size == 384  # its weights' crop size
    assert get_entry("resnet26d").library == "timm"
    assert get_entry("vgg13").library == "torchvision"  # in both libraries
    assert not get_entry("regnet_x_400mf").builds_on_meta  # regnet computes its widths with tensors
    assert find_entry("vit_b_17") is None
    with pytest.raises(UnknownNameError, match="did you mean: vit_b_16"):
        get_entry("vit_b_17")
    spec = JobSpec(source=ZooSource(name="swin_t"), batch_size=4)
    assert spec.seq_len == 128 and items_of(spec) == ("samples", 1.0)  # an image job: no sequence to name


def test_every_torchvision_classifier_builds_where_its_entry_says():
    """Each torchvision classifier builds on the meta device unless its entry says it cannot (then it is built on
    the CPU and moved): the flag is the library's behaviour, not a guess."""
    ensure_torchvision()
    import torchvision

    for name, model in library_models().items():
        if model.library != "torchvision":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with torch.device("meta"):
                    torchvision.models.get_model(name, weights=None)
                built = True
            except NotImplementedError:  # "Cannot copy out of meta tensor"
                built = False
        assert built == model.builds_on_meta, name


@pytest.mark.parametrize("name", ["mnasnet0_5", "regnet_x_400mf", "resnet10t"])
def test_a_library_classifier_captures_as_a_training_graph(name, check_training_graph):
    """A torchvision-only model, one built off the meta device, and a timm-only model: real training graphs."""
    spec = JobSpec(source=ZooSource(name=name), batch_size=2)
    graph = capture_graph(spec)
    assert graph.job_id == spec.key() and graph.totals.params > 1e6
    check_training_graph(graph)


def test_a_zoo_name_longer_than_any_is_refused_before_it_is_compared_with_every_known_one():
    assert max(len(name) for name in [*ZOO, *library_models()]) < ZOO_NAME_MAX_CHARS
    with pytest.raises(ValidationError, match=f"at most {ZOO_NAME_MAX_CHARS} characters"):
        JobSpec.model_validate({"source": {"kind": "zoo", "name": "vit" * 100}, "batch_size": 2})
