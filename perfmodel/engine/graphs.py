"""Graphs for the engine: one capture at a time (torch.export is not thread-safe), each spec captured once however
many requests ask for it at once (single-flight), kept in a bounded LRU.

    cache = GraphCache(max_size=20_000)
    cache.get(spec)                      # cached graph, else None: a dictionary look-up
    cache.graph(spec, deadline_s=60.0)   # blocking: waits on the capture another thread runs, or runs it

Every capture goes through `capture(spec, deadline_s)`: a graph IR is parsed (no lock), any other source is
captured under the one capture lock.

Batch sizes are free after three captures: two captures of a spec at different batches with the same structure fix
its affine model (`perfmodel.graph.batch_affine`), a third checks it (every total within `AFFINE_TOLERANCE` of the
capture); from then on its graph at any other batch is arithmetic, not a capture (`synthesized` counts them). A
spec whose third capture disagrees (Mask R-CNN's fixed proposal counts) keeps being captured at every batch.
`prepare_batches(spec)` captures the two other batches up front (job registration does), unless the spec's capture
took over `PREPARE_MAX_CAPTURE_S` (Tacotron 2 unrolls its 850-frame decoder loop: a minute and a half here): a
registration then waits for one capture, not three, and other batches of it are captured when asked.

With a `directory` (the CLI: `PERFMODEL_HOME/graphs`), graphs of zoo and Hugging Face config jobs (whose spec key
holds everything their graph depends on) are kept there as IR JSON, so a later process asking for the same spec
reads it instead of capturing (module and ONNX jobs are not: their files may change under the same key).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from perfmodel.core.atomic import write_text_atomically
from perfmodel.core.errors import PerfmodelError
from perfmodel.core.ir import CAPTURE_REVISION, SCHEMA_VERSION, Graph
from perfmodel.core.lru import LRU
from perfmodel.graph.batch_affine import BatchAffine, affine, agrees
from perfmodel.jobs.spec import GraphSource, HFConfigSource, JobSpec, ZooSource

log = logging.getLogger("perfmodel.engine")
T = TypeVar("T")

# what third-party model code (transformers, torchvision, torch.export) raises for a config it cannot build or
# trace; only while captures run in-process (`perfmodel.graph.capture` raises PerfmodelError subclasses itself)
IN_PROCESS_CAPTURE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, KeyError, IndexError, AssertionError, RuntimeError, NotImplementedError, AttributeError,
    OverflowError, ZeroDivisionError, MemoryError)
# a spec whose capture took longer gets no captures of other batches up front (`GraphCache.prepare_batches`)
PREPARE_MAX_CAPTURE_S = 20.0


class CaptureError(PerfmodelError):
    """The job's graph could not be had (its config does not build, an op does not trace, ...)."""


DEFAULT_CAPTURE_TIMEOUT_S = 120.0


def _has_isolated_capture() -> bool:
    return importlib.util.find_spec("perfmodel.graph.capture") is not None


def capture(spec: JobSpec, deadline_s: float | None = None, limits: Any = None, *, isolated: bool = True) -> Graph:
    """The job's graph. `isolated` (the service): checked against `limits` (`perfmodel.jobs.limits.JobLimits`) and
    captured in a child process killed at `deadline_s` (`perfmodel.graph.capture.capture_graph`); an IR is parsed
    and checked. Not isolated (the CLI, running the user's own model): `graph_for_job` in this process. Raises
    `PerfmodelError` for whatever the client got wrong (`CaptureError` for model code that fails in-process)."""
    from perfmodel.graph import graph_for_job

    if isolated and _has_isolated_capture():
        from perfmodel.graph.capture import capture_graph
        from perfmodel.jobs.limits import JobLimits

        return capture_graph(spec, timeout_s=deadline_s if deadline_s is not None else DEFAULT_CAPTURE_TIMEOUT_S,
                             limits=limits if limits is not None else JobLimits())
    if isinstance(spec.source, GraphSource):
        return graph_for_job(spec)
    try:
        return graph_for_job(spec)
    except PerfmodelError:
        raise
    except IN_PROCESS_CAPTURE_ERRORS as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CaptureError(f"source: the job's graph could not be captured ({type(exc).__name__}: "
                           f"{message[:300]})") from None


