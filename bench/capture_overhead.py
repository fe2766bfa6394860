"""What the bounded capture (`perfmodel.graph.capture.capture_graph`: a child process forked from a preloaded fork
server) costs over capturing in-process (`perfmodel.graph.from_torch.capture_graph`), warm, on one zoo model.

    .venv/bin/python bench/capture_overhead.py [--model resnet18] [--batch-size 32] [--repeats 5] [--record [RUN]]

`--record` records the medians and the overhead for docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _figures import add_record_option, record_if_asked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    add_record_option(parser)
    args = parser.parse_args()

    from perfmodel.graph.capture import capture_graph, prestart
    from perfmodel.graph.from_torch import capture_graph as in_process
    from perfmodel.jobs.limits import JobLimits
    from perfmodel.jobs.spec import JobSpec, ZooSource

    spec = JobSpec(source=ZooSource(name=args.model), batch_size=args.batch_size)
    limits = JobLimits()
    start = time.perf_counter()
    prestart()
    print(f"fork server start (imports torch, transformers; one warm-up capture): {time.perf_counter() - start:.1f} s")
    in_process(spec)
    capture_graph(spec, timeout_s=300, limits=limits)
    here, child = [], []
    for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
        start = time.perf_counter()
        in_process(spec)
        here.append(time.perf_counter() - start)
        start = time.perf_counter()
        capture_graph(spec, timeout_s=300, limits=limits)
        child.append(time.perf_counter() - start)
    a, b = statistics.median(here), statistics.median(child)
    print(f"{args.model} b{args.batch_size}, median of {args.repeats}: in-process {a:.2f} s, child process {b:.2f} s "
          f"(overhead {b - a:+.2f} s)")
    record_if_asked(args, "capture_overhead", {"in_process_s": a, "child_process_s": b, "overhead_s": b - a})


if __name__ == "__main__":
    main()
