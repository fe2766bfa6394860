"""The shipped catalog.json: enough GPUs, torch's device names and the datasets' device names resolve, ambiguous
names raise with their candidates, and the figures are consistent with each other, with the math modes' needs
(TF32 / bf16 / fp8 where the architecture has them), with the node fields and with NeuSight's spec sheets."""

import csv
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from perfmodel.core.errors import UnknownNameError
from perfmodel.hardware import catalog as catalog_module
from perfmodel.hardware.catalog import (
    AmbiguousNameError,
    get_accelerator,
    loose_key,
    normalize_name,
    shipped_ambiguous,
    shipped_specs,
)
from perfmodel.settings import get_settings

DATASETS = get_settings().datasets_dir

# torch.cuda.get_device_name() (CUDA / ROCm) and the datasets' folder-style names -> catalog id
DEVICE_NAMES = {
    "Tesla M40": "m40",
    "Tesla M60": "m60",
    "GeForce GTX TITAN X": "titan-x-maxwell",
    "Tesla P4": "p4",
    "Tesla P100-PCIE-12GB": "p100-pcie-12gb",
    "Tesla P100-PCIE-16GB": "p100-pcie-16gb",
    "Tesla P100-SXM2-16GB": "p100-sxm2-16gb",
    "TITAN X (Pascal)": "titan-x-pascal",
    "NVIDIA TITAN Xp": "titan-xp",
    "GeForce GTX 1080 Ti": "gtx-1080-ti",
    "NVIDIA GeForce GTX 1080 Ti": "gtx-1080-ti",
    "Tesla V100-PCIE-16GB": "v100-pcie-16gb",
    "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla V100-SXM2-16GB": "v100-sxm2-16gb",
    "Tesla V100-SXM2-32GB": "v100-sxm2-32gb",
    "Tesla V100S-PCIE-32GB": "v100s-pcie-32gb",
    "Tesla T4": "t4",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "NVIDIA A30": "a30",
    "NVIDIA A40": "a40",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA L4": "l4",
    "NVIDIA L40S": "l40s",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 80GB HBM3": "h100-sxm5",
    "NVIDIA H200": "h200",
    "NVIDIA B200": "b200",
    "Radeon Instinct MI25": "mi25",
    "AMD Instinct MI100": "mi100",
    "AMD Instinct MI210": "mi210",
    "AMD Instinct MI250": "mi250",
    "AMD Instinct MI250X": "mi250x",
    "AMD Instinct MI300X": "mi300x",
    "AMD Instinct MI300X VF": "mi300x",
    "NVIDIA TITAN V": "titan-v",
    "Quadro GV100": "quadro-gv100",
    "NVIDIA TITAN RTX": "titan-rtx",
    "TITAN RTX": "titan-rtx",
    "Quadro RTX 4000": "quadro-rtx-4000",
    "Quadro RTX 5000": "quadro-rtx-5000",
    "Quadro RTX 6000": "quadro-rtx-6000",
    "Quadro RTX 8000": "quadro-rtx-8000",
    "NVIDIA RTX A4000": "rtx-a4000",
    "NVIDIA RTX A4500": "rtx-a4500",
    "NVIDIA RTX A5000": "rtx-a5000",
    "NVIDIA RTX A5500": "rtx-a5500",
    "NVIDIA A16": "a16",
    "NVIDIA A2": "a2",
    "NVIDIA A800-SXM4-80GB": "a800-sxm4-80gb",
    "NVIDIA A800 80GB PCIe": "a800-pcie-80gb",
    "NVIDIA GeForce RTX 3090 Ti": "rtx-3090-ti",
    "NVIDIA L40": "l40",
    "NVIDIA L20": "l20",
    "NVIDIA RTX 4000 Ada Generation": "rtx-4000-ada",
    "NVIDIA RTX 4000 SFF Ada Generation": "rtx-4000-sff-ada",
    "NVIDIA RTX 5000 Ada Generation": "rtx-5000-ada",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H800": "h800-sxm",
    "NVIDIA H800 PCIe": "h800-pcie",
    "NVIDIA H20": "h20",
    "NVIDIA GH200 480GB": "gh200-96gb",
    "NVIDIA GH200 144G HBM3e": "gh200-144gb",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA GB200": "gb200",
    "NVIDIA GB300": "gb300",
    "Tesla P40": "p40",
    "GeForce RTX 2080": "rtx-2080",
    "GeForce RTX 2080 SUPER": "rtx-2080-super",
    "NVIDIA GeForce RTX 3060": "rtx-3060",
    "NVIDIA GeForce RTX 3080 Ti": "rtx-3080-ti",
    "NVIDIA GeForce RTX 4070 Ti": "rtx-4070-ti",
    "NVIDIA GeForce RTX 4080": "rtx-4080",
    "NVIDIA GeForce RTX 4080 SUPER": "rtx-4080-super",
    "NVIDIA GeForce RTX 5080": "rtx-5080",
    "NVIDIA GeForce RTX 5090": "rtx-5090",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "rtx-pro-6000-blackwell-workstation",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000-blackwell-server",
    "AMD Instinct MI300A": "mi300a",
    "AMD Instinct MI325X": "mi325x",
    "AMD Instinct MI350X": "mi350x",
    "AMD Instinct MI355X": "mi355x",
    "Tesla K80": "k80",
    "NVIDIA GeForce RTX 2080 Ti": "rtx-2080-ti",
    "GeForce RTX 2080 Ti": "rtx-2080-ti",
    "NVIDIA GeForce RTX 3070": "rtx-3070",
    "GeForce RTX 3070": "rtx-3070",
    "NVIDIA GeForce RTX 3080": "rtx-3080",
    "GeForce RTX 3080": "rtx-3080",
    "GeForce RTX 2070 with Max-Q Design": "rtx-2070-max-q",
    "NVIDIA GeForce RTX 2070 with Max-Q Design": "rtx-2070-max-q",
    "GeForce RTX 2080 with Max-Q Design": "rtx-2080-max-q",
    "NVIDIA GeForce RTX 2080 with Max-Q Design": "rtx-2080-max-q",
    "GeForce RTX 2080 Super with Max-Q Design": "rtx-2080-super-max-q",
    "NVIDIA GeForce RTX 2080 Super with Max-Q Design": "rtx-2080-super-max-q",
    "GeForce RTX 3080 Laptop GPU": "rtx-3080-max-q",
    "NVIDIA GeForce RTX 3080 Laptop GPU": "rtx-3080-max-q",
    "A100-SXM-80GB": "a100-sxm4-80gb",  # older drivers, no "NVIDIA " (Lambda's systems.csv)
    # names people type, and their documented defaults (catalog module docstring)
    "h100": "h100-sxm5",
    "H100 SXM": "h100-sxm5",
    "h100-sxm": "h100-sxm5",
    "h100-80gb": "h100-sxm5",
    "a100": "a100-sxm4-80gb",
    "a100-80gb": "a100-sxm4-80gb",
    "v100": "v100-sxm2-32gb",
    "H200": "h200",
    "H800": "h800-sxm",
    "rtx4090": "rtx-4090",
    "4090": "rtx-4090",
    "5090": "rtx-5090",
    "3090": "rtx-3090",
    "a6000": "rtx-a6000",
    "RTX 6000 Ada": "rtx-6000-ada",
    "L40S": "l40s",
    "MI300X": "mi300x",
    # folder / file names in the datasets (runs of space, _ and - match each other)
    "NVIDIA_A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA_A100_80GB_PCIe": "a100-pcie-80gb",
    "NVIDIA_H100_80GB_HBM3": "h100-sxm5",
    "Tesla_V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla_P100-PCIE-16GB": "p100-pcie-16gb",
    "AMD_Instinct_MI100": "mi100",
    "AMD_Instinct_MI250": "mi250",
    "NV_TitanX_Pascal": "titan-x-pascal",
    "AMD_MI25": "mi25",
    "RTX4090": "rtx-4090",  # llmservingsim
    "RTX3090": "rtx-3090",
    "A6000": "rtx-a6000",
    "RTXPRO6000": "rtx-pro-6000-blackwell-server",
    "k80": "k80",  # Gavel's worker type (one GK210 die)
}

