"""The service process's heap: no full collection runs while work that builds long-lived objects runs (in any
number of threads), young ones do, and what was kept is frozen when the last ends; the app lowers the GIL switch
interval while it serves."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

from fastapi.testclient import TestClient

from service.app import GIL_SWITCH_INTERVAL_S, create_app
from service.settings import ServiceSettings
from service.state import NO_FULL_COLLECTION, growing_heap


def test_no_full_collection_runs_until_the_last_growing_section_ends_then_what_was_kept_is_frozen():
    thresholds = gc.get_threshold()
    frozen = gc.get_freeze_count()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with growing_heap():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    try:
        with growing_heap():
            thread.start()
            assert inside.wait(10)
            kept = [[i] for i in range(1000)]  # long-lived containers made while growing
            assert gc.isenabled() and gc.get_threshold()[:2] == thresholds[:2]
            assert gc.get_threshold()[2] == NO_FULL_COLLECTION
        assert gc.get_threshold()[2] == NO_FULL_COLLECTION  # the other thread's section still runs
        release.set()
        thread.join(10)
        assert gc.get_threshold() == thresholds and gc.get_freeze_count() >= frozen + len(kept)
    finally:
        release.set()
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_young_collections_free_request_garbage_while_a_section_runs():
    """A capture may run for minutes: the cyclic garbage requests make meanwhile is still freed."""

    class Node:
        pass

    with growing_heap():
        cycle = Node()
        cycle.self = cycle  # type: ignore[attr-defined]
        alive = weakref.ref(cycle)
        del cycle
        kept = [[] for _ in range(50_000)]  # allocations: young collections run on their own
        assert alive() is None
        del kept


def test_a_failing_section_restores_the_thresholds():
    thresholds = gc.get_threshold()
    try:
        with growing_heap():
            raise ValueError("registration refused")
    except ValueError:
        pass
    assert gc.get_threshold() == thresholds


def test_the_app_serves_with_a_short_gil_switch_interval_and_restores_it(tmp_path, models_dir):
    before = sys.getswitchinterval()
    settings = ServiceSettings(store_url=f"sqlite:///{tmp_path / 'store.db'}", models_dir=models_dir,
                               sync_interval_s=0)
    with TestClient(create_app(settings)) as http:
        assert http.get("/healthz").status_code == 200
        assert sys.getswitchinterval() == GIL_SWITCH_INTERVAL_S < before
    assert sys.getswitchinterval() == before
