"""The ways out vLLM itself offers a plan that does not fit: a quantized KV dtype the release takes, weights or
evicted KV blocks in host memory."""

from __future__ import annotations

from math import ceil

from kvops.dtypes import resolve_kv_dtype
from kvops.engines.vllm import options, releases
from kvops.plan import Plan, PlanInputs, WayOut

PCIE_BYTES_PER_SECOND = 25 * 10**9  # PCIe 4.0 x16, what host<->GPU copies reach in practice (an estimate)


def _release_options(inputs: PlanInputs) -> tuple[releases.VllmRelease, options.ReleaseOptions]:
    release = releases.release(inputs.engine_version)
    return release, options.for_version(release.version)


def kv_dtype_ways(inputs: PlanInputs) -> list[str]:
    """The quantized KV dtypes to try, least lossy first, that the planned release takes (int8 and int4 per token
    and head from 0.20.0 and 0.25.0): the CPU build's attention takes fp8 only."""
    _, release_options = _release_options(inputs)
    return options.kv_ways(release_options, inputs.device, inputs.gpu.vendor if inputs.gpu else None)


def kv_dtype_spelling(inputs: PlanInputs, name: str) -> str:
    """How the planned release is told to keep the KV cache in `name`."""
    release, release_options = _release_options(inputs)
    dtype = resolve_kv_dtype(name, inputs.spec.dtype)
    value = options.kv_cache_dtype(release_options, dtype, inputs.spec.dtype, inputs.device, release.label)
    return f"{name} KV, vLLM --kv-cache-dtype {value}"


def offload_ways(inputs: PlanInputs, failed: Plan) -> list[WayOut]:
    """Host memory instead of GPU memory: weights (UVA) or evicted KV blocks; described, not re-planned."""
    if inputs.device != "gpu" or failed.need_bytes is None or failed.have_bytes is None:
        return []
    _, release_options = _release_options(inputs)
    short = max(0, failed.need_bytes - max(failed.have_bytes, 0))
    if short <= 0:
        return []
    gib = ceil(short / (1 << 30))
    seconds = gib * (1 << 30) / PCIE_BYTES_PER_SECOND
    weights = failed.term("weights")
    ways = []
    if weights and gib * (1 << 30) < weights.bytes and release_options.has("--cpu-offload-gb"):
        ways.append(
            WayOut(
                f"--cpu-offload-gb {gib}",
                None,
                f"moves {gib} GiB of weights per GPU to host memory (UVA), freeing it for KV; every forward step streams them over PCIe: ~{seconds * 1000:.0f} ms per step at ~25 GB/s (an estimate)",
                "decode slows by that much on every token",
            )
        )
    if failed.kv_cache_bytes <= 0 or not release_options.has("--kv-offloading-size"):
        return ways  # the weights and overheads do not fit (host memory for KV blocks changes nothing), or no tier
    if failed.capacity is None or failed.capacity.requests_at_full < 1:
        return ways  # one request does not fit the GPU's blocks: a host tier holds evicted blocks, not a longer one
    ways.append(
        WayOut(
            f"--kv-offloading-size {gib * inputs.tp} --kv-offloading-backend native",
            None,
            f"keeps {gib * inputs.tp} GiB (all TP ranks) of evicted KV blocks in host memory, so preempted and repeated prefixes reload over PCIe (~{seconds * 1000:.0f} ms per {gib} GiB) instead of being recomputed; it does not raise how many sequences run at once",
            f"costs {gib * inputs.tp} GiB of host RAM",
        )
    )
    return ways
