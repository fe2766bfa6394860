import pytest
import torch

from perfmodel.hardware.probe import (
    FRESH_MAP_BYTES,
    CpuIdentity,
    first_touch_gb_s,
    l2_cache_mib,
    parse_cpuinfo,
    parse_lscpu,
    probe_host,
    read_cpu_identity,
    vendor_of,
)


def test_probe_measures_plausible_figures_and_restores_threads():
    before = torch.get_num_threads()
    spec = probe_host(threads=1, gemm_sizes=(64, 128), copy_mib=8, repeats=2)
    assert torch.get_num_threads() == before
    assert spec.name == "cpu" and spec.kind == "cpu" and spec.threads == 1
    assert 0.1 < spec.peak_fp32_gflops < 100_000
    assert 0.1 < spec.memory_bandwidth_gb_s < 10_000
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


# what /proc/cpuinfo and lscpu print on other machines (abridged to the fields that matter, plus neighbours)
XEON_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 106
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
stepping\t: 6
flags\t\t: fpu vme de pse avx512f

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
"""
EPYC_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7763 64-Core Processor
"""
GRAVITON_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
"""
GRAVITON_LSCPU = """Architecture:                    aarch64
CPU op-mode(s):                  32-bit, 64-bit
Vendor ID:                       ARM
Model name:                      Neoverse-N1
Model:                           1
"""
EPYC_LSCPU = """Architecture:                            x86_64
Vendor ID:                               AuthenticAMD
Model name:                              AMD EPYC 9654 96-Core Processor
CPU family:                              25
"""


def test_cpuinfo_names_the_real_cpu_and_its_vendor():
    assert parse_cpuinfo(XEON_CPUINFO) == CpuIdentity("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "Intel",
                                                      "GenuineIntel")
    assert parse_cpuinfo(EPYC_CPUINFO) == CpuIdentity("AMD EPYC 7763 64-Core Processor", "AMD", "AuthenticAMD")
    graviton = parse_cpuinfo(GRAVITON_CPUINFO)  # Arm kernels print no model name: the vendor comes from the code
    assert graviton == CpuIdentity("", "Arm", "0x41")
    assert parse_cpuinfo("") == CpuIdentity()


def test_lscpu_names_the_cpu_where_cpuinfo_does_not():
    assert parse_lscpu(GRAVITON_LSCPU) == CpuIdentity("Neoverse-N1", "Arm", "ARM")
    assert parse_lscpu(EPYC_LSCPU) == CpuIdentity("AMD EPYC 9654 96-Core Processor", "AMD", "AuthenticAMD")


def test_reading_this_host_parses_the_file_it_is_given(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(XEON_CPUINFO)
    assert read_cpu_identity(cpuinfo) == parse_cpuinfo(XEON_CPUINFO)
    here = read_cpu_identity(tmp_path / "missing")  # no cpuinfo: lscpu, else platform, still names something
    assert here.model


def test_the_probe_names_this_hosts_cpu_not_a_fixed_one():
    spec = probe_host(threads=1, gemm_sizes=(64,), copy_mib=8, repeats=1)
    cpu = read_cpu_identity()
    assert spec.vendor == cpu.vendor
    assert spec.aliases == ((cpu.model,) if cpu.model else ())


def test_the_shipped_cpu_entry_says_it_is_the_corpus_host():
    from perfmodel.hardware.catalog import shipped_specs

    shipped = {spec.name: spec for spec in shipped_specs()}["cpu"]
    assert "corpus host" in shipped.source and "not necessarily the machine perfmodel runs on" in shipped.source


def test_new_memory_is_timed_on_tensors_the_allocator_maps_afresh():
    """The first-touch rate is measured on tensors past glibc's largest mmap threshold (mapped anew each time): on
    this host either free (None) or a positive rate no faster than a few hundred GB/s; a tensor under the threshold
    is never what it times."""
    from perfmodel.hardware.probe import FIRST_TOUCH_MIB

    assert FIRST_TOUCH_MIB * 2**20 > FRESH_MAP_BYTES == 32 * 2**20
    rate = first_touch_gb_s(repeats=3)  # in a new interpreter: what a new training process meets
    assert rate is None or 0 < rate < 500


def test_the_rate_of_new_memory_is_the_tensors_bytes_over_the_median_extra_time():
    from perfmodel.hardware.probe import first_touch_rate

    mib64 = 64 * 2**20
    assert first_touch_rate([0.030, 0.020, 0.025], [0.004, 0.005, 0.004], mib64) == pytest.approx(mib64 / 0.025 / 1e9)
    assert first_touch_rate([0.0003, 0.0001, -0.0002], [0.004, 0.005, 0.004], mib64) is None  # nothing measurable
    with pytest.raises(ValueError, match="reuse freed heap"):
        first_touch_gb_s(mib=32)
