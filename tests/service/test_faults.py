"""Faults survived, tested for real: two `perfmodel serve` replicas on one PostgreSQL store, under steady load, while
the store restarts, a replica is SIGKILLed mid-write, and the store refuses writes for a moment.

The load: one client thread per replica predicts registered jobs, posts observations and registers jobs (graph IRs,
no capture), recording every answer with its start and end time; the acknowledged writes (job ids answered 201/200,
observation ids answered 201) are kept. The replicas start at once on the empty database (both create its schema).
The faults, one after another:

1. PostgreSQL restarts: `pg_ctl stop -m immediate` (a crash: no checkpoint, sessions cut) and `pg_ctl start`.
2. One replica is SIGKILLed while its client thread is posting an observation, and started again.
3. The store refuses writes: `ALTER SYSTEM SET default_transaction_read_only = on` and a configuration reload make
   every transaction of every session read-only at once; reads go on. That is what a database that turned read-only
   (a demoted primary) or ran out of disk (PostgreSQL refuses writes with "could not extend file", reads go on)
   looks like to the service: connections stay up, every write fails; `ALTER SYSTEM RESET` and a reload end it.

Then: no acknowledged job or observation is missing from the store, nothing is half-written (every observation's
job is stored, every job has its spec and graph, each replica lists the stored jobs with their stored observation
counts), every error is a 503 with `Retry-After` answered while the store was down (no 500, no 503 outside an
outage window and a short grace after it), the killed replica's connection errors fall in its kill window, `/readyz`
said not ready during each store outage and ready again by itself after it, and predictions of jobs a replica had in
memory were answered 200 throughout.

The faults go to a PostgreSQL server of the test's own, made with the binaries of the one `scripts/with-postgres.sh`
started (`PERFMODEL_TEST_POSTGRES_CTL`): under pytest-xdist the shared server serves the other worker's tests, which a
restart or a read-only server would break. Like every PostgreSQL test it skips, saying why, without that server.
`test_which_store_errors_are_a_503` needs no server: which database errors are the store's availability (503, retry)
and which are bugs (500).
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, InternalError, OperationalError, ProgrammingError

from service.errors import store_unavailable
from service.launch import LocalServer

CTL_ENV = "PERFMODEL_TEST_POSTGRES_CTL"
DATA_ENV = "PERFMODEL_TEST_POSTGRES_DATA"
DATABASE = "perfmodel_faults"
SYNC_INTERVAL_S = 0.5  # replicas pick up each other's writes this often (and retry the store after an outage)
GRACE_S = 1.0  # a 503 may end this long after both replicas said ready again
MIN_OUTAGE_S = 2.0  # each store outage lasts at least this long: several sync rounds fail during it
WAIT_S = 60.0  # the longest any one condition is waited for (a loaded 2-core machine)
LOAD_LIMIT_S = 240.0  # the load threads stop by themselves after this long, whatever happens
PAUSE_S = 0.02  # between two rounds of a load thread
MAX_JOBS = 24  # jobs registered in all
T4 = {"accelerator": "t4"}
PLACEMENTS = (T4, {"accelerator": "a100-sxm4-80gb"}, {"accelerator": "t4", "devices_per_node": [2]})


# --- a PostgreSQL server of the test's own --------------------------------------------------------------------


class PostgresServer:
    """A throwaway cluster in a folder under /tmp (Unix socket there, no TCP), run as the user who owns the data
    folder of `scripts/with-postgres.sh`'s server (PostgreSQL refuses to run as root)."""

    def __init__(self, pg_ctl: Path, owner_of: Path):
        self.bindir = pg_ctl.parent
        self.folder = Path(tempfile.mkdtemp(prefix="perfmodel-faults-", dir="/tmp"))  # socket path < 108 bytes
        self.data = self.folder / "data"
        self.as_owner: list[str] = []
        if os.geteuid() == 0:
            owner = owner_of.stat()
            os.chown(self.folder, owner.st_uid, owner.st_gid)
            self.as_owner = ["runuser", "-u", pwd.getpwuid(owner.st_uid).pw_name, "--"]
        self.folder.chmod(0o755)
        self.url = f"postgresql+psycopg://postgres@/{DATABASE}?host={self.folder}"
        self.admin_url = f"postgresql+psycopg://postgres@/postgres?host={self.folder}"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_owner, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = (self.folder / "server.log")
            raise RuntimeError(f"{' '.join(args[:1])} failed: {done.stdout[-1000:]}{done.stderr[-1000:]}"
                               f"{log.read_text()[-2000:] if log.exists() else ''}")

    def create(self) -> PostgresServer:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--locale=C")
        self.start()
        self.admin(f'CREATE DATABASE "{DATABASE}"')
        return self

    def start(self) -> None:
        # durable commits (synchronous_commit on): an acknowledged write must survive the crash of fault 1
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w",
                  "-t", "60", "-o", f"-c listen_addresses='' -k {self.folder} -c fsync=off -c full_page_writes=off",
                  "start")

    def crash(self) -> None:
        """Stop as a crash would: no checkpoint, every session cut (the next start replays the WAL)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def admin(self, *statements: str) -> None:
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text("SET default_transaction_read_only = off"))  # even while fault 3 lasts
                for statement in statements:
                    connection.execute(text(statement))
        finally:
            engine.dispose()

    def read_only(self, on: bool) -> None:
        """Every transaction of every session read-only (on) or not (off), at once: a reload re-reads the setting in
        every session that did not set its own."""
        change = ("ALTER SYSTEM SET default_transaction_read_only = on" if on
                  else "ALTER SYSTEM RESET default_transaction_read_only")
        self.admin(change, "SELECT pg_reload_conf()")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self.as_owner, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                            "-w", "-t", "30", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def postgres(postgres_url: str) -> Iterator[PostgresServer]:
    """A fresh server of this test's own (`postgres_url` is asked for its skip: no PostgreSQL, no test)."""
    del postgres_url
    pg_ctl, data = os.environ.get(CTL_ENV), os.environ.get(DATA_ENV)
    if not pg_ctl or not data:
        pytest.skip(f"{CTL_ENV} / {DATA_ENV} not set: PERFMODEL_TEST_POSTGRES_URL names a server that "
                    "scripts/with-postgres.sh did not start, and this test needs PostgreSQL binaries to run its own")
    server = PostgresServer(Path(pg_ctl), Path(data))
    try:
        yield server.create()
    finally:
        server.remove()


