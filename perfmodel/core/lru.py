"""A thread-safe bounded mapping that forgets its least recently used entries: what every long-lived cache of
perfmodel (the engine's graphs and jobs, the placement predictor's per-device computes) is made of, so that a
process asked about any number of distinct jobs keeps a bounded amount of memory."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `max_size` entries; `get` marks an entry as used, `put` evicts the least recently used ones."""

    def __init__(self, max_size: int, *, on_evict: Callable[[K, V], None] | None = None):
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._on_evict = on_evict

    def get(self, key: K, default: V | None = None) -> V | None:
        """The entry, marked used. No lock: each OrderedDict call is atomic under the GIL, and an entry evicted
        between the two is a miss."""
        try:
            self._data.move_to_end(key)
            return self._data[key]
        except KeyError:
            return default

    def peek(self, key: K) -> V | None:
        """The entry without marking it used."""
        return self._data.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def put(self, key: K, value: V) -> V:
        evicted: list[tuple[K, V]] = []
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_size:
                evicted.append(self._data.popitem(last=False))
        if self._on_evict is not None:
            for old_key, old_value in evicted:
                self._on_evict(old_key, old_value)
        return value

    def setdefault(self, key: K, value: V) -> V:
        """The entry already there (another thread got there first), else `value`, stored."""
        with self._lock:
            known = self._data.get(key)
            if known is not None:
                self._data.move_to_end(key)
                return known
        return self.put(key, value)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._data)

    def items(self) -> list[tuple[K, V]]:
        with self._lock:
            return list(self._data.items())

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())
