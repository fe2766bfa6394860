"""Shared fixtures. Tests run on CPU; tests that need a GPU carry the `gpu` marker and skip without one.

Store URLs: `store_url` is parametrised over a fresh SQLite file and an emptied PostgreSQL database; `postgres_url`
is the latter alone. PostgreSQL comes from PERFMODEL_TEST_POSTGRES_URL, which `scripts/with-postgres.sh` (and so
`make test` and CI) sets after starting a throwaway server; without it those tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

POSTGRES_ENV = "PERFMODEL_TEST_POSTGRES_URL"
POSTGRES_SKIP_REASON_ENV = "PERFMODEL_TEST_POSTGRES_SKIP_REASON"  # set by scripts/with-postgres.sh when it fails


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs one worker per core), each worker gets one torch thread: with
    torch's default of one thread per core, the workers would oversubscribe the machine and slow every test down."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        # xdist workers inherit COLUMNS=80 from execnet, where a single pytest process has none: the CLI's console
        # would then wrap its tables at 80 columns instead of its own default width
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


# A test file's expected run time in "ordinary tests": each test counts 1, each `slow`-marked test this much.
SLOW_TEST_WEIGHT = 10


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests where torch sees no GPU; run the files expected to take longest first."""
    _longest_files_first(items)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device; torch sees none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files by their expected time, longest first (stable within a file and among equals).

    `make test` hands whole files to the xdist workers in this order (`--dist loadfile --no-loadscope-reorder`), so
    that module-scoped fixtures are built once; xdist's own order is by test count, which left a one-test file of
    minutes (a slow fixture) to the end while the other worker idled. Longest first is the classic greedy bound: the
    run ends at most one file after the ideal. (Putting the files that start a graph-capture fork server on one
    worker saved two fork-server starts, ~16 CPU-seconds, but made that worker's share, ~250 s, the longest of the
    run: the run waited on it.)"""
    weight: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        weight[path] = weight.get(path, 0) + (SLOW_TEST_WEIGHT if "slow" in item.keywords else 1)
    items.sort(key=lambda item: -weight[item.nodeid.split("::", 1)[0]])


def copy_shipped_models(target: Path) -> Path:
    """A private copy of the shipped registry (`models/`) at `target`, for a test that promotes, retrains or adds
    versions. Its JSON files (promoted.json, manifests, domains) are copied; its boosters (*.ubj, 17 of its 18 MB)
    are hard links where the file system allows. A saved booster is never written again (a new version is a new
    folder; promoted.json is replaced by a rename), so the links are never written through, and a copy costs a
    few small files instead of 18 MB (about 150 service tests make one)."""
    from perfmodel.registry.registry import default_models_dir

    def link_or_copy(source: str, destination: str) -> str:
        if source.endswith(".ubj"):
            try:
                os.link(source, destination)
                return destination
            except OSError:  # another file system, or no hard links on this one
                pass
        return shutil.copy2(source, destination)

    shutil.copytree(default_models_dir(), target, copy_function=link_or_copy)
    return target


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Every test gets its own PERFMODEL_HOME, so the default SQLite store never touches the user's."""
    home = tmp_path_factory.mktemp("perfmodel-home")
    monkeypatch.setenv("PERFMODEL_HOME", str(home))
    monkeypatch.delenv("PERFMODEL_STORE_URL", raising=False)
    return home


# Test folders whose tests are about capturing itself (the exporter, the zoo's builders): they always capture.
CAPTURE_TEST_DIRS = frozenset({"graph", "jobs"})
_CAPTURED_GRAPHS: dict[str, object] = {}