# --- replicas and the load --------------------------------------------------------------------------------------


class Replica:
    """One `perfmodel serve`; `current` is (generation, url), replaced whole when it is started again."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path):
        self.name, self.env, self.log_dir = name, env, log_dir
        self.server: LocalServer | None = None
        self.current: tuple[int, str] = (0, "http://127.0.0.1:9")  # nothing listens on the discard port
        self.logs: list[Path] = []

    def start(self) -> None:
        generation = self.current[0] + 1
        log_path = self.log_dir / f"{self.name}-{generation}.log"
        self.logs.append(log_path)
        server = LocalServer(self.env, log_path=log_path, start_timeout_s=WAIT_S * 2)
        try:
            server.start()
        except RuntimeError as exc:
            raise RuntimeError(f"replica {self.name} did not start: {exc}") from None
        self.server = server
        self.current = (generation, server.url)

    def kill(self) -> None:
        assert self.server is not None and self.server.process is not None
        self.server.process.send_signal(signal.SIGKILL)
        self.server.process.wait(timeout=30)

    @property
    def url(self) -> str:
        return self.current[1]

    def log_tail(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}\n" for p in self.logs if p.exists())


@dataclass
class Outcome:
    replica: int
    kind: str  # predict (a job in the replica's memory), predict-cold, observe, register
    started: float
    ended: float
    status: int | None  # None: no HTTP answer (connection refused or cut)
    retry_after: str | None = None
    detail: str = ""

    def overlaps(self, start: float, end: float) -> bool:
        return self.started <= end and self.ended >= start

    def __str__(self) -> str:
        return (f"replica {self.replica} {self.kind} {self.status} at {self.started:.2f}-{self.ended:.2f} s "
                f"(Retry-After {self.retry_after}): {self.detail[:300]}")


@dataclass
class Window:
    name: str
    start: float
    end: float = float("inf")
    replicas: tuple[int, ...] = (0, 1)


@dataclass
class Load:
    """What the client threads share: the answers, the acknowledged writes, and signals for the test."""

    ir: dict[str, Any]
    replicas: list[Replica]
    t0: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)  # acknowledged job ids, in order
    observations: dict[int, str] = field(default_factory=dict)  # acknowledged observation id: its job id
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    observing: list[threading.Event] = field(default_factory=lambda: [threading.Event(), threading.Event()])
    registered: int = 0
    failures: list[str] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def spec(self, number: int) -> dict[str, Any]:
        """The `number`-th job: the same graph IR, a sequence length of its own (another spec: another job id)."""
        return {"source": {"kind": "ir", "graph": self.ir}, "batch_size": 8, "seq_len": 100 + number}

    def next_spec(self) -> dict[str, Any] | None:
        with self.lock:
            if self.registered >= MAX_JOBS:
                return None
            self.registered += 1
            return self.spec(self.registered)

    def send(self, client: httpx.Client, index: int, kind: str, method: str, path: str,
             body: dict[str, Any]) -> httpx.Response | None:
        url = self.replicas[index].url
        started = self.now()
        try:
            response = client.request(method, url + path, json=body)
        except httpx.TransportError as exc:
            with self.lock:
                self.outcomes.append(Outcome(index, kind, started, self.now(), None, detail=repr(exc)))
            time.sleep(0.05)
            return None
        status = response.status_code
        with self.lock:
            self.outcomes.append(Outcome(index, kind, started, self.now(), status, response.headers.get("retry-after"),
                                         response.text if status >= 300 else ""))
        return response

    def count(self, index: int, kind: str, status: int, after: float) -> int:
        assert not self.failures, self.failures  # a load thread died: say so now, not when a wait times out
        with self.lock:
            return sum(1 for o in self.outcomes
                       if o.replica == index and o.kind == kind and o.status == status and o.started >= after)

    def summary(self, after: float) -> str:
        """What was answered since `after`: {(replica, kind, status): count}, and the first few errors."""
        with self.lock:
            recent = [o for o in self.outcomes if o.started >= after]
        counts: dict[tuple[int, str, int | None], int] = {}
        for o in recent:
            counts[o.replica, o.kind, o.status] = counts.get((o.replica, o.kind, o.status), 0) + 1
        examples: dict[tuple[int, str, int | None], str] = {}
        for o in recent:
            if o.status not in (200, 201):
                examples.setdefault((o.replica, o.kind, o.status), str(o))
        return (f"answers since {after:.2f} s: {sorted(counts.items(), key=str)}; one error of each kind: "
                f"{list(examples.values())}")

    def run(self, index: int) -> None:
        try:
            self._run(index)
        except Exception as exc:  # a bug of the test: reported by the test, not lost in a thread
            self.failures.append(f"load thread {index}: {exc!r}")
            raise

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        generation = -1
        warm: set[str] = set()  # jobs this replica answered for since it last started: in its memory
        raw_t4: dict[str, float] = {}  # job id: its uncalibrated prediction on T4 (what an observation is near)
        deadline = time.monotonic() + LOAD_LIMIT_S
        round_ = 0
        with httpx.Client(timeout=30.0) as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                round_ += 1
                if self.replicas[index].current[0] != generation:  # started again: nothing in its memory
                    generation = self.replicas[index].current[0]
                    warm.clear()
                with self.lock:
                    known = list(self.jobs)
                cold = [job for job in known if job not in warm]
                if warm and (round_ % 4 or not cold):
                    job, kind = rng.choice(sorted(warm)), "predict"
                elif cold:
                    job, kind = rng.choice(cold), "predict-cold"
                else:
                    job, kind = None, ""
                if job is not None:
                    placement = rng.choice(PLACEMENTS)
                    response = self.send(client, index, kind, "POST", "/v1/predict",
                                         {"job": job, "placement": placement})
                    if response is not None and response.status_code == 200:
                        warm.add(job)
                        if placement == T4:
                            raw_t4[job] = response.json()["uncalibrated_throughput_samples_per_s"]
                observable = sorted(job for job in warm if job in raw_t4)
                if observable:
                    job = rng.choice(observable)
                    measured = raw_t4[job] * rng.uniform(0.8, 0.95)
                    self.observing[index].set()
                    response = self.send(client, index, "observe", "POST", "/v1/observations",
                                         {"job": job, "placement": T4, "throughput_samples_per_s": measured})
                    if response is not None and response.status_code == 201:
                        answer = response.json()
                        raw_t4[job] = answer["predicted_throughput_samples_per_s"]
                        with self.lock:
                            self.observations[answer["observation_id"]] = answer["job_id"]
                if round_ % 8 == 0 and (spec := self.next_spec()) is not None:
                    self.register(client, index, spec, warm)
                time.sleep(PAUSE_S)

    def register(self, client: httpx.Client, index: int, spec: dict[str, Any], warm: set[str]) -> None:
        response = self.send(client, index, "register", "POST", "/v1/jobs", spec)
        if response is not None and response.status_code in (200, 201):
            job = response.json()["job_id"]
            warm.add(job)
            with self.lock:
                if job not in self.jobs:
                    self.jobs.append(job)


def poll(what: str | Callable[[], str], condition: Callable[[], bool], timeout_s: float = WAIT_S,
         every_s: float = 0.1) -> None:
    """Wait until `condition()`; fail saying `what` (a callable: said as it is then) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:.0f} s: {what() if callable(what) else what}")
        time.sleep(every_s)


