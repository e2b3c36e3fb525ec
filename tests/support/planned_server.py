"""A vLLM engine started from a kvops plan's own argv, and the plan and the engine's cache config side by side."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.vllm_server import VllmServer


class PlannedServer(VllmServer):
    """The plan's own argv (`vllm serve MODEL ...`), run by the API server module: `--model MODEL`, then every flag
    as emitted, and no flag of the test's own but dummy weights and the port."""

    def __init__(self, argv: list[str], log: Path):
        assert argv[:2] == ["vllm", "serve"], argv
        super().__init__(Path(argv[2]), log)
        self.planned = argv

    def command(self) -> list[str]:
        return self.api_server(self.planned[2], self.planned[3:])


def plan_json(run_kvops, *args: str) -> dict:
    return json.loads(run_kvops("plan", "--engine", "vllm", "--device", "cpu", "--format", "json", *args).stdout)


def reported(server: VllmServer) -> dict[str, str]:
    labels = server.cache_config()
    assert labels is not None, "no vllm:cache_config_info on /metrics"
    return labels
