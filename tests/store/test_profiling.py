"""Profiling into the store keeps each job's graph with its runs; `add_missing_graphs` fills in older stores."""

from __future__ import annotations

from pathlib import Path

from perfmodel.graph.from_torch import capture_graph
from perfmodel.jobs.spec import JobSpec
from perfmodel.store.profiling import add_missing_graphs, profile_into_store

USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"
QUICK = {"warmup": 1, "repeats": 3, "op_steps": 1, "time_budget_s": None}


def user_spec(name: str, **run) -> JobSpec:
    return JobSpec.from_options(module=f"{USER_MODELS}:{name}", batch_size=2, **run)


def test_profiling_stores_the_graph_its_ops_were_matched_against_and_reuses_it(sqlite_url):
    from perfmodel.store import ProfileStore

    spec = user_spec("tiny_mlp")
    with ProfileStore(sqlite_url) as store:
        said: list[str] = []
        [done] = profile_into_store([spec], "cpu", store, progress=said.append, **QUICK)
        graph = store.graph(spec.key())
        assert graph is not None and graph.job_id == spec.key() and graph == capture_graph(spec)
        node_ids = {node.id for node in graph.nodes}
        matched = {op.ir_node for op in done.profile.ops.ops if op.ir_node is not None}
        assert matched and matched <= node_ids
        assert sum("capturing the graph" in line for line in said) == 1  # one capture per job

        said.clear()
        [again] = profile_into_store([spec], "cpu", store, force=True, progress=said.append, **QUICK)
        assert again.profile_id != done.profile_id and store.graph_keys() == {spec.key()}
        assert not any("capturing the graph" in line for line in said)  # the stored graph is used
        assert any("using the graph stored" in line for line in said)


def test_add_missing_graphs_captures_what_lacks_and_skips_onnx_and_failed_captures(store, factory):
    tiny, broken = user_spec("tiny_mlp"), user_spec("broken")
    onnx = JobSpec.from_options(onnx="/models/net.onnx", batch_size=2)
    for spec in (tiny, broken, onnx):
        store.add(factory.profile().model_copy(update={"job": spec, "job_id": spec.key()}))
    lines: list[str] = []
    fills = add_missing_graphs(store, progress=lines.append)
    assert [(f.job_key, f.added) for f in fills] == [(tiny.key(), True), (broken.key(), False), (onnx.key(), False)]
    assert "ONNX" in fills[2].reason and "a bug in the user's forward" in fills[1].reason
    assert store.graph_keys() == {tiny.key()} and store.graph(tiny.key()) == capture_graph(tiny)
    assert lines[0] == "3 profiled job(s) without a stored graph" and len(lines) == 4
    # a second run looks only at the jobs still without a graph
    assert [f.job_key for f in add_missing_graphs(store)] == [broken.key(), onnx.key()]