# Lambda's deeplearning-benchmark: every `gpu` of runs.csv / failed_runs.csv (the held-out Hopper, Blackwell and
# RTX 6000 Ada names too) -> catalog id. Checked without the dataset; test_every_lambda_gpu_name_resolves checks the
# CSVs hold no other name.
LAMBDA_GPUS = {
    "GTX 1080 Ti": "gtx-1080-ti", "V100 16GB SXM2": "v100-sxm2-16gb", "V100 32GB SXM2": "v100-sxm2-32gb",
    "Quadro RTX 5000": "quadro-rtx-5000", "Quadro RTX 6000": "quadro-rtx-6000", "Quadro RTX 8000": "quadro-rtx-8000",
    "RTX 2070 Max-Q": "rtx-2070-max-q", "RTX 2080 Max-Q": "rtx-2080-max-q",
    "RTX 2080 Super Max-Q": "rtx-2080-super-max-q", "RTX 2080 Ti": "rtx-2080-ti", "Titan RTX": "titan-rtx",
    "A10": "a10", "A100 40GB PCIe": "a100-pcie-40gb", "A100 40GB SXM4": "a100-sxm4-40gb",
    "A100 80GB PCIe": "a100-pcie-80gb", "A100 80GB SXM4": "a100-sxm4-80gb", "A40": "a40", "RTX 3070": "rtx-3070",
    "RTX 3080": "rtx-3080", "RTX 3080 Max-Q (Laptop)": "rtx-3080-max-q", "RTX 3090": "rtx-3090",
    "RTX A4000": "rtx-a4000", "RTX A4500": "rtx-a4500", "RTX A5000": "rtx-a5000", "RTX A5500": "rtx-a5500",
    "RTX A6000": "rtx-a6000", "RTX 4090": "rtx-4090",
    # held out of the given part (PROVENANCE.md), named in Lambda's summary tables
    "H100 80GB PCIe": "h100-pcie", "H100 80GB SXM5": "h100-sxm5", "H200 141GB": "h200", "GH200 96GB": "gh200-96gb",
    "B200 192GB": "b200", "RTX 6000 Ada": "rtx-6000-ada",
}
# label forms people write (memory and form factor in either order, brand words or not) -> catalog id
LABEL_FORMS = {
    "H100 80GB SXM5": "h100-sxm5", "H100 SXM5 80GB": "h100-sxm5", "NVIDIA H100 80GB SXM5": "h100-sxm5",
    "H100 80GB PCIe": "h100-pcie", "H100 PCIe": "h100-pcie", "H100 PCIe 80GB": "h100-pcie",
    "A100 40GB SXM4": "a100-sxm4-40gb", "A100 80GB SXM4": "a100-sxm4-80gb", "A100 40GB PCIe": "a100-pcie-40gb",
    "A100 80GB PCIe": "a100-pcie-80gb", "A100 SXM4 40GB": "a100-sxm4-40gb", "NVIDIA A100 80GB SXM4": "a100-sxm4-80gb",
    "A100 80 GB PCIe": "a100-pcie-80gb", "A100-PCIE-80GB": "a100-pcie-80gb", "A100 SXM 80GB": "a100-sxm4-80gb",
    "B200 192GB": "b200", "B200 180GB": "b200", "H200 141GB": "h200", "H200 140GB": "h200", "H200 SXM 141GB": "h200",
    "H200 141GB SXM": "h200", "H200 NVL 141GB": "h200-nvl", "GH200 96GB": "gh200-96gb", "GH200 144GB": "gh200-144gb",
    "GH200 144G HBM3e": "gh200-144gb", "RTX 6000 Ada": "rtx-6000-ada", "RTX A6000": "rtx-a6000",
    "Quadro RTX 8000": "quadro-rtx-8000", "V100 16GB SXM2": "v100-sxm2-16gb", "V100 32GB SXM2": "v100-sxm2-32gb",
    "V100 SXM2 16GB": "v100-sxm2-16gb", "Tesla V100 SXM2 32GB": "v100-sxm2-32gb", "V100 32GB PCIe": "v100-pcie-32gb",
    "GTX 1080 Ti": "gtx-1080-ti", "RTX 4090": "rtx-4090", "Tesla V100-SXM2-16GB": "v100-sxm2-16gb",
    "RTX 2080 Ti": "rtx-2080-ti", "GeForce RTX 2080 Ti": "rtx-2080-ti", "NVIDIA GeForce RTX 2080 Ti": "rtx-2080-ti",
    "RTX 3070": "rtx-3070", "RTX 3080": "rtx-3080", "RTX 3080 10GB": "rtx-3080",
    # the part's own memory size added to a name of it; an ambiguous name narrowed to its one part of that size
    "RTX 3090 24GB": "rtx-3090", "L40S 48GB": "l40s", "A10 24GB": "a10", "Tesla T4 16GB": "t4", "L4 24 GB": "l4",
    "RTX A6000 48GB": "rtx-a6000", "RTX 6000 48GB": "rtx-6000-ada", "RTX 6000 24GB": "quadro-rtx-6000",
    "P100 12GB": "p100-pcie-12gb", "V100S": "v100s-pcie-32gb", "Tesla V100S": "v100s-pcie-32gb",
    # GeForce and workstation cards common in labs, from their spec sheets
    "GTX 1080": "gtx-1080", "GeForce GTX 1070": "gtx-1070", "RTX 2060": "rtx-2060", "RTX 2060 Super": "rtx-2060-super",
    "RTX 2070": "rtx-2070", "NVIDIA GeForce RTX 2070 SUPER": "rtx-2070-super", "RTX 3050": "rtx-3050",
    "RTX 3060 Ti": "rtx-3060-ti", "NVIDIA GeForce RTX 3070 Ti": "rtx-3070-ti", "RTX 4060": "rtx-4060",
    "RTX 4060 Ti 16GB": "rtx-4060-ti-16gb", "RTX 4060 Ti 8GB": "rtx-4060-ti-8gb", "RTX 4070": "rtx-4070",
    "RTX 4070 Super": "rtx-4070-super", "RTX 4070 Ti SUPER": "rtx-4070-ti-super", "RTX 5070": "rtx-5070",
    "GeForce RTX 5070 Ti": "rtx-5070-ti", "NVIDIA RTX 4500 Ada Generation": "rtx-4500-ada",
    "RTX 2000 Ada": "rtx-2000-ada", "RTX A6000 Ada": "rtx-6000-ada",
    "AdaA6000": "rtx-6000-ada",  # Lambda's results folders (`*AdaA6000*`)
    "NVIDIA GeForce RTX 3080": "rtx-3080", "RTX 3080 Laptop GPU": "rtx-3080-max-q", "RTX 3080 Max-Q": "rtx-3080-max-q",
    "RTX 3080 Max-Q 16GB": "rtx-3080-max-q", "RTX 2080 Super Max-Q": "rtx-2080-super-max-q",
    "Tesla K80": "k80", "K80": "k80", "NVIDIA Tesla K80": "k80",
}

