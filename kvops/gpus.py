"""The GPU catalog: each device with the total memory its vendor tool reports, and where that figure comes from.

Names match case-insensitively by id or alias ("h100", "H100-80GB", "rtx4090"); `--gpu-memory 80GiB` overrides
the figure (or stands alone for a device the catalog lacks).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import field, replace
from functools import lru_cache
from types import MappingProxyType

from kvops.errors import MissingDevice, UsageError
from kvops.frozen import frozen
from kvops.packaged import packaged_text

MiB = 1 << 20


@frozen
class Gpu:
    id: str
    name: str  # the product name nvidia-smi / rocm-smi prints
    vendor: str  # "nvidia", "amd" or "custom"
    memory_bytes: int  # total per device, as reported_by shows it
    reported_by: str
    source: str
    aliases: tuple[str, ...] = ()

    @property
    def memory_mib(self) -> float:
        return self.memory_bytes / MiB

    def with_memory(self, memory_bytes: int) -> Gpu:
        """The same device with an overridden total (`--gpu-memory`)."""
        return replace(
            self, memory_bytes=memory_bytes, reported_by="--gpu-memory", source=f"--gpu-memory override of {self.id}"
        )

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "memory_bytes": self.memory_bytes,
            "reported_by": self.reported_by,
            "source": self.source,
        }


@lru_cache(maxsize=1)
def gpu_catalog() -> tuple[Gpu, ...]:
    data = json.loads(packaged_text("kvops.catalog", "gpus.json"))
    gpus = []
    for item in data["gpus"]:
        memory = item["memory_bytes"] if "memory_bytes" in item else item["memory_mib"] * MiB
        gpus.append(
            Gpu(
                item["id"],
                item["name"],
                item["vendor"],
                memory,
                item["reported_by"],
                item["source"],
                tuple(item.get("aliases", ())),
            )
        )
    return tuple(gpus)


def find_gpu(name: str) -> Gpu:
    """A GPU by id, alias or the name nvidia-smi, rocm-smi or an engine log prints ('NVIDIA H100 80GB HBM3',
    'AMD Instinct MI300X'), any case and spacing, with or without the vendor's prefix."""
    index = _name_index()
    for key in _keys(name):
        if key in index:
            return index[key]
        if key in AMBIGUOUS:
            raise UsageError(
                f"--gpu {name!r} names two parts, {' and '.join(AMBIGUOUS[key])}: give one (a plan for the other "
                "promises twice its memory or half)"
            )
    valid = ", ".join(gpu.id for gpu in gpu_catalog())
    raise UsageError(f"--gpu {name!r} is not in the GPU catalog; valid: {valid} (or give --gpu-memory SIZE)")


AMBIGUOUS = {"a100": ("A100-40GB", "A100-80GB")}  # a name without its size
_VENDOR_PREFIXES = ("nvidia-geforce-", "nvidia-", "amd-instinct-", "amd-", "geforce-", "instinct-")


def _normal(name: str) -> str:
    """Case, spacing and the memory's spelling as logs and threads write it: 'A100 80 GB', 'A100 80G', 'a100_80gb'."""
    spaced = re.sub(r"(\d+)\s*g(?:b|ib)?\b", r"\1gb", name.strip().lower())
    return re.sub(r"[\s_]+", "-", spaced).rstrip(".")


def _keys(name: str) -> list[str]:
    """The name normalised, then without a vendor prefix."""
    key = _normal(name)
    keys = [key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix):
            keys.append(key[len(prefix) :])
    return keys


@lru_cache(maxsize=1)
def _name_index() -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for gpu in gpu_catalog():
        for name in (gpu.id, gpu.name, *gpu.aliases):
            for key in _keys(name):
                index.setdefault(key, gpu)
    return index


def custom_gpu(memory_bytes: int) -> Gpu:
    return Gpu("custom", "custom device", "custom", memory_bytes, "--gpu-memory", "--gpu-memory")


def resolve_gpu(name: str | None, memory_bytes: int | None) -> Gpu:
    """`--gpu NAME` and/or `--gpu-memory SIZE`: at least one is needed."""
    if name is None:
        if memory_bytes is None:
            raise MissingDevice(
                "missing --gpu NAME (e.g. H100-80GB; `kvops plan --help` lists them) or --gpu-memory SIZE"
            )
        return custom_gpu(memory_bytes)
    gpu = find_gpu(name)
    return gpu.with_memory(memory_bytes) if memory_bytes is not None else gpu


# Serving dtype names (vLLM --dtype / --quantization / --kv-cache-dtype, torch) -> the key of the vendor figure.
_FLOPS_KEYS = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "fp8_e4m3fn": "fp8",
    "fp8_e4m3fnuz": "fp8",
    "fp8_e5m2fnuz": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "float8_e5m2fnuz": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
}


@frozen
class GpuPerformance:
    """A GPU's vendor-published peaks (gpu_performance.json): dense Tensor-core FLOP/s per dtype, memory and
    GPU-to-GPU bandwidth in bytes/s. None where the vendor publishes no figure (the json says why)."""

    id: str
    variant: str  # the SKU the figures belong to (SXM, PCIe, NVL ...)
    memory_bandwidth: int | None  # bytes/s
    flops: Mapping[str, int] = field(hash=False)  # dense, per dtype key: bf16, fp16, fp8, int8 (ops/s), fp4
    interconnect: str | None  # "nvlink", "xgmi", "pcie"
    interconnect_bandwidth: int | None  # bytes/s per direction, per GPU
    source: str

    def peak_flops(self, dtype: str) -> int | None:
        """Dense peak for a serving dtype ('bfloat16', 'fp8_e4m3', 'nvfp4' ...); None when the part has no
        published figure for it (no FP8 before Hopper/Ada, no FP4 before Blackwell, or none found)."""
        key = _FLOPS_KEYS.get(dtype.strip().lower())
        if key is None:
            raise UsageError(f"dtype {dtype!r} has no Tensor-core peak; valid: {', '.join(_FLOPS_KEYS)}")
        return self.flops.get(key)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "variant": self.variant,
            "memory_bandwidth": self.memory_bandwidth,
            "flops": dict(self.flops),
            "interconnect": self.interconnect,
            "interconnect_bandwidth": self.interconnect_bandwidth,
            "source": self.source,
        }


def _performance(item: dict) -> GpuPerformance:
    link = item["interconnect"]
    flops = {key: value for key, value in item["flops"].items() if value is not None}
    return GpuPerformance(
        item["id"],
        item["variant"],
        item["memory_bandwidth_bytes_per_s"],
        MappingProxyType(flops),
        link["kind"],
        link["per_direction_bytes_per_s"],
        item["source"],
    )


@lru_cache(maxsize=1)
def _performance_table() -> dict[str, GpuPerformance]:
    data = json.loads(packaged_text("kvops.catalog", "gpu_performance.json"))
    return {item["id"]: _performance(item) for item in data["gpus"]}


@lru_cache(maxsize=64)  # names come from users and logs: bounded
def gpu_performance(gpu_id: str) -> GpuPerformance | None:
    """The performance figures of a catalog GPU, by id or any name find_gpu takes; None for a device the catalog
    lacks (a --gpu-memory custom device)."""
    table = _performance_table()
    if gpu_id in table:
        return table[gpu_id]
    try:
        return table.get(find_gpu(gpu_id).id)
    except UsageError:
        return None
