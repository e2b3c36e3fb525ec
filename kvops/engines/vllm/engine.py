"""The vLLM adapter: the `Engine` interface (kvops/engines/base.py) over this package's modules."""

from __future__ import annotations

from types import ModuleType


class VllmEngine:
    name = "vllm"
    title = "vLLM"

    @property
    def metrics(self) -> ModuleType:
        from kvops.engines.vllm import metrics

        return metrics

    @property
    def api(self) -> ModuleType:
        from kvops.engines.vllm import api

        return api


ENGINE = VllmEngine()