@pytest.fixture(autouse=True)
def _zoo_graph_captured_once(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside tests/graph and tests/jobs, a zoo or `hf_config` job that this worker captured once is answered
    with that graph after (a frozen Graph, the same for the same spec): the predictor, CLI and evaluation tests
    capture the same few specs (resnet18, bert-small) again and again, ~40 CPU-seconds of a run. A module job
    (a file a test wrote) and a failed capture are never kept."""
    if Path(str(request.node.path)).parent.name in CAPTURE_TEST_DIRS:
        return
    from perfmodel.graph import from_torch
    from perfmodel.jobs.spec import HFConfigSource, ZooSource

    real = from_torch.capture_graph

    def once(spec):
        if not isinstance(spec.source, (ZooSource, HFConfigSource)):
            return real(spec)
        key = spec.model_dump_json()
        if key not in _CAPTURED_GRAPHS:
            _CAPTURED_GRAPHS[key] = real(spec)
        return _CAPTURED_GRAPHS[key]

    monkeypatch.setattr(from_torch, "capture_graph", once)
    run = sys.modules.get("perfmodel.profilers.run")  # imported it by name; patched once it is loaded
    if run is not None:
        monkeypatch.setattr(run, "capture_graph", once)


def _empty_postgres(url: str) -> None:
    """Drop everything in the database's public schema (perfmodel tables and anything a test added)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("SET LOCAL lock_timeout = '30s'"))  # a leaked open transaction fails, not hangs
            connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


def _worker_database(url: str, worker: str) -> str:
    """`url` with the database `<its name>_<worker>`, created on that server when missing: each pytest-xdist worker
    empties and fills its own database, never the one another worker is using."""
    from sqlalchemy import create_engine, make_url, text

    base = make_url(url)
    name = f"{base.database}_{worker}"
    engine = create_engine(base, isolation_level="AUTOCOMMIT")  # CREATE DATABASE runs outside a transaction
    try:
        with engine.connect() as connection:
            exists = connection.scalar(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name})
            if not exists:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def _postgres_server_url() -> str | None:
    """This test process's PostgreSQL database URL (one per xdist worker), or None without a server."""
    url = os.environ.get(POSTGRES_ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return _worker_database(url, worker) if url and worker else url


@pytest.fixture
def postgres_url(_postgres_server_url: str | None) -> str:
    """The URL of an emptied PostgreSQL database; skips, saying why, without one. (Emptied before each test, not
    after: the next test's emptying clears what this one left, and the server is thrown away at the end.)"""
    url = _postgres_server_url
    if not url:
        reason = os.environ.get(POSTGRES_SKIP_REASON_ENV) or (
            "run the tests through scripts/with-postgres.sh (make test does) to start a throwaway server"
        )
        pytest.skip(f"{POSTGRES_ENV} not set: {reason}")
    _empty_postgres(url)
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'perfmodel.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh store URL: a SQLite file, and an emptied PostgreSQL database (see `postgres_url`)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")


@pytest.fixture(scope="session")
def exported_mlp_onnx(tmp_path_factory) -> Path:
    """A two-layer MLP exported the default way of current PyTorch: its weights land in mlp.onnx.data."""
    import contextlib
    import io

    import torch

    folder = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).eval()
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model, (torch.randn(4, 32),), str(folder / "mlp.onnx"), dynamo=True, external_data=True)
    assert (folder / "mlp.onnx.data").is_file()
    return folder / "mlp.onnx"


def _check_training_graph(graph) -> None:
    """What every captured training graph holds, whichever model: totals that add up, what autograd saves measured
    (as captured and under autocast), backward between one and three forwards, unique node ids in topological order,
    and the ops the FLOP table knows doing the work (unknown ops hold no tensor arithmetic we miss)."""
    from perfmodel.graph import OpKind, summarize

    totals = graph.totals
    assert graph.source == "torch.export" and graph.mode == "train"
    assert totals.nodes == len(graph.nodes) > 0
    assert totals.params > 0 and totals.flops_fwd > 0 and totals.activation_bytes > 0
    assert totals.saved_activation_bytes and totals.saved_activation_bytes_amp
    assert 1.0 <= totals.flops_bwd / totals.flops_fwd <= 3.0  # about twice the forward (GEMM/conv)
    ids = [n.id for n in graph.nodes]
    assert len(set(ids)) == len(ids)
    seen: set[str] = set()
    for node in graph.nodes:  # producers come first
        assert set(node.inputs) <= seen, node.id
        seen.add(node.id)
    heavy = {OpKind.conv.value, OpKind.linear.value, OpKind.matmul.value, OpKind.bmm.value,
             OpKind.attention.value, OpKind.rnn.value}
    assert sum(f for k, f in totals.flops_fwd_by_kind.items() if k in heavy) > 0.8 * totals.flops_fwd
    assert summarize(graph)["nodes"] == totals.nodes


@pytest.fixture
def check_training_graph():
    """`check_training_graph(graph)` asserts what every captured training graph holds (`_check_training_graph`)."""
    return _check_training_graph
