import json

import pytest

from perfmodel.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware.catalog import (
    dump_catalog,
    get_accelerator,
    load_catalog,
    local_catalog_path,
    parse_catalog,
    save_local,
)
from perfmodel.hardware.spec import HardwareSpec


def gpu(name: str = "a100-sxm4-40gb", *aliases: str, gflops: float = 19_500.0) -> HardwareSpec:
    return HardwareSpec(name=name, kind="gpu", vendor="NVIDIA", aliases=aliases or ("NVIDIA A100-SXM4-40GB",),
                        peak_fp32_gflops=gflops, peak_fp16_gflops=312_000.0, memory_bandwidth_gbps=1555.0,
                        memory_gb=40.0, compute_units=108, l2_cache_mb=40.0, source="NVIDIA A100 datasheet")


def test_shipped_catalog_has_a_measured_cpu_entry():
    cpu = load_catalog()["cpu"]
    assert cpu.kind == "cpu" and cpu.threads and cpu.compute_units >= 1
    assert cpu.source.startswith("perfmodel hw probe on "), "catalog.json's cpu entry must come from a real probe"


def test_lookup_by_name_or_alias_ignores_case_and_separators():
    catalog = {"a100-sxm4-40gb": gpu(), "cpu": load_catalog()["cpu"]}
    for name in ("a100-sxm4-40gb", "A100-SXM4-40GB", "a100 sxm4 40gb", "A100_SXM4_40GB", "nvidia a100-sxm4-40gb",
                 "  NVIDIA A100-SXM4-40GB "):
        assert get_accelerator(name, catalog).name == "a100-sxm4-40gb"
    assert get_accelerator("CPU", catalog).name == "cpu"


def test_unknown_name_lists_close_matches():
    catalog = {"a100-sxm4-40gb": gpu(), "a100-sxm4-80gb": gpu("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB")}
    with pytest.raises(UnknownNameError) as error:
        get_accelerator("a100-sxm4-60gb", catalog)
    assert "a100-sxm4-40gb" in error.value.close_matches and "did you mean" in str(error.value)
    with pytest.raises(UnknownNameError):
        get_accelerator("tpu-v4")  # the real catalog


def test_local_file_overlays_the_shipped_catalog():
    shipped_cpu = load_catalog()["cpu"]
    mine = shipped_cpu.model_copy(update={"peak_fp32_gflops": 1234.5, "aliases": ("My Workstation CPU",),
                                          "source": "perfmodel hw probe on test"})
    path = save_local(mine)
    assert path == local_catalog_path() and path.is_file()
    assert load_catalog()["cpu"] == mine
    assert get_accelerator("my workstation cpu").peak_fp32_gflops == 1234.5

    save_local(gpu())
    save_local(mine.model_copy(update={"peak_fp32_gflops": 99.0}))  # replaces, does not duplicate
    entries = json.loads(path.read_text())["accelerators"]
    assert sorted(e["name"] for e in entries) == ["a100-sxm4-40gb", "cpu"]
    catalog = load_catalog()
    assert catalog["cpu"].peak_fp32_gflops == 99.0 and catalog["a100-sxm4-40gb"] == gpu()


def test_a_broken_local_file_is_a_user_error():
    local_catalog_path().parent.mkdir(parents=True, exist_ok=True)
    local_catalog_path().write_text("{not json")
    with pytest.raises(PerfmodelError, match="not valid JSON"):
        load_catalog()
    local_catalog_path().write_text(json.dumps({"schema_version": 1, "accelerators": [{"name": "x"}]}))
    with pytest.raises(PerfmodelError, match="entry 'x' is invalid"):
        load_catalog()
    local_catalog_path().write_text(json.dumps({"schema_version": 99, "accelerators": []}))
    with pytest.raises(PerfmodelError, match="schema_version"):
        load_catalog()


def test_a_name_must_not_lead_to_two_entries_in_one_file():
    text = dump_catalog([gpu(), gpu("a100-40gb", "nvidia a100 sxm4 40gb")])
    with pytest.raises(PerfmodelError, match="names both"):
        parse_catalog(text, "test")


def test_dump_and_parse_round_trip():
    specs = [gpu(), gpu("h100-sxm5-80gb", "NVIDIA H100 80GB HBM3", gflops=67_000.0)]
    assert parse_catalog(dump_catalog(specs), "test") == sorted(specs, key=lambda s: s.name)
