"""What requests look like: prompt and generated tokens, from flags or a JSONL file (sized at its p95).

`kvops tokens` writes such files; `kvops plan --workload` and `kvops explain --workload` read them. Pure: the
caller reads the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import ceil
from typing import Any

from kvops.errors import UsageError
from kvops.files import load_json
from kvops.frozen import frozen


@frozen
class Workload:
    """What requests look like: tokens in and out (p95 when read from a file), and parallel sequences per request."""

    prompt_tokens: int | None = None
    gen_tokens: int | None = None
    sequences: int = 1  # n x beams
    source: str = "none"
    p50_tokens: int | None = None
    p95_tokens: int | None = None
    requests: int | None = None

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None and self.gen_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.gen_tokens or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "tokens_per_request": self.total_tokens,
            "sequences_per_request": self.sequences,
            "p50_tokens": self.p50_tokens,
            "p95_tokens": self.p95_tokens,
            "requests": self.requests,
        }


MAX_REQUEST_TOKENS = 1 << 32  # past any model's context
_PROMPT_KEYS = ("prompt_tokens", "input_tokens", "prompt_len", "input_len")
_GEN_KEYS = ("gen_tokens", "output_tokens", "completion_tokens", "max_tokens", "output_len")


def parse_workload(lines: Iterable[str], where: str, sequences: int = 1) -> Workload:
    """A JSONL file of requests ({"prompt_tokens": P, "gen_tokens": G} per line): sized at its p95."""
    prompts, gens = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = load_json(line, f"{where}:{number}", UsageError)
        prompt = _first_int(record, _PROMPT_KEYS)
        gen = _first_int(record, _GEN_KEYS)
        if prompt is None or gen is None:
            raise UsageError(
                f"{where}:{number}: needs a prompt length ({', '.join(_PROMPT_KEYS)}) and an output length ({', '.join(_GEN_KEYS)}), each a whole number from 0 to {MAX_REQUEST_TOKENS:,}"
            )
        if prompt == 0:
            raise UsageError(
                f"{where}:{number}: prompt length 0; a request has at least 1 prompt token (the engines refuse an empty prompt)"
            )
        prompts.append(prompt)
        gens.append(gen)
    if not prompts:
        raise UsageError(f"{where}: no requests in the file")
    return p95_workload(prompts, gens, f"{where} ({len(prompts)} requests, p95)", sequences)


def p95_workload(prompts: list[int], gens: list[int], source: str, sequences: int = 1) -> Workload:
    """Requests sized at their p95 request: the one at the 95th percentile of prompt + output (nearest rank), its
    prompt and output the split. Not the p95 prompt plus the p95 output: where long prompts get short answers and
    short prompts long ones, no request is that long."""
    requests = sorted(zip(prompts, gens), key=lambda request: (sum(request), request[0]))
    prompt, gen = requests[max(1, ceil(0.95 * len(requests))) - 1]
    totals = [sum(request) for request in requests]
    return Workload(
        prompt_tokens=prompt,
        gen_tokens=gen,
        sequences=sequences,
        source=source,
        p50_tokens=percentile(totals, 50),
        p95_tokens=percentile(totals, 95),
        requests=len(requests),
    )


def _first_int(record: Any, keys: tuple[str, ...]) -> int | None:
    if not isinstance(record, dict):
        return None
    for key in keys:
        value = record.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REQUEST_TOKENS:
            return value
    return None


def percentile(values: list[int], pct: float) -> int:
    """Nearest-rank percentile: the smallest value with at least pct% of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
