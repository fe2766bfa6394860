"""A client of the perfmodel service for schedulers (httpx, one keep-alive connection pool).

    from perfmodel.client import Client

    with Client("http://127.0.0.1:8000", token="...") as pm:
        job = pm.register_job(zoo="resnet50", batch_size=32)["job_id"]
        pm.predict(job, {"accelerator": "a100-sxm4-80gb", "devices_per_node": [8]})["throughput_samples_per_s"]
        pm.matrix([job], grid={"accelerators": ["t4", "v100-sxm2-32gb"], "device_counts": [1, 2, 4]})
        pm.colocation([job, other_job], {"accelerator": "a100-sxm4-80gb"}, sharing="mps")
        pm.observe(job, {"accelerator": "t4"}, throughput_samples_per_s=412.0)

Jobs are given by id or as a `JobSpec` (or its dict); placements as a `PlacementSpec` or a dict. A job's
`batch_size` is the samples of one forward/backward pass of one model replica; a placement's `global_batch_size`
is the samples of one iteration over all replicas and micro-batches, and may be left out: the job's batch × the
data-parallel degree × the micro-batches (README, "Batch size"). Responses are the service's JSON as dicts. A 4xx
or 5xx answer raises `ServiceError` with the status and the service's `detail`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from pydantic import BaseModel

DEFAULT_TIMEOUT_S = 60.0

JobRef = str | BaseModel | Mapping[str, Any]
PlacementRef = BaseModel | Mapping[str, Any]


class ServiceError(Exception):
    """The service answered with an error: `status_code` and its `detail` (a message, or validation errors that
    name the field)."""

    def __init__(self, status_code: int, detail: Any):
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"{status_code}: {_describe(detail)}")


def _describe(detail: Any) -> str:
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" if isinstance(d, dict) else str(d)
                         for d in detail)
    return str(detail)


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return dict(value)
    return value


class Client:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, token: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s, transport=transport)

    # --- jobs ---

    def register_job(self, spec: BaseModel | Mapping[str, Any] | None = None, *, zoo: str | None = None,
                     hf_config: Mapping[str, Any] | None = None, task: str | None = None,
                     ir: Mapping[str, Any] | str | None = None, batch_size: int | None = None,
                     **run: Any) -> dict[str, Any]:
        """Register a job: a `JobSpec` (or dict), or one of `zoo`, `hf_config`, `ir` (the IR JSON that `perfmodel
        graph --json` printed, as text or dict) plus `batch_size` (one replica's forward/backward pass; an IR's
        must be the batch it was captured at) and run settings (seq_len, precision, optimizer, mode). Returns the
        job (`job_id`, `created`, graph size)."""
        if isinstance(spec, str):  # refused here: the service would only say "body: Input should be an object"
            raise TypeError(f"register_job's spec is a JobSpec or its dict, not the name {spec!r}: register a zoo "
                            f"model with register_job(zoo={spec!r}, batch_size=...)")
        if spec is None:
            spec = _spec_from_options(zoo=zoo, hf_config=hf_config, task=task, ir=ir, batch_size=batch_size, **run)
        return self._call("POST", "/v1/jobs", json=_json(spec))

    def register_onnx(self, path: str | Path, *, batch_size: int, **run: Any) -> dict[str, Any]:
        """Upload an ONNX model (multipart) as a job; `run`: seq_len, precision, optimizer."""
        path = Path(path)
        fields = {"batch_size": str(batch_size), **{k: str(v) for k, v in run.items() if v is not None}}
        with path.open("rb") as file:
            return self._call("POST", "/v1/jobs", data=fields,
                              files={"file": (path.name, file, "application/octet-stream")})

    def job(self, job_id: str) -> dict[str, Any]:
        """A registered job with its calibration report (observations, MAPE before and after)."""
        return self._call("GET", f"/v1/jobs/{job_id}")

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/jobs")["jobs"]

    def delete_job(self, job_id: str) -> None:
        self._call("DELETE", f"/v1/jobs/{job_id}")

    # --- predictions and observations ---

    def predict(self, job: JobRef, placement: PlacementRef) -> dict[str, Any]:
        """The job on the placement: `iter_time_ms`, `throughput_samples_per_s`, ..., `calibrated`."""
        return self._call("POST", "/v1/predict", json={"job": _json(job), "placement": _json(placement)})

    def matrix(self, jobs: Sequence[JobRef], placements: Sequence[PlacementRef] | None = None, *,
               grid: Mapping[str, Any] | None = None, layout: str = "matrix", detail: bool = False,
               job_types: Sequence[str] | None = None, worker_types: Mapping[str, str] | None = None,
               colocation: bool = False, sharing: str = "time-slicing") -> dict[str, Any]:
        """Jobs × placements (or × `grid`: accelerators × device_counts [× spread]) in one call; `layout="gavel"`
        answers Gavel's throughput dictionaries: `job_types` names the jobs, `worker_types` maps worker type names
        to accelerators, and `colocation=True` adds every pair of jobs sharing the GPUs (`sharing`: "time-slicing"
        or "mps"). docs/api.md, POST /v1/predict/matrix."""
        body: dict[str, Any] = {"jobs": [_json(j) for j in jobs], "layout": layout, "detail": detail,
                                "colocation": colocation, "sharing": sharing}
        if placements is not None:
            body["placements"] = [_json(p) for p in placements]
        if grid is not None:
            body["grid"] = dict(grid)
        if job_types is not None:
            body["job_types"] = list(job_types)
        if worker_types is not None:
            body["worker_types"] = dict(worker_types)
        return self._call("POST", "/v1/predict/matrix", json=body)

    def colocation(self, jobs: Sequence[JobRef], placement: PlacementRef,
                   sharing: str = "time-slicing") -> dict[str, Any]:
        """Two jobs sharing the placement's GPUs (`sharing`: "time-slicing", two processes, or "mps"): each one's
        `throughput_samples_per_s` while sharing, its interval, slowdown and isolated answer, and how busy the
        device is. A pair that does not fit in memory together raises ServiceError(422)."""
        return self._call("POST", "/v1/predict/colocation", json={
            "jobs": [_json(j) for j in jobs], "placement": _json(placement), "sharing": sharing})

    def observe(self, job_id: str, placement: PlacementRef, *, throughput_samples_per_s: float,
                colocated_with: str | None = None, sharing: str = "time-slicing") -> dict[str, Any]:
        """Tell the service what a running job measured (samples/s over the whole job); its later predictions are
        calibrated by it. With `colocated_with` (a registered job's id), it measured that while sharing the
        placement's GPUs with that job in `sharing` mode: its later answers while sharing are calibrated by it. A
        throughput physics rules out raises ServiceError(422)."""
        body: dict[str, Any] = {"job": job_id, "placement": _json(placement),
                                "throughput_samples_per_s": throughput_samples_per_s}
        if colocated_with is not None:
            body.update(colocated_with=colocated_with, sharing=sharing)
        return self._call("POST", "/v1/observations", json=body)

    def observation(self, observation_id: int) -> dict[str, Any]:
        """One stored observation."""
        return self._call("GET", f"/v1/observations/{int(observation_id)}")

    def delete_observation(self, observation_id: int) -> dict[str, Any]:
        """Delete an observation; the answer holds its job's calibration without it."""
        return self._call("DELETE", f"/v1/observations/{int(observation_id)}")

    # --- catalog, models, health ---

    def accelerators(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/accelerators")

    def models(self) -> dict[str, Any]:
        return self._call("GET", "/v1/models")

    def promote(self, version: str) -> dict[str, Any]:
        """Hot-swap the served model; a model that does not load raises ServiceError(409)."""
        return self._call("POST", f"/v1/models/{version}/promote")

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def ready(self) -> bool:
        return self._http.get("/readyz").status_code == 200

    # --- plumbing ---

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ServiceError(response.status_code, detail)
        return None if response.status_code == 204 else response.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _spec_from_options(*, zoo: str | None, hf_config: Mapping[str, Any] | None, task: str | None,
                       ir: Mapping[str, Any] | str | None, batch_size: int | None, **run: Any) -> dict[str, Any]:
    import json

    given = [s for s in (zoo, hf_config, ir) if s is not None]
    if len(given) != 1 or batch_size is None:
        raise ValueError("give a spec, or exactly one of zoo, hf_config, ir, and batch_size")
    if zoo is not None:
        source: dict[str, Any] = {"kind": "zoo", "name": zoo}
    elif hf_config is not None:
        source = {"kind": "hf_config", "config": dict(hf_config), "task": task}
    else:
        source = {"kind": "ir", "graph": json.loads(ir) if isinstance(ir, str) else dict(ir)}  # type: ignore[arg-type]
    return {"source": source, "batch_size": batch_size, **{k: v for k, v in run.items() if v is not None}}
