"""What `kvops simulate` needs of an engine's scheduler: requests in, batches out, tokens back.

An engine adapter builds the scheduler itself (`kvops/engines/vllm/simulator.py` builds vLLM's own); the loop
(`kvops.simulate.run`) owns the clock and asks a step-time model what each batch costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class Batch:
    """One scheduled step: each request's new tokens and the tokens it already had in the cache before them."""

    request_ids: list[str]
    new_tokens: list[int]
    context: list[int]
    samples: list[bool]  # the step samples a token for this request (not a partial prefill chunk)
    preempted: tuple[str, ...]
    output: Any = field(default=None, repr=False)  # the engine's own record of the step


@dataclass(slots=True)
class StepResult:
    """What a finished step handed back: tokens per request and the requests that ended (id, reason)."""

    tokens: list[tuple[str, int]]
    finished: list[tuple[str, str]]


class SchedulerCore(Protocol):
    """An engine's scheduler, stepped as its engine core steps it."""

    @property
    def batches_in_flight(self) -> int:
        """Steps the engine keeps in flight: 2 with vLLM's async scheduling (the next batch is scheduled while
        the previous one runs), else 1."""
        ...

    @property
    def label(self) -> str:
        """What ran, as users read it: the engine, its installed release and the scheduler class."""
        ...

    def add(
        self,
        request_id: str,
        prompt: list[int],
        *,
        output_tokens: int,
        max_tokens: int,
        exact: bool,
        priority: int,
        arrival: float,
    ) -> None: ...

    def has_requests(self) -> bool: ...

    def schedule(self) -> Batch: ...

    def complete(self, batch: Batch) -> StepResult: ...

    @property
    def usage(self) -> float:
        """KV cache usage, 0-1, as the engine exports it."""
        ...

    @property
    def running(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    def counters(self) -> dict[str, int]: ...
