import json

import pytest

from perfmodel.core.errors import PerfmodelError, UnknownNameError
from perfmodel.hardware import catalog as catalog_module
from perfmodel.hardware.catalog import (
    AmbiguousNameError,
    ambiguous_names,
    dump_catalog,
    get_accelerator,
    load_catalog,
    local_catalog_path,
    loose_key,
    parse_ambiguous,
    parse_catalog,
    save_local,
)
from perfmodel.hardware.spec import HardwareSpec


def gpu(name: str = "a100-sxm4-40gb", *aliases: str, gflops: float = 19_500.0) -> HardwareSpec:
    return HardwareSpec(name=name, kind="gpu", vendor="NVIDIA", aliases=aliases or ("NVIDIA A100-SXM4-40GB",),
                        peak_fp32_gflops=gflops, peak_fp16_gflops=312_000.0, memory_bandwidth_gb_s=1555.0,
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
    for blank in ("", "  "):  # an empty name is said to be empty, not "close" to whatever sorts first
        with pytest.raises(UnknownNameError, match="the name is empty") as error:
            get_accelerator(blank, catalog)
        assert error.value.close_matches == []
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


def test_an_ambiguous_table_round_trips_and_is_checked():
    specs = [gpu(), gpu("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB")]
    table = {"A100 40GB": ["a100-sxm4-40gb", "a100-pcie-40gb"]}
    text = dump_catalog(specs, table)
    assert parse_catalog(text, "test") == sorted(specs, key=lambda s: s.name)
    assert parse_ambiguous(text, "test") == {"A100 40GB": ("a100-sxm4-40gb", "a100-pcie-40gb")}
    for bad, message in (({"A100 40GB": ["a100-sxm4-40gb"]}, "two or more"),
                         ({"A100 40GB": "a100-sxm4-40gb"}, "two or more"),
                         ({"NVIDIA A100-SXM4-40GB": ["a100-sxm4-40gb", "a100-pcie-40gb"]}, "also a name or alias"),
                         ({"A100 40GB": ["a", "b"], "a100_40gb": ["a", "c"]}, "same look-up key")):
        with pytest.raises(PerfmodelError, match=message):
            parse_catalog(json.dumps(json.loads(text) | {"ambiguous": bad}), "test")
    broken = json.loads(text) | {"ambiguous": ["A100 40GB"]}
    with pytest.raises(PerfmodelError, match="'ambiguous' must map"):
        parse_catalog(json.dumps(broken), "test")
    with pytest.raises(PerfmodelError, match="unknown top-level keys"):
        parse_catalog(json.dumps(json.loads(text) | {"aliases": {}}), "test")


def test_an_ambiguous_name_lists_only_the_candidates_the_catalog_has():
    catalog = {"a100-sxm4-40gb": gpu(), "a100-pcie-40gb": gpu("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB")}
    with pytest.raises(AmbiguousNameError) as error:
        get_accelerator("a100_40GB", catalog)
    assert set(error.value.candidates) == set(catalog) and error.value.close_matches == error.value.candidates
    assert "a100-sxm4-40gb" in str(error.value) and "a100-pcie-40gb" in str(error.value)
    with pytest.raises(UnknownNameError) as unknown:  # none of its candidates here: plainly unknown
        get_accelerator("RTX 6000", catalog)
    assert not isinstance(unknown.value, AmbiguousNameError)


def test_a_local_entry_can_claim_an_ambiguous_name_and_a_local_table_adds_names():
    shipped = load_catalog()
    with pytest.raises(AmbiguousNameError):
        get_accelerator("RTX 6000")
    mine = shipped["rtx-6000-ada"].model_copy(update={"name": "my-rtx-6000", "aliases": ("RTX 6000",)})
    local_catalog_path().parent.mkdir(parents=True, exist_ok=True)
    local_catalog_path().write_text(dump_catalog([mine], {"my fleet": ["my-rtx-6000", "h100-sxm5"]}))
    assert get_accelerator("rtx 6000").name == "my-rtx-6000"  # an exact alias wins over the shipped table
    with pytest.raises(AmbiguousNameError) as error:
        get_accelerator("My Fleet")
    assert error.value.candidates == ["my-rtx-6000", "h100-sxm5"]
    assert ambiguous_names()["my-fleet"] == ("my-rtx-6000", "h100-sxm5")
    save_local(gpu("my-a100", "My A100"))  # saving another entry keeps the local table
    assert "my-fleet" in ambiguous_names() and get_accelerator("my a100").name == "my-a100"


def test_the_loose_key_ignores_brands_punctuation_and_the_order_of_memory_and_form_factor():
    same = ["Tesla V100-SXM2-16GB", "V100 16GB SXM2", "v100 16 GB sxm2", "NVIDIA V100 (SXM2, 16GB)", "16G V100 SXM2"]
    assert {loose_key(name) for name in same} == {"v100|16gb sxm2"}
    assert loose_key("GH200 144G HBM3e") == loose_key("NVIDIA GH200 HBM3e 144GB") == "gh200|144gb hbm3e"
    assert loose_key("NVIDIA GeForce RTX 3080 10GB") == loose_key("RTX 3080 10 GB") == "rtx 3080|10gb"
    assert loose_key("H100 NVL 94GB") != loose_key("H100 94GB") and loose_key("A10G 24GB") != loose_key("A10 G 24GB")
    assert loose_key("RTX A6000 48GB") != loose_key("A6000 RTX 48GB")  # the model's own words keep their order
    for vague in ("NVIDIA H100", "Tesla P100", "RTX 3080", "NVIDIA", "80GB PCIe"):  # no qualifier, or no model
        assert loose_key(vague) == "", vague


def test_loose_spellings_resolve_and_stay_ambiguous_where_the_catalog_is():
    catalog = {"a100-sxm4-40gb": gpu("a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
               "a100-pcie-40gb": gpu("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB"),
               "h100-sxm5": gpu("h100-sxm5", "NVIDIA H100 80GB HBM3", "H100 SXM5 80GB", "H100"),
               "h100-nvl": gpu("h100-nvl", "NVIDIA H100 NVL")}
    for name, entry in {"A100 40GB SXM4": "a100-sxm4-40gb", "40GB A100-SXM4": "a100-sxm4-40gb",
                        "NVIDIA A100 40GB PCIe": "a100-pcie-40gb", "a100_pcie_40gb": "a100-pcie-40gb",
                        "H100 80GB SXM5": "h100-sxm5", "H100 HBM3 80GB": "h100-sxm5", "H100 NVL": "h100-nvl",
                        "Tesla H100 NVL": "h100-nvl", "NVL H100": "h100-nvl"}.items():
        assert get_accelerator(name, catalog).name == entry, name
    for name in ("A100 40GB", "40GB A100", "NVIDIA A100 40GB", "A100 PCIe", "PCIe A100"):  # the shipped table
        with pytest.raises(AmbiguousNameError) as error:
            get_accelerator(name, catalog)
        assert error.value.candidates and set(error.value.candidates) <= set(catalog), name
    with pytest.raises(UnknownNameError) as unknown:  # a loose miss is still unknown, with close matches
        get_accelerator("A100 SXM4 48GB", catalog)
    assert not isinstance(unknown.value, AmbiguousNameError) and "a100-sxm4-40gb" in unknown.value.close_matches
    with pytest.raises(UnknownNameError) as unknown:  # a bare name gets no loose look-up
        get_accelerator("NVIDIA H10", catalog)
    assert not isinstance(unknown.value, AmbiguousNameError) and "NVIDIA H100 NVL" in unknown.value.close_matches


def test_a_bare_name_with_brand_words_is_the_name_without_them():
    catalog = {"h100-sxm5": gpu("h100-sxm5", "NVIDIA H100 80GB HBM3", "H100"),
               "h100-nvl": gpu("h100-nvl", "NVIDIA H100 NVL"),
               "p100-pcie-16gb": gpu("p100-pcie-16gb", "Tesla P100-PCIE-16GB"),
               "p100-sxm2-16gb": gpu("p100-sxm2-16gb", "Tesla P100-SXM2-16GB"),
               "rtx-4090": gpu("rtx-4090", "NVIDIA GeForce RTX 4090", "RTX 4090")}
    for name, entry in {"NVIDIA H100": "h100-sxm5", "nvidia_h100": "h100-sxm5", "Tesla H100": "h100-sxm5",
                        "NVIDIA GeForce RTX 4090": "rtx-4090", "GeForce RTX 4090": "rtx-4090"}.items():
        assert get_accelerator(name, catalog).name == entry, name
    with pytest.raises(AmbiguousNameError) as error:  # the shipped table's P100, with its brand word
        get_accelerator("Tesla P100", catalog)
    assert set(error.value.candidates) == {"p100-pcie-16gb", "p100-sxm2-16gb"}
    shipped = load_catalog()
    for name, entry in {"Instinct MI300X": "mi300x", "AMD Instinct MI250X": "mi250x",
                        "Radeon Instinct MI25": "mi25"}.items():  # AMD's brand words as NVIDIA's
        assert get_accelerator(name, shipped).name == entry, name
    for name in ("NVIDIA", "NVIDIA Tesla", "H100 NVIDIA"):  # only leading brand words go, and never the whole name
        with pytest.raises(UnknownNameError) as unknown:
            get_accelerator(name, catalog)
        assert not isinstance(unknown.value, AmbiguousNameError), name


def test_a_name_with_the_parts_own_memory_size_resolves_and_an_ambiguous_one_narrows_by_it(monkeypatch):
    def sized(name: str, alias: str, memory_gb: float) -> HardwareSpec:
        return gpu(name, alias).model_copy(update={"memory_gb": memory_gb})

    catalog = {"x-24": sized("x-24", "Card X", 24.0), "y-old": sized("y-old", "Y Classic", 24.0),
               "y-new": sized("y-new", "Y Next", 48.0), "z-1": sized("z-1", "Z One", 16.0),
               "z-2": sized("z-2", "Z Two", 16.0), "z-3": sized("z-3", "Z Three", 12.0),
               "w-sxm": sized("w-sxm", "W SXM 80GB", 80.0)}
    table = {"y": ("y-old", "y-new"), "z": ("z-1", "z-2", "z-3")}  # look-up keys (`normalize_name`)
    monkeypatch.setattr(catalog_module, "ambiguous_names", lambda: table)
    for name, entry in {"Card X 24GB": "x-24", "NVIDIA Card X 24 GB": "x-24", "24GB Card X": "x-24",
                        "Y 48GB": "y-new", "Y 24 GB": "y-old", "Z 12GB": "z-3", "W SXM 80GB": "w-sxm"}.items():
        assert get_accelerator(name, catalog).name == entry, name
    with pytest.raises(AmbiguousNameError) as error:  # two of the three Zs have 16 GB
        get_accelerator("Z 16GB", catalog)
    assert set(error.value.candidates) == {"z-1", "z-2"}
    for name in ("Card X 48GB", "Y 32GB", "W SXM 40GB"):  # not the part's memory: unknown, as before
        with pytest.raises(UnknownNameError) as unknown:
            get_accelerator(name, catalog)
        assert not isinstance(unknown.value, AmbiguousNameError), name


def test_a_loose_key_two_entries_share_is_ambiguous():
    catalog = {"x-sxm": gpu("x-sxm", "X 80GB SXM"), "x-oam": gpu("x-oam", "SXM X 80GB")}
    assert get_accelerator("x 80gb sxm", catalog).name == "x-sxm"  # exact look-ups are untouched
    with pytest.raises(AmbiguousNameError) as error:
        get_accelerator("X SXM 80GB", catalog)
    assert set(error.value.candidates) == {"x-sxm", "x-oam"}


def test_loose_spellings_follow_a_local_entry_that_claims_a_name():
    shipped = load_catalog()
    mine = shipped["rtx-6000-ada"].model_copy(update={"name": "my-rtx-6000", "aliases": ("RTX 6000",)})
    local_catalog_path().parent.mkdir(parents=True, exist_ok=True)
    local_catalog_path().write_text(dump_catalog([mine]))
    local_catalog_path().write_text(dump_catalog([mine], {"My Fleet 80GB": ["my-rtx-6000", "h100-sxm5"]}))
    with pytest.raises(AmbiguousNameError) as error:  # a local ambiguous name, spelled loosely
        get_accelerator("NVIDIA 80GB My-Fleet")
    assert error.value.candidates == ["my-rtx-6000", "h100-sxm5"]
    mine = mine.model_copy(update={"aliases": ("RTX 6000", "A100 40GB")})  # claims a shipped ambiguous name
    local_catalog_path().write_text(dump_catalog([mine]))
    assert get_accelerator("NVIDIA 40GB A100").name == "my-rtx-6000"  # ... however it is spelled
    theirs = shipped["h100-sxm5"].model_copy(update={"aliases": ("H100 SXM5 80GB", "My H100")})
    local_catalog_path().write_text(dump_catalog([theirs]))  # same name: it replaces the shipped entry
    assert get_accelerator("H100 80GB SXM5") == theirs
