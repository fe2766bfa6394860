"""What full profiling (iteration + per-op) costs on this machine: wall time of `profile_job` with its defaults.

Run: .venv/bin/python bench/profile_cost.py [zoo-name:batch[:seq] ...] [--record [RUN]]
Default jobs: resnet50 batch 32 and bert-base seq 128 batch 8, training, on the CPU. Target: at most 60 s each.
Prints, per job, the total wall time, the time of each stage (from the progress messages), the median step, its
coefficient of variation, and the op coverage and IR match of the per-op profile. `--record` records them for
docs/accuracy.md (bench/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from _figures import add_record_option, figure_key, record_if_asked

from perfmodel.jobs.spec import JobSpec
from perfmodel.profilers.run import profile_job

DEFAULT_JOBS = ("resnet50:32", "bert-base:8:128")
TARGET_S = 60.0


def bench(job: str, device: str = "cpu") -> dict:
    """Profile `job`, print what it cost; return the printed figures."""
    name, batch, *seq = job.split(":")
    spec = JobSpec.from_options(zoo=name, batch_size=int(batch), seq_len=int(seq[0]) if seq else None)
    stages: list[tuple[float, str]] = []
    start_s = time.perf_counter()
    profile = profile_job(spec, device, progress=lambda message: stages.append((time.perf_counter(), message)))
    total_s = time.perf_counter() - start_s
    print(f"== {job} on {device}: {total_s:.1f} s to profile (target <= {TARGET_S:.0f} s)")
    for (at_s, message), (next_s, _) in zip(stages, stages[1:] + [(start_s + total_s, "")]):
        print(f"   {next_s - at_s:6.1f} s  {message}")
    it, ops = profile.iteration, profile.ops
    print(f"   iteration: median {it.iter_time_ms_median:.1f} ms, p10 {it.iter_time_ms_p10:.1f}, "
          f"p90 {it.iter_time_ms_p90:.1f}, cv {it.iter_time_cv:.3f}, {it.throughput_samples_per_s:.1f} samples/s, "
          f"peak {it.peak_memory_bytes / 2**20:.0f} MiB")
    if ops is not None:
        print(f"   per-op: {len(ops.ops)} op calls/step over {ops.steps} steps, profiled step "
              f"{ops.iter_time_ms:.1f} ms, coverage {ops.coverage:.3f}, matched to IR {ops.matched_fraction:.3f}")
    return {"total_s": total_s, "warmup_steps": it.warmup, "timed_steps": it.repeats,
            "median_ms": it.iter_time_ms_median,
            "cv_pct": 100 * it.iter_time_cv if it.iter_time_cv is not None else None,
            "profiled_steps": ops.steps if ops is not None else None,
            "coverage": ops.coverage if ops is not None else None}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="*", default=list(DEFAULT_JOBS), help="zoo-name:batch[:seq]")
    add_record_option(parser)
    args = parser.parse_args(argv)
    jobs = {job: bench(job) for job in args.jobs}
    record_if_asked(args, "profile_cost", {"jobs": {figure_key(job): figures for job, figures in jobs.items()}})
    return 0 if all(figures["total_s"] <= TARGET_S for figures in jobs.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
