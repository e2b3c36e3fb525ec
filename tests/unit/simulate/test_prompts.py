"""Simulated prompts' token ids: equal where a prefix is shared, distinct elsewhere, and within what every vLLM
release stores (0.34 keeps a request's tokens as signed 32-bit integers: vllm/v1/token_buffer.py)."""

from __future__ import annotations

from array import array

from kvops.simulate.prompts import prompt_tokens, segment_tokens
from kvops.simulate.trace import TraceRequest


def request(prompt: int, prefix: tuple[tuple[str, int], ...] = ()) -> TraceRequest:
    return TraceRequest(arrival_s=0.0, prompt_tokens=prompt, output_tokens=8, prefix=prefix)


def test_every_id_fits_a_signed_32_bit_array():
    ids = prompt_tokens(10**9, request(40, (("system", 16), ("tools", 8))))
    array("i", ids)  # raises OverflowError past 2**31 - 1, as vLLM 0.34's TokenBuffer does
    assert len(ids) == 40


def test_a_shared_segment_is_the_same_tokens_and_a_request_s_own_are_its_alone():
    first, second = (prompt_tokens(index, request(48, (("system", 32),))) for index in (0, 1))
    assert first[:32] == second[:32] and first[32:] != second[32:]
    assert segment_tokens("system", 32) == first[:32]


def test_keys_lead_with_ids_no_other_key_shares():
    leads = {tuple(segment_tokens(f"group-{index}", 2)) for index in range(20_000)}
    assert len(leads) == 20_000
    assert segment_tokens("system", 1) == segment_tokens("system", 2)[:1]
