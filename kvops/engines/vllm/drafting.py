"""Speculative decoding under vLLM's rules: the lookahead slots each request reserves for the drafter, the drafter's
cache layers in the pool, and EAGLE/MTP with chunked local attention (which turns the hybrid KV cache manager off)."""

from __future__ import annotations

from kvops.engines.vllm.capacity import Draft
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs


def lookahead_tokens(inputs: PlanInputs) -> int:
    """KV slots a request reserves past its tokens for the drafter (`VllmConfig.num_lookahead_tokens`)."""
    speculative = inputs.speculative
    if speculative is None:
        return 0
    if speculative.uses_target_hidden_states or speculative.method == "draft_model":
        return speculative.tokens
    return 0


def eagle_with_chunked(inputs: PlanInputs) -> bool:
    """vLLM turns the hybrid KV cache manager off for chunked local attention with an EAGLE/MTP drafter
    (vllm-internals notes; `VllmConfig.__post_init__`): the chunked layers are then allocated as full attention."""
    speculative = inputs.speculative
    return bool(speculative and speculative.uses_target_hidden_states and inputs.spec.attention_chunk)


def speculative_notes(draft: Draft, cached: ModelSpec) -> None:
    inputs = draft.inputs
    speculative = inputs.speculative
    if speculative is None:
        return
    added = len(cached.caches()) - len(inputs.spec.caches())
    where = f"{added} drafter cache layer(s) share the KV pool" if added else "the drafter keeps no KV cache"
    lookahead = lookahead_tokens(inputs)
    slots = f"; each request reserves {lookahead} lookahead slot(s)" if lookahead else ""
    draft.notes.append(f"speculative decoding ({speculative.method}, {speculative.tokens} tokens): {where}{slots}")
    if eagle_with_chunked(inputs):
        draft.notes.append(
            "chunked local attention with an EAGLE/MTP drafter: vLLM turns the hybrid KV cache manager off, so the chunked layers hold the whole context"
        )
    if speculative.draft is None and speculative.method in ("eagle", "eagle3", "draft_model"):
        draft.warnings.append(
            f"--speculative-config {speculative.method}: the draft's config was not read: its KV layers and weights are not counted"
        )
