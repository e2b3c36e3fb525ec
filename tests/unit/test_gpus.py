"""The GPU catalog: the totals vendor tools report, each with its public source; names any case."""

from __future__ import annotations

import pytest

from kvops.errors import UsageError
from kvops.gpus import find_gpu, gpu_catalog, resolve_gpu

MiB = 1 << 20

# What nvidia-smi / rocm-smi print as the device total, as captured in public threads (sources in gpus.json).
REPORTED_MIB = {
    "A10G": 23028,
    "L4": 23034,
    "L40S": 46068,
    "A100-40GB": 40960,
    "A100-80GB": 81920,
    "H100-80GB": 81559,
    "H200": 143771,
    "B200": 183359,
    "RTX-3090": 24576,
    "RTX-4090": 24564,
    "GH200": 97871,
    "B300": 275040,
    "GB200": 189471,
    "GB300": 284208,
    "H100-NVL": 95830,
    "H100-PCIe": 81559,
    "H200-NVL": 143771,
    "H20": 97871,
    "H20-3e": 143771,
    "H800": 81559,
    "L20": 46068,
    "RTX-5090": 32607,
    "RTX-PRO-6000": 97887,
    "RTX-6000-Ada": 49140,
}


@pytest.mark.parametrize("gpu_id, mib", REPORTED_MIB.items())
def test_nvidia_totals_are_what_nvidia_smi_reports(gpu_id, mib):
    gpu = find_gpu(gpu_id)
    assert gpu.memory_bytes == mib * MiB
    assert gpu.reported_by == "nvidia-smi"


def test_mi300x_total_is_what_rocm_smi_reports_in_bytes():
    gpu = find_gpu("MI300X")
    assert gpu.memory_bytes == 206141652992  # rocm-smi --showmeminfo vram
    assert gpu.vendor == "amd" and gpu.reported_by == "rocm-smi"


# Totals found only in files of the research code index, whose repository the index does not name: the source
# quotes the tool's own line and gives the index ids (the quoted line can be re-read by them).
INDEXED_ONLY = {
    "GH200",
    "H100-NVL",
    "H100-PCIe",
    "H200-NVL",
    "H20",
    "H20-3e",
    "H800",
    "RTX-5060-Ti",
    "RTX-6000-Ada",
    "MI325X",
}


# Totals found only as vLLM's own 'total_gpu_memory (X GiB)' line in a public notebook's output (named by its path)
VLLM_LINE_ONLY = {"T4"}


def test_every_entry_names_its_source():
    for gpu in gpu_catalog():
        if gpu.id in VLLM_LINE_ONLY:
            assert "total_gpu_memory (" in gpu.source and ".ipynb" in gpu.source, gpu.id
            continue
        if gpu.id in INDEXED_ONLY:
            quoted = ("MiB |", "MiB/GPU", "vendor")
            assert "code-index id" in gpu.source and any(words in gpu.source for words in quoted), gpu.id
            continue
        assert gpu.source and ("#" in gpu.source or "measured on an H200 for kvops" in gpu.source), gpu.id


@pytest.mark.parametrize("name", ["h200", "H200", "nvidia h200", "h200-sxm", "  H200 "])
def test_names_match_case_insensitively_by_id_product_name_or_alias(name):
    assert find_gpu(name).id == "H200"


def test_unknown_gpu_is_one_line_listing_the_valid_names():
    with pytest.raises(UsageError) as error:
        find_gpu("H300")
    message = str(error.value)
    assert "\n" not in message and "H300" in message and "H100-80GB" in message and "--gpu-memory" in message


def test_gpu_memory_overrides_the_catalog_figure_or_stands_alone():
    assert resolve_gpu("L4", 30 * (1 << 30)).memory_bytes == 30 * (1 << 30)
    assert resolve_gpu("L4", 30 * (1 << 30)).id == "L4"
    custom = resolve_gpu(None, 12345 * MiB)
    assert custom.id == "custom" and custom.memory_bytes == 12345 * MiB
    with pytest.raises(UsageError):
        resolve_gpu(None, None)


@pytest.mark.parametrize(
    "printed, gpu_id",
    [
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),  # nvidia-smi and vLLM's device name
        ("nvidia  h100 80gb  hbm3", "H100-80GB"),
        ("H100_PCIe", "H100-PCIe"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("GH200 120GB", "GH200-120GB"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA RTX PRO 6000 Blac...", "RTX-PRO-6000"),  # nvidia-smi truncates long names
        ("NVIDIA GeForce RTX 5090", "RTX-5090"),
        ("AMD MI300", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Instinct MI325X", "MI325X"),
        ("mi355x", "MI355X"),
    ],
)
def test_names_as_tools_and_engines_print_them(printed, gpu_id):
    assert find_gpu(printed).id == gpu_id


@pytest.mark.parametrize("gpu_id", ["MI300A", "MI325X", "MI355X"])
def test_parts_without_a_tool_capture_say_how_to_measure(gpu_id):
    gpu = find_gpu(gpu_id)
    assert gpu.reported_by == "vendor specification"
    assert "kvops calibrate" in gpu.source and "--gpu-memory" in gpu.source