# every GPU the brief names must be in the catalog (ids other code and tests use stay as they are)
REQUIRED_IDS = {
    "a100-sxm4-80gb", "a100-sxm4-40gb", "a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm5", "h100-pcie", "rtx-4090",
    "rtx-3090", "rtx-a6000", "a10", "v100-sxm2-32gb", "l40s", "v100s-pcie-32gb", "titan-v", "titan-rtx",
    "quadro-rtx-6000", "quadro-rtx-8000", "rtx-a4000", "rtx-a4500", "rtx-a5000", "rtx-a5500", "rtx-4000-ada",
    "rtx-5000-ada", "rtx-6000-ada", "l40", "l20", "l4", "a16", "a2", "a800-pcie-40gb", "a800-pcie-80gb",
    "a800-sxm4-80gb", "h800-pcie", "h800-sxm", "h20", "h100-nvl", "gh200-96gb", "gh200-144gb", "h200", "h200-nvl",
    "b200", "gb200", "gb300", "rtx-pro-6000-blackwell-workstation", "rtx-pro-6000-blackwell-server", "rtx-3090-ti",
    "rtx-5090", "mi100", "mi210", "mi250", "mi250x", "mi300x", "mi300a", "mi325x", "mi350x", "mi355x",
    # Lambda's deeplearning-benchmark GPUs, and Gavel's K80 (one GK210 die)
    "rtx-2080-ti", "rtx-3070", "rtx-3080", "rtx-2070-max-q", "rtx-2080-max-q", "rtx-2080-super-max-q",
    "rtx-3080-max-q", "k80",
}
# architectures and the math modes they accelerate
TF32_ARCHS = {"ampere", "ada", "hopper", "blackwell", "cdna3"}  # CDNA4 dropped TF32 matrix instructions (ROCm docs)
BF16_ARCHS = {"ampere", "ada", "hopper", "blackwell", "cdna", "cdna2", "cdna3", "cdna4"}
FP8_ARCHS = {"ada", "hopper", "blackwell", "cdna3", "cdna4"}
FP16_ARCHS = {"volta", "turing", *BF16_ARCHS}
BOARD_FORMS = {"sxm", "oam", "superchip"}  # devices joined by NVLink / Infinity Fabric on the board
# GeForce RTX cards (not TITAN) run fp16 / bf16 / TF32 tensor math with fp32 accumulate at half the rate of the
# professional parts: the fp16 peak over the fp32 (CUDA-core) peak, by architecture
GEFORCE_FP16_OVER_FP32 = {"turing": 4.0, "ampere": 2.0, "ada": 2.0, "blackwell": 2.0}


