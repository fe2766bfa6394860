"""`perfmodel predict` from the shell: wall time of whole processes, as a user meets it.

    .venv/bin/python bench/cli_predict.py [--runs 3] [--args "resnet50 -b 32 --accelerator t4"]

In a fresh PERFMODEL_HOME: the first call (imports, model loading, the graph captured and kept under
PERFMODEL_HOME/graphs), then the median of `--runs` later calls of the same job (the kept graph read instead of a
capture), each a new process. Target: 2 s. `--record [RUN]` records both times for docs/accuracy.md
(bench/_figures.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _figures import add_record_option, record_if_asked


def once(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("perfmodel")), "predict", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--args", default="resnet50 -b 32 --accelerator t4")
    add_record_option(parser)
    opts = parser.parse_args(argv)
    args = shlex.split(opts.args)
    env = {**os.environ, "PERFMODEL_HOME": tempfile.mkdtemp(prefix="perfmodel-cli-")}
    first = once(args, env)
    again = statistics.median(once(args, env) for _ in range(opts.runs))
    print(f"perfmodel predict {opts.args}: first call {first:.2f} s (captures the graph); later calls "
          f"{again:.2f} s (median of {opts.runs}; target 2 s)")
    record_if_asked(opts, "cli_predict", {"first_call_s": first, "later_median_s": again, "runs": opts.runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
