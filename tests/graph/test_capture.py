"""perfmodel.graph.capture: the bounded capture (job limits first, then a child process forked from this process's
capture fork server, with a time limit, and which dies with its parent)."""

from __future__ import annotations

import resource
import time

import pytest

from perfmodel.graph import capture_graph
from perfmodel.jobs.spec import HFConfigSource, JobSpec, ZooSource

GPT2_SMALL = {"model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 256, "vocab_size": 1000}


def _bounded():
    from perfmodel.graph.capture import capture_graph as bounded
    from perfmodel.jobs.limits import JobLimits

    return bounded, JobLimits


def test_bounded_capture_returns_the_in_process_graph():
    bounded, JobLimits = _bounded()
    spec = JobSpec(source=HFConfigSource(config=GPT2_SMALL, task="causal-lm"), batch_size=2, seq_len=32)
    graph = bounded(spec, timeout_s=300, limits=JobLimits())
    assert graph.to_json() == capture_graph(spec).to_json()
    assert graph.job_id == spec.key()


def test_bounded_capture_refuses_a_huge_config_before_any_work():
    from perfmodel.jobs.limits import JobLimitError

    bounded, JobLimits = _bounded()
    config = {"model_type": "gpt2", "n_layer": 1e5, "n_embd": 1e6, "n_head": 8}
    spec = JobSpec(source=HFConfigSource(config=config), batch_size=1)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(JobLimitError, match=r"source\.config\.(n_layer|n_embd): .* max_(layers|width)"):
        bounded(spec, timeout_s=300, limits=JobLimits())
    assert time.perf_counter() - start < 0.1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 10 * 1024  # KiB: no growth


def test_bounded_capture_checks_the_exact_parameter_count_in_the_child():
    from perfmodel.jobs.limits import JobLimitError

    bounded, JobLimits = _bounded()
    spec = JobSpec(source=ZooSource(name="resnet18"), batch_size=1)  # a zoo model has no config to estimate from
    with pytest.raises(JobLimitError, match=r"the model has 1.17e\+07 parameters, over the limit max_params"):
        bounded(spec, timeout_s=300, limits=JobLimits(max_params=1_000_000))


def test_a_capture_over_its_time_budget_is_killed():
    import psutil

    from perfmodel.graph.capture import CaptureTimeout

    bounded, JobLimits = _bounded()
    config = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16}  # GPT-2 medium: seconds
    spec = JobSpec(source=HFConfigSource(config=config, task="causal-lm"), batch_size=1, seq_len=64)
    bounded(JobSpec(source=ZooSource(name="mlp-recommender"), batch_size=2), timeout_s=300,
            limits=JobLimits())  # the fork server is up: the budget below is spent on the capture itself
    from multiprocessing import forkserver

    server = psutil.Process(forkserver._forkserver._forkserver_pid)  # forks every capture
    start = time.perf_counter()
    with pytest.raises(CaptureTimeout, match="longer than 0.3 s"):
        bounded(spec, timeout_s=0.3, limits=JobLimits())
    assert time.perf_counter() - start < 2.0
    running = [p for p in server.children() if p.status() != psutil.STATUS_ZOMBIE]
    assert not running, f"capture processes still running after the timeout: {running}"


@pytest.mark.slow
def test_a_capture_child_dies_with_its_parent(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    import psutil

    script = tmp_path / "parent.py"
    script.write_text(
        "from perfmodel.graph.capture import capture_graph\n"
        "from perfmodel.jobs.limits import JobLimits\n"
        "from perfmodel.jobs.spec import HFConfigSource, JobSpec\n"
        "if __name__ == '__main__':\n"
        "    config = {'model_type': 'gpt2', 'n_embd': 2048, 'n_layer': 48, 'n_head': 16}\n"
        "    spec = JobSpec(source=HFConfigSource(config=config), batch_size=1, seq_len=512)\n"
        "    capture_graph(spec, timeout_s=600, limits=JobLimits())\n")
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 120
        captures: list[psutil.Process] = []
        while not captures and time.monotonic() < deadline:  # the fork server starts, then forks the capture
            time.sleep(0.5)
            family = psutil.Process(parent.pid).children(recursive=True)
            captures = [p for p in family if p.ppid() != parent.pid]  # forked by the fork server
        assert captures, "no capture process appeared"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        _gone, alive = psutil.wait_procs(captures, timeout=10)
        assert not alive, f"capture processes outlived their parent: {[p.pid for p in alive]}"
    finally:
        if parent.poll() is None:
            parent.kill()