@pytest.fixture(scope="module")
def catalog():
    return {spec.name: spec for spec in shipped_specs()}


@pytest.fixture(scope="module")
def gpus(catalog):
    return [spec for spec in catalog.values() if spec.kind == "gpu"]


def test_every_required_gpu_and_the_probed_cpu_are_catalogued(catalog, gpus):
    assert not REQUIRED_IDS - set(catalog), sorted(REQUIRED_IDS - set(catalog))
    assert len(gpus) >= 70 and "cpu" in catalog
    assert {g.vendor for g in gpus} == {"NVIDIA", "AMD"}


@pytest.mark.parametrize("device_name,entry", sorted(DEVICE_NAMES.items()))
def test_torch_and_folder_device_names_resolve(catalog, device_name, entry):
    assert get_accelerator(device_name, catalog).name == entry


@pytest.mark.parametrize("label,entry", sorted({**LAMBDA_GPUS, **LABEL_FORMS}.items()))
def test_lambda_gpu_names_and_the_label_forms_people_write_resolve(catalog, label, entry):
    assert get_accelerator(label, catalog).name == entry


def test_ids_are_lower_case_dashed_and_every_gpu_entry_is_complete(gpus):
    for g in gpus:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", g.name), g.name
        missing = [field for field in ("architecture", "release_year", "form_factor", "memory_type", "pcie_gen",
                                       "interconnect", "fp32_cores_per_cu", "peak_fp64_gflops")
                   if getattr(g, field) is None]
        assert not missing, f"{g.name} lacks {missing}"
        assert g.aliases and len(g.source) > 20, g.name


def test_peaks_are_ordered(gpus):
    for g in gpus:
        fp32 = g.peak_fp32_gflops
        for half in (g.peak_fp16_gflops, g.peak_bf16_gflops):
            assert half is None or half >= fp32, g.name
        if g.peak_tf32_gflops is not None:
            assert g.peak_fp16_gflops is not None and g.peak_tf32_gflops <= g.peak_fp16_gflops, g.name
        if g.peak_fp8_gflops is not None:
            assert g.peak_fp8_gflops >= g.peak_fp16_gflops, g.name
        if g.peak_fp32_matrix_gflops is not None:
            assert g.peak_fp32_matrix_gflops >= fp32, g.name
        assert g.peak_fp64_gflops <= fp32, g.name
        if g.architecture in ("kepler", "maxwell", "pascal", "volta", "turing", "gcn5", "cdna", "cdna2"):
            assert g.peak_tf32_gflops is None and g.peak_fp8_gflops is None, g.name