def readiness(url: str) -> tuple[int | None, str]:
    try:
        response = httpx.get(f"{url}/readyz", timeout=10.0)
    except httpx.TransportError as exc:
        return None, repr(exc)
    return response.status_code, response.text


def wait_readiness(replicas: list[Replica], status: int, mentions: str = "") -> None:
    for replica in replicas:
        seen: list[tuple[int | None, str]] = []

        def answers(replica: Replica = replica, seen: list[tuple[int | None, str]] = seen) -> bool:
            seen[:] = [readiness(replica.url)]
            return seen[0][0] == status and mentions in seen[0][1]

        poll(lambda replica=replica, seen=seen: f"/readyz of replica {replica.name} answering {status} {mentions!r} "
             f"(last: {seen})", answers)


def start_together(replicas: list[Replica]) -> None:
    failed: list[str] = []

    def start(replica: Replica) -> None:
        try:
            replica.start()
        except RuntimeError as exc:
            failed.append(str(exc))

    starting = [threading.Thread(target=start, args=(replica,)) for replica in replicas]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    if failed:
        pytest.fail("\n".join(failed))


# --- the test ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "why"), [
    (OperationalError("SELECT 1", {}, psycopg.OperationalError("connection refused")), "cannot be reached"),
    (InternalError("INSERT", {}, psycopg.errors.ReadOnlySqlTransaction("read-only transaction")), "read-only"),
    (OperationalError("INSERT", {}, psycopg.errors.DiskFull("could not extend file")), "cannot be reached"),
    (OperationalError("INSERT", {}, sqlite3.OperationalError("attempt to write a readonly database")),
     "cannot be reached"),
    (IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("duplicate key")), None),
    (ProgrammingError("SELECT", {}, psycopg.errors.UndefinedTable("no such table")), None),
])
def test_which_store_errors_are_a_503(error: Exception, why: str | None):
    """The store's availability (503 with Retry-After, the client retries) versus a bug (500)."""
    found = store_unavailable(error)
    assert (found is None) if why is None else (found is not None and why in found)



