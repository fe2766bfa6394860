import torch

from perfmodel.hardware.probe import l2_cache_mib, probe_host, vendor_of


def test_probe_measures_plausible_figures_and_restores_threads():
    before = torch.get_num_threads()
    spec = probe_host(threads=1, gemm_sizes=(64, 128), copy_mib=8, repeats=2)
    assert torch.get_num_threads() == before
    assert spec.name == "cpu" and spec.kind == "cpu" and spec.threads == 1
    assert 0.1 < spec.peak_fp32_gflops < 100_000
    assert 0.1 < spec.memory_bandwidth_gbps < 10_000
    assert 0.5 < spec.memory_gb < 100_000
    assert spec.compute_units >= 1
    assert spec.source.startswith("perfmodel hw probe on ") and f"torch {torch.__version__}" in spec.source


def test_vendor_from_the_cpu_model_then_the_vendor_id():
    assert vendor_of("AMD EPYC 7763 64-Core Processor") == "AMD"
    assert vendor_of("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz") == "Intel"
    assert vendor_of("unknown", "GenuineIntel") == "Intel"
    assert vendor_of("Neoverse-N1") == "Arm"
    assert vendor_of("", "") == ""


def test_l2_cache_counts_each_shared_instance_once(tmp_path):
    for cpu, shared in (("cpu0", "0-1"), ("cpu1", "0-1"), ("cpu2", "2-3")):
        for index, (level, kind, size) in enumerate(((1, "Data", "32K"), (2, "Unified", "1024K"))):
            folder = tmp_path / cpu / "cache" / f"index{index}"
            folder.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
                (folder / name).write_text(f"{value}\n")
    assert l2_cache_mib(tmp_path) == 2.0
    assert l2_cache_mib(tmp_path / "missing") is None