def test_every_gpu_has_the_peaks_its_math_modes_need(gpus):
    """A predictor picks the peak of the job's math mode (fp32, TF32, fp16/bf16 autocast, fp8): the catalog must
    have it wherever the architecture accelerates that mode, and leave it empty where it does not."""
    for g in gpus:
        arch = g.architecture
        if arch in FP16_ARCHS:
            assert g.peak_fp16_gflops and g.peak_fp16_gflops >= g.peak_fp32_gflops, f"{g.name}: fp16 peak"
        assert (g.peak_tf32_gflops is not None) == (arch in TF32_ARCHS), f"{g.name} ({arch}): TF32 peak"
        assert (g.peak_bf16_gflops is not None) == (arch in BF16_ARCHS), f"{g.name} ({arch}): bf16 peak"
        assert (g.peak_fp8_gflops is not None) == (arch in FP8_ARCHS), f"{g.name} ({arch}): fp8 peak"
        if g.vendor == "AMD" and arch.startswith("cdna"):
            assert g.peak_fp32_matrix_gflops, f"{g.name}: fp32 matrix peak"
        if arch == "cdna4":
            assert "TF32" in g.source, f"{g.name}: say why TF32 is missing"


def test_every_gpu_says_how_its_devices_talk_and_what_node_it_sits_in(gpus):
    for g in gpus:
        assert g.peer_to_peer in ("nvlink", "pcie", "none"), g.name
        assert g.node_devices and g.node_network_gbit_s, g.name
        assert "Node:" in g.source, f"{g.name}: the source must give the node fields' reasoning"
        if g.form_factor in BOARD_FORMS or g.name == "mi300a":
            assert g.peer_to_peer == "nvlink", g.name
        if g.peer_to_peer == "nvlink":
            assert g.interconnect.startswith(("nvlink", "infinity-fabric")), g.name
        if g.form_factor in ("sxm", "oam"):
            assert g.node_devices == 8 and g.node_network_gbit_s >= 400, g.name
        if g.node_devices == 4 and g.peer_to_peer != "nvlink":  # workstations: Ethernet
            assert 10 <= g.node_network_gbit_s <= 25, g.name
        if g.form_factor == "laptop":  # one GPU, no peer, Gigabit Ethernet / Wi-Fi
            assert g.node_devices == 1 and g.peer_to_peer == "none" and g.interconnect == "pcie", g.name
            assert 1 <= g.node_network_gbit_s <= 10, g.name
        else:  # up to 8 x 800 Gb/s ConnectX-8 (HGX B300)
            assert 10 <= g.node_network_gbit_s <= 6400, g.name
    by_name = {g.name: g for g in gpus}
    for geforce in ("rtx-2080", "rtx-2080-super", "rtx-2080-ti", "rtx-3060", "rtx-3070", "rtx-3080", "rtx-3080-ti",
                    "rtx-3090", "rtx-3090-ti", "rtx-4070-ti", "rtx-4080", "rtx-4080-super", "rtx-4090", "rtx-5080",
                    "rtx-5090", "rtx-2060", "rtx-2070-super", "rtx-3050", "rtx-3060-ti", "rtx-4060", "rtx-4070",
                    "rtx-5070"):  # NVIDIA's driver: no P2P over PCIe on GeForce RTX cards
        assert by_name[geforce].peer_to_peer == "none", geforce
    for geforce in ("gtx-1080-ti", "titan-xp", "gtx-1080", "gtx-1070"):  # before Turing it allowed it
        assert by_name[geforce].peer_to_peer == "pcie", geforce
    for pcie_card in ("a100-pcie-80gb", "h100-pcie", "l40s", "a10", "t4", "rtx-a6000", "mi210", "k80"):
        assert by_name[pcie_card].peer_to_peer == "pcie", pcie_card
    network = {name: spec.node_network_gbit_s for name, spec in by_name.items()}
    assert network["v100-sxm2-32gb"] == 400 and network["a100-sxm4-80gb"] == 1600
    assert network["h100-sxm5"] == network["h200"] == network["b200"] == 3200 and network["b300"] == 6400


def test_geforce_tensor_peaks_are_half_rate_with_fp32_accumulate(gpus):
    """GeForce RTX cards: fp16 (and bf16 / TF32) tensor peaks with fp32 accumulate, half the professional rate:
    fp16 = 4 x fp32 on Turing (8 on a TITAN RTX / Quadro), 2 x fp32 from Ampere on (4 on an RTX A6000); TF32 = fp32."""
    checked = 0
    for g in gpus:
        if not any("geforce rtx" in alias.lower() for alias in g.aliases):
            continue
        ratio = g.peak_fp16_gflops / g.peak_fp32_gflops
        assert math.isclose(ratio, GEFORCE_FP16_OVER_FP32[g.architecture], rel_tol=0.01), f"{g.name}: {ratio:.3f}"
        if g.peak_bf16_gflops is not None:
            assert g.peak_bf16_gflops == g.peak_fp16_gflops, g.name
        if g.peak_tf32_gflops is not None:
            assert math.isclose(g.peak_tf32_gflops, g.peak_fp32_gflops, rel_tol=0.01), g.name
        checked += 1
    assert checked >= 19


