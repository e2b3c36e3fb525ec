"""What a vLLM plan finds: the capacity of its KV pool (VllmCapacity), and the draft a plan collects on its way
(its memory terms, notes and warnings) until it becomes a Plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvops.engines.vllm import flags, options, releases
from kvops.frozen import frozen
from kvops.plan import Plan, PlanInputs, Term, Verdict
from kvops.units import format_bytes


@frozen
class CacheGroup:
    """One KV cache group as the scheduler sees it: its kind, the tokens a sliding or chunked layer keeps, its block
    size, and for a state group the mamba cache mode vLLM runs it in and its prefill checkpoint pages."""

    kind: str  # "full", "sliding", "chunked", "mla", "indexer" or "mamba"
    window: int | None = None
    block_size: int = 16
    mamba_cache_mode: str | None = None  # mamba: "align" (prefix caching on), "none" or "all" (0.15-0.31)
    prefill_checkpoint_blocks: int = 0  # mamba, align mode: a Mamba-2 mixer's prefill checkpoint page

    def to_dict(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"kind": self.kind, "window": self.window, "block_size": self.block_size}
        if self.mamba_cache_mode is not None:
            shape |= {
                "mamba_cache_mode": self.mamba_cache_mode,
                "prefill_checkpoint_blocks": self.prefill_checkpoint_blocks,
            }
        return shape


@frozen
class VllmCapacity:
    """The plan's KV pool as vLLM sizes it, and the planned workload in it."""

    num_blocks: int
    usable_blocks: int
    block_size: int
    bytes_per_block: int
    kv_cache_groups: int
    kv_cache_size_tokens: int  # vLLM's 'GPU KV cache size': max concurrency x max-model-len
    max_model_len: int
    blocks_per_request_at_max_model_len: int
    max_concurrency: float
    tokens_per_request: int
    blocks_per_request: int
    blocks_per_request_in_prefill: int  # while its prompt is computed: a sliding window holds the tokens in flight
    requests_under_warn: int
    requests_at_full: int
    warn_level: float
    max_num_batched_tokens: int
    max_in_flight_tokens: int
    replicas: int
    engine_auto_max_model_len: int = 0  # what vLLM's own --max-model-len auto would pick for this KV memory
    sampler_sequences: int = 0  # the sequences the profile run sizes the sampler's logits for
    cache_groups: tuple[CacheGroup, ...] = ()

    @property
    def kv_tokens(self) -> int:
        return self.kv_cache_size_tokens

    @property
    def request_tokens(self) -> int:
        return self.tokens_per_request

    @property
    def holding(self) -> str:
        """A sliding or chunked layer keeps its window of a longer request, so the request holds fewer KV tokens than
        it has: its blocks say it."""
        windows = [
            group
            for group in self.cache_groups
            if group.kind in ("sliding", "chunked") and group.window and group.window < self.tokens_per_request
        ]
        if not windows:
            return f"each holding {self.tokens_per_request:,} KV tokens"
        kept = min(windows, key=lambda group: group.window or 0)
        return (
            f"each of {self.tokens_per_request:,} tokens in {self.blocks_per_request:,} blocks ({kept.kind} layers "
            f"keep {kept.window:,} of them)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "block_size": self.block_size,
            "bytes_per_block": self.bytes_per_block,
            "kv_cache_groups": self.kv_cache_groups,
            "kv_tokens": self.kv_cache_size_tokens,
            "kv_cache_size_tokens": self.kv_cache_size_tokens,
            "max_model_len": self.max_model_len,
            "blocks_per_request_at_max_model_len": self.blocks_per_request_at_max_model_len,
            "max_concurrency": self.max_concurrency,
            "tokens_per_request": self.tokens_per_request,
            "blocks_per_request": self.blocks_per_request,
            "blocks_per_request_in_prefill": self.blocks_per_request_in_prefill,
            "requests_under_warn": self.requests_under_warn,
            "requests_at_full": self.requests_at_full,
            "warn_level": self.warn_level,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_in_flight_tokens": self.max_in_flight_tokens,
            "replicas": self.replicas,
            "engine_auto_max_model_len": self.engine_auto_max_model_len,
            "sampler_sequences": self.sampler_sequences,
            "kv_cache_group_specs": [group.to_dict() for group in self.cache_groups],
        }

    def lines(self) -> list[str]:
        warn = f"{self.warn_level:.0%}"
        blocks = f"{self.blocks_per_request} blocks"
        if self.blocks_per_request_in_prefill != self.blocks_per_request:
            blocks += f" ({self.blocks_per_request_in_prefill:,} while its prompt is computed, for one at a time)"
        return [
            f"blocks           {self.num_blocks:,} of {self.block_size} tokens ({self.usable_blocks:,} usable; block 0 is the null block), {format_bytes(self.bytes_per_block)} each",
            f"KV tokens        {self.kv_cache_size_tokens:,} (vLLM's 'KV cache size': max concurrency x max-model-len)",
            f"max concurrency  {self.max_concurrency:.2f}x at max-model-len {self.max_model_len:,} ({self.blocks_per_request_at_max_model_len} blocks per request)",
            f"workload         {self.tokens_per_request:,} tokens per request, {blocks}: {self.requests_under_warn} requests under the warn level ({warn}), {self.requests_at_full} at 100%",
            f"batching         max-num-batched-tokens {self.max_num_batched_tokens:,}, {self.max_in_flight_tokens:,} tokens in flight",
            f"engine auto      vLLM's --max-model-len auto would pick {self.engine_auto_max_model_len:,} for this KV memory",
        ]


@dataclass
class Draft:
    """What the plan collects on its way: the memory, its notes and warnings."""

    inputs: PlanInputs
    memory: list[Term]
    kv_bytes: int
    warnings: list[str]
    notes: list[str]
    release: releases.VllmRelease

    @property
    def margin_bytes(self) -> int:
        """kvops' margin below the engine's predicted KV (the 'margin' term), 0 when none is planned."""
        return next((term.bytes for term in self.memory if term.name == "margin"), 0)

    def plan(self, capacity: VllmCapacity | None, engine_flags: dict[str, Any], verdict: Verdict | None) -> Plan:
        inputs = self.inputs
        program = inputs.launcher or flags.PROGRAM
        return Plan(
            inputs=inputs,
            memory=tuple(self.memory),
            kv_cache_bytes=self.kv_bytes,
            capacity=capacity,
            flags=engine_flags,
            program=program,
            args=tuple(flags.arguments(engine_flags, program, inputs.kept_options) if engine_flags else ()),
            image=options.image(self.release.version, inputs.gpu.vendor if inputs.gpu else None),
            port=inputs.port or flags.PORT,
            verdict=verdict,
            warnings=tuple(self.warnings),
            notes=tuple(self.notes),
            release=self.release,
            kv_margin_bytes=self.margin_bytes if self.kv_bytes > 0 else 0,
        )
