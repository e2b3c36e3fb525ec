"""What a vLLM run states about its own launch (its non-default args, its cache config): the deployment options
that predict that very run (`kvops calibrate`, `kvops explain`)."""

from __future__ import annotations

import json
from typing import Any

from kvops.deployment import DeploymentOptions
from kvops.engines.vllm.flags import KV_DTYPE_OF_FLAG, LORA_DTYPES
from kvops.engines.vllm.logs import VllmLog
from kvops.engines.vllm.metrics import CacheConfig
from kvops.engines.vllm.releases import V0_SUFFIX, V1_SUFFIX

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
    if isinstance(args.get("model"), str) and args["model"]:
        options["model"] = args["model"]
    length = (log.max_model_len if log else None) or args.get("max_model_len") or max_model_len(config)
    if _whole(length, 1, MAX_COUNT):
        options["max_model_len"] = length
    for key, option in _INTEGER_ARGS.items():
        if _whole(args.get(key), 1, MAX_COUNT):
            options[option] = args[key]
    pinned = args.get("kv_cache_memory_bytes") or (config.integer("kv_cache_memory_bytes") if config else None)
    if _whole(pinned, 1, MAX_COUNT):
        options["kv_cache_memory_bytes"] = pinned
    util = (
        args.get("gpu_memory_utilization")
        or (log.get("gpu_memory_utilization") if log else None)
        or (config.number("gpu_memory_utilization") if config else None)
    )
    if isinstance(util, (int, float)) and not isinstance(util, bool) and 0 < util <= 1:  # a log is user input
        options["memory_fraction"] = float(util)
    dtype = args.get("kv_cache_dtype") or (config.get("cache_dtype") if config else None)
    if isinstance(dtype, str) and dtype in KV_DTYPE_OF_FLAG:
        options["kv_dtype"] = KV_DTYPE_OF_FLAG[dtype]
    if args.get("enforce_eager"):
        options["enforce_eager"] = True
    compilation = args.get("compilation_config")
    if isinstance(compilation, dict) and {
        "cudagraph_mode",
        "cudagraph_capture_sizes",
        "max_cudagraph_capture_size",
    } & set(compilation):
        options["compilation_config"] = json.dumps(compilation)
    if args.get("disable_custom_all_reduce"):
        options["custom_all_reduce"] = False
    if _whole(args.get("num_gpu_blocks_override"), 1, MAX_COUNT):
        options["num_gpu_blocks_override"] = args["num_gpu_blocks_override"]
    if isinstance(args.get("enable_extensible_kv_cache"), bool):
        options["extensible_kv_cache"] = args["enable_extensible_kv_cache"]
    if log and log.device:
        options["device"] = log.device
    release = log.release() if log else None
    if release is not None:
        suffix = (
            V0_SUFFIX if release.v0 and release.version.at_least(0, 8) else (V1_SUFFIX if release.v1_opt_in else "")
        )
        options["engine_version"] = f"{release.version}{suffix}"
        if not release.v0 and release.version.at_least(0, 32):
            options |= _read_since_032(args)
    block = config.integer("block_size") if config else None
    if block and "block_size" not in options:
        options["block_size"] = block
    options["as_run"] = True
    return DeploymentOptions.stated(**options)


MAX_COUNT = 1 << 50  # tokens, blocks, bytes a run may state: past this a log line is not a real run's


def _read_since_032(args: dict[str, Any]) -> dict[str, Any]:
    """What a run of 0.32 or later states of the options kvops reads from those releases on: decode context
    parallelism and the LoRA slots (an older run's LoRA layers kvops has not read: its plan leaves them out)."""
    options: dict[str, Any] = {}
    if _whole(args.get("decode_context_parallel_size"), 2, MAX_COUNT):
        options["dcp"] = args["decode_context_parallel_size"]
    if args.get("enable_lora") is not True:
        return options
    options["enable_lora"] = True
    for key in ("max_loras", "max_lora_rank"):
        if _whole(args.get(key), 1, MAX_COUNT):
            options[key] = args[key]
    if args.get("fully_sharded_loras") is True:
        options["fully_sharded_loras"] = True
    if args.get("lora_dtype") in LORA_DTYPES:
        options["lora_dtype"] = args["lora_dtype"]
    return options


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


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