def test_laptop_parts_say_which_configuration_their_figures_are(gpus):
    laptops = [g for g in gpus if g.form_factor == "laptop"]
    assert {g.name for g in laptops} >= {"rtx-2070-max-q", "rtx-2080-max-q", "rtx-2080-super-max-q", "rtx-3080-max-q"}
    for g in laptops:
        assert g.tdp_w and g.tdp_w <= 150 and g.boost_clock_mhz and g.base_clock_mhz, g.name
        assert "Max-Q" in g.source and "Derived" in g.source and "TGP" in g.source, g.name


def test_k80_is_one_gk210_die(catalog):
    k80 = catalog["k80"]
    assert (k80.architecture, k80.compute_units * k80.fp32_cores_per_cu, k80.memory_gb) == ("kepler", 2496, 12.0)
    assert k80.memory_bandwidth_gb_s == 240.0 and math.isclose(k80.peak_fp32_gflops, 4370, rel_tol=0.01)
    assert k80.peak_fp16_gflops is None and "GK210 die" in k80.source


def test_fp32_peak_is_lanes_times_two_times_clock(gpus):
    checked = 0
    for g in gpus:
        if g.boost_clock_mhz is None:
            continue
        lanes = g.compute_units * g.fp32_cores_per_cu * 2 * g.boost_clock_mhz / 1000
        ratio = g.peak_fp32_gflops / lanes
        # CDNA3 and CDNA4 datasheets count dual-issue fp32 in the vector peak
        expected = 2.0 if g.architecture in ("cdna3", "cdna4") else 1.0
        assert math.isclose(ratio, expected, rel_tol=0.03), f"{g.name}: {ratio:.3f}"
        checked += 1
    assert checked >= 20


def test_generations_order_as_expected(catalog):
    bw = {name: spec.memory_bandwidth_gb_s for name, spec in catalog.items()}
    assert bw["b200"] > bw["h200"] > bw["h100-sxm5"] > bw["a100-sxm4-80gb"] > bw["a100-sxm4-40gb"]
    assert bw["h100-pcie"] > bw["a100-pcie-80gb"] > bw["a100-pcie-40gb"] > bw["v100-sxm2-32gb"] > bw["p4"]
    assert bw["mi300x"] > bw["mi250x"] and bw["t4"] > bw["p4"]
    fp16 = {name: spec.peak_fp16_gflops for name, spec in catalog.items()}
    assert fp16["b200"] > fp16["h100-sxm5"] > fp16["h100-pcie"] > fp16["a100-sxm4-40gb"] > fp16["v100-sxm2-16gb"]
    assert fp16["v100-sxm2-16gb"] > fp16["t4"] > fp16["p100-pcie-16gb"]
    assert catalog["h100-sxm5"].peak_fp32_gflops > catalog["a100-sxm4-80gb"].peak_fp32_gflops


def test_link_bandwidth_only_for_gpu_to_gpu_links(gpus):
    for g in gpus:
        if g.interconnect == "pcie":
            assert g.interconnect_bidir_gb_s is None, g.name
        elif g.form_factor == "sxm":
            assert g.interconnect.startswith("nvlink") and g.interconnect_bidir_gb_s, g.name


def test_bare_short_names_pick_one_documented_default(catalog):
    defaults = {"A100": "a100-sxm4-80gb", "A100 80GB": "a100-sxm4-80gb", "V100": "v100-sxm2-32gb",
                "H100": "h100-sxm5", "H100 80GB": "h100-sxm5", "H100 SXM": "h100-sxm5", "H200": "h200",
                "H800": "h800-sxm", "RTXPRO6000": "rtx-pro-6000-blackwell-server", "H200 141GB": "h200",
                "GH200": "gh200-96gb"}
    doc = catalog_module.__doc__
    for short, entry in defaults.items():
        assert get_accelerator(short, catalog).name == entry, short
        assert f"`{short}`" in doc and entry in doc, f"{short} -> {entry} is not documented in the module docstring"
    for entry in ("a100-sxm4-80gb", "v100-sxm2-32gb", "h100-sxm5", "h200", "h800-sxm", "gh200-96gb"):
        assert "Default for the bare name" in catalog[entry].source, entry
    for short, entry in defaults.items():  # with the brand words people put in front, the same part
        for brand in ("NVIDIA", "Tesla", "nvidia"):
            assert get_accelerator(f"{brand} {short}", catalog).name == entry, f"{brand} {short}"


