"""`perfmodel serve` runs the service's own launcher (`python -m service`, service/cli.py) with its arguments passed
through, without the library importing the service."""

import hashlib
import subprocess
import sys
from pathlib import Path

from perfmodel.cli.serve import service_argv

PERFMODEL = str(Path(sys.executable).parent / "perfmodel")


def test_the_arguments_pass_through_to_python_m_service():
    argv = service_argv(["--port", "9000", "--hash-token", "x y"])
    assert argv[0] == sys.executable
    assert argv[argv.index("-m"):] == ["-m", "service", "--port", "9000", "--hash-token", "x y"]


def test_serve_help_is_the_service_help():
    out = subprocess.run([PERFMODEL, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "perfmodel serve" in out.stdout and "--hash-token" in out.stdout and "--allow-open-writes" in out.stdout


def test_python_m_service_is_the_same_launcher():
    out = subprocess.run([sys.executable, "-m", "service", "--hash-token", "abc"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == hashlib.sha256(b"abc").hexdigest()


def test_the_cli_does_not_import_the_service():
    code = ("import sys, perfmodel.cli.main; "
            "print(sorted(m for m in sys.modules if m == 'service' or m.startswith('service.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
