"""What a TGI run states about its own launch (the launcher's `Args { ... }` dump and its startup lines): the
deployment options that predict that very run (`kvops calibrate --tgi-log`)."""

from __future__ import annotations

from typing import Any

from kvops.deployment import DeploymentOptions
from kvops.engines.tgi.flags import KV_DTYPE_OF_FLAG
from kvops.engines.tgi.logs import TgiLog

# The release a log in 0.9.0-0.9.3's words is planned as (the `u32` max_batch_total_tokens of its Args, "Not enough
# memory to handle N total tokens with P prefill tokens"): the last of the four, the first with Llama 2's grouped KV
# heads; kvops plans the four alike (a pool as given, blocks of 16, no wiggle room).
LEGACY_POOL_RELEASE = "0.9.3"


def stated_options(log: TgiLog) -> DeploymentOptions:
    args = log.args
    options: dict[str, Any] = {"engine": "tgi"}
    if args.get("model_id"):
        options["model"] = args["model_id"]
    shards = args.get("num_shard") or log.get("num_shard")
    if shards:
        options["tp"] = shards
    if args.get("cuda_memory_fraction"):
        options["memory_fraction"] = args["cuda_memory_fraction"]
    prefill = (
        args.get("max_batch_prefill_tokens")
        or log.get("max_batch_prefill_tokens")
        or log.get("warmup_max_prefill_tokens")
    )
    if prefill:
        options["batched_tokens"] = prefill
    # the launcher's defaults (2.x) are inputs; the router's "defaulted to" lines (3.x) come from the pool itself
    total = args.get("max_total_tokens") or log.get("launcher_max_total_tokens") or log.get("warmup_max_total_tokens")
    if total:
        options["max_model_len"] = total
    if args.get("kv_cache_dtype") in KV_DTYPE_OF_FLAG:
        options["kv_dtype"] = KV_DTYPE_OF_FLAG[args["kv_cache_dtype"]]
    max_input = (
        args.get("max_input_tokens") or log.get("launcher_max_input_tokens") or log.get("warmup_max_input_tokens")
    )
    if max_input:
        options["max_input_tokens"] = max_input
    if log.get("version"):
        options["engine_version"] = log.get("version")
    elif log.get("pool_out_of_memory") or log.args.get("max_batch_total_tokens"):
        options["engine_version"] = LEGACY_POOL_RELEASE
    return DeploymentOptions.stated(**options)