@pytest.mark.slow  # two real servers, one started again, and a PostgreSQL server of its own
def test_two_replicas_survive_a_store_restart_a_killed_replica_and_a_read_only_store(
        postgres: PostgresServer, models_dir: Path, small_ir: dict, tmp_path: Path):
    env = {"PERFMODEL_STORE_URL": postgres.url, "PERFMODEL_MODELS_DIR": str(models_dir),
           "PERFMODEL_SYNC_INTERVAL_S": str(SYNC_INTERVAL_S)}
    replicas = [Replica("a", env, tmp_path), Replica("b", env, tmp_path)]
    load = Load(small_ir, replicas)
    threads = [threading.Thread(target=load.run, args=(i,), name=f"load-{i}", daemon=True) for i in (0, 1)]
    outages: list[Window] = []
    kill = Window("replica a killed", start=float("inf"), replicas=(0,))
    try:
        start_together(replicas)  # on an empty store: both create its schema at once
        with httpx.Client(timeout=30.0) as client:  # two jobs to begin with, one through each replica
            for i in (0, 1):
                spec = load.next_spec()
                assert spec is not None
                load.register(client, i, spec, set())
        assert len(load.jobs) == 2, load.outcomes
        for thread in threads:
            thread.start()

        def steady(after: float, replica_indexes: tuple[int, ...] = (0, 1), n: int = 3) -> None:
            for i in replica_indexes:
                poll(lambda i=i: f"{n} observations acknowledged by replica {i} after {after:.1f} s; "
                     f"{load.summary(after)}",
                     lambda i=i: load.count(i, "observe", 201, after) >= n)

        def store_outage(name: str, begin: Callable[[], None], end: Callable[[], None], mentions: str) -> None:
            window = Window(name, start=load.now())
            outages.append(window)
            begin()
            wait_readiness(replicas, 503, mentions)
            for i in (0, 1):  # writes refused, and predictions of jobs in memory answered, while it lasts
                poll(lambda i=i: f"a write refused with 503 by replica {i} during {name}; {load.summary(window.start)}",
                     lambda i=i: load.count(i, "observe", 503, window.start)
                     + load.count(i, "register", 503, window.start) >= 1)
                poll(lambda i=i: f"a prediction answered 200 by replica {i} during {name}; "
                     f"{load.summary(window.start)}",
                     lambda i=i: load.count(i, "predict", 200, window.start + 0.5) >= 3)
            poll(f"{name} lasting {MIN_OUTAGE_S} s", lambda: load.now() - window.start >= MIN_OUTAGE_S)
            end()
            wait_readiness(replicas, 200)  # by itself: nothing but the store changed
            window.end = load.now()
            steady(window.end)

        steady(0.0)

        # 1. PostgreSQL crashes and starts again
        store_outage("the PostgreSQL restart", postgres.crash, postgres.start, "store")

        # 2. replica a is SIGKILLed while it posts an observation, then started again
        load.observing[0].clear()
        poll("replica a posting an observation", load.observing[0].is_set, every_s=0.001)
        time.sleep(random.uniform(0.0, 0.01))
        kill.start = load.now()
        replicas[0].kill()
        steady(kill.start, (1,))  # the other replica goes on writing
        replicas[0].start()
        kill.end = load.now()
        steady(kill.end)

        # 3. the store refuses writes for a moment (read-only, as a full disk or a demoted primary would)
        store_outage("the read-only store", lambda: postgres.read_only(True), lambda: postgres.read_only(False),
                     "read-only")

        load.stop.set()
        for thread in threads:
            thread.join(timeout=WAIT_S)
        assert not any(thread.is_alive() for thread in threads), "a load thread did not stop"
        assert not load.failures, load.failures
        check_answers(load, outages, kill, "".join(r.log_tail() for r in replicas))
        check_store_and_replicas(load, postgres, replicas)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=WAIT_S)
        for replica in replicas:
            if replica.server is not None:
                replica.server.stop()


