"""The rows of bench/accuracy.py: one corpus launch, what its log says and what kvops planned (bench/peers.py reads
them too)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvops.plan import PlanInputs
from tests.support.corpus import Entry


@dataclass
class Logged:
    """What an entry's log says the engine allocated (None where it does not say)."""

    kv_bytes: int | None = None
    blocks: int | None = None
    tokens: int | None = None
    concurrency: float | None = None
    kv_from: str = ""


@dataclass
class Row:
    entry: Entry
    family: str = ""
    gpu: str = ""
    why: str | None = None  # not planned, and why
    inputs: PlanInputs | None = None
    logged: Logged = field(default_factory=Logged)
    predicted: dict[str, float | None] = field(default_factory=dict)
    pinned: dict[str, float | None] = field(default_factory=dict)  # the capacity, with the logged KV pinned
    fits: bool | None = None
    kind: str = ""  # dense, MoE, MLA, sliding, hybrid
    predicted_len: int = 0  # the max-model-len the plan sized for
    weights_error: int | None = None  # kvops' computed weights less the logged ones (bytes), where logged
    weights_logged: int | None = None
    caveats: tuple[str, ...] = ()

    @property
    def planned(self) -> bool:
        return self.why is None