class SingleFlight:
    """Concurrent calls for one key run `fn` once; the others wait for its result (or its exception)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[Hashable, Future] = {}

    def run(self, key: Hashable, fn: Callable[[], T], *, done: Callable[[], T | None] = lambda: None) -> T:
        """`fn()`, unless another thread is running it for `key` (then its outcome) or `done()` has the result."""
        with self._lock:
            found = done()
            if found is not None:
                return found
            future = self._running.get(key)
            owner = future is None
            if owner:
                future = self._running[key] = Future()
        assert future is not None
        if not owner:
            return future.result()
        try:
            result = fn()
        except BaseException as exc:
            future.set_exception(exc)
            raise
        else:
            future.set_result(result)
            return result
        finally:
            with self._lock:
                self._running.pop(key, None)

    @property
    def running(self) -> int:
        return len(self._running)


NOT_AFFINE = object()  # a spec whose third capture disagreed with its affine model


@dataclass(frozen=True)
class Checked:
    """An affine model a third capture agreed with."""

    model: BatchAffine

    def at(self, batch: int) -> Graph:
        return self.model.at(batch)


class GraphCache:
    """Graphs by graph key (`JobSpec.graph_key`: the specs of one model at one batch whatever their optimizer and
    float32 math share one capture): a bounded LRU in front of single-flight captures serialised by one lock. Each
    spec gets the graph labelled with its own key."""

    def __init__(self, max_size: int, *, capture_fn: Callable[..., Graph] | None = None,
                 deadline_s: float | None = None, limits: Any = None, isolated: bool = True,
                 directory: Path | None = None, clock: Callable[[], float] = time.monotonic):
        self._graphs: LRU[str, Graph] = LRU(max_size)
        # per spec whatever its batch: its checked affine model, a candidate to check, its last capture, or
        # NOT_AFFINE
        self._batches: LRU[str, Any] = LRU(max_size)
        self._flight = SingleFlight()
        self._capture_lock = threading.Lock()
        self._capture_fn = capture_fn or (lambda spec, deadline, limits: capture(spec, deadline, limits,
                                                                                 isolated=isolated))
        self.deadline_s = deadline_s
        self.limits = limits
        self.captures = 0  # captures run (not cache hits, not waits on another thread's capture)
        self.synthesized = 0  # graphs made from a spec's affine model instead of a capture
        self.directory = directory
        self._capture_s: LRU[str, float] = LRU(max_size)  # per spec whatever its batch: its last capture's seconds
        self._clock = clock

    def get(self, spec: JobSpec) -> Graph | None:
        graph = self._graphs.get(spec.graph_key())
        return None if graph is None else graph_of(spec, graph)

    def put(self, spec: JobSpec, graph: Graph) -> Graph:
        """Keep a graph had elsewhere (the store's) as if captured here."""
        if not isinstance(spec.source, GraphSource):
            self._learn(_batch_free_graph_key(spec), spec.batch_size, graph)
        return graph_of(spec, self._graphs.setdefault(spec.graph_key(), graph))

    def graph(self, spec: JobSpec, deadline_s: float | None = None) -> Graph:
        """`spec`'s graph; blocking: captured at most once at a time per graph key, one capture at a time
        overall."""
        return graph_of(spec, self._graph(spec, deadline_s))

    def _graph(self, spec: JobSpec, deadline_s: float | None) -> Graph:
        key = spec.graph_key()
        deadline = deadline_s if deadline_s is not None else self.deadline_s

        def run() -> Graph:
            if isinstance(spec.source, GraphSource):  # parsing an IR needs no lock; its batch is fixed
                graph = self._capture_fn(spec, deadline, self.limits)
                return self._graphs.setdefault(key, graph)
            family = _batch_free_graph_key(spec)
            model = self._batches.get(family)
            if isinstance(model, Checked):
                self.synthesized += 1
                return self._graphs.setdefault(key, model.at(spec.batch_size))
            with self._capture_lock:
                found = self._graphs.get(key)
                if found is not None:
                    return found
                kept = self._read(spec)
                if kept is not None:
                    graph = kept
                else:
                    self.captures += 1
                    log.info("capturing the graph of %s (batch %d)", spec.name, spec.batch_size)
                    started = self._clock()
                    graph = self._capture_fn(spec, deadline, self.limits)
                    self._capture_s.put(family, self._clock() - started)
                    self._write(spec, graph)
            self._learn(family, spec.batch_size, graph)
            return self._graphs.setdefault(key, graph)

        return self._flight.run(key, run, done=lambda: self._graphs.get(key))

    def _path(self, spec: JobSpec) -> Path | None:
        if self.directory is None or not isinstance(spec.source, (ZooSource, HFConfigSource)):
            return None
        return self.directory / f"{spec.graph_key()}.v{SCHEMA_VERSION}.r{CAPTURE_REVISION}.json"

    def _read(self, spec: JobSpec) -> Graph | None:
        path = self._path(spec)
        if path is None or not path.is_file():
            return None
        try:
            return Graph.from_json(path.read_text())
        except (OSError, ValueError):  # unreadable, or written by another version of the IR: capture again
            return None

    def _write(self, spec: JobSpec, graph: Graph) -> None:
        path = self._path(spec)
        if path is None:
            return
        try:
            write_text_atomically(path, graph.to_json())
        except OSError as exc:  # a read-only home: the capture still serves this process
            log.info("graph of %s not kept in %s: %s", spec.name, path.parent, exc)

    def _learn(self, family: str, batch: int, graph: Graph) -> None:
        """Keep a capture toward the spec's affine model: with an earlier one of another batch, a candidate; at a
        third batch, the candidate checked (or the spec marked not affine)."""
        seen = self._batches.get(family)
        if isinstance(seen, Checked) or seen is NOT_AFFINE:
            return
        if isinstance(seen, BatchAffine):
            if batch not in (seen.batch_first, seen.batch_second):
                self._batches.put(family, Checked(seen) if agrees(seen.at(batch), graph) else NOT_AFFINE)
            return
        if isinstance(seen, tuple) and seen[0] != batch:
            model = affine(seen[1], seen[0], graph, batch)
            self._batches.put(family, model if model is not None else (batch, graph))
            return
        self._batches.put(family, (batch, graph))

    def prepare_batches(self, spec: JobSpec, graph: Graph | None = None, deadline_s: float | None = None) -> bool:
        """Capture `spec` at two more batches (twice and three times its own) so that every other batch of it
        costs no capture; `graph`: its graph at its own batch, if the caller has it. True when the spec now has a
        checked affine model. Nothing more is captured for a spec whose last capture took over
        `PREPARE_MAX_CAPTURE_S`."""
        if isinstance(spec.source, GraphSource):
            return False
        family = _batch_free_graph_key(spec)
        if graph is not None:
            self._learn(family, spec.batch_size, graph)
        for factor in (2, 3):
            if isinstance(self._batches.get(family), Checked) or self._batches.get(family) is NOT_AFFINE:
                break
            took = self._capture_s.get(family) or 0.0
            if took > PREPARE_MAX_CAPTURE_S:
                log.info("%s: a capture took %.0f s; other batches are captured when asked", spec.name, took)
                break
            self.graph(spec.model_copy(update={"batch_size": factor * spec.batch_size}), deadline_s)
        return self.has_batches(spec)

    def has_batches(self, spec: JobSpec) -> bool:
        """Whether any batch of `spec` is arithmetic, not a capture. Cheap."""
        return isinstance(self._batches.get(_batch_free_graph_key(spec)), Checked)

    def batch_model(self, spec: JobSpec) -> BatchAffine | None:
        """`spec`'s checked affine model (its graph at any batch), None where it has none. Cheap."""
        model = self._batches.get(_batch_free_graph_key(spec))
        return model.model if isinstance(model, Checked) else None

    def __len__(self) -> int:
        return len(self._graphs)


def batch_free_key(spec: JobSpec) -> str:
    """The key of a spec whatever its batch."""
    return spec.model_copy(update={"batch_size": 1}).key()


def _batch_free_graph_key(spec: JobSpec) -> str:
    """The graph key of a spec whatever its batch: what a batch-affine model of its graphs is kept by."""
    return spec.model_copy(update={"batch_size": 1}).graph_key()


def graph_of(spec: JobSpec, graph: Graph) -> Graph:
    """`graph` labelled as `spec`'s (its `job_id`): the graph of another spec of the same graph key."""
    key = spec.key()
    return graph if graph.job_id is None or graph.job_id == key else graph.model_copy(update={"job_id": key})
