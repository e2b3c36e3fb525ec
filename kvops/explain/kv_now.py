"""The KV pool now: blocks in use and free from the engine's usage gauge and cache config, and the headroom in
tokens and in requests of the planned size."""

from __future__ import annotations

from dataclasses import dataclass
from math import floor
from typing import Any

from kvops.engines.metrics import exact
from kvops.explain.run import Run, planned_capacity
from kvops.plan import Plan
from kvops.policy import Level, Policy


@dataclass
class KvNow:
    """The KV pool now, from the engine's usage gauge and its cache config."""

    usage: float
    num_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    bytes_per_block: int | None
    bytes_per_block_source: str
    groups: int
    request_tokens: int | None
    request_blocks: int | None
    request_source: str
    warn_level: float
    running: float | int | None  # an integer when the exported count is one
    waiting: float | int | None  # an integer when the exported count is one
    preemptions_total: float | int | None  # an integer when the exported count is one
    source: str

    @property
    def usable_blocks(self) -> int:
        return max(0, self.num_blocks - 1)

    @property
    def pool_bytes(self) -> int | None:
        return self.num_blocks * self.bytes_per_block if self.bytes_per_block else None

    @property
    def in_use_bytes(self) -> int | None:
        return self.used_blocks * self.bytes_per_block if self.bytes_per_block else None

    @property
    def in_use_tokens(self) -> int:
        """Token slots the used blocks hold (a block is held whole, so tokens cached <= this)."""
        return self.used_blocks * self.block_size // self.groups

    @property
    def headroom_tokens(self) -> int:
        return self.free_blocks * self.block_size // self.groups

    @property
    def headroom_requests(self) -> int | None:
        return self.free_blocks // self.request_blocks if self.request_blocks else None

    @property
    def warn_headroom_blocks(self) -> int:
        return max(0, floor(self.warn_level * self.usable_blocks) - self.used_blocks)

    @property
    def headroom_requests_to_warn(self) -> int | None:
        return self.warn_headroom_blocks // self.request_blocks if self.request_blocks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "usage": self.usage,
            "num_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "block_size": self.block_size,
            "used_blocks": self.used_blocks,
            "free_blocks": self.free_blocks,
            "bytes_per_block": self.bytes_per_block,
            "bytes_per_block_source": self.bytes_per_block_source,
            "kv_cache_groups": self.groups,
            "pool_bytes": self.pool_bytes,
            "in_use_bytes": self.in_use_bytes,
            "in_use_tokens": self.in_use_tokens,
            "headroom_tokens": self.headroom_tokens,
            "request_tokens": self.request_tokens,
            "request_blocks": self.request_blocks,
            "request_source": self.request_source,
            "headroom_requests": self.headroom_requests,
            "warn_level": self.warn_level,
            "headroom_blocks_to_warn": self.warn_headroom_blocks,
            "headroom_requests_to_warn": self.headroom_requests_to_warn,
            "running": self.running,
            "waiting": self.waiting,
            "preemptions_total": self.preemptions_total,
            "source": self.source,
        }


def kv_now(run: Run, predicted: Plan | None, policy: Policy) -> KvNow | None:
    """Blocks in use from `vllm:kv_cache_usage_perc` (1 - free / (num_gpu_blocks - 1), block_pool.get_usage)."""
    reading = run.reading
    if reading is None:
        return None
    cap = planned_capacity(predicted)
    blocks = run.label_int("num_gpu_blocks") or run.facts.get("num_gpu_blocks") or (cap.num_blocks if cap else None)
    block_size = run.label_int("block_size") or (cap.block_size if cap else None)
    if not blocks or not block_size:
        return None
    usable = max(0, blocks - 1)
    used = round(reading.kv_usage * usable)
    per_block, per_block_source = _bytes_per_block(run, predicted, blocks)
    groups = cap.kv_cache_groups if cap else 1
    tokens, request_blocks, request_source = _request_size(run, predicted, blocks, block_size)
    warn = policy.thresholds[Level.WARN]
    return KvNow(
        usage=reading.kv_usage,
        num_blocks=blocks,
        block_size=block_size,
        used_blocks=used,
        free_blocks=usable - used,
        bytes_per_block=per_block,
        bytes_per_block_source=per_block_source,
        groups=groups,
        request_tokens=tokens,
        request_blocks=request_blocks,
        request_source=request_source,
        warn_level=warn,
        running=exact(reading.running),
        waiting=exact(reading.waiting),
        preemptions_total=exact(reading.preemptions_total),
        source=f"{reading.basis} x (vllm:cache_config_info num_gpu_blocks {blocks} - 1 null block)",
    )


def _bytes_per_block(run: Run, predicted: Plan | None, blocks: int) -> tuple[int | None, str]:
    cap = planned_capacity(predicted)
    if cap:
        return cap.bytes_per_block, "computed: the plan's KV layout for this model"
    pinned = run.pinned_kv_bytes
    if pinned:
        return (
            pinned // blocks,
            f"~ --kv-cache-memory-bytes {pinned} / {blocks} blocks (give --model for the exact block size)",
        )
    kv = run.facts.get("kv_cache_bytes")
    if kv and kv > 0:
        return kv // blocks, f"~ the log's KV cache memory / {blocks} blocks (give --model for the exact block size)"
    return None, "unknown: give --model"


def _request_size(run: Run, predicted: Plan | None, blocks: int, block_size: int) -> tuple[int | None, int | None, str]:
    """Blocks one request of the planned size holds: the plan's workload, else the engine's max_model_len."""
    cap = planned_capacity(predicted)
    if predicted and cap:
        source = predicted.inputs.workload.source
        what = f"the workload ({source})" if source != "none" else f"max_model_len {cap.max_model_len}"
        return cap.tokens_per_request, cap.blocks_per_request, what
    tokens_in_pool = run.label_int("kv_cache_size_tokens") or (run.log.kv_cache_size_tokens if run.log else None)
    concurrency = run.label_float("kv_cache_max_concurrency") or (run.log.max_concurrency if run.log else None)
    length = run.log.max_model_len if run.log else None
    if length is None and tokens_in_pool and concurrency:
        length = round(tokens_in_pool / concurrency)  # kv_cache_size_tokens = int(concurrency x max_model_len)
    if concurrency:
        per_request = round(blocks / concurrency)  # max concurrency = num_gpu_blocks / blocks per request
        return length, per_request, f"max_model_len {length} at the engine's own max concurrency {concurrency:g}x"
    if length:
        return (
            length,
            -(-length // block_size),
            f"max_model_len {length}, one full-attention KV group assumed (give --model for the exact layout)",
        )
    return None, None, "unknown: give --model or --prompt-tokens/--gen-tokens"
