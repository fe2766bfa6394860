"""Prometheus metrics of one service process (`GET /metrics`), and the plain ASGI middleware that counts and times
every request by route template (not by raw path, so job ids do not blow up the label set).

    perfmodel_http_requests_total{method, route, status}
    perfmodel_http_request_duration_seconds{method, route}       histogram
    perfmodel_predictions_total{endpoint}                         single predictions and matrix cells
    perfmodel_calibrated_predictions_total{endpoint}              of those, calibrated by observations
    perfmodel_model_info{role, version}                           1 for each model being served
    perfmodel_jobs_cached                                         jobs whose graph this process holds
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNMATCHED = "<unmatched>"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("perfmodel_http_requests", "HTTP requests by route template and status",
                                ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram("perfmodel_http_request_duration_seconds", "HTTP request latency",
                                 ["method", "route"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.predictions = Counter("perfmodel_predictions", "predictions served (a matrix counts every cell)",
                                   ["endpoint"], registry=self.registry)
        self.calibrated = Counter("perfmodel_calibrated_predictions", "predictions scaled by observed throughput",
                                  ["endpoint"], registry=self.registry)
        self.model_info = Gauge("perfmodel_model_info", "the model serving each role (value 1)",
                                ["role", "version"], registry=self.registry)
        self.jobs_cached = Gauge("perfmodel_jobs_cached", "jobs whose graph this process holds in memory",
                                 registry=self.registry)
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._endpoints: dict[str, tuple[Any, Any]] = {}

    def set_models(self, versions: dict[str, str]) -> None:
        self.model_info.clear()
        for role, version in versions.items():
            self.model_info.labels(role=role, version=version).set(1)

    def count_predictions(self, endpoint: str, total: int, calibrated: int) -> None:
        counters = self._endpoints.get(endpoint)
        if counters is None:  # a label look-up costs microseconds: once per endpoint
            counters = self._endpoints[endpoint] = (self.predictions.labels(endpoint=endpoint),
                                                    self.calibrated.labels(endpoint=endpoint))
        counters[0].inc(total)
        if calibrated:
            counters[1].inc(calibrated)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            children = (self.requests.labels(method=method, route=route, status=str(status)),
                        self.latency.labels(method=method, route=route))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts and times each HTTP request (a plain ASGI middleware: no per-request task or body copy)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            self.metrics.observe_request(scope["method"], getattr(route, "path", UNMATCHED), status,
                                         time.perf_counter() - started)
