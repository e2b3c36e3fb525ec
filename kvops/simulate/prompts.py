"""Token ids for simulated prompts: what prefix caching sees. Only equality matters to a scheduler: a request's own
tokens differ from every other request's, a shared segment's are the same wherever it starts a prompt."""

from __future__ import annotations

import hashlib

from kvops.simulate.trace import TraceRequest

OWN_BASE = 1 << 40  # token ids from here on are one request's own (a shared segment's stay below)
FILL = 7


def prompt_tokens(index: int, request: TraceRequest) -> list[int]:
    """The shared segments' tokens, then the request's own: its first own token is its index, so no block of it
    matches another request's."""
    tokens: list[int] = []
    for key, count in request.prefix:
        tokens += segment_tokens(key, count)
    own = request.prompt_tokens - len(tokens)
    if own > 0:
        tokens += [OWN_BASE + index] + [FILL] * (own - 1)
    return tokens


def segment_tokens(key: str, count: int) -> list[int]:
    """The same key, the same tokens, in every process (Python's own str hash is salted per process)."""
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=5).digest(), "little") + 16
    return [value] + [FILL] * (count - 1)
