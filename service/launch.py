"""Start a real `perfmodel serve` in a subprocess on a free loopback port and wait until it is ready; and the
check every launch makes first, `refuse_open_writes`: never open to the network by accident.

Used by the integration tests, `bench/service.py` and `examples/scheduler.py`:

    with LocalServer(env={"PERFMODEL_HOME": tmp}) as server:
        Client(server.url).predict(...)
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.settings import ServiceSettings

DEFAULT_START_TIMEOUT_S = 120.0


OPEN_WRITES_FIX = ('set a write token: export PERFMODEL_TOKEN_SHA256=$(perfmodel serve --hash-token "$TOKEN") '
                   '(clients send "Authorization: Bearer $TOKEN"), or pass --allow-open-writes '
                   '(PERFMODEL_ALLOW_OPEN_WRITES=true) if anyone who reaches it may write')


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only: localhost, 127.0.0.0/8 or ::1 (a name other than
    localhost counts as reachable from the network: it may resolve to anything)."""
    if host.strip().lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_writes(settings: ServiceSettings) -> None:
    """Refuse to serve beyond this machine with writes open (no write token configured), unless the settings
    say `allow_open_writes`: a PerfmodelError whose message is the one-line fix."""
    from perfmodel.core.errors import PerfmodelError

    host = settings.host
    if settings.writes_open and not settings.allow_open_writes and not is_loopback(host):
        raise PerfmodelError(f"refusing to serve on {host} with writes open to anyone who reaches it: "
                             f"{OPEN_WRITES_FIX}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def perfmodel_executable() -> str:
    """The `perfmodel` script of the running interpreter's environment."""
    return str(Path(sys.executable).parent / "perfmodel")


class LocalServer:
    """`perfmodel serve` on 127.0.0.1:<free port>. `env` is added to this process's environment (PERFMODEL_*
    settings); the server's output goes to `log_path` (a temporary file by default)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, args: Sequence[str] = (),
                 log_path: Path | None = None, start_timeout_s: float = DEFAULT_START_TIMEOUT_S):
        self.env = dict(env or {})
        self.args = tuple(args)
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not running"
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def start(self) -> LocalServer:
        self.port = free_port()
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="perfmodel-serve-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        # no capture fork server at start (it preloads torch for 10-20 s of CPU): the first capture starts it
        env = {**os.environ, "PERFMODEL_LOG_LEVEL": "warning", "PERFMODEL_CAPTURE_PRESTART": "false", **self.env,
               "PERFMODEL_HOST": "127.0.0.1", "PERFMODEL_PORT": str(self.port)}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([perfmodel_executable(), "serve", *self.args], env=env, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout_s
        while not self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"perfmodel serve exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"perfmodel serve was not ready within {self.start_timeout_s:.0f} s:\n"
                                   f"{self.log()[-3000:]}")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as response:
                status: int = response.status
                return status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
