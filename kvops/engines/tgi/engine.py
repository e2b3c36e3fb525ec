"""The TGI adapter: the `Engine` interface (kvops/engines/base.py) over this package's modules."""

from __future__ import annotations

from types import ModuleType


class TgiEngine:
    name = "tgi"
    title = "TGI"

    @property
    def metrics(self) -> ModuleType:
        from kvops.engines.tgi import metrics

        return metrics

    @property
    def api(self) -> ModuleType:
        from kvops.engines.tgi import api

        return api


ENGINE = TgiEngine()
