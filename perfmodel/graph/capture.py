"""A job's graph with bounded work: `capture_graph(spec, timeout_s=..., limits=...)`.

Capturing a graph runs model code (transformers, torchvision, torch.export) on a config a client wrote; done in the
serving process it could run for hours, grow by gigabytes and outlive a SIGTERM. Here:

1. the spec is checked against `JobLimits` first (`perfmodel.jobs.limits.check_spec`: no torch, microseconds);
2. an IR source is used in-process (no capture: its graph is parsed and checked);
3. anything else is captured in a child process (multiprocessing `forkserver`, whose server preloads torch and
   transformers once, so a capture pays a fork, not the imports). The child builds the model on the meta device,
   checks its exact parameter count, exports it and sends the graph back as JSON (`Graph.to_json`). The parent
   waits until `timeout_s` and kills the child then (`CaptureTimeout`), or as soon as its resident memory passes
   `limits.max_capture_rss_mb`. The child never outlives its parent: it is a daemon process (killed at interpreter
   exit), and a watchdog thread in it exits the moment the parent's end of a "lifeline" pipe closes, which is
   also what happens when the parent is killed.

Every refusal is a `PerfmodelError` (the service answers 422; a timeout is a `CaptureTimeout`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from typing import Any, Final

from perfmodel.core.errors import JobLoadError, PerfmodelError
from perfmodel.core.ir import Graph
from perfmodel.jobs.limits import JobLimitError, JobLimits, check_graph, check_params, check_spec
from perfmodel.jobs.spec import GraphSource, JobSpec, OnnxSource

START_METHOD: Final = "forkserver"
# imported once by the fork server: each capture's child then starts without paying for them
PRELOAD = ["perfmodel.graph.capture_preload"]
POLL_S = 0.05  # how often the parent looks at the child's memory while it waits
_GRAPH, _REFUSED, _FAILED = b"G", b"E", b"X"  # the first byte of the child's answer
_CHILD_ERRORS: dict[str, type[PerfmodelError]] = {"JobLimitError": JobLimitError, "JobLoadError": JobLoadError}


class CaptureTimeout(PerfmodelError):
    """A capture did not finish within its time budget; its child process was killed."""


class CaptureFailed(PerfmodelError):
    """The model code could not be captured (it rejected the config, an op cannot be traced) or its process died."""


_live: set[Any] = set()  # children running now (killed at interpreter exit by multiprocessing: daemon=True)
_context_lock = threading.Lock()
_context: Any = None


def _mp_context() -> Any:
    """The forkserver context, its server running (started on first use: it imports torch and transformers and
    runs one tiny capture, 10-20 s on a 2-core machine; `prestart` does it ahead of the first request)."""
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context(START_METHOD)
            context.set_forkserver_preload(PRELOAD)
            ready = context.Process(target=_ready, name="perfmodel-capture-ready", daemon=True)
            ready.start()  # returns once the server has preloaded and forked it
            ready.join()
            _context = context
        return _context


def _ready() -> None:
    """A child that does nothing: starting one waits for the fork server to be up."""


def prestart() -> None:
    """Start the capture fork server now (blocking), so that the first capture does not wait for it."""
    _mp_context()


def capture_graph(spec: JobSpec, *, timeout_s: float, limits: JobLimits) -> Graph:
    """The job's graph, checked against `limits`, captured within `timeout_s` seconds (in a child process) or
    refused: `JobLimitError` naming the limit, `CaptureTimeout`, `CaptureFailed`, or the model's own
    `PerfmodelError`."""
    check_spec(spec, limits)
    if isinstance(spec.source, GraphSource):
        from perfmodel.graph import graph_for_job

        graph = graph_for_job(spec)
        check_graph(graph, limits, where="source.graph")
        return graph
    if not timeout_s > 0:
        raise CaptureTimeout(f"source: no time left to capture the job's graph (budget {timeout_s:.3g} s)")
    return _capture_in_child(spec, timeout_s, limits)


def _capture_in_child(spec: JobSpec, timeout_s: float, limits: JobLimits) -> Graph:
    context = _mp_context()  # the fork server's start is not part of the capture's time budget
    answer_in, answer_out = context.Pipe(duplex=False)
    lifeline_in, lifeline_out = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, name=f"perfmodel-capture-{spec.key()[:8]}", daemon=True,
                            args=(JobSpec.model_dump_json(spec), limits.model_dump_json(), answer_out, lifeline_in))
    start = time.monotonic()
    deadline = start + timeout_s
    child.start()
    answer_out.close()
    lifeline_in.close()
    _live.add(child)
    try:
        payload = _wait(child, answer_in, deadline, timeout_s, limits)
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        _live.discard(child)
        answer_in.close()
        lifeline_out.close()
    return _answer(payload, child.exitcode)


def _wait(child: Any, answer: Any, deadline: float, timeout_s: float, limits: JobLimits) -> bytes | None:
    """The child's answer, None if it died without one; CaptureTimeout at the deadline; JobLimitError if it
    holds more memory than allowed."""
    import psutil

    try:
        process = psutil.Process(child.pid)
    except psutil.Error:  # already gone: its answer (or EOF) is in the pipe
        process = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CaptureTimeout(f"source: capturing the job's graph took longer than {timeout_s:.3g} s; stopped "
                                 f"(a smaller model, or a graph IR captured on your machine, is accepted)")
        if answer.poll(min(remaining, POLL_S)):
            try:
                return answer.recv_bytes()
            except EOFError:
                return None
        if process is not None:
            try:
                rss_mb = process.memory_info().rss / 2**20
            except psutil.Error:
                continue
            if rss_mb > limits.max_capture_rss_mb:
                raise JobLimitError(f"source: capturing the job's graph needed more than the limit "
                                    f"max_capture_rss_mb = {limits.max_capture_rss_mb:,} MiB; stopped")


def _answer(payload: bytes | None, exitcode: int | None) -> Graph:
    if not payload:
        how = f"was killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else \
            f"exited with code {exitcode}"
        raise CaptureFailed(f"source: the process capturing the job's graph {how} without an answer")
    kind, body = payload[:1], payload[1:]
    if kind == _GRAPH:
        return Graph.from_json(body)
    error = json.loads(body)
    if kind == _REFUSED:
        raise _CHILD_ERRORS.get(error["type"], PerfmodelError)(error["message"])
    raise CaptureFailed(f"source: the job's graph could not be captured ({error['type']}: {error['message']})")


# --- the child --------------------------------------------------------------------------------------------------


def _child_main(spec_json: str, limits_json: str, answer: Any, lifeline: Any) -> None:
    """Capture in the child; answer with the graph's JSON or the error; exit at once if the parent goes away."""
    threading.Thread(target=_exit_when_parent_goes, args=(lifeline,), daemon=True).start()
    try:
        graph = _capture(JobSpec.model_validate_json(spec_json), JobLimits.model_validate_json(limits_json))
        payload = _GRAPH + graph.to_json().encode()
    except PerfmodelError as exc:
        payload = _REFUSED + json.dumps({"type": type(exc).__name__, "message": str(exc)}).encode()
    except Exception as exc:  # model code rejecting a client's config: reported to the parent in one line
        text = str(exc).strip()
        first = text.splitlines()[0][:300] if text else ""
        payload = _FAILED + json.dumps({"type": type(exc).__name__, "message": first}).encode()
    answer.send_bytes(payload)
    answer.close()
    os._exit(0)  # no interpreter teardown (torch's can take seconds); the answer is sent


def _exit_when_parent_goes(lifeline: Any) -> None:
    try:
        lifeline.recv_bytes()  # the parent never sends: this returns (EOFError) only when its end closes
    except (EOFError, OSError):
        pass
    os._exit(3)


def _capture(spec: JobSpec, limits: JobLimits) -> Graph:
    """What `perfmodel.graph.from_torch.capture_graph` does, with the exact parameter count checked between the
    (meta-device) build and the export; ONNX sources are read as `graph_for_job` reads them."""
    if isinstance(spec.source, OnnxSource):
        from perfmodel.graph import graph_for_job

        graph = graph_for_job(spec)
    else:
        from perfmodel.graph.from_torch import graph_of_job
        from perfmodel.jobs.build import build_job

        job = build_job(spec, "meta")  # a user module: imported after `ensure_torchvision`, as in the parent
        check_params(sum(p.numel() for p in job.module.parameters()), limits)
        graph = graph_of_job(job)  # with the job's own loss, when it has one
    check_graph(graph, limits)
    return graph
