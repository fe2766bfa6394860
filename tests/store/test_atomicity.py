"""A profile is stored whole or not at all: an error or a SIGKILL in the middle of `add` leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import event, func, select, text

import perfmodel.store.store as store_module
from perfmodel.store import ProfileStore
from perfmodel.store.tables import OnnxNodeRow, OpRecordRow, ProfileRow


def _row_counts(store: ProfileStore) -> tuple[int, int, int]:
    with store.engine.connect() as connection:
        return tuple(  # type: ignore[return-value]
            connection.scalar(select(func.count()).select_from(table))
            for table in (ProfileRow, OpRecordRow, OnnxNodeRow)
        )


def test_error_after_some_op_rows_rolls_back_everything(store, factory, monkeypatch):
    kept = factory.profile(n_ops=5, n_onnx=2)
    kept_id = store.add(kept)
    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 10)
    op_inserts = []

    def fail_on_third_op_chunk(connection, cursor, statement, parameters, context, executemany):
        if statement.startswith("INSERT INTO op_records"):
            op_inserts.append(len(parameters))
            if len(op_inserts) == 3:  # the profile row and two chunks of op rows are already written
                raise RuntimeError("disk on fire")

    event.listen(store.engine, "before_cursor_execute", fail_on_third_op_chunk)
    with pytest.raises(RuntimeError, match="disk on fire"):
        store.add(factory.profile(n_ops=95, n_onnx=3))
    event.remove(store.engine, "before_cursor_execute", fail_on_third_op_chunk)

    assert op_inserts == [10, 10, 10]
    assert _row_counts(store) == (1, 5, 2)  # only the earlier profile
    assert store.get(kept_id) == kept
    assert store.has(kept.job_id)
    again = factory.profile(n_ops=95, n_onnx=3)
    assert store.get(store.add(again)) == again  # the store is still usable


def test_error_after_all_op_rows_rolls_back_everything(store, factory, monkeypatch):
    def broken_onnx_values(onnx):
        raise ValueError("bad ONNX node")

    monkeypatch.setattr(store_module, "onnx_values", broken_onnx_values)
    with pytest.raises(ValueError, match="bad ONNX node"):
        store.add(factory.profile(n_ops=50, n_onnx=4))
    assert _row_counts(store) == (0, 0, 0)
    assert store.count() == 0


_CHILD = textwrap.dedent(
    """
    import runpy, sys
    from sqlalchemy import event
    import perfmodel.store.store as store_module
    from perfmodel.store import ProfileStore

    factories = runpy.run_path(sys.argv[1])
    store = ProfileStore(sys.argv[2])
    print("committed", store.add(factories["make_profile"](n_ops=20, n_onnx=3)), flush=True)
    big = factories["make_profile"](name="vit_b_16", n_ops=200_000, n_onnx=1000)
    op_chunks = 0

    @event.listens_for(store.engine, "after_cursor_execute")
    def signal_parent(connection, cursor, statement, parameters, context, executemany):
        global op_chunks
        if statement.startswith("INSERT INTO op_records"):
            op_chunks += 1
            if op_chunks == 20:
                print("inserting", op_chunks * store_module.INSERT_CHUNK_ROWS, flush=True)

    store.add(big)
    print("added", flush=True)
    """
)


@pytest.mark.slow  # a child process writes a large profile
def test_sigkill_in_the_middle_of_a_large_add_leaves_no_partial_profile(sqlite_url, factory, tmp_path):
    conftest = Path(__file__).with_name("conftest.py")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(conftest), sqlite_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        committed = child.stdout.readline().split()
        assert committed[:1] == ["committed"], child.stderr.read()
        inserting = child.stdout.readline().split()
        assert inserting[:1] == ["inserting"], child.stderr.read()
        child.send_signal(signal.SIGKILL)  # 100k op rows are written, 100k to go, no commit yet
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert child.stdout.read() == ""  # never printed "added": it died inside add()
    wal = Path(sqlite_url.removeprefix("sqlite:///") + "-wal")
    assert wal.stat().st_size > 4_000_000  # uncommitted pages of the killed add reached the disk

    with ProfileStore(sqlite_url) as store:
        with store.engine.connect() as connection:
            assert connection.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        assert _row_counts(store) == (1, 20, 3)  # the committed profile, nothing of the killed one
        assert store.get(int(committed[1])) == factory.profile(n_ops=20, n_onnx=3)
        assert not store.has(factory.profile(name="vit_b_16").job_id)
        retry = factory.profile(name="vit_b_16", n_ops=1000)
        assert store.get(store.add(retry)) == retry


@pytest.mark.parametrize("where", ["coverage", "op", "sample"])
def test_nan_is_refused_rather_than_stored_as_null(store, factory, where):
    profile = factory.profile(n_ops=30)
    if where == "coverage":
        profile = profile.model_copy(update={"ops": profile.ops.model_copy(update={"coverage": float("nan")})})
    elif where == "op":
        ops = list(profile.ops.ops)
        ops[20] = ops[20].model_copy(update={"self_time_ms": float("nan")})
        profile = profile.model_copy(update={"ops": profile.ops.model_copy(update={"ops": tuple(ops)})})
    else:
        iteration = profile.iteration.model_copy(update={"samples_ms": (1.0, float("nan"))})
        profile = profile.model_copy(update={"iteration": iteration})
    with pytest.raises(ValueError, match="NaN"):
        store.add(profile)
    assert _row_counts(store) == (0, 0, 0)


def test_concurrent_writers_on_one_sqlite_file_all_land(sqlite_url, factory):
    ProfileStore(sqlite_url).close()
    profiles = [factory.profile(batch_size=b, n_ops=400, n_onnx=20) for b in range(1, 9)]

    def write(profile):
        with ProfileStore(sqlite_url) as store:  # one store (engine) per writer, as separate processes would have
            return [store.add(profile) for _ in range(5)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        ids = dict(zip(profiles, pool.map(write, profiles), strict=True))
    with ProfileStore(sqlite_url) as store:
        assert store.count() == 40
        assert _row_counts(store) == (40, 40 * 400, 40 * 20)
        for profile, profile_ids in ids.items():
            assert all(store.get(i) == profile for i in profile_ids)
