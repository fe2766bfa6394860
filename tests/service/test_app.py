"""The app's lifespan: on shutdown, the store sync round in flight ends before the store closes, and none starts
after (a real app on a real SQLite store)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fastapi.testclient import TestClient

from perfmodel.store.store import ProfileStore
from service.app import create_app
from service.settings import ServiceSettings
from service.state import ServiceState


def test_shutdown_waits_for_the_sync_round_in_flight_and_starts_none_after_the_store_closes(
        models_dir: Path, tmp_path: Path, monkeypatch):
    events: list[str] = []
    lock = threading.Lock()
    started = threading.Event()

    def slow_sync(self: ServiceState) -> None:
        with lock:
            events.append("sync")
        started.set()
        time.sleep(0.3)  # a round the shutdown arrives in the middle of
        with lock:
            events.append("synced")

    close = ProfileStore.close

    def recorded_close(self: ProfileStore) -> None:
        with lock:
            events.append("close")
        close(self)

    monkeypatch.setattr(ServiceState, "sync_once", slow_sync)
    monkeypatch.setattr(ProfileStore, "close", recorded_close)
    settings = ServiceSettings(store_url=f"sqlite:///{tmp_path / 'store.db'}", models_dir=models_dir,
                               sync_interval_s=0.02)
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        assert started.wait(10), "no sync round ran"
    time.sleep(0.2)  # a round a cancelled loop had left running, or a new one, would show here
    assert events[-1] == "close", events
    assert events.count("sync") == events.count("synced") >= 1
    assert events.index("close") == len(events) - 1
