"""`GraphSource`: a job given by the graph IR that `perfmodel graph --json` printed elsewhere; no capture."""

import json

import pytest
from pydantic import ValidationError

from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.graph import graph_for_job
from perfmodel.jobs.build import build_job
from perfmodel.jobs.spec import GraphSource, JobSpec, ZooSource


@pytest.fixture(scope="module")
def ir() -> dict:
    graph = graph_for_job(JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=4))
    return json.loads(graph.to_json())


def test_ir_job_returns_its_graph_without_capture(ir, monkeypatch):
    import perfmodel.graph.from_torch as from_torch

    def no_capture(*_args, **_kwargs):
        raise AssertionError("an IR job must not be captured")

    monkeypatch.setattr(from_torch, "capture_graph", no_capture)
    spec = JobSpec(source=GraphSource(graph=ir), batch_size=4)
    graph = graph_for_job(spec)
    assert isinstance(graph, Graph)
    assert graph.nodes == Graph.model_validate(ir).nodes
    assert graph.totals == Graph.model_validate(ir).totals
    assert graph.job_id == spec.key()
    assert spec.name == "ir:mlp-recommender"


def test_ir_spec_round_trips_through_json_with_the_same_key(ir):
    spec = JobSpec(source=GraphSource(graph=ir), batch_size=4)
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and again.key() == spec.key()
    assert spec.model_dump(mode="json")["source"]["kind"] == "ir"
    changed = json.loads(json.dumps(ir))
    changed["nodes"][0]["flops_fwd"] += 1
    assert JobSpec(source=GraphSource(graph=changed), batch_size=4).key() != spec.key()


@pytest.mark.parametrize("mutate,where", [
    (lambda g: g.update(schema_version=99), "graph.schema_version"),
    (lambda g: g["nodes"][1].update(kind="warp-drive"), "graph.nodes.1.kind"),
    (lambda g: g.pop("totals"), "graph.totals"),
])
def test_a_bad_ir_is_refused_naming_the_field(ir, mutate, where):
    bad = json.loads(json.dumps(ir))
    mutate(bad)
    with pytest.raises(ValidationError) as info:
        JobSpec(source={"kind": "ir", "graph": bad}, batch_size=4)
    assert where in str(info.value)


def test_ir_mode_must_match_the_job(ir):
    with pytest.raises(ValidationError, match="mode: the graph IR was captured for 'train'"):
        JobSpec(source=GraphSource(graph=ir), batch_size=4, mode="inference")


def test_key_is_cached_but_not_carried_into_a_changed_copy():
    spec = JobSpec(source=ZooSource(name="resnet18"), batch_size=8)
    key = spec.key()
    assert spec.key() is key  # computed once
    assert spec.model_copy().key() == key
    smaller = spec.model_copy(update={"batch_size": 4})
    assert smaller.key() == JobSpec(source=ZooSource(name="resnet18"), batch_size=4).key() != key
    assert spec == JobSpec(source=ZooSource(name="resnet18"), batch_size=8)  # the cache is not a field


def test_an_ir_job_cannot_be_built_to_profile(ir):
    with pytest.raises(PerfmodelError, match="IR job"):
        build_job(JobSpec(source=GraphSource(graph=ir), batch_size=4))
