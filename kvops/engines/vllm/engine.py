"""The vLLM adapter: the `Engine` interface (kvops/engines/base.py) over this package's modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kvops.deployment import DeploymentOptions
from kvops.engines.base import Container
from kvops.engines.vllm import flags
from kvops.errors import KvopsError, UsageError

if TYPE_CHECKING:
    from kvops.calibration import Calibration
    from kvops.dtypes import KvDtype
    from kvops.engines.command import StatedCommand
    from kvops.engines.scheduling import SchedulerCore
    from kvops.engines.vllm.logs import VllmLog
    from kvops.engines.vllm.metrics import CacheConfig
    from kvops.model.spec import ModelSpec
    from kvops.plan import Plan, PlanInputs, WayOut


class VllmEngine:
    name = "vllm"
    title = "vLLM"
    program = flags.PROGRAM
    container = Container(
        name="vllm",
        port=flags.PORT,
        host_port=flags.PORT,
        model_cache="/root/.cache/huggingface",
        docker_cache="~/.cache/huggingface",
        compose_cache="huggingface-cache",  # a named volume: downloads survive restarts
        compose_cache_is_volume=True,
        docker_shared_memory=("--ipc=host",),
        compose_shared_memory=(("ipc", "host"),),
        k8s_shared_memory=True,
    )
    memory_fraction_flag = "gpu-memory-utilization"  # the share of the device the engine may use
    data_parallel = True
    guard_scheduler = flags.GUARD_SCHEDULER
    admission_middleware = flags.MIDDLEWARE
    signals = ("queue_growth", "preemptions", "stall", "prefix_cache_hit_rate", "offload_usage", "offload_load_latency")
    needs_capacity = False
    gateway_load_metrics = None  # llm-d's picker maps vLLM's metrics itself
    # its own queue limit refuses requests with 503 and counts them (vllm:admission_rejections, 0.32+): an alert
    refuses_at_queue_limit = True

    def image(self, vendor: str | None) -> str:
        return flags.image(vendor)

    def read_command(
        self, words: list[str], version: str | None = None, fallback: str | None = None
    ) -> StatedCommand | None:
        from kvops.engines.vllm import command

        return command.read_command(words, version, fallback)

    def plan_once(self, inputs: PlanInputs) -> Plan:
        from kvops.engines import targets
        from kvops.engines.vllm import offload, plan

        return targets.with_note(offload.with_tier(inputs, plan.plan_once(inputs)), self.memory_fraction_flag)

    def kv_dtype_ways(self, inputs: PlanInputs) -> list[str]:
        from kvops.engines.vllm import ways_out

        return ways_out.kv_dtype_ways(inputs)

    def kv_dtype_spelling(self, inputs: PlanInputs, name: str) -> str:
        from kvops.engines.vllm import ways_out

        return ways_out.kv_dtype_spelling(inputs, name)

    def offload_ways(self, inputs: PlanInputs, failed: Plan) -> list[WayOut]:
        from kvops.engines.vllm import ways_out

        return ways_out.offload_ways(inputs, failed)

    def kv_bytes_per_token(self, spec: ModelSpec, dtype: KvDtype, tp: int) -> int:
        from kvops.formula import kv_cost

        return kv_cost(spec, tokens=1, dtype=dtype, tp=tp).bytes_per_token

    def env_variables(self, plan: Plan) -> list[tuple[str, str]] | None:
        return None  # vLLM reads its engine flags only from the command line

    def simulation_arms(self, arms: Sequence[str]) -> dict[str, str]:
        from kvops.engines.vllm import simulator

        return {arm: simulator.parse_arm(arm).change for arm in arms}

    def simulation_core(
        self, plan: Plan, arm: str, scheduler_flags: Mapping[str, Any]
    ) -> tuple[SchedulerCore, str, dict[str, Any]]:
        from kvops.engines.vllm import simulator

        return simulator.simulation_core(plan, arm, scheduler_flags)

    def watch_capacity(self, plan: Plan) -> int | None:
        return None

    def capacity_from(self, plan: str | None = None, startup_log: str | None = None) -> int:
        raise UsageError("vLLM exports its KV usage: it needs no capacity")

    def usage_formula(self, capacity: int | None) -> str | None:
        return None

    def read_log(self, text: str, where: str) -> VllmLog:
        from kvops.engines.vllm.logs import parse_vllm_log

        log = parse_vllm_log(text)
        if not log.facts:
            raise KvopsError(
                f"{where}: no vLLM startup lines found (looked for 'Available KV cache memory', 'KV cache size', 'Model loading took', ...)"
            )
        return log

    def run_config(self, metrics_text: str, where: str) -> CacheConfig:
        """The running engine's cache config, from its /metrics."""
        from kvops.engines.metrics import MetricsError, Samples
        from kvops.engines.vllm import metrics

        try:
            config = metrics.cache_config(Samples.from_exposition(metrics_text, only=[metrics.CACHE_CONFIG]))
        except MetricsError:
            config = None
        if config is None:
            raise KvopsError(f"{where}: no vllm:cache_config_info sample; is this a vLLM /metrics endpoint?")
        return config

    def stated_options(self, log: VllmLog | None, config: CacheConfig | None) -> DeploymentOptions:
        from kvops.engines.vllm import run

        stated = run.stated_options(log, config)
        total = log.get("total_memory_bytes") if log is not None else None
        if total and log is not None and log.device != "cpu":
            stated = stated.under(DeploymentOptions.stated(gpu_memory=total))
        return stated

    def calibrate(self, log: VllmLog | None, config: CacheConfig | None, plan: Plan | None, source: str) -> Calibration:
        from kvops.engines.vllm import calibrate

        return calibrate.calibrate(log, config, plan, source)

    @property
    def metrics(self) -> ModuleType:
        from kvops.engines.vllm import metrics

        return metrics

    @property
    def api(self) -> ModuleType:
        from kvops.engines.vllm import api

        return api


ENGINE = VllmEngine()