def check_answers(load: Load, outages: list[Window], kill: Window, logs: str) -> None:
    """Every answer is a 200/201; or a 503 with Retry-After during a store outage (or just after it); or no answer
    from the killed replica while it was down. Predictions of jobs in memory were answered 200 throughout."""

    def allowed(o: Outcome) -> bool:
        if o.status in (200, 201):
            return True
        if o.status == 503:
            return any(o.overlaps(w.start, w.end + GRACE_S) for w in outages) and (o.retry_after or "").isdigit()
        return o.status is None and o.replica in kill.replicas and o.overlaps(kill.start, kill.end)

    windows = ", ".join(f"{w.name} {w.start:.2f}-{w.end:.2f} s" for w in [*outages, kill])
    wrong = [str(o) for o in load.outcomes if not allowed(o)]
    assert not wrong, (f"{len(wrong)} answer(s) outside what the faults allow ({windows}):\n" + "\n".join(wrong[:20])
                       + "\n" + logs)
    answered = [str(o) for o in load.outcomes if o.kind == "predict" and o.status not in (200, None)]
    assert not answered, "predictions of jobs in memory not answered:\n" + "\n".join(answered[:20])
    refused = {o.kind for o in load.outcomes if o.status == 503}
    assert refused <= {"observe", "register", "predict-cold"}, refused
    assert sum(o.status == 201 for o in load.outcomes if o.kind == "observe") >= 20


