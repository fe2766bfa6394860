"""What full profiling (iteration + per-op) costs on this machine: wall time of `profile_job` with its defaults.

Run: .venv/bin/python bench/profile_cost.py [zoo-name:batch[:seq] ...]
Default jobs: resnet50 batch 32 and bert-base seq 128 batch 8, training, on the CPU. Target: at most 60 s each.
Prints, per job, the total wall time, the time of each stage (from the progress messages), the median step, its
coefficient of variation, and the op coverage and IR match of the per-op profile.
"""

from __future__ import annotations

import sys
import time

from perfmodel.jobs.spec import JobSpec
from perfmodel.profilers.run import profile_job

DEFAULT_JOBS = ("resnet50:32", "bert-base:8:128")
TARGET_S = 60.0


def bench(job: str, device: str = "cpu") -> float:
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
    return total_s


def main(argv: list[str]) -> int:
    totals = [bench(job) for job in (argv or DEFAULT_JOBS)]
    return 0 if all(t <= TARGET_S for t in totals) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
