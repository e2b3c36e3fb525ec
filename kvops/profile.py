"""A calibration profile: what one engine run measured, to replace the planner's estimates (`kvops plan --profile`).

Written by `kvops calibrate --save FILE` (YAML or JSON). Every field is optional: the planner uses what was
measured and keeps its own figure, marked as an estimate, for the rest. A profile records the model, the GPU and
the engine release it came from; a plan for another says so.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from kvops.errors import ConfigError
from kvops.frozen import frozen

PROFILE_VERSION = 1


@frozen
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
    cudagraph_captures: int | None = None  # the batch sizes the run captured, which cudagraph_bytes grows with
    overhead_bytes: int | None = None  # activation + non-torch + CUDA graphs, when the log gives only their sum
    startup_used_bytes: int | None = None  # in use before the engine's startup snapshot: total - free at startup
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
        unknown = sorted(str(key) for key in set(data) - known - {"kvops_profile"})
        if unknown:
            raise ConfigError(f"{where}: unknown profile key {unknown[0]!r}; valid: {', '.join(sorted(known))}")
        if not isinstance(data.get("engine"), str) or not data["engine"]:  # a foreign engine: its adapter refuses it
            raise ConfigError(
                f"{where}: engine {data.get('engine')!r:.60} is not an engine name (`kvops calibrate --save` writes it)"
            )
        checked = {key: _checked(key, data[key], where) for key in known if data.get(key) is not None}
        checked.setdefault("source", where)
        return cls(**checked)


_TEXTS = ("engine", "source", "model", "gpu", "engine_version")
MAX_BYTES = 1 << 50  # a PiB: past any device's memory
# the largest value each whole-number field may hold (bytes fields: MAX_BYTES)
_HIGHEST = {
    "tp": 4096,
    "block_size": 1 << 20,
    "num_gpu_blocks": 1 << 40,
    "max_num_batched_tokens": 1 << 32,
    "cudagraph_captures": 1 << 20,
}


def _checked(key: str, value: Any, where: str) -> Any:
    """One profile field, typed and bounded: names are strings, gpu_memory_utilization a fraction, the rest whole
    numbers (bytes, blocks, tokens) no device holds more of."""
    if key in _TEXTS:
        if key == "engine_version" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # YAML reads 0.10 as a number
        if not isinstance(value, str) or len(value) > 4096:
            raise ConfigError(f"{where}: {key} {value!r:.60} must be a string")
        return value
    if key == "gpu_memory_utilization":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ConfigError(f"{where}: gpu_memory_utilization {value!r:.60} must be a number in (0, 1]")
        return float(value)
    lowest, highest = (1 if key in ("tp", "block_size") else 0), _HIGHEST.get(key, MAX_BYTES)
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        raise ConfigError(f"{where}: {key} {value!r:.60} must be a whole number from {lowest} to {highest:,}")
    return value
