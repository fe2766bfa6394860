"""The service process's heap: the cyclic collector is off while work that builds long-lived objects runs (in any
number of threads), on again when the last ends, and what was kept is frozen; the app lowers the GIL switch
interval while it serves."""

from __future__ import annotations

import gc
import sys
import threading

from fastapi.testclient import TestClient

from service.app import GIL_SWITCH_INTERVAL_S, create_app
from service.settings import ServiceSettings
from service.state import growing_heap


def test_the_collector_is_off_until_the_last_growing_section_ends_then_what_was_kept_is_frozen():
    assert gc.isenabled()
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
            assert not gc.isenabled()
        assert not gc.isenabled()  # the other thread's section still runs
        release.set()
        thread.join(10)
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(kept)
    finally:
        release.set()
        gc.unfreeze()
        gc.enable()


def test_a_failing_section_turns_the_collector_back_on():
    try:
        with growing_heap():
            raise ValueError("registration refused")
    except ValueError:
        pass
    assert gc.isenabled()


def test_the_app_serves_with_a_short_gil_switch_interval_and_restores_it(tmp_path, models_dir):
    before = sys.getswitchinterval()
    settings = ServiceSettings(store_url=f"sqlite:///{tmp_path / 'store.db'}", models_dir=models_dir,
                               sync_interval_s=0)
    with TestClient(create_app(settings)) as http:
        assert http.get("/healthz").status_code == 200
        assert sys.getswitchinterval() == GIL_SWITCH_INTERVAL_S < before
    assert sys.getswitchinterval() == before
