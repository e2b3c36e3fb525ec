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


def test_every_entry_names_its_source():
    for gpu in gpu_catalog():
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
