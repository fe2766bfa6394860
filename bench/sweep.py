"""Schedulers that search: a batch sweep and cold work over HTTP, on the real app in this process.

    .venv/bin/python bench/sweep.py [--runs 3] [--record]

1. A registered job (resnet50; registration captures it at its batch and at twice it), then one
   `POST /v1/predict/matrix` with a grid of 4 accelerators x 8 device counts x 64 per-device batch sizes (2,048 cells,
   every batch new to the server): the wall time, and how many captures it cost (none: every other batch is made
   from the job's two captures, `perfmodel.graph.batch_affine`).
2. Cold work: 100 new jobs (5 zoo models x 20 batch sizes, each model registered once first) x 5 accelerators in one
   matrix call.
3. Other maths and optimizers: a registered fp32 resnet50 and bert-base, then one matrix call asking each one's
   tf32, amp and AdamW twins (inline specs) on 4 accelerators: they share its graph (`JobSpec.graph_key`), so no
   capture.
Each figure is the median of `--runs` runs on a fresh server (nothing cached between runs but the registration).

Where the time goes (cProfile of the matrix call): a job's graphs at two batches make its kernel rows and what memory
reads of its graph lines in the batch (`perfmodel.predictor.batch_sweep`), so every batch of every job in the call
is priced in one call of the per-op model and composed vectorised, then corrected by the whole-step stage in one
call: no graph, row table or memory walk per batch. What is left: building each (job, math table)'s lines once (three
row tables, ~0.1 s), the per-op model over the distinct kernels of every batch, and pydantic objects per answer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # the graph-capture fork server's children re-import this file, as __mp_main__
    from _figures import add_record_option, record_if_asked  # before this folder leaves the path

# bench/service.py is named like the `service` package (a namespace package, which a module shadows): keep this
# folder off the import path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

ACCELERATORS = ["t4", "a100-sxm4-80gb", "h100-sxm5", "v100-sxm2-32gb"]
MODELS = ["resnet50", "bert-base", "gpt2", "mobilenet_v2", "vit_base_patch16_224"]


def client(home: Path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    os.environ["PERFMODEL_STORE_URL"] = f"sqlite:///{home / 'store.db'}"
    settings = ServiceSettings()
    return TestClient(create_app(settings))


def sweep_once() -> tuple[float, int, int, int]:
    with tempfile.TemporaryDirectory() as home, client(Path(home)) as http:
        job = http.post("/v1/jobs", json={"source": {"kind": "zoo", "name": "resnet50"}, "batch_size": 32}).json()
        engine = http.app.state.service.engine
        before = engine.stats()["captures"]
        grid = {"accelerators": ACCELERATORS, "device_counts": [1, 2, 3, 4, 6, 8, 12, 16],
                "batch_sizes": list(range(4, 260, 4))}
        started = time.perf_counter()
        response = http.post("/v1/predict/matrix", json={"jobs": [job["job_id"]], "grid": grid})
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, response.text
        cells = len(response.json()["throughput_samples_per_s"][0])
        stats = engine.stats()
        return elapsed, cells, stats["captures"] - before, stats["synthesized_graphs"]


def cold_once() -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as home, client(Path(home)) as http:
        for model in MODELS:
            http.post("/v1/jobs", json={"source": {"kind": "zoo", "name": model}, "batch_size": 8})
        engine = http.app.state.service.engine
        before = engine.stats()["captures"]
        jobs = [{"source": {"kind": "zoo", "name": model}, "batch_size": b} for model in MODELS
                for b in range(2, 42, 2)]
        started = time.perf_counter()
        response = http.post("/v1/predict/matrix", json={
            "jobs": jobs, "placements": [{"accelerator": a} for a in [*ACCELERATORS, "l4"]]})
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, response.text
        return elapsed, len(jobs) * 5, engine.stats()["captures"] - before


def twins_once() -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory() as home, client(Path(home)) as http:
        bases = [{"source": {"kind": "zoo", "name": model}, "batch_size": 16} for model in ("resnet50", "bert-base")]
        for base in bases:
            http.post("/v1/jobs", json=base)
        engine = http.app.state.service.engine
        before = engine.stats()["captures"]
        jobs = [{**base, **twin} for base in bases
                for twin in ({"precision": "tf32"}, {"precision": "amp"}, {"optimizer": "adamw"})]
        started = time.perf_counter()
        response = http.post("/v1/predict/matrix", json={
            "jobs": jobs, "placements": [{"accelerator": a} for a in ["t4", "a100-sxm4-80gb", "h100-sxm5", "l4"]]})
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, response.text
        return elapsed, len(jobs) * 4, engine.stats()["captures"] - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    add_record_option(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("PERFMODEL_HOME", tempfile.mkdtemp(prefix="perfmodel-sweep-"))
    sweeps = [sweep_once() for _ in range(args.runs)]
    _, cells, captures, made = sweeps[-1]
    print(f"batch sweep: {cells} cells (4 accelerators x 8 device counts x 64 batch sizes) in "
          f"{statistics.median(s[0] for s in sweeps):.2f} s (median of {args.runs}; target 1 s); captures during "
          f"the sweep: {captures}, graphs made from the job's two captures: {made}")
    colds = [cold_once() for _ in range(args.runs)]
    print(f"cold work: {colds[-1][1]} cells (100 new jobs x 5 accelerators) in "
          f"{statistics.median(c[0] for c in colds):.2f} s (median of {args.runs}; target 5 s); captures: "
          f"{colds[-1][2]}")
    twins = [twins_once() for _ in range(args.runs)]
    print(f"other maths and optimizers: {twins[-1][1]} cells (2 registered fp32 jobs' tf32, amp and AdamW twins x 4 "
          f"accelerators) in {statistics.median(t[0] for t in twins):.2f} s (median of {args.runs}); captures: "
          f"{twins[-1][2]}")
    record_if_asked(args, "sweep", {
        "batch_sweep": {"cells": cells, "median_s": statistics.median(s[0] for s in sweeps), "captures": captures},
        "cold_work": {"cells": colds[-1][1], "median_s": statistics.median(c[0] for c in colds),
                      "captures": colds[-1][2]}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