def test_ambiguous_names_raise_and_list_their_candidates(catalog):
    table = shipped_ambiguous()
    assert {"RTX 6000", "A100 40GB", "RTX PRO 6000"} <= set(table)
    aliases = {normalize_name(a) for spec in catalog.values() for a in (spec.name, *spec.aliases)}
    for name, candidates in table.items():
        assert len(candidates) >= 2 and set(candidates) <= set(catalog), name
        assert normalize_name(name) not in aliases, f"{name} is ambiguous and an alias at once"
        words = name.split()  # loose spellings of names with a qualifier: a brand word, the qualifiers first
        qualifiers = [w for w in words if re.fullmatch(r"(?i)\d+gb|pcie|sxm\d?", w)]
        loose = (f"NVIDIA {name}", " ".join(qualifiers + [w for w in words if w not in qualifiers])) if qualifiers \
            else ()
        for spelling in (name, name.lower().replace(" ", "_"), f"  {name.upper()} ", *loose):
            with pytest.raises(AmbiguousNameError) as error:
                get_accelerator(spelling, catalog)
            assert error.value.candidates == list(candidates)
            assert all(c in str(error.value) for c in candidates) and "ambiguous" in str(error.value)
            assert isinstance(error.value, UnknownNameError)  # callers that skip unknown names skip these too
    with pytest.raises(AmbiguousNameError) as error:
        get_accelerator("RTX 6000", catalog)
    assert set(error.value.candidates) == {"quadro-rtx-6000", "rtx-6000-ada", "rtx-pro-6000-blackwell-workstation",
                                           "rtx-pro-6000-blackwell-server"}
    with pytest.raises(AmbiguousNameError) as error:  # the memory size narrows an ambiguous name to its parts
        get_accelerator("P100 16GB", catalog)
    assert set(error.value.candidates) == {"p100-pcie-16gb", "p100-sxm2-16gb"}


def test_unknown_names_list_close_matches_ignoring_case_and_separators(catalog):
    with pytest.raises(UnknownNameError) as error:
        get_accelerator("nvidia h10", catalog)  # no qualifier: no loose look-up
    assert not isinstance(error.value, AmbiguousNameError)
    assert {"NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"} <= set(error.value.close_matches)
    assert "did you mean" in str(error.value)
    with pytest.raises(UnknownNameError) as error:
        get_accelerator("A100 40GB", catalog)
    assert {"a100-pcie-40gb", "a100-sxm4-40gb"} <= set(error.value.close_matches)
    with pytest.raises(UnknownNameError) as error:
        get_accelerator("H101", catalog)
    assert "h100-sxm5" in error.value.close_matches or "H100" in error.value.close_matches
    assert len(error.value.close_matches) <= 5


# --- the datasets in ../shared/datasets ----------------------------------------------------------------------------
def needs(folder: str) -> Path:
    path = DATASETS / folder
    if not path.is_dir():
        pytest.skip(f"dataset folder {path} is absent "
                    "(set PERFMODEL_DATASETS_DIR, or put shared/datasets beside the checkout)")
    return path


def csv_column(path: Path, column: str) -> set[str]:
    with (gzip.open(path, "rt", newline="") if path.suffix == ".gz" else open(path, newline="")) as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if column not in header:
            return set()
        i = header.index(column)
        return {row[i].strip() for row in reader if len(row) > i and row[i].strip()}


def neusight_devices(root: Path) -> set[str]:
    names = {p.name for p in (root / "label").iterdir() if p.is_dir()} if (root / "label").is_dir() else set()
    for path in root.glob("data/**/*.csv*"):
        if "/collect/" in path.as_posix():  # one file per device, named after it
            names.add(path.name.removesuffix(".gz").removesuffix(".csv"))
        else:
            names |= csv_column(path, "Device")
    for path in root.glob("data/**/device_configs/*.json"):
        names |= {path.stem, json.loads(path.read_text())["Device"]}
    return names


def deepbench_devices(root: Path) -> set[str]:
    names: set[str] = set()
    for path in root.glob("tidy/*.csv"):
        names |= csv_column(path, "device")
    for path in root.glob("results/**/csv/*__Specs.csv"):
        with open(path, newline="") as f:
            for row in csv.reader(f):
                if row and row[0].strip() == "GPU Model" and len(row) > 1:
                    names.add(row[1].strip())
                if row and row[0].strip() == "CPU Model" and "Xeon Phi" in "".join(row[1:]):
                    names.add(row[1].strip())
    return names


def vidur_devices(root: Path) -> set[str]:
    base = root / "data" / "profiling"
    return {p.name for kind in ("compute", "network") if (base / kind).is_dir()
            for p in (base / kind).iterdir() if p.is_dir()}


def vtrain_devices(root: Path) -> set[str]:
    names = {p.name for p in (root / "trace").iterdir() if p.is_dir()} if (root / "trace").is_dir() else set()
    for path in root.glob("config/**/*.json"):
        gpu = json.loads(path.read_text(encoding="utf-8-sig")).get("gpu_name")
        if gpu:
            names.add(gpu)
    return names


def llmservingsim_devices(root: Path) -> set[str]:
    names = {p.name for sub in ("profiler/perf", "profiler/v0/perf_models", "bench/examples")
             if (root / sub).is_dir() for p in (root / sub).iterdir() if p.is_dir()}
    for path in root.glob("profiler/perf/**/meta.yaml"):
        names |= {line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("gpu:")}
    for path in root.glob("bench/examples/**/config.json"):
        text = path.read_text()
        names |= set(re.findall(r'"hardware":\s*"([^"]+)"', text))
    return names


