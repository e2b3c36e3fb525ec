"""One engine run as `kvops explain` reads it: its vLLM log, its live /metrics, nvidia-smi beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvops.engines.metrics import Reading
from kvops.engines.vllm.capacity import VllmCapacity
from kvops.engines.vllm.logs import Failure, KvTooSmall, NoKvMemory, VllmLog
from kvops.engines.vllm.metrics import CacheConfig
from kvops.nvidia_smi import SmiDevice
from kvops.plan import Plan

TERMS = ("weights", "non_torch", "activation", "cuda_graphs", "kv_cache")
TERM_LABELS = {
    "weights": "weights",
    "non_torch": "non-torch memory",
    "activation": "activation peak",
    "cuda_graphs": "CUDA graphs",
    "kv_cache": "KV cache",
    "other_processes": "other processes",
    "overhead": "overhead",
}


@dataclass
class Run:
    """What one engine run left to read: its log, its live metrics, nvidia-smi beside it."""

    log: VllmLog | None = None
    log_source: str | None = None
    labels: CacheConfig | None = None  # vllm:cache_config_info
    reading: Reading | None = None  # vllm:kv_cache_usage_perc and the request gauges
    metrics_source: str | None = None
    smi: SmiDevice | None = None
    smi_source: str | None = None
    device_option: str | None = None  # --device, when the run's own lines do not say

    @property
    def facts(self) -> dict[str, Any]:
        return self.log.facts if self.log else {}

    def line(self, fact: str) -> str:
        return self.log.lines.get(fact, "") if self.log else ""

    def quote(self, fact: str) -> str:
        """The words a fact was read from, quoted: 'Model loading took 12.66 GiB'."""
        return f"'{self.log.matches[fact]}'" if self.log and fact in self.log.matches else ""

    @property
    def failure(self) -> Failure | None:
        return self.log.failure if self.log else None

    @property
    def device(self) -> str:
        return (self.log.device if self.log else None) or self.device_option or "gpu"

    def label_int(self, name: str) -> int | None:
        return self.labels.integer(name) if self.labels else None

    def label_float(self, name: str) -> float | None:
        return self.labels.number(name) if self.labels else None

    @property
    def pinned_kv_bytes(self) -> int | None:
        """The KV pool `--kv-cache-memory-bytes` pinned (vLLM then sizes nothing from the utilization)."""
        pinned = self.log.args.get("kv_cache_memory_bytes") if self.log else None
        return pinned or self.label_int("kv_cache_memory_bytes")

    @property
    def known_kv_pool(self) -> int | None:
        """The KV pool the run states: pinned, in its KV error, or in its log (None when not positive)."""
        failure = self.failure
        pool = (
            self.pinned_kv_bytes
            or (failure.available_bytes if isinstance(failure, (KvTooSmall, NoKvMemory)) else None)
            or self.facts.get("kv_cache_bytes")
        )
        return pool if pool and pool > 0 else None


def planned_capacity(plan: Plan | None) -> VllmCapacity | None:
    """The vLLM plan's capacity record (explain reads vLLM runs), or None without a sized plan."""
    capacity = plan.capacity if plan else None
    return capacity if isinstance(capacity, VllmCapacity) else None
