"""GPU performance figures: vendor-published dense peaks and bandwidths for every catalog GPU, each with its source."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from kvops.errors import UsageError
from kvops.gpus import gpu_catalog, gpu_performance

DTYPES = {"bf16", "fp16", "fp8", "int8", "fp4"}
KINDS = {"nvlink", "xgmi", "pcie", None}


def _entries() -> dict[str, dict]:
    data = json.loads(resources.files("kvops.catalog").joinpath("gpu_performance.json").read_text())
    return {item["id"]: item for item in data["gpus"]}


def test_every_catalog_gpu_has_exactly_one_entry():
    data = json.loads(resources.files("kvops.catalog").joinpath("gpu_performance.json").read_text())
    ids = [item["id"] for item in data["gpus"]]
    assert sorted(ids) == sorted(gpu.id for gpu in gpu_catalog())
    assert len(ids) == len(set(ids))
    for gpu in gpu_catalog():
        assert gpu_performance(gpu.id) is not None, gpu.id


def test_about_defines_units_and_dense():
    about = json.loads(resources.files("kvops.catalog").joinpath("gpu_performance.json").read_text())["about"]
    assert "bytes per" in about and "DENSE" in about and "sparsity" in about and "per_direction" in about


@pytest.mark.parametrize("gpu_id, entry", _entries().items())
def test_entry_shape_and_source(gpu_id, entry):
    assert entry["variant"] and entry["form_factor"] and entry["flops_basis"], gpu_id
    assert set(entry["flops"]) <= DTYPES, gpu_id
    assert "Read 20" in entry["source"], gpu_id  # the date read
    assert "http" in entry["source"] or "No vendor datasheet" in entry["source"] or "not found" in entry["source"]
    link = entry["interconnect"]
    assert link["kind"] in KINDS and link["as_stated"], gpu_id
    if link["bidirectional_bytes_per_s"] is not None:
        assert link["per_direction_bytes_per_s"] * 2 == link["bidirectional_bytes_per_s"], gpu_id


@pytest.mark.parametrize("gpu_id, entry", _entries().items())
def test_nulls_say_why(gpu_id, entry):
    """A missing figure is null with a reason, never a guess: the basis text explains every null."""
    if entry["memory_bandwidth_bytes_per_s"] is None or None in entry["flops"].values():
        basis = entry["flops_basis"].lower()
        assert "null" in basis or "no figures" in basis, gpu_id


@pytest.mark.parametrize("gpu", gpu_catalog(), ids=lambda gpu: gpu.id)
def test_units_are_sane(gpu):
    perf = gpu_performance(gpu.id)
    assert perf is not None
    if perf.memory_bandwidth is not None:
        assert 1e11 < perf.memory_bandwidth < 1e13, gpu.id  # bytes/s: 100 GB/s .. 10 TB/s
    for dtype, value in perf.flops.items():
        assert isinstance(value, int) and 1e13 <= value < 1e17, (gpu.id, dtype)
    if "bf16" in perf.flops:
        assert 1e13 < perf.flops["bf16"] < 1e16, gpu.id
    if "bf16" in perf.flops and "fp8" in perf.flops:
        assert perf.flops["fp8"] >= perf.flops["bf16"], gpu.id
    if "fp8" in perf.flops and "fp4" in perf.flops:
        assert perf.flops["fp4"] >= perf.flops["fp8"], gpu.id
    if perf.interconnect_bandwidth is not None:
        assert 1e10 <= perf.interconnect_bandwidth < 1e13, gpu.id  # bytes/s per direction


def test_h100_sxm_datasheet_and_whitepaper_figures():
    perf = gpu_performance("H100-80GB")
    assert perf.memory_bandwidth == 3_350_000_000_000  # datasheet: 3.35TB/s
    assert perf.peak_flops("bfloat16") == 989_400_000_000_000  # whitepaper: 989.4 dense (1,979 with sparsity)
    assert perf.peak_flops("fp8") == 1_978_900_000_000_000
    assert perf.interconnect == "nvlink"
    assert perf.interconnect_bandwidth == 450_000_000_000  # NVLink 900GB/s, bidirectional total
    assert "SXM" in perf.variant


@pytest.mark.parametrize(
    "gpu_id, dtype, value",
    [
        ("A100-80GB", "bf16", 312_000_000_000_000),  # datasheet prints dense 312 | 624*
        ("L40S", "bf16", 362_050_000_000_000),  # datasheet prints dense 362.05 | 733*
        ("L4", "fp8", 242_500_000_000_000),  # 485* with sparsity, halved
        ("H100-NVL", "bf16", 835_500_000_000_000),  # 1,671* halved
        ("MI300X", "fp16", 1_307_400_000_000_000),  # AMD's peak table, dense
        ("B200", "fp4", 9_000_000_000_000_000),  # HGX B200: 18 PF with sparsity
        ("B300", "fp4", 14_000_000_000_000_000),  # printed '18 | 14' (sparse | dense)
        ("RTX-4090", "bf16", 165_200_000_000_000),  # FP32 accumulate, as engines run it
    ],
)
def test_exact_vendor_figures(gpu_id, dtype, value):
    assert gpu_performance(gpu_id).flops[dtype] == value


@pytest.mark.parametrize(
    "gpu_id, bandwidth",
    [
        ("A100-80GB", 2_039_000_000_000),
        ("A100-40GB", 1_555_000_000_000),
        ("H200", 4_800_000_000_000),
        ("MI300X", 5_300_000_000_000),
        ("B200", 7_700_000_000_000),
        ("RTX-4090", 1_008_000_000_000),
    ],
)
def test_exact_memory_bandwidths(gpu_id, bandwidth):
    assert gpu_performance(gpu_id).memory_bandwidth == bandwidth


@pytest.mark.parametrize(
    "dtype, key",
    [
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("fp8", "fp8"),
        ("fp8_e4m3", "fp8"),
        ("fp8_e5m2", "fp8"),
        ("float8_e4m3fn", "fp8"),
        ("int8", "int8"),
        ("nvfp4", "fp4"),
        ("mxfp4", "fp4"),
    ],
)
def test_serving_dtypes_map_to_the_vendor_figure(dtype, key):
    perf = gpu_performance("B200")
    assert perf.peak_flops(dtype) == perf.flops[key]


def test_a_dtype_the_part_lacks_is_none():
    assert gpu_performance("A100-80GB").peak_flops("fp8_e4m3") is None  # no FP8 before Hopper
    assert gpu_performance("H100-80GB").peak_flops("nvfp4") is None  # no FP4 before Blackwell
    assert gpu_performance("T4").peak_flops("bfloat16") is None  # Turing has no BF16 Tensor Cores


def test_unknown_dtype_is_a_usage_error():
    with pytest.raises(UsageError) as error:
        gpu_performance("H100-80GB").peak_flops("float32")
    assert "float32" in str(error.value) and "bfloat16" in str(error.value)


def test_lookup_by_alias_or_printed_name_and_unknown_is_none():
    assert gpu_performance("h100").id == "H100-80GB"
    assert gpu_performance("NVIDIA H100 80GB HBM3").id == "H100-80GB"
    assert gpu_performance("custom") is None
    assert gpu_performance("H300") is None


def test_parts_without_a_vendor_source_load_as_none():
    for gpu_id in ("A10G", "H20", "L20", "H800", "MI300A"):
        perf = gpu_performance(gpu_id)
        assert perf.memory_bandwidth is None and dict(perf.flops) == {}, gpu_id


def test_figures_are_read_only_and_to_dict_is_json():
    perf = gpu_performance("GB200")
    with pytest.raises(TypeError):
        perf.flops["bf16"] = 1  # type: ignore[index]
    out = json.loads(json.dumps(perf.to_dict()))
    assert out["id"] == "GB200" and out["flops"]["fp8"] == 5_000_000_000_000_000
    assert out["interconnect"] == "nvlink" and out["interconnect_bandwidth"] == 900_000_000_000
