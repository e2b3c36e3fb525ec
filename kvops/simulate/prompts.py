"""Token ids for simulated prompts: what prefix caching sees. Only equality matters to a scheduler: a request's own
tokens differ from every other request's, a shared segment's are the same wherever it starts a prompt.

Every id fits a signed 32-bit integer: vLLM 0.34 keeps a request's tokens in an array of them
(vllm/v1/token_buffer.py), and raises on a larger id."""

from __future__ import annotations

import hashlib

from kvops.simulate.trace import TraceRequest

OWN_BASE = 1 << 30  # token ids from here on are one request's own (a shared segment's stay below)
FILL = 7
_SEGMENT_BITS = 29  # each of a segment's two leading ids: 16 <= id < 16 + 2**29, below OWN_BASE


def prompt_tokens(index: int, request: TraceRequest) -> list[int]:
    """The shared segments' tokens, then the request's own: its first own token is OWN_BASE + its index, so no
    block of it matches another request's."""
    tokens: list[int] = []
    for key, count in request.prefix:
        tokens += segment_tokens(key, count)
    own = request.prompt_tokens - len(tokens)
    if own > 0:
        tokens += [OWN_BASE + index] + [FILL] * (own - 1)
    return tokens


def segment_tokens(key: str, count: int) -> list[int]:
    """The same key, the same tokens, in every process (Python's own str hash is salted per process): two leading
    ids from a 58-bit digest of the key, so that two keys' segments do not match by chance."""
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    mask = (1 << _SEGMENT_BITS) - 1
    lead = [16 + (digest & mask), 16 + ((digest >> _SEGMENT_BITS) & mask)]
    return (lead + [FILL] * max(0, count - 2))[:count]
