"""A calibration profile: what one engine run measured, to replace the planner's estimates (`kvops plan --profile`).

Written by `kvops calibrate --save FILE` (YAML or JSON). Every field is optional: the planner uses what was
measured and keeps its own figure, marked as an estimate, for the rest. A profile records the model, the GPU and
the engine release it came from; a plan for another says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from kvops import engines
from kvops.errors import ConfigError

PROFILE_VERSION = 1


@dataclass(frozen=True)
class Profile:
    engine: str
    source: str  # the log file or metrics URL it came from
    model: str | None = None
    gpu: str | None = None  # the GPU catalog id of the run
    engine_version: str | None = None  # the engine release of the run
    tp: int | None = None
    max_num_batched_tokens: int | None = None
    total_memory_bytes: int | None = None  # what the engine saw as the device total (torch), not nvidia-smi's
    gpu_memory_utilization: float | None = None
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cudagraph_bytes: int | None = None
    overhead_bytes: int | None = None  # activation + non-torch + CUDA graphs, when the log gives only their sum
    kv_cache_bytes: int | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None

    def to_text(self, as_json: bool) -> str:
        """The profile file: YAML, or JSON."""
        import json

        import yaml

        data = self.to_dict()
        return json.dumps(data, indent=2) + "\n" if as_json else yaml.safe_dump(data, sort_keys=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kvops_profile": PROFILE_VERSION,
            **{key: value for key, value in asdict(self).items() if value is not None},
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Profile:
        if not isinstance(data, dict) or data.get("kvops_profile") != PROFILE_VERSION:
            raise ConfigError(
                f"{where}: not a kvops profile (expected `kvops_profile: {PROFILE_VERSION}`; write one with `kvops calibrate --save`)"
            )
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(data) - known - {"kvops_profile"})
        if unknown:
            raise ConfigError(f"{where}: unknown profile key {unknown[0]!r}; valid: {', '.join(sorted(known))}")
        if data.get("engine") not in engines.NAMES:
            raise ConfigError(f"{where}: engine {data.get('engine')!r}; valid: {', '.join(engines.NAMES)}")
        for key in known - {"engine", "source", "model", "gpu", "engine_version", "gpu_memory_utilization"}:
            value = data.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ConfigError(f"{where}: {key} {value!r} must be a non-negative integer")
        if data.get("engine_version") is not None:
            data = {**data, "engine_version": str(data["engine_version"])}
        return cls(**{key: data[key] for key in known if key in data})
