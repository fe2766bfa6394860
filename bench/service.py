"""Load benchmark of the real service: `perfmodel serve` (one uvicorn worker, SQLite, the shipped models) on
loopback, driven by a lean asyncio HTTP/1.1 keep-alive client in this process (the server gets one core, the load
generator the other).

    .venv/bin/python bench/service.py                  # ~3 min
    .venv/bin/python bench/service.py --baseline       # also a bare FastAPI + pydantic endpoint, same client

Prints:
- `POST /v1/predict` latency p50/p99 at 1 connection and at 16, and requests/s sustained for `--duration-s` (60 s)
  at 16 connections, with the count of non-200 answers and transport errors. Every request names a registered job
  and one of 20 placements (5 GPUs × 1/2/4/8 devices), all warmed before timing;
- `POST /v1/predict/matrix`: `--matrix-jobs` (1,000) job ids × 10 placements, cold (the first call predicts each
  distinct job's compute on each GPU) and warm (median of `--matrix-repeats`). The 1,000 ids cycle over
  `--distinct-jobs` registered jobs (zoo models × batch sizes), as a queue of repeated job types does;
- the server's resident memory after warm-up, after the predictions (the growth the target bounds: same jobs,
  sustained load) and after registering the matrix jobs (new jobs add their graphs and caches: reported per job).
Targets (issue 6, this 2-core machine): p50 ≤ 1 ms and p99 ≤ 5 ms at 1 connection; ≥ 2,500 requests/s at 16;
matrix ≤ 150 ms; memory growth ≤ 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# this file is named like the `service` package it benchmarks: keep its folder off the import path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from pydantic import BaseModel  # noqa: E402

from perfmodel.client import Client  # noqa: E402
from service.launch import LocalServer, free_port  # noqa: E402

GPUS = ("t4", "v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm5", "l4")
DEVICE_COUNTS = (1, 2, 4, 8)
PREDICT_JOBS = (("resnet50", 32), ("bert-base", 16), ("gpt2", 8), ("mobilenet_v3_small", 64))
MATRIX_MODELS = ("resnet18", "resnet50", "mobilenet_v3_small", "bert-base", "gpt2", "mlp-recommender",
                 "vgg11", "densenet121", "distilbert-base", "efficientnet_b0")
MATRIX_PLACEMENTS = tuple({"accelerator": g, "devices_per_node": [n]} for g in GPUS for n in (1, 8))


@dataclass
class LoadResult:
    connections: int
    duration_s: float
    latencies_s: list[float] = field(default_factory=list)
    non_200: int = 0
    transport_errors: int = 0

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_s) / self.duration_s

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def http_request(path: str, body: dict) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def _connection(port: int, requests: Sequence[bytes], offset: int, deadline: float,
                      result: LoadResult) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        result.transport_errors += 1
        return
    clock = time.perf_counter
    try:
        for i in itertools.count(offset):
            if clock() >= deadline:
                break
            started = clock()
            writer.write(requests[i % len(requests)])
            status = await reader.readline()
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if not line:
                    raise ConnectionError("the server closed the connection")
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            result.latencies_s.append(clock() - started)
            if status[9:12] != b"200":
                result.non_200 += 1
    except (OSError, ConnectionError, asyncio.IncompleteReadError):
        result.transport_errors += 1
    finally:
        writer.close()


async def _load(port: int, requests: Sequence[bytes], connections: int, duration_s: float) -> LoadResult:
    result = LoadResult(connections, duration_s)
    deadline = time.perf_counter() + duration_s
    await asyncio.gather(*(_connection(port, requests, 7 * c, deadline, result) for c in range(connections)))
    return result


def run_load(port: int, requests: Sequence[bytes], connections: int, duration_s: float) -> LoadResult:
    try:
        import uvloop
        return uvloop.run(_load(port, requests, connections, duration_s))
    except ImportError:
        return asyncio.run(_load(port, requests, connections, duration_s))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def report_load(name: str, result: LoadResult) -> None:
    print(f"{name:<34} {result.connections:>5} {len(result.latencies_s):>9,} {result.requests_per_s:>9,.0f} "
          f"{result.percentile_ms(0.5):>8.2f} {result.percentile_ms(0.99):>8.2f} "
          f"{result.non_200:>7} {result.transport_errors:>6}")


def matrix_jobs(client: Client, distinct: int) -> list[str]:
    """Register `distinct` jobs (zoo models × batch sizes 1, 2, 4, ...) and return their ids."""
    batches = [2 ** k for k in range(-(-distinct // len(MATRIX_MODELS)))]
    specs = itertools.islice(((m, b) for b in batches for m in MATRIX_MODELS), distinct)
    started = time.perf_counter()
    ids = [client.register_job(zoo=m, batch_size=b)["job_id"] for m, b in specs]
    print(f"registered {len(ids)} distinct matrix jobs in {time.perf_counter() - started:.1f} s "
          f"({1e3 * (time.perf_counter() - started) / len(ids):.0f} ms each: graph capture on the meta device)")
    return ids


def time_matrix(client: Client, jobs: Sequence[str], repeats: int) -> tuple[float, list[float]]:
    started = time.perf_counter()
    answer = client.matrix(jobs, list(MATRIX_PLACEMENTS))
    cold_s = time.perf_counter() - started
    cells = sum(len(row) for row in answer["throughput_samples_per_s"])
    assert cells == len(jobs) * len(MATRIX_PLACEMENTS), cells
    warm = []
    for _ in range(repeats):
        started = time.perf_counter()
        client.matrix(jobs, list(MATRIX_PLACEMENTS))
        warm.append(time.perf_counter() - started)
    return cold_s, warm


def baseline(args: argparse.Namespace) -> None:
    """The same load on a bare FastAPI endpoint that validates a pydantic body of the same shape and answers a
    small JSON object: what the framework alone costs on this machine."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        import subprocess
        process = subprocess.Popen([sys.executable, __file__, "--serve-baseline", str(port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        try:
            with Client(f"http://127.0.0.1:{port}") as probe:
                for _ in range(100):
                    try:
                        probe.health()
                        break
                    except Exception:
                        time.sleep(0.1)
            body = {"job": "0" * 24, "placement": {"accelerator": "a100", "devices_per_node": [4]}}
            requests = [http_request("/v1/predict", body)]
            run_load(port, requests, 1, 2)
            report_load("bare FastAPI, 1 connection", run_load(port, requests, 1, args.latency_s))
            report_load("bare FastAPI, 16 connections", run_load(port, requests, 16, args.latency_s))
        finally:
            process.terminate()
            process.wait()


class BaselinePlacement(BaseModel):
    accelerator: str
    devices_per_node: list[int]


class BaselineBody(BaseModel):
    job: str
    placement: BaselinePlacement


def serve_baseline(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/v1/predict")
    async def predict(body: BaselineBody) -> dict:
        return {"job": body.job, "devices": sum(body.placement.devices_per_node), "throughput_samples_per_s": 1.0}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, server_header=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=60.0, help="sustained run at 16 connections")
    parser.add_argument("--latency-s", type=float, default=10.0, help="each latency run")
    parser.add_argument("--distinct-jobs", type=int, default=100)
    parser.add_argument("--matrix-jobs", type=int, default=1000)
    parser.add_argument("--matrix-repeats", type=int, default=10)
    parser.add_argument("--baseline", action="store_true", help="also measure a bare FastAPI endpoint")
    parser.add_argument("--serve-baseline", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(args.serve_baseline)
        return

    with tempfile.TemporaryDirectory() as home, LocalServer({"PERFMODEL_HOME": home}) as server, \
            Client(server.url, timeout_s=600) as client:
        print(f"perfmodel serve on {server.url} (pid {server.pid}), models {client.models()['serving']}")
        ids = [client.register_job(zoo=m, batch_size=b)["job_id"] for m, b in PREDICT_JOBS]
        placements = [{"accelerator": g, "devices_per_node": [n]} for g in GPUS for n in DEVICE_COUNTS]
        bodies = [{"job": j, "placement": p} for j in ids for p in placements]
        started = time.perf_counter()
        for body in bodies:  # warm: each job's compute on each GPU is predicted once, then cached
            client.predict(body["job"], body["placement"])
        print(f"warmed {len(bodies)} (job, placement) pairs in {time.perf_counter() - started:.1f} s")
        requests = [http_request("/v1/predict", b) for b in bodies]
        run_load(server.port, requests, 16, 3)  # warm the server's code paths and connection handling
        rss_before = rss_bytes(server.pid)

        print(f"\n{'POST /v1/predict':<34} {'conns':>5} {'requests':>9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'non-200':>7} {'errors':>6}")
        one = run_load(server.port, requests, 1, args.latency_s)
        report_load(f"latency, {args.latency_s:.0f} s", one)
        sixteen = run_load(server.port, requests, 16, args.duration_s)
        report_load(f"sustained, {args.duration_s:.0f} s", sixteen)
        rss_after_load = rss_bytes(server.pid)
        if args.baseline:
            baseline(args)

        print()
        jobs = matrix_jobs(client, args.distinct_jobs)
        queue = [jobs[i % len(jobs)] for i in range(args.matrix_jobs)]
        cold_s, warm_s = time_matrix(client, queue, args.matrix_repeats)
        print(f"POST /v1/predict/matrix, {len(queue):,} jobs ({len(jobs)} distinct) × {len(MATRIX_PLACEMENTS)} "
              f"placements: cold {1e3 * cold_s:.0f} ms; warm median {1e3 * statistics.median(warm_s):.0f} ms, "
              f"max {1e3 * max(warm_s):.0f} ms over {len(warm_s)} calls (client-side wall time: request encode, "
              f"HTTP, response decode)")
        rss_after_matrix = rss_bytes(server.pid)
        print(f"server resident memory: {rss_before / 2**20:.0f} MiB after warm-up, {rss_after_load / 2**20:.0f} MiB "
              f"after the {one.duration_s + sixteen.duration_s:.0f} s of predictions "
              f"({100 * (rss_after_load / rss_before - 1):+.1f} %), {rss_after_matrix / 2**20:.0f} MiB once the "
              f"{len(jobs)} matrix jobs are registered and predicted "
              f"({(rss_after_matrix - rss_after_load) / 2**20 / len(jobs):.1f} MiB per job: graph and compute caches)")
        print("\nsummary vs targets:")
        checks = [
            ("p50 at 1 connection ≤ 1 ms", one.percentile_ms(0.5), one.percentile_ms(0.5) <= 1.0),
            ("p99 at 1 connection ≤ 5 ms", one.percentile_ms(0.99), one.percentile_ms(0.99) <= 5.0),
            ("req/s at 16 connections ≥ 2,500", sixteen.requests_per_s, sixteen.requests_per_s >= 2500),
            ("zero errors in the sustained run", sixteen.non_200 + sixteen.transport_errors,
             sixteen.non_200 + sixteen.transport_errors == 0),
            ("warm matrix ≤ 150 ms", 1e3 * statistics.median(warm_s), statistics.median(warm_s) <= 0.150),
            ("memory growth under load ≤ 10 %", 100 * (rss_after_load / rss_before - 1),
             rss_after_load <= 1.10 * rss_before),
        ]
        for name, value, met in checks:
            print(f"  {name:<36} {value:>10,.2f}  {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
