"""What one service process holds: the prediction engine (`perfmodel.engine`: jobs, graphs, calibration, models)
and the process's metrics. Everything about predicting lives in the engine; the routers are a thin HTTP adapter."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from perfmodel.core.lru import LRU
from perfmodel.engine import EngineConfig, PredictionEngine
from service.metrics import Metrics
from service.settings import ServiceSettings

RESPONSE_CACHE_SIZE = 20_000  # ~1.5 KB each: ~30 MB at most


class ResponseCache:
    """Encoded `/v1/predict` answers, admitted on their body's second ask. A poller asks the same bodies over and over:
    from their second ask on they are kept, and served from memory. A searcher asks bodies once each: those only
    leave their hash among the last `size` bodies seen (~100 bytes), not a 1.5 KB answer nobody asks again."""

    def __init__(self, size: int = RESPONSE_CACHE_SIZE) -> None:
        self._answers: LRU[Any, tuple[bytes, bool]] = LRU(size)
        self._seen: LRU[int, bool] = LRU(size)

    def get(self, key: Any) -> tuple[bytes, bool] | None:
        return self._answers.get(key)

    def peek(self, key: Any) -> tuple[bytes, bool] | None:
        return self._answers.peek(key)

    def offer(self, key: Any, answer: tuple[bytes, bool]) -> None:
        """Keep `answer` if its body was asked before (among the last `size` seen), else remember the body."""
        if key in self._answers:
            self._answers.put(key, answer)
            return
        digest = hash(key)
        if self._seen.pop(digest) is not None:
            self._answers.put(key, answer)
        else:
            self._seen.put(digest, True)

    def __len__(self) -> int:
        return len(self._answers)


@dataclass(frozen=True)
class ServiceState:
    settings: ServiceSettings
    engine: PredictionEngine
    metrics: Metrics
    # encoded /v1/predict answers by (engine.response_token(job), placement): (body, calibrated). The hot path of a
    # scheduler asking the same (job, placement) again is a look-up, not a prediction and a JSON encoding.
    responses: ResponseCache = field(default_factory=ResponseCache)

    @property
    def store(self) -> Any:
        return self.engine.store

    def sync_once(self) -> None:
        """Pick up what other workers wrote (blocking)."""
        self.engine.sync_once()


def settle_heap() -> None:
    """Take what the process holds now (the models, the jobs' graphs and computes it just loaded) out of the cyclic
    garbage collector's walks (`gc.freeze`). A graph is 10^4-10^5 tracked objects; a full collection walks every
    one, and while it does every request waits (100-200 ms with a few jobs in memory, the p99 of a busy server).
    Reference counting still frees them when they go (an evicted graph has no cycles); the walks go on over what
    requests allocate afterwards. O(1): called after each piece of blocking work that keeps something."""
    gc.freeze()


_growing = 0  # `growing_heap` sections under way, in any thread
_growing_lock = threading.Lock()
_thresholds: tuple[int, int, int] | None = None  # the collector's thresholds outside them
# while a section runs, a full collection waits until the oldest generation's pending count reaches this: in effect,
# none. Young collections go on, so the cyclic garbage of requests (~180 objects per refused request: exceptions
# and their tracebacks) is freed as usual, however long a capture runs.
NO_FULL_COLLECTION = 1 << 30


@contextmanager
def growing_heap() -> Iterator[None]:
    """Blocking work that builds what the process keeps (a job registered: its IR parsed, its graph and computes
    made, 10^5-10^6 new objects). No full collection runs while any such work runs: one would walk every new object
    (70 ms for a Llama-7B IR, measured) holding the GIL, and every request would wait. When the last one ends, the
    collector's thresholds are restored and what was kept is frozen (`settle_heap`)."""
    global _growing, _thresholds
    with _growing_lock:
        if _growing == 0:
            _thresholds = gc.get_threshold()
            gc.set_threshold(_thresholds[0], _thresholds[1], NO_FULL_COLLECTION)
        _growing += 1
    try:
        yield
    finally:
        with _growing_lock:
            _growing -= 1
            if _growing == 0 and _thresholds is not None:
                gc.set_threshold(*_thresholds)
                settle_heap()


def open_state(settings: ServiceSettings, metrics: Metrics) -> ServiceState:
    """Open the store and the engine (models loaded). Blocking; raises if either fails: the server does not start."""
    from perfmodel.store.jobs import JobStore

    store = JobStore(settings.resolved_store_url())
    try:
        engine = PredictionEngine.open(EngineConfig.from_settings(settings), store)
    except BaseException:
        store.close()
        raise
    metrics.set_models(engine.model_versions)
    engine.subscribe(metrics.set_models)
    metrics.jobs_cached.set_function(engine.jobs_cached)
    return ServiceState(settings, engine, metrics)
