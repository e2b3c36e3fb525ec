"""What a vLLM run states about its own launch (its non-default args, its cache config): the deployment options
that predict that very run (`kvops calibrate`, `kvops explain`)."""

from __future__ import annotations

from typing import Any

from kvops.deployment import DeploymentOptions
from kvops.engines.vllm.flags import KV_DTYPE_OF_FLAG
from kvops.engines.vllm.logs import VllmLog
from kvops.engines.vllm.metrics import CacheConfig
from kvops.engines.vllm.releases import V0_SUFFIX

# the run's args -> DeploymentOptions fields
_INTEGER_ARGS = {
    "tensor_parallel_size": "tp",
    "max_num_batched_tokens": "batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "block_size": "block_size",
}


def stated_options(log: VllmLog | None, config: CacheConfig | None) -> DeploymentOptions:
    """The options the run itself states; the device total from its log when it ran on a GPU."""
    args = log.args if log else {}
    options: dict[str, Any] = {}
    if args.get("model"):
        options["model"] = args["model"]
    length = (log.max_model_len if log else None) or args.get("max_model_len") or max_model_len(config)
    if isinstance(length, int) and length > 0:
        options["max_model_len"] = length
    for key, option in _INTEGER_ARGS.items():
        if isinstance(args.get(key), int):
            options[option] = args[key]
    pinned = args.get("kv_cache_memory_bytes") or (config.integer("kv_cache_memory_bytes") if config else None)
    if pinned:
        options["kv_cache_memory_bytes"] = pinned
    util = (
        args.get("gpu_memory_utilization")
        or (log.get("gpu_memory_utilization") if log else None)
        or (config.number("gpu_memory_utilization") if config else None)
    )
    if util:
        options["memory_fraction"] = float(util)
    dtype = args.get("kv_cache_dtype") or (config.get("cache_dtype") if config else None)
    if dtype in KV_DTYPE_OF_FLAG:
        options["kv_dtype"] = KV_DTYPE_OF_FLAG[dtype]
    if args.get("enforce_eager"):
        options["enforce_eager"] = True
    if log and log.device:
        options["device"] = log.device
    release = log.release() if log else None
    if release is not None:
        options["engine_version"] = (
            f"{release.version}{V0_SUFFIX if release.v0 and release.version.at_least(0, 8) else ''}"
        )
    block = config.integer("block_size") if config else None
    if block and "block_size" not in options:
        options["block_size"] = block
    return DeploymentOptions.stated(**options)


def max_model_len(config: CacheConfig | None) -> int | None:
    """max_model_len from the cache config: `kv_cache_size_tokens = int(max concurrency x max_model_len)`, so the
    quotient is max_model_len to within 1 / concurrency (exact once rounded, for concurrency >= 1)."""
    if config is None:
        return None
    tokens, concurrency = config.integer("kv_cache_size_tokens"), config.number("kv_cache_max_concurrency")
    if not tokens or not concurrency or concurrency < 1:
        return None
    return round(tokens / concurrency)


def version_from_endpoint(text: str) -> str | None:
    """The version a running engine's `/version` answers (`{"version": "0.32.0"}`), or None."""
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return str(version) if version else None
