"""Fan-out of profiling work over a Ray cluster: `run_on_ray` runs tasks (`perfmodel profile --sweep FILE --ray
ADDRESS` through perfmodel/store/profiling.py; `perfmodel hw bench --ray` can reuse it). Ray is an optional extra
(`pip install 'perfmodel[ray]'`); nothing here imports it before a fan-out starts, and this module never touches the
store (the layer above does, in the task bodies it passes).

Each job is one Ray task that asks for `num_gpus` = the GPUs the job runs on (0 on the CPU, `gpus_for`), so Ray
places it on a node that has them. A task body should do its work, then write its result to the shared store as its
LAST step, in ONE transaction, under a uid derived from the run id and the job key (`result_uid`): a task that dies
or is preempted (worker killed, node lost) is retried by Ray up to `max_retries` times, and a retry whose
predecessor had already written finds the uid stored and adds nothing. So a crash never leaves a partial row, and
never two rows.

    results = run_on_ray([FanoutTask(key, fn, num_gpus=1), ...], address="auto")
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfmodel.core.errors import PerfmodelError

DEFAULT_MAX_RETRIES = 3
LOCAL = "local"  # --ray local: start a Ray instance on this machine


class RayUnavailableError(PerfmodelError):
    """Ray is not installed (it is the optional extra `perfmodel[ray]`)."""


@dataclass(frozen=True)
class FanoutTask:
    """One unit of work: `run()` executes on a Ray worker (it must be picklable: a module-level function or a
    functools.partial of one) and returns a small JSON-like result. `key` names it in the results."""

    key: str
    run: Callable[[], Any]
    num_gpus: float = 0.0
    num_cpus: float = 1.0


@dataclass(frozen=True)
class FanoutResult:
    key: str
    value: Any = None
    error: str | None = None  # the task's exception (after any retries), or the system failure that ended it

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class RayOptions:
    """`max_retries`: retries of a task whose worker died (preemption, OOM kill, os._exit) and, with
    `retry_exceptions`, of one that raised one of them; `init`: extra `ray.init` arguments (e.g. num_cpus)."""

    max_retries: int = DEFAULT_MAX_RETRIES
    retry_exceptions: tuple[type[BaseException], ...] = (OSError,)
    init: dict[str, Any] = field(default_factory=dict)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("Ray is not installed: pip install 'perfmodel[ray]' (or 'ray[default]')") from None
    return ray


def result_uid(run_id: str, job_id: str, device: str) -> str:
    """The store uid of one job's result in one run: a retry of the task writes under the same uid."""
    return hashlib.sha256(f"{run_id}|{job_id}|{device}".encode()).hexdigest()[:32]


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


def run_on_ray(tasks: Sequence[FanoutTask], address: str | None = LOCAL, *, options: RayOptions | None = None,
               on_result: Callable[[FanoutResult], None] | None = None) -> list[FanoutResult]:
    """Run every task as a Ray task and wait for all; results in the order of `tasks`. `address`: "local" (or
    None) starts Ray here, "auto" joins the running cluster, "HOST:PORT" / "ray://HOST:PORT" a given one. A Ray
    instance this call started is shut down at the end; one already initialised in the process is reused."""
    ray = _ray()
    options = options or RayOptions()
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False, **options.init}
        if address not in (None, LOCAL):
            kwargs["address"] = address
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise PerfmodelError(f"cannot start or reach Ray at {address!r}: {exc}") from None
        started = True
    try:
        _check_resources(ray.cluster_resources(), tasks)
        remote = ray.remote(_call)
        pending = {}
        for index, task in enumerate(tasks):
            ref = remote.options(num_gpus=task.num_gpus, num_cpus=task.num_cpus, max_retries=options.max_retries,
                                 retry_exceptions=list(options.retry_exceptions) or False,
                                 name=f"perfmodel:{task.key}").remote(task.run)
            pending[ref] = index
        results: list[FanoutResult | None] = [None] * len(tasks)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    result = FanoutResult(tasks[index].key, value=ray.get(ref))
                except ray.exceptions.RayTaskError as exc:  # the task raised (after any retries)
                    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                    result = FanoutResult(tasks[index].key, error=f"{type(cause).__name__}: {cause}")
                except ray.exceptions.RayError as exc:  # its worker died more often than max_retries allows
                    result = FanoutResult(tasks[index].key, error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
                results[index] = result
                if on_result is not None:
                    on_result(result)
        return [r for r in results if r is not None]
    finally:
        if started:
            ray.shutdown()


def _check_resources(cluster: dict[str, float], tasks: Sequence[FanoutTask]) -> None:
    """Fail now, not hang: a task asking for more GPUs (or CPUs) than the whole cluster has would wait forever."""
    for resource, attribute in (("GPU", "num_gpus"), ("CPU", "num_cpus")):
        wanted = max((getattr(t, attribute) for t in tasks), default=0.0)
        if wanted > cluster.get(resource, 0.0):
            raise PerfmodelError(f"a task asks for {wanted:g} {resource}(s) but the Ray cluster has "
                                 f"{cluster.get(resource, 0.0):g} (resources: {dict(sorted(cluster.items()))})")


def gpus_for(device: str) -> float:
    """The GPUs a job profiled on `device` needs: 1 on cuda / cuda:N (ROCm too), 0 on the CPU."""
    name = device.strip().lower()
    if name == "cpu":
        return 0.0
    if name == "cuda" or name.startswith("cuda:"):
        return 1.0
    raise PerfmodelError(f"device {device!r}: expected cpu, cuda or cuda:N")
