"""Each vLLM release's own option set: which `vllm serve` options a plan for that release may emit, the
`--kv-cache-dtype` values and `--quantization` methods it takes, its image tag.

The table is release_options.json, read from the releases' PyPI wheels by bench/vllm_options.py (every row names
the file and line of the wheel it comes from); a release not read there follows the newest read release at or
before it. Nothing here is vLLM 0.32-specific: a plan for 0.10.1 emits and suggests what 0.10.1 takes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from kvops.dtypes import KvDtype
from kvops.engines.release import Version, newest_read
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.packaged import packaged_text

OPTIONS_FILE = "release_options.json"
# docs.vllm.ai deployment/docker: the official image, entrypoint `vllm serve`, tagged v<release>
IMAGE = "vllm/vllm-openai:v{version}"
ROCM_IMAGE = "vllm/vllm-openai-rocm:v{version}"
ROCM_IMAGE_SINCE = Version(0, 32, 0)  # the first release whose ROCm image kvops has checked (the 0.32.0 tag)
# before it AMD publishes ROCm builds of vLLM as rocm/vllm:rocm<X>_vllm_<release>_<date> tags
# (rocm.docs.amd.com, "vLLM inference performance testing version history")
ROCM_BUILDS = "rocm/vllm"

# kvops KV dtype -> `--kv-cache-dtype` where the names differ (vllm/config/cache.py CacheDType); the packed and
# per-token-head modes added from 0.20.0 keep vLLM's own names
_SPELLINGS = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "int8": "int8_per_token_head",
    "int4": "int4_per_token_head",
}
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # CPUAttentionBackend.supported_kv_cache_dtypes
# packed layouts a backend of one vendor only implements (vllm/v1/attention/backends/rocm_octave_attn.py)
ROCM_ONLY = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")
# the quantized KV dtypes a plan tries as ways out, least lossy first (each only where its release takes it)
KV_WAYS = ("int8", "fp8", "int4")
# options bench/vllm_options.py began reading on 2026-12-07, in the wheels then at hand: the older releases' rows
# were read before and are silent on them, which says nothing of whether those releases take them
READ_SINCE = {
    "--enable-chunked-prefill": Version(0, 32, 0),
    "--no-enable-chunked-prefill": Version(0, 32, 0),
    "--performance-mode": Version(0, 32, 0),
    "--async-scheduling": Version(0, 32, 0),
    "--no-async-scheduling": Version(0, 32, 0),
    "--disable-sliding-window": Version(0, 32, 0),
    "--kv-cache-dtype-skip-layers": Version(0, 32, 0),
    "--enable-lora": Version(0, 32, 0),
    "--max-loras": Version(0, 32, 0),
    "--max-lora-rank": Version(0, 32, 0),
    "--fully-sharded-loras": Version(0, 32, 0),
    "--lora-dtype": Version(0, 32, 0),
    "--decode-context-parallel-size": Version(0, 32, 0),
}


@frozen
class Choices:
    """An option's accepted values in one release, and the wheel file:line that lists them."""

    values: tuple[Any, ...]
    source: str


@frozen
class ReleaseOptions:
    """What one release's `vllm serve` takes, as read from its wheel (`read`: the release whose wheel was read)."""

    read: Version
    options: dict[str, str]  # option -> wheel file:line
    kv_cache_dtypes: Choices
    quantization: Choices | None
    block_sizes: Choices | None  # None: any positive size passes config validation

    def has(self, option: str) -> bool:
        return option in self.options

    def where(self, option: str) -> str:
        return f"vllm {self.read} wheel, {self.options[option]}" if option in self.options else ""


def image(version: Version, vendor: str | None) -> str:
    """The official image of a release (its own tag, `v` + the release as typed) for the device's vendor."""
    tag = version.release_tag
    if vendor == "amd":
        return ROCM_IMAGE.format(version=tag) if version >= ROCM_IMAGE_SINCE else ROCM_BUILDS
    return IMAGE.format(version=tag)


@lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    text = packaged_text("kvops.engines.vllm", OPTIONS_FILE)
    return json.loads(text)["releases"]


def _choices(item: dict[str, Any] | None) -> Choices | None:
    return Choices(tuple(item["values"]), item["source"]) if item else None


@lru_cache(maxsize=64)
def for_version(version: Version) -> ReleaseOptions:
    """The option set of the newest release read at or before `version` (the oldest read one below it all)."""
    table = _table()
    chosen = newest_read(table, version)
    data = table[chosen.text]
    kv = _choices(data["kv_cache_dtypes"])
    assert kv is not None, f"release_options.json: {chosen} lists no --kv-cache-dtype values"
    return ReleaseOptions(
        Version(chosen.major, chosen.minor, chosen.patch),
        dict(data["options"]),
        kv,
        _choices(data["quantization"]),
        _choices(data["block_sizes"]),
    )