@pytest.mark.parametrize("folder,devices,expected", [
    ("neusight", neusight_devices, {"Tesla P4", "AMD Instinct MI210", "NVIDIA A100 80GB PCIe"}),
    ("deepbench", deepbench_devices, {"NV_M40", "NV_TitanX", "AMD_MI25", "IA_KNL7250"}),
    ("vidur", vidur_devices, {"a100", "a40", "a100_dgx"}),
    ("vtrain", vtrain_devices, {"a100", "v100", "A100"}),
    ("llmservingsim", llmservingsim_devices, {"RTX4090", "RTXPRO6000", "A6000", "RTX3090",
                                              "NVIDIA RTX PRO 6000 Blackwell Server Edition"}),
])
def test_every_device_named_in_a_dataset_resolves(catalog, folder, devices, expected):
    names = devices(needs(folder))
    assert expected <= names, f"{folder}: device names not found where expected"
    unknown = set()
    for name in names:
        try:
            get_accelerator(name, catalog)
        except UnknownNameError:
            unknown.add(name)
    assert not unknown, f"{folder} names devices the catalog lacks: {sorted(unknown)}"


def test_figures_agree_with_neusight_spec_sheets(catalog):
    """NeuSight's device_configs/*.json are spec-sheet features; ours may differ only where the source says so."""
    configs = sorted((needs("neusight") / "data" / "device_configs").glob("*.json"))
    assert configs
    for path in configs:
        sheet = json.loads(path.read_text())
        spec = get_accelerator(sheet["Device"], catalog)
        assert math.isclose(sheet["Mem_Bw"], spec.memory_bandwidth_gb_s, rel_tol=0.02), spec.name
        assert abs(sheet["Dev_Mem"] - spec.memory_gb) <= 1.0, spec.name
        if spec.vendor == "AMD":
            assert sheet["Num_Sm"] == spec.compute_units
            assert math.isclose(sheet["SingleFLOPsVEC"], spec.peak_fp32_gflops, rel_tol=0.02), spec.name
            assert math.isclose(sheet["SingleFLOPsMM"], spec.peak_fp32_matrix_gflops, rel_tol=0.02), spec.name
        else:  # NeuSight's P4 has 40 "SMs" of 64: same CUDA-core total
            assert sheet["Num_Sm"] * sheet["Core_Per_SM"] == spec.compute_units * spec.fp32_cores_per_cu
            assert math.isclose(sheet["SingleFLOPs"], spec.peak_fp32_gflops, rel_tol=0.05), spec.name
        if sheet["L2Cache"] != spec.l2_cache_mb or not math.isclose(sheet["Freq"], spec.boost_clock_mhz,
                                                                     rel_tol=0.005):
            assert "NeuSight" in spec.source and "disagree" in spec.source, f"{spec.name}: undocumented difference"


def test_aliases_do_not_collide_across_entries(catalog):
    owner = {}
    for spec in catalog.values():
        for key in {normalize_name(spec.name), *map(normalize_name, spec.aliases)}:
            assert owner.setdefault(key, spec.name) == spec.name, key


def test_loose_keys_do_not_collide_across_entries_or_hide_an_ambiguous_name(catalog):
    """Every loose key (catalog module docstring) of a name or alias leads to one entry, and no ambiguous name's
    loose key is an alias's."""
    owner: dict[str, str] = {}
    for spec in catalog.values():
        for written in (spec.name, *spec.aliases):
            key = loose_key(written)
            if key:
                assert owner.setdefault(key, spec.name) == spec.name, f"{written!r}: {key!r} is also {owner[key]!r}'s"
    assert len(owner) >= 50
    assert not {name for name in shipped_ambiguous() if loose_key(name) in owner}


# --- Lambda's deeplearning-benchmark ---------------------------------------------------------------------------------
def test_every_lambda_gpu_name_resolves(catalog):
    """Every GPU name of ../shared/datasets/lambda: the `gpu` column of runs.csv and failed_runs.csv (LAMBDA_GPUS
    says which entry each is) and the device names sys_pytorch.txt recorded (systems.csv `gpu_reported`, `_` for
    spaces, ' | ' between the GPUs of a mixed machine)."""
    root = needs("lambda")
    names = csv_column(root / "runs.csv", "gpu") | csv_column(root / "failed_runs.csv", "gpu")
    assert {"RTX 2080 Ti", "RTX 3080 Max-Q (Laptop)", "V100 16GB SXM2"} <= names
    assert names <= set(LAMBDA_GPUS), sorted(names - set(LAMBDA_GPUS))
    for name in names:
        assert get_accelerator(name, catalog).name == LAMBDA_GPUS[name], name
    reported = {one.strip() for value in csv_column(root / "systems.csv", "gpu_reported") for one in value.split("|")}
    assert "GeForce_RTX_3080_Laptop_GPU" in reported
    unknown = set()
    for name in reported:
        try:
            get_accelerator(name, catalog)
        except UnknownNameError:
            unknown.add(name)
    assert not unknown, sorted(unknown)
