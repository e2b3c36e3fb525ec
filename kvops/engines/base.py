"""What kvops needs to know of a serving engine: the `Engine` interface every adapter in `kvops/engines/<name>/`
implements. Nothing outside `kvops/engines/` asks which engine it is; it asks the adapter."""

from __future__ import annotations

from types import ModuleType
from typing import Protocol


class Engine(Protocol):
    name: str  # as users type it: "vllm"
    title: str  # as users read it: "vLLM"

    @property
    def metrics(self) -> ModuleType:
        """The engine's /metrics: `SERIES`, `reading(samples, capacity_tokens)`, `promql(matchers, capacity_tokens)`."""
        ...

    @property
    def api(self) -> ModuleType:
        """The engine's HTTP API as the admission proxy sees it: the generation routes and their token fields."""
        ...
