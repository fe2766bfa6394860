"""`perfmodel profiles add-graphs`: fills in the graphs of profiled jobs of a store made before graphs were kept."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from perfmodel.cli.main import app
from perfmodel.graph.from_torch import capture_graph
from perfmodel.jobs.spec import JobSpec
from perfmodel.profilers.run import profile_job
from perfmodel.store import ProfileStore

USER_MODELS = Path(__file__).parents[1] / "profilers" / "user_models.py"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_add_graphs_stores_the_graph_of_a_profiled_job_once(tmp_path):
    spec = JobSpec.from_options(module=f"{USER_MODELS}:tiny_mlp", batch_size=2)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with ProfileStore(url) as store:  # a run stored the way stores before schema v5 got them: no graph
        store.add(profile_job(spec, "cpu", warmup=1, repeats=3, per_op=False, time_budget_s=None))
        assert store.graph_keys() == set()

    result = run("profiles", "add-graphs", "--store", url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"job_key": spec.key(), "job_name": spec.name, "added": True,
                                          "reason": None}]
    assert f"[1/1] {spec.name} ({spec.key()[:12]})" in result.stderr  # progress on stderr
    with ProfileStore(url) as store:
        assert store.graph(spec.key()) == capture_graph(spec)

    again = run("profiles", "add-graphs", "--store", url)
    assert again.exit_code == 0 and "stored 0 graph(s); skipped 0" in again.stdout


def test_add_graphs_on_a_bad_store_url_exits_2(tmp_path):
    result = run("profiles", "add-graphs", "--store", "nosuchdb://x")
    assert result.exit_code == 2 and "error:" in result.stderr
