"""Admission by projected KV: how many blocks a request will hold at its peak, per KV-cache group.

Pure arithmetic (no vLLM import), so it can be checked against vLLM's own bounds in tests.

A request that may generate `max_tokens` tokens after a `prompt`-token prompt caches at most prompt + max_tokens
tokens. In a paged cache each group holds whole blocks: ceil(tokens / block_size) (kvops.formula.token_slots).
A sliding-window group frees the blocks that fall behind its window, so one request never holds more than the
window less one token, plus the tokens scheduled but not yet processed (their blocks are freed only after the
step settles), plus one block because the window rarely starts on a block boundary; vLLM sizes its pool and its
own admission cap the same way (SlidingWindowSpec.max_admission_blocks_per_request).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvops.formula import token_slots


def whole_blocks(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` tokens."""
    return token_slots(tokens, block_size) // block_size


def window_blocks(window: int, block_size: int, in_flight_tokens: int, extra_retained_tokens: int = 0) -> int:
    """The most blocks one request holds in a sliding-window group, however long it grows."""
    return whole_blocks(window - 1 + extra_retained_tokens + in_flight_tokens, block_size) + 1


@dataclass(frozen=True)
class GroupShape:
    """One KV-cache group as admission sees it."""

    block_size: int
    max_blocks: int | None = None  # blocks one request holds at most (groups that free blocks behind a window)
    window: int | None = None  # sliding window in tokens, for the log line

    def blocks(self, tokens: int) -> int:
        """Blocks one request of `tokens` cached tokens holds at its peak."""
        grown = whole_blocks(tokens, self.block_size)
        return grown if self.max_blocks is None else min(grown, self.max_blocks)

    def describe(self) -> str:
        if self.window is not None:
            return (
                f"sliding window {self.window} ({self.block_size}-token blocks, at most {self.max_blocks} per request)"
            )
        if self.max_blocks is not None:
            return f"{self.block_size}-token blocks, at most {self.max_blocks} per request"
        return f"full attention ({self.block_size}-token blocks)"


def projected_blocks(shapes: Sequence[GroupShape], tokens: int) -> int:
    """Blocks a request of `tokens` cached tokens holds at its peak, all groups together (they share one pool)."""
    return sum(shape.blocks(tokens) for shape in shapes)


def live_blocks(blocks: Sequence) -> int:
    """Blocks a request really holds: a sliding-window group swaps the blocks behind its window for vLLM's
    null block, always a prefix of the request's block list, so binary search finds where the live ones start."""
    if not blocks or not blocks[0].is_null:
        return len(blocks)
    return len(blocks) - bisect_left(blocks, True, key=lambda block: not block.is_null)


def admissible_prefix(needs: Iterable[int], slack: int, idle: bool) -> int:
    """How many requests, in queue order, fit in `slack` blocks: first come, first served, so the first one
    that does not fit stops the rest (a large request is not starved by smaller ones behind it). `needs` is
    consumed lazily: nothing past the first request that does not fit is computed.

    `idle`: nothing runs, so nothing will free blocks; the first request is admitted whatever its size (vLLM
    still checks that it fits the pool), or a request larger than the pool minus the headroom would wait forever.
    """
    admitted = 0
    for need in needs:
        if need > slack and not (idle and admitted == 0):
            break
        slack -= need
        admitted += 1
    return admitted