def check_store_and_replicas(load: Load, postgres: PostgresServer, replicas: list[Replica]) -> None:
    """No acknowledged job or observation is missing; nothing is half-written; each replica (one of them started
    again, the other kept in step by its sync) lists the stored jobs with the stored observation counts."""
    engine = create_engine(postgres.url)
    try:
        with engine.connect() as connection:
            jobs = {key: complete for key, complete in connection.execute(text(
                "SELECT key, spec_json IS NOT NULL AND graph_json IS NOT NULL FROM jobs"))}
            observations = dict(connection.execute(text(
                "SELECT o.id, j.key FROM observations o LEFT JOIN jobs j ON j.id = o.job_id")).all())
    finally:
        engine.dispose()
    assert set(load.jobs) <= set(jobs), f"acknowledged jobs not stored: {set(load.jobs) - set(jobs)}"
    assert all(jobs.values()), f"jobs stored without their spec or graph: {[k for k, v in jobs.items() if not v]}"
    lost = {i: job for i, job in load.observations.items() if observations.get(i) != job}
    assert not lost, f"acknowledged observations not stored as acknowledged (id: job): {lost}"
    assert None not in observations.values(), "observations whose job is not stored"
    counts = {key: 0 for key in jobs}
    for key in observations.values():
        counts[key] += 1

    with httpx.Client(timeout=30.0) as client:
        for replica in replicas:
            last: dict[str, Any] = {}

            def in_step(replica: Replica = replica, last: dict[str, Any] = last) -> bool:
                listed = client.get(f"{replica.url}/v1/jobs")
                assert listed.status_code == 200, listed.text
                last["jobs"] = {job["job_id"] for job in listed.json()["jobs"]}
                if last["jobs"] != set(jobs):
                    return False
                for key, count in counts.items():
                    detail = client.get(f"{replica.url}/v1/jobs/{key}")
                    assert detail.status_code == 200, detail.text
                    seen = (detail.json()["calibration"] or {}).get("observations", 0)
                    last[key] = (seen, count)
                    if seen != count:
                        return False
                return True

            poll(lambda replica=replica, last=last: f"replica {replica.name} listing the stored jobs and observation "
                 f"counts (last: {last})", in_step, every_s=SYNC_INTERVAL_S)
