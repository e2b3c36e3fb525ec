"""Whether a vLLM plan fits, and when not, why in vLLM's own words: nothing left for KV, one request longer than
the pool, more sequences than a hybrid model's state blocks, requests longer than --max-model-len, a concurrency
above the warn level."""

from __future__ import annotations

from math import ceil

from kvops.engines import common
from kvops.engines.device_total import device_total
from kvops.engines.vllm import layout
from kvops.engines.vllm.capacity import Draft, VllmCapacity
from kvops.plan import Verdict
from kvops.units import format_bytes

_NOT_SPENT = ("total", "requested", "kv_cache", "margin", "headroom")


def verdict(
    draft: Draft, kv_layout: layout.KVCacheLayout, pool: layout.Pool, capacity: VllmCapacity, seqs: int
) -> Verdict | None:
    inputs, kv = draft.inputs, draft.kv_bytes
    terms = {term.name: term.bytes for term in draft.memory}
    if kv <= 0:
        others = sum(term.bytes for term in draft.memory if term.name not in _NOT_SPENT)
        have = terms["requested"]
        total = device_total(inputs)
        utilization = inputs.memory_fraction or draft.release.default_gpu_memory_utilization
        return Verdict(
            f"{common.what_does_not_fit(terms, have)} need {format_bytes(others)} per GPU but vLLM may use {format_bytes(have)} ({utilization:g} of {format_bytes(total)}); nothing is left for the KV cache",
            others + kv_layout.bytes_per_block * (pool.blocks_per_request + 1),
            have,
            states_need=True,
        )
    if terms.get("headroom", 0) < 0:
        total = device_total(inputs)
        need = total - terms["headroom"]
        return Verdict(
            f"weights, overheads and the pinned {format_bytes(kv)} KV cache need {format_bytes(need)} per GPU; the device has {format_bytes(total)}",
            need,
            total,
            states_need=True,
        )
    if not pool.fits_one_request:
        return _too_shortverdict(draft, kv_layout, pool, capacity)
    refused = _state_blocks_refusal(draft, kv_layout, pool, seqs)
    if refused is not None:
        return refused
    asked = inputs.workload.total_tokens
    if asked is not None and asked > pool.max_model_len:
        need = layout.kv_bytes_needed(kv_layout, ceil(asked / pool.block_size))
        return Verdict(
            f"requests of {asked} tokens (prompt + gen) exceed --max-model-len {pool.max_model_len}: vLLM rejects "
            "every one of them ('maximum context length'); raise --max-model-len or state shorter requests",
            need,
            kv,
            states_need=True,
        )
    per_request, under_warn = capacity.blocks_per_request, capacity.requests_under_warn
    if isinstance(inputs.concurrency, int) and inputs.concurrency > under_warn:
        held = inputs.concurrency * per_request + capacity.blocks_per_request_in_prefill - per_request
        blocks = ceil(held / inputs.warn_level)
        need = layout.kv_bytes_needed(kv_layout, blocks)
        return Verdict(
            f"{inputs.concurrency} concurrent requests of {capacity.tokens_per_request} tokens need {held} blocks, {blocks} with the {inputs.warn_level:.0%} warn level = {format_bytes(need)} of KV cache; the plan has {format_bytes(kv)} ({pool.usable_blocks} usable blocks: {under_warn} under the warn level)",
            need,
            kv,
            states_need=True,
        )
    if inputs.concurrency == "auto" and under_warn < 1:
        need = layout.kv_bytes_needed(kv_layout, ceil(capacity.blocks_per_request_in_prefill / inputs.warn_level))
        return Verdict(
            f"not one request of {capacity.tokens_per_request} tokens stays under the warn level ({per_request} blocks of {pool.usable_blocks})",
            need,
            kv,
        )
    return None


def _state_blocks_refusal(
    draft: Draft, kv_layout: layout.KVCacheLayout, pool: layout.Pool, seqs: int
) -> Verdict | None:
    """vLLM refuses to start a model with state layers under full CUDA graphs when max_num_seqs exceeds the KV cache
    blocks (releases.VllmRelease.refuses_seqs_above_state_blocks): the plan does not fit, in vLLM's words."""
    inputs = draft.inputs
    if not kv_layout.has_state or inputs.device != "gpu" or inputs.enforce_eager or seqs <= pool.num_blocks:
        return None
    if not draft.release.refuses_seqs_above_state_blocks:
        return None
    need = layout.kv_bytes_needed(kv_layout, seqs)
    return Verdict(
        f"{draft.release.label} refuses to start: 'max_num_seqs ({seqs}) exceeds available Mamba cache blocks "
        f"({pool.num_blocks}). Each decode sequence requires one Mamba cache block' (config/compilation.py "
        f"resolve_cudagraph_mode_and_sizes): lower --max-num-seqs to {pool.num_blocks}, add --enforce-eager, or give "
        f"the KV cache {format_bytes(need)}",
        need,
        draft.kv_bytes,
        states_need=True,
    )


def _too_shortverdict(
    draft: Draft, kv_layout: layout.KVCacheLayout, pool: layout.Pool, capacity: VllmCapacity
) -> Verdict:
    """One request at max-model-len does not fit the KV memory: the engine's startup check, in its words."""
    length, kv = pool.max_model_len, draft.kv_bytes
    # the error's estimate searches up to the max_model_len asked for (`_estimate_max_model_len_from_groups`)
    longest = layout.engine_max_model_len(kv_layout, max(kv, 0), capacity.max_in_flight_tokens, length, True)
    need = layout.kv_bytes_needed(kv_layout, pool.blocks_per_request)
    blocks = f"one request at --max-model-len {length} needs {pool.blocks_per_request} blocks"
    if not draft.release.null_block:
        tokens = pool.num_blocks * pool.block_size
        refusal = (
            f"{draft.release.label} refuses to start: 'The model's max seq len ({length}) is larger than the maximum "
            f"number of tokens that can be stored in KV cache ({tokens})'"
        )
        return Verdict(
            f"{blocks} of {pool.block_size} tokens; the KV cache holds {pool.num_blocks} ({tokens:,} tokens): {refusal}",
            need,
            kv,
            states_need=True,
        )
    estimate = f"; the estimated maximum model length is {longest}" if longest else ""
    return Verdict(
        f"{blocks} = {format_bytes(need)} of KV cache (block 0 is the null block), more than the {format_bytes(kv)} vLLM has "
        "(vLLM refuses to start: 'To serve at least one request with the model's max seq len ... KV cache is "
        f"needed, which is larger than the available KV cache memory'){estimate}",
        need,
        kv,
        states_need=True,
    )
