"""Safetensors files written by the test itself: the real format (u64 header length, JSON header, data), zeros for
the data. Sizes and dtypes are the test's own, so the expected bytes per dtype are known exactly."""

from __future__ import annotations

import json
import struct
from math import prod
from pathlib import Path

ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "U8": 1, "I8": 1, "I32": 4, "I64": 8}


def tensor_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    return prod(shape) * ELEMENT_BYTES[dtype]


def safetensors_bytes(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> bytes:
    """A whole safetensors file: {name: (dtype, shape)} in order, data zeroed."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = tensor_bytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_sharded(folder: Path, shards: list[dict[str, tuple[str, tuple[int, ...]]]]) -> dict[str, bytes]:
    """model-0000i-of-0000n.safetensors files and their model.safetensors.index.json; returns every file's bytes."""
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for number, tensors in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        files[name] = safetensors_bytes(tensors)
        for tensor, (dtype, shape) in tensors.items():
            weight_map[tensor] = name
            total += tensor_bytes(dtype, shape)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files