def first_with(option: str) -> Version | None:
    """The first release read that takes `option` (None: none does)."""
    table = _table()
    found = sorted(Version.parse(name) for name, data in table.items() if option in data["options"])
    return found[0] if found else None


def last_with(option: str) -> Version | None:
    """The newest release read that takes `option` (None: none does)."""
    table = _table()
    found = sorted(Version.parse(name) for name, data in table.items() if option in data["options"])
    return found[-1] if found else None


def read_after(version: Version) -> Version | None:
    """The next release whose wheel was read after `version` (None: it is the newest read)."""
    later = sorted(Version.parse(name) for name in _table() if Version.parse(name) > version)
    return later[0] if later else None


def first_with_kv_dtype(value: str) -> Version | None:
    table = _table()
    found = sorted(
        Version.parse(name)
        for name, data in table.items()
        if data["kv_cache_dtypes"] and value in data["kv_cache_dtypes"]["values"]
    )
    return found[0] if found else None


def first_with_quantization(value: str) -> Version | None:
    table = _table()
    found = sorted(
        Version.parse(name)
        for name, data in table.items()
        if data["quantization"] and value in data["quantization"]["values"]
    )
    return found[0] if found else None


def kv_cache_dtype(options: ReleaseOptions, dtype: KvDtype, model_dtype: str, device: str, label: str) -> str:
    """The `--kv-cache-dtype` value of this release: 'auto' when the cache keeps the model's own dtype; a value the
    release does not take is a one-line error naming the release that adds it."""
    if dtype.name == model_dtype:
        return "auto"
    value = _SPELLINGS.get(dtype.name, dtype.name)
    if value not in options.kv_cache_dtypes.values:
        since = first_with_kv_dtype(value)
        added = f" (added in {since})" if since else ""
        raise UsageError(
            f"--kv-dtype {dtype.name}: {label} has no --kv-cache-dtype {value}{added}; it takes "
            f"{', '.join(map(str, options.kv_cache_dtypes.values))} (vllm {options.read} wheel, {options.kv_cache_dtypes.source})"
        )
    if device == "cpu" and value not in CPU_KV_CACHE_DTYPES:
        raise UsageError(
            f"--kv-dtype {dtype.name}: vLLM's CPU attention takes --kv-cache-dtype {', '.join(CPU_KV_CACHE_DTYPES)} only"
        )
    return value


def kv_dtype_name(value: str) -> str:
    """The kvops KV dtype a `--kv-cache-dtype` value names (the inverse of the spellings above)."""
    inverse = {flag: name for name, flag in _SPELLINGS.items()}
    return inverse.get(value, value)


def kv_ways(options: ReleaseOptions, device: str, vendor: str | None) -> list[str]:
    """The quantized KV dtypes to try as ways out, least lossy first, that this release takes on this device."""
    if device == "cpu":
        return ["fp8"]
    return [name for name in KV_WAYS if _SPELLINGS.get(name, name) in options.kv_cache_dtypes.values]


def check_weight_format(options: ReleaseOptions, name: str, label: str) -> None:
    """The release serves the checkpoint's weight format: bitsandbytes only where its quantization methods list it
    (vLLM served it from 0.5 until it was removed), EETQ never (TGI's)."""
    if name == "eetq":
        raise UsageError("eetq weights are TGI's (--quantize eetq); plan --engine tgi, or vLLM with --quantization fp8")
    if not name.startswith("bitsandbytes") or options.quantization is None:
        return
    if "bitsandbytes" in options.quantization.values:
        return
    since = first_with_quantization("bitsandbytes")
    raise UsageError(
        f"{name} weights: {label} has no bitsandbytes quantization (vllm {options.read} wheel, "
        f"{options.quantization.source}; served from {since}); plan an earlier --engine-version, serve an AWQ, GPTQ "
        f"or FP8 checkpoint, or plan --engine tgi (--quantize {name})"
    )


def missing(options: ReleaseOptions, emitted: dict[str, Any], label: str) -> str | None:
    """The first option a plan would emit that this release does not take, as a one-line error (None: all taken).
    The model is `vllm serve`'s positional argument, not an option."""
    for name in emitted:
        option = f"--{name}"
        if name == "model" or options.has(option):
            continue
        read = READ_SINCE.get(option)
        if read is not None and not options.read.at_least(read.major, read.minor, read.patch):
            return (
                f"{option}: kvops has read that option in the wheels of vLLM {read} and later only, not in "
                f"{label}'s; plan with --engine-version {read} or later, or without it"
            )
        since = first_with(option)
        added = f"; added in vLLM {since}" if since else ""
        return f"{option}: {label} has no {option} (its option set: vllm {options.read} wheel, vllm/engine/arg_utils.py{added})"
    return None
