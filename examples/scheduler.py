"""A small scheduler that places a queue of training jobs on a mixed GPU cluster with perfmodel's predictions.

    .venv/bin/python examples/scheduler.py                    # starts a local `perfmodel serve`, ~1 min
    .venv/bin/python examples/scheduler.py --url http://host:8000 --token TOKEN --jobs 60 --seed 3

Cluster: 8×H100 (one node), 16×A100 (two nodes of 8), 32×T4 (eight nodes of 4). Each queued job is a model with
a per-device batch, the number of GPUs it asks for and the samples it must process. Two policies are simulated on
the same cluster and the same job durations:

- `perfmodel`: one `POST /v1/predict/matrix` call gives every job's throughput and memory fit on every GPU type at
  its device count. Longest predicted job first; each job goes to the GPU type where it would finish earliest
  (when that type has room, by the predicted ends of the jobs running there, plus the predicted duration); it
  starts if that type has room now and waits otherwise. When a job ends the scheduler posts the throughput it
  reached (`POST /v1/observations`) and refreshes the matrix: later predictions of that job are calibrated.
- `blind`: first come, first served, on whichever GPU type has room, treating GPUs as interchangeable. A job that
  does not fit the GPU's memory fails after `--oom-cost-s` and is requeued, avoiding that type.

No GPU runs here, so a job's true duration is simulated: the throughput the service predicted (uncalibrated)
times a log-normal error of `--error` (default 0.15, about the model's measured error), fixed per job and GPU
type and hidden from both policies. The output is each policy's makespan.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from perfmodel.client import Client

# (accelerator, nodes, devices per node)
CLUSTER = (("h100-sxm5", 1, 8), ("a100-sxm4-80gb", 2, 8), ("t4", 8, 4))
# (zoo model, per-device batch): job types of the queue
TEMPLATES = (("resnet50", 64), ("resnet18", 128), ("bert-base", 32), ("bert-large", 8), ("gpt2", 16),
             ("gpt2-medium", 32), ("vit_base_patch16_224", 64), ("mobilenet_v3_large", 128), ("t5-base", 16),
             ("opt-350m", 16), ("llama-160m", 64), ("mlp-recommender", 2048))
DEVICE_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class QueuedJob:
    index: int
    model: str
    batch_size: int
    devices: int
    samples: float
    job_id: str = ""


@dataclass
class Cluster:
    free: dict[str, list[int]]  # accelerator -> free devices per node
    per_node: dict[str, int]

    @classmethod
    def of(cls, layout: Sequence[tuple[str, int, int]]) -> Cluster:
        return cls({name: [size] * nodes for name, nodes, size in layout}, {name: size for name, _, size in layout})

    def take(self, accelerator: str, devices: int) -> list[int] | None:
        """Nodes for a consolidated placement (as few nodes as possible), taken; None if there is no room."""
        free, size = self.free[accelerator], self.per_node[accelerator]
        if devices <= size:
            for node, count in enumerate(free):
                if count >= devices:
                    free[node] -= devices
                    return [node] * devices
            return None
        whole = [node for node, count in enumerate(free) if count == size][: math.ceil(devices / size)]
        if len(whole) * size < devices:
            return None
        nodes = [node for node in whole for _ in range(size)][:devices]
        for node in nodes:
            free[node] -= 1
        return nodes

    def give_back(self, accelerator: str, nodes: list[int]) -> None:
        for node in nodes:
            self.free[accelerator][node] += 1

    def has_room(self, accelerator: str, devices: int) -> bool:
        taken = self.take(accelerator, devices)
        if taken is not None:
            self.give_back(accelerator, taken)
        return taken is not None

    def copy(self) -> Cluster:
        return Cluster({name: list(free) for name, free in self.free.items()}, self.per_node)


def placement_of(accelerator: str, devices: int, per_node: int) -> dict:
    full, rest = divmod(devices, per_node)
    return {"accelerator": accelerator, "devices_per_node": [per_node] * full + ([rest] if rest else [])}


@dataclass
class Matrix:
    """Throughput (samples/s) and fit of each job id on each (accelerator, device count)."""

    throughput: dict[tuple[str, str, int], float] = field(default_factory=dict)
    fits: dict[tuple[str, str, int], bool] = field(default_factory=dict)

    @classmethod
    def fetch(cls, client: Client, job_ids: Sequence[str], cluster: Cluster) -> Matrix:
        columns = [(name, n) for name in cluster.free for n in DEVICE_COUNTS]
        answer = client.matrix(list(job_ids), [placement_of(name, n, cluster.per_node[name]) for name, n in columns])
        matrix = cls()
        for job_id, throughputs, fits in zip(job_ids, answer["throughput_samples_per_s"], answer["fits"]):
            for (name, n), value, fit in zip(columns, throughputs, fits):
                matrix.throughput[job_id, name, n] = value
                matrix.fits[job_id, name, n] = fit
        return matrix

    def duration_s(self, job: QueuedJob, accelerator: str) -> float:
        key = (job.job_id, accelerator, job.devices)
        return job.samples / self.throughput[key] if self.fits[key] else math.inf


@dataclass(frozen=True)
class Run:
    policy: str
    makespan_s: float
    placed: dict[int, str]  # job index -> accelerator it completed on
    failures: int


@dataclass(frozen=True)
class Running:
    true_end_s: float
    index: int
    accelerator: str
    nodes: list[int]
    ok: bool  # false: it does not fit and fails at true_end_s
    predicted_end_s: float

    def __lt__(self, other: Running) -> bool:
        return (self.true_end_s, self.index) < (other.true_end_s, other.index)


def simulate(policy: str, queue: Sequence[QueuedJob], layout: Sequence[tuple[str, int, int]],
             true_duration_s: Callable[[QueuedJob, str], float], *, oom_cost_s: float,
             predicted: Callable[[], Matrix] | None = None,
             on_finish: Callable[[QueuedJob, str, float], None] | None = None) -> Run:
    """Event-driven run of one policy ('perfmodel' needs `predicted`, the current matrix). `true_duration_s` is
    inf where the job does not fit."""
    cluster = Cluster.of(layout)
    now, running = 0.0, []  # heap of Running, by true end
    waiting = list(queue)
    excluded: dict[int, set[str]] = {job.index: set() for job in queue}
    placed: dict[int, str] = {}
    failures = 0
    matrix = predicted() if predicted else None
    while waiting or running:
        if matrix is not None:
            waiting.sort(key=lambda j: -min(matrix.duration_s(j, a) for a in cluster.free))
        for job in list(waiting):
            if policy == "blind":
                choice = _first_with_room(job, cluster, excluded[job.index])
            else:
                assert matrix is not None
                choice = _earliest_finish(job, cluster, matrix, running, now)
            if choice is None:
                continue
            nodes = cluster.take(choice, job.devices)
            assert nodes is not None
            duration = true_duration_s(job, choice)
            ok = math.isfinite(duration)
            predicted_s = matrix.duration_s(job, choice) if matrix is not None else duration
            heapq.heappush(running, Running(now + (duration if ok else oom_cost_s), job.index, choice, nodes, ok,
                                            now + predicted_s))
            waiting.remove(job)
        if not running:
            raise RuntimeError(f"{policy}: jobs {[j.index for j in waiting]} fit no GPU type of the cluster")
        done = heapq.heappop(running)
        now = done.true_end_s
        cluster.give_back(done.accelerator, done.nodes)
        job = next(j for j in queue if j.index == done.index)
        if done.ok:
            placed[job.index] = done.accelerator
            if on_finish is not None:
                on_finish(job, done.accelerator, job.samples / true_duration_s(job, done.accelerator))
                matrix = predicted() if predicted else None
        else:
            failures += 1
            excluded[job.index].add(done.accelerator)
            waiting.insert(0, job)
    return Run(policy, now, placed, failures)


def _first_with_room(job: QueuedJob, cluster: Cluster, excluded: set[str]) -> str | None:
    """Blind: the first GPU type with room for the job (and where it has not failed yet)."""
    for name in cluster.free:
        if name not in excluded and cluster.has_room(name, job.devices):
            return name
    return None


def _earliest_finish(job: QueuedJob, cluster: Cluster, matrix: Matrix, running: Sequence[Running],
                     now: float) -> str | None:
    """perfmodel: the GPU type where the job would finish first, if it has room now; else None (wait for it)."""
    finish: dict[str, tuple[float, float]] = {}
    for name in cluster.free:
        duration = matrix.duration_s(job, name)
        if math.isfinite(duration):
            start = _room_at(cluster, name, job.devices, running, now)
            finish[name] = (start + duration, start)
    if not finish:
        return None
    best = min(finish, key=finish.__getitem__)
    return best if cluster.has_room(best, job.devices) else None


def _room_at(cluster: Cluster, name: str, devices: int, running: Sequence[Running], now: float) -> float:
    """When the GPU type will have room for `devices`, by the predicted ends of the jobs running on it (a job past
    its predicted end is taken to end now; inf: never)."""
    if cluster.has_room(name, devices):
        return now
    free = cluster.copy()
    for job in sorted((r for r in running if r.accelerator == name), key=lambda r: r.predicted_end_s):
        free.give_back(name, job.nodes)
        if free.take(name, devices) is not None:
            return max(now, job.predicted_end_s)
    return math.inf


def make_queue(jobs: int, seed: int) -> list[QueuedJob]:
    rng = random.Random(seed)
    queue = []
    for index in range(jobs):
        model, batch = rng.choice(TEMPLATES)
        devices = rng.choice(DEVICE_COUNTS)
        samples = devices * batch * rng.randint(2_000, 20_000)  # 2k-20k iterations
        queue.append(QueuedJob(index, model, batch, devices, float(samples)))
    return queue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running perfmodel service (default: start one on loopback)")
    parser.add_argument("--token", help="bearer token for writes (jobs, observations)")
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--error", type=float, default=0.15, help="σ of the simulated log-normal prediction error")
    parser.add_argument("--oom-cost-s", type=float, default=120.0, help="time a job that does not fit wastes")
    args = parser.parse_args()

    with ExitStack() as stack:
        url = args.url
        if url is None:
            from service.launch import LocalServer

            home = stack.enter_context(tempfile.TemporaryDirectory())
            url = stack.enter_context(LocalServer({"PERFMODEL_HOME": home})).url
        client = stack.enter_context(Client(url, token=args.token, timeout_s=600))
        print(f"perfmodel service at {url}; cluster: "
              + ", ".join(f"{nodes * size}×{name} ({nodes} node(s) of {size})" for name, nodes, size in CLUSTER))
        ids = {(m, b): client.register_job(zoo=m, batch_size=b)["job_id"] for m, b in dict.fromkeys(
            (j.model, j.batch_size) for j in make_queue(args.jobs, args.seed))}
        queue = [QueuedJob(j.index, j.model, j.batch_size, j.devices, j.samples, ids[j.model, j.batch_size])
                 for j in make_queue(args.jobs, args.seed)]
        cluster = Cluster.of(CLUSTER)
        truth = Matrix.fetch(client, list(ids.values()), cluster)  # before any observation: uncalibrated
        rng = random.Random(args.seed + 1)
        error = {(j.index, a): math.exp(rng.gauss(0, args.error)) for j in queue for a in cluster.free}

        def true_duration_s(job: QueuedJob, accelerator: str) -> float:
            return truth.duration_s(job, accelerator) * error[job.index, accelerator]

        def observe(job: QueuedJob, accelerator: str, throughput: float) -> None:
            client.observe(job.job_id, placement_of(accelerator, job.devices, cluster.per_node[accelerator]),
                           throughput_samples_per_s=throughput)

        blind = simulate("blind", queue, CLUSTER, true_duration_s, oom_cost_s=args.oom_cost_s)
        aware = simulate("perfmodel", queue, CLUSTER, true_duration_s, oom_cost_s=args.oom_cost_s,
                         predicted=lambda: Matrix.fetch(client, list(ids.values()), cluster), on_finish=observe)
        print(f"{len(queue)} jobs of {len(ids)} types, {sum(j.devices for j in queue)} GPUs requested in all\n")
        print(f"{'policy':<10} {'makespan h':>10} {'OOM restarts':>12}   jobs finished per GPU type")
        for run in (blind, aware):
            counts = {name: list(run.placed.values()).count(name) for name, _, _ in CLUSTER}
            print(f"{run.policy:<10} {run.makespan_s / 3600:>10.2f} {run.failures:>12}   {counts}")
        print(f"\nmakespan with perfmodel's predictions: {aware.makespan_s / blind.makespan_s:.2f}× the blind "
              f"placement's ({100 * (1 - aware.makespan_s / blind.makespan_s):.0f} % shorter)")


if __name__ == "__main__":
    main()
