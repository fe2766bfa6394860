"""Load benchmark of the real service: `perfmodel serve` (one uvicorn worker, SQLite, the shipped models) on
loopback, driven by wrk (Debian's `wrk`; one wrk thread, so the server gets one core and the load generator the
other), next to a bare FastAPI endpoint that validates a pydantic body of the same shape, in the same run: the
ratio of the two is the figure, since these machines are shared and noisy.

    .venv/bin/python bench/service.py [--record]       # ~4 min
    .venv/bin/python bench/service.py --duration-s 10 --matrix-jobs 200   # a quick look

Prints:
- `POST /v1/predict` requests/s at 16 connections for `--duration-s` (30 s), the service's and the bare
  endpoint's, and their ratio (target >= 70 %); latency p50/p99 at 1 connection (target p99 <= 5 ms); non-2xx and
  socket errors. Every request names a registered job and one of 56 placements (8 GPUs × 1, 2, 4 or 8 devices on one
  node, or 2, 4 or 8 split over two), all warmed before timing; wrk's Lua script cycles through them;
- `POST /v1/predict/matrix`: `--matrix-jobs` (1,000) job ids × 10 placements, cold (the first call predicts each
  distinct job's compute on each GPU) and warm (median of `--matrix-repeats`; target <= 150 ms). The 1,000 ids
  cycle over `--distinct-jobs` registered jobs (zoo models × batch sizes), as a queue of repeated job types does;
- `POST /v1/predict` p99 while two other clients register big zoo jobs, then inline IRs (Llama-7B, GPT-2 medium)
  (target <= 50 ms);
- the server's resident memory after warm-up, after the load, and after registering the matrix jobs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _figures import add_record_option, record_if_asked  # imported before this folder leaves the path

# this file is named like the `service` package it benchmarks: keep its folder off the import path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from pydantic import BaseModel  # noqa: E402

from perfmodel.client import Client  # noqa: E402
from service.launch import LocalServer, free_port  # noqa: E402

GPUS = ("t4", "v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm5", "l4")
# what `POST /v1/predict` is asked: 8 accelerators x 1-8 GPUs on one node or split over two
PREDICT_GPUS = (*GPUS, "a10", "rtx-4090", "l40s")
LAYOUTS = ((1,), (2,), (4,), (8,), (1, 1), (2, 2), (4, 4))
PREDICT_JOBS = (("resnet50", 32), ("bert-base", 16), ("gpt2", 8), ("mobilenet_v3_small", 64))
MATRIX_MODELS = ("resnet18", "resnet50", "mobilenet_v3_small", "bert-base", "gpt2", "mlp-recommender",
                 "vgg11", "densenet121", "distilbert-base", "efficientnet_b0")
MATRIX_PLACEMENTS = tuple({"accelerator": g, "devices_per_node": [n]} for g in GPUS for n in (1, 8))


WRK_SCRIPT = """
local bodies = {BODIES}
local UNIQUE = {UNIQUE}
local FIRST = {FIRST}  -- unique bodies of one run never repeat another run's
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  local body = bodies[(i % #bodies) + 1]
  if UNIQUE then  -- every body new: the placement's network latency differs each time, so no cache can answer
    body = body:gsub("LATENCY_US", string.format("%d.%d", math.floor((FIRST + i) / 10), (FIRST + i) % 10))
  end
  return wrk.format(nil, nil, nil, body)
end
done = function(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format("WRK {\\"requests\\": %d, \\"duration_us\\": %d, \\"p50_us\\": %d, \\"p99_us\\": %d, "
    .. "\\"non_2xx\\": %d, \\"socket_errors\\": %d}\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), summary.errors.status, errors))
end
"""


@dataclass(frozen=True)
class LoadResult:
    connections: int
    requests: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s


_unique_runs = itertools.count()


def run_wrk(port: int, path: str, bodies: Sequence[dict], connections: int, duration_s: float, *,
            unique: bool = False) -> LoadResult:
    """wrk, one thread, `connections` keep-alive connections for `duration_s`, cycling through `bodies`; with
    `unique`, each body's placement gets `inter_node_latency_us` from a counter that no other run of this process
    shares: every request is new."""
    if unique:
        bodies = [{**b, "placement": {**b["placement"], "inter_node_latency_us": "LATENCY_US"}} for b in bodies]
    lua_bodies = "{" + ", ".join(json.dumps(json.dumps(b, separators=(",", ":")).replace('"LATENCY_US"', "LATENCY_US"))
                                 for b in bodies) + "}"
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT.replace("{BODIES}", lua_bodies).replace("{UNIQUE}", "true" if unique else "false")
                     .replace("{FIRST}", str(10_000_000 * next(_unique_runs))))
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s", "--timeout", "5s",
                              "-s", script.name, f"http://127.0.0.1:{port}{path}"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        Path(script.name).unlink()
    line = next(line for line in out.splitlines() if line.startswith("WRK "))
    figures = json.loads(line[4:])
    return LoadResult(connections, figures["requests"], figures["duration_us"] / 1e6, figures["p50_us"] / 1e3,
                      figures["p99_us"] / 1e3, figures["non_2xx"], figures["socket_errors"])


BIG_JOBS = ("gpt2-medium", "bert-large", "t5-base", "opt-350m", "vit_base_patch16_224", "densenet169")
# inline graph IRs (what `perfmodel graph --json` prints on a client's machine): parsed, checked, hashed and stored in
# the server's own process, not in the capture child
LLAMA_7B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
            "vocab_size": 32000, "max_position_embeddings": 4096}


def big_irs() -> list[tuple[dict, int]]:
    """The IRs of Llama-7B (batch 1, 512 tokens; ~0.8 MB, 1,928 nodes) and GPT-2 medium (batch 4; ~0.4 MB), with
    their batch."""
    from perfmodel.graph import graph_for_job
    from perfmodel.jobs.spec import JobSpec

    specs = [JobSpec.from_options(hf_config=LLAMA_7B, batch_size=1, seq_len=512),
             JobSpec.from_options(zoo="gpt2-medium", batch_size=4)]
    return [(json.loads(graph_for_job(spec).to_json()), spec.batch_size) for spec in specs]


def while_registering(server: LocalServer, bodies: Sequence[dict], duration_s: float,
                      irs: Sequence[tuple[dict, int]] = ()) -> LoadResult:
    """`POST /v1/predict` at 16 connections (bodies asked before) while two other clients register jobs one after
    another: big zoo jobs (each: a capture in the fork-server child, the graph parsed and stored, two more
    captures), or, with `irs`, those inline IRs under a new name each time (each: the IR parsed, checked, hashed and
    stored in the server's process)."""
    import threading

    stop = threading.Event()
    registered: list[float] = []

    def register(offset: int) -> None:
        with Client(server.url, timeout_s=600) as other:
            for k in itertools.count():
                if stop.is_set():
                    return
                started = time.perf_counter()
                if irs:
                    ir, batch = irs[(k + offset) % len(irs)]
                    other.register_job(ir={**ir, "name": f"{ir['name']}-{offset}-{k}"}, batch_size=batch)
                else:
                    other.register_job(zoo=BIG_JOBS[(2 * k + offset) % len(BIG_JOBS)], batch_size=3 + k)
                registered.append(time.perf_counter() - started)

    clients = [threading.Thread(target=register, args=(i,), daemon=True) for i in range(2)]
    for thread in clients:
        thread.start()
    time.sleep(1.0)  # both registrations under way
    result = run_wrk(server.port, "/v1/predict", bodies, 16, duration_s)
    stop.set()
    what = "inline IRs (Llama-7B, GPT-2 medium)" if irs else "big zoo jobs"
    report_load(f"perfmodel, 16 conns, 2 clients registering {'IRs' if irs else 'zoo jobs'}", result)
    print(f"predict while two clients register {what} ({len(registered)} registered during the run, "
          f"{statistics.median(registered) if registered else float('nan'):.2f} s each): p99 {result.p99_ms:.1f} ms "
          f"at 16 connections (target 50 ms)")
    for thread in clients:
        thread.join(timeout=600)
    return result


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def report_load(name: str, result: LoadResult) -> None:
    print(f"{name:<40} {result.connections:>5} {result.requests:>9,} {result.requests_per_s:>9,.0f} "
          f"{result.p50_ms:>8.2f} {result.p99_ms:>8.2f} {result.non_2xx:>7} {result.socket_errors:>6}")


def matrix_jobs(client: Client, distinct: int) -> tuple[list[str], float]:
    """Register `distinct` jobs (zoo models × batch sizes 1, 2, 4, ...): their ids, and the ms per job."""
    batches = [2 ** k for k in range(-(-distinct // len(MATRIX_MODELS)))]
    specs = itertools.islice(((m, b) for b in batches for m in MATRIX_MODELS), distinct)
    started = time.perf_counter()
    ids = [client.register_job(zoo=m, batch_size=b)["job_id"] for m, b in specs]
    per_job_ms = 1e3 * (time.perf_counter() - started) / len(ids)
    print(f"registered {len(ids)} distinct matrix jobs in {time.perf_counter() - started:.1f} s "
          f"({per_job_ms:.0f} ms each: graph capture on the meta device)")
    return ids, per_job_ms


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


class BareServer:
    """The bare FastAPI endpoint in a child process (this file with --serve-baseline)."""

    def __enter__(self) -> BareServer:
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, __file__, "--serve-baseline", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with Client(f"http://127.0.0.1:{self.port}") as probe:
            for _ in range(200):
                try:
                    probe.health()
                    return self
                except Exception:
                    time.sleep(0.1)
        raise RuntimeError("the bare FastAPI endpoint did not start")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait()


class BaselinePlacement(BaseModel):
    accelerator: str
    devices_per_node: list[int]
    global_batch_size: int = 1
    inter_node_latency_us: float = 5.0


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
    parser.add_argument("--duration-s", type=float, default=30.0, help="each run at 16 connections")
    parser.add_argument("--latency-s", type=float, default=10.0, help="the run at 1 connection")
    parser.add_argument("--distinct-jobs", type=int, default=100)
    parser.add_argument("--matrix-jobs", type=int, default=1000)
    parser.add_argument("--matrix-repeats", type=int, default=10)
    parser.add_argument("--serve-baseline", type=int, metavar="PORT", help=argparse.SUPPRESS)
    add_record_option(parser)
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(args.serve_baseline)
        return
    if shutil.which("wrk") is None:
        sys.exit("bench/service.py needs wrk on PATH (Debian: apt-get install wrk)")

    with tempfile.TemporaryDirectory() as home, LocalServer({"PERFMODEL_HOME": home}) as server, \
            Client(server.url, timeout_s=600) as client, BareServer() as bare:
        print(f"perfmodel serve on {server.url} (pid {server.pid}), models {client.models()['serving']}; "
              f"bare FastAPI on port {bare.port}")
        irs = big_irs()
        ids = [client.register_job(zoo=m, batch_size=b)["job_id"] for m, b in PREDICT_JOBS]
        placements = [{"accelerator": g, "devices_per_node": list(n)} for g in PREDICT_GPUS for n in LAYOUTS]
        bodies = [{"job": j, "placement": p} for j in ids for p in placements]
        started = time.perf_counter()
        for body in bodies:  # warm: each job's compute on each GPU is predicted once, then cached
            client.predict(body["job"], body["placement"])
        print(f"warmed {len(bodies)} (job, placement) pairs in {time.perf_counter() - started:.1f} s")
        bare_bodies = [{"job": b["job"], "placement": {**b["placement"], "global_batch_size": 32}} for b in bodies]
        run_wrk(server.port, "/v1/predict", bodies, 16, 3)  # warm both servers' code paths and connections
        run_wrk(bare.port, "/v1/predict", bare_bodies, 16, 3)
        rss_before = rss_bytes(server.pid)

        print(f"\n{'POST /v1/predict (wrk)':<40} {'conns':>5} {'requests':>9} {'req/s':>9} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'non-2xx':>7} {'errors':>6}")
        one = run_wrk(server.port, "/v1/predict", bodies, 1, args.latency_s)
        report_load("perfmodel, latency", one)
        bare_one = run_wrk(bare.port, "/v1/predict", bare_bodies, 1, args.latency_s)
        report_load("bare FastAPI + pydantic, latency", bare_one)
        # alternate the two at 16 connections, twice each, so that a noisy neighbour hits both alike
        runs: dict[str, list[LoadResult]] = {"perfmodel": [], "bare": []}
        for _ in range(2):
            runs["perfmodel"].append(run_wrk(server.port, "/v1/predict", bodies, 16, args.duration_s / 2))
            runs["bare"].append(run_wrk(bare.port, "/v1/predict", bare_bodies, 16, args.duration_s / 2))
        for name, results in runs.items():
            for result in results:
                report_load(f"{name}, 16 connections", result)
        service_rps = sum(r.requests for r in runs["perfmodel"]) / sum(r.duration_s for r in runs["perfmodel"])
        bare_rps = sum(r.requests for r in runs["bare"]) / sum(r.duration_s for r in runs["bare"])
        ratio = service_rps / bare_rps
        print(f"repeated bodies: {service_rps:,.0f} req/s against the bare endpoint's {bare_rps:,.0f} req/s = "
              f"{100 * ratio:.0f} % of the floor (answers of bodies seen before come from the response cache)")
        unique: dict[str, list[LoadResult]] = {"perfmodel": [], "bare": []}
        for _ in range(2):
            unique["perfmodel"].append(run_wrk(server.port, "/v1/predict", bodies, 16, args.duration_s / 2,
                                               unique=True))
            unique["bare"].append(run_wrk(bare.port, "/v1/predict", bare_bodies, 16, args.duration_s / 2,
                                          unique=True))
        for name, results in unique.items():
            for result in results:
                report_load(f"{name}, 16 conns, every body new", result)
        unique_rps = sum(r.requests for r in unique["perfmodel"]) / sum(r.duration_s for r in unique["perfmodel"])
        unique_bare = sum(r.requests for r in unique["bare"]) / sum(r.duration_s for r in unique["bare"])
        unique_p99 = max(r.p99_ms for r in unique["perfmodel"])
        print(f"every body new: {unique_rps:,.0f} req/s against the bare endpoint's {unique_bare:,.0f} req/s = "
              f"{100 * unique_rps / unique_bare:.0f} % of the floor (target 70 %), p99 {unique_p99:.1f} ms at 16 "
              f"connections (target 20 ms)")
        rss_after_load = rss_bytes(server.pid)
        registering = while_registering(server, bodies, args.duration_s / 2)
        registering_irs = while_registering(server, bodies, args.duration_s / 2, irs)
        errors = sum(r.non_2xx + r.socket_errors
                     for r in [one, *runs["perfmodel"], *unique["perfmodel"], registering, registering_irs])

        print()
        jobs, register_ms = matrix_jobs(client, args.distinct_jobs)
        queue = [jobs[i % len(jobs)] for i in range(args.matrix_jobs)]
        cold_s, warm_s = time_matrix(client, queue, args.matrix_repeats)
        print(f"POST /v1/predict/matrix, {len(queue):,} jobs ({len(jobs)} distinct) × {len(MATRIX_PLACEMENTS)} "
              f"placements: cold {1e3 * cold_s:.0f} ms; warm median {1e3 * statistics.median(warm_s):.0f} ms, "
              f"max {1e3 * max(warm_s):.0f} ms over {len(warm_s)} calls (client-side wall time: request encode, "
              f"HTTP, response decode)")
        rss_after_matrix = rss_bytes(server.pid)
        print(f"server resident memory: {rss_before / 2**20:.0f} MiB after warm-up, {rss_after_load / 2**20:.0f} MiB "
              f"after the load ({100 * (rss_after_load / rss_before - 1):+.1f} %), {rss_after_matrix / 2**20:.0f} "
              f"MiB once the {len(jobs)} matrix jobs are registered and predicted "
              f"({(rss_after_matrix - rss_after_load) / 2**20 / len(jobs):.1f} MiB per job: graph and compute caches)")
        unique_ratio = unique_rps / unique_bare
        print("\nsummary vs targets:")
        checks = [
            ("repeated bodies >= 70 % of the bare floor", 100 * ratio, ratio >= 0.70),
            ("every body new >= 70 % of the floor", 100 * unique_ratio, unique_ratio >= 0.70),
            ("every body new: p99 <= 20 ms", unique_p99, unique_p99 <= 20.0),
            ("p99 at 1 connection <= 5 ms", one.p99_ms, one.p99_ms <= 5.0),
            ("zero non-2xx / socket errors", errors, errors == 0),
            ("warm matrix <= 150 ms", 1e3 * statistics.median(warm_s), statistics.median(warm_s) <= 0.150),
            ("memory growth under load <= 10 %", 100 * (rss_after_load / rss_before - 1),
             rss_after_load <= 1.10 * rss_before),
            ("p99 while 2 register zoo jobs <= 50 ms", registering.p99_ms, registering.p99_ms <= 50.0),
            ("p99 while 2 register IRs <= 50 ms", registering_irs.p99_ms, registering_irs.p99_ms <= 50.0),
        ]
        for name, value, met in checks:
            print(f"  {name:<40} {value:>10,.2f}  {'met' if met else 'MISSED'}")
        record_if_asked(args, "service", {
            "repeated_bodies": {"req_per_s": service_rps, "bare_req_per_s": bare_rps, "of_floor_pct": 100 * ratio,
                                "p99_ms": max(r.p99_ms for r in runs["perfmodel"]), "errors": errors},
            "new_bodies": {"req_per_s": unique_rps, "bare_req_per_s": unique_bare,
                           "of_floor_pct": 100 * unique_ratio, "p99_ms": unique_p99},
            "while_registering": {"p99_ms": registering.p99_ms},
            "while_registering_irs": {"p99_ms": registering_irs.p99_ms},
            "one_connection": {"p50_ms": one.p50_ms, "p99_ms": one.p99_ms, "bare_p50_ms": bare_one.p50_ms,
                               "bare_p99_ms": bare_one.p99_ms},
            "matrix": {"warm_median_ms": 1e3 * statistics.median(warm_s), "warm_max_ms": 1e3 * max(warm_s),
                       "warm_calls": len(warm_s), "cold_s": cold_s},
            "rss_mib": {"after_warmup": rss_before / 2**20, "after_load": rss_after_load / 2**20,
                        "growth_pct": 100 * (rss_after_load / rss_before - 1)},
            "register_ms_per_job": register_ms})

if __name__ == "__main__":
    main()
