"""The TGI adapter: the `Engine` interface (kvops/engines/base.py) over this package's modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kvops.deployment import DeploymentOptions
from kvops.engines.base import Container
from kvops.engines.tgi import flags
from kvops.engines.tgi.metrics import BATCH_SIZE, QUEUE_SIZE
from kvops.errors import KvopsError, UsageError

if TYPE_CHECKING:
    from kvops.calibration import Calibration
    from kvops.dtypes import KvDtype
    from kvops.engines.command import StatedCommand
    from kvops.engines.tgi.logs import TgiLog
    from kvops.model.spec import ModelSpec
    from kvops.plan import Plan, PlanInputs, WayOut


NOT_SIMULATED = (
    "--engine tgi: kvops simulate runs the engine's own scheduler in Python, and TGI's router schedules in Rust; "
    "simulate with --engine vllm"
)


class TgiEngine:
    name = "tgi"
    title = "TGI"
    program = flags.PROGRAM
    container = Container(
        name="tgi",
        port=flags.PORT,
        host_port=8080,
        model_cache="/data",
        docker_cache='"$PWD"/data',
        compose_cache="./data",
        compose_cache_is_volume=False,
        docker_shared_memory=("--shm-size", "1g"),
        compose_shared_memory=(("shm_size", "1g"),),
        k8s_shared_memory=False,
    )
    memory_fraction_flag = "cuda-memory-fraction"  # the share of the device the engine may use
    data_parallel = False  # one replica per launcher
    guard_scheduler = None  # TGI has no scheduler plugin: the proxy guards it
    admission_middleware = None  # nor a middleware: its router is Rust
    signals = ("queue_growth", "stall")  # TGI never preempts and exports no prefix-cache counters
    needs_capacity = True  # KV usage = tgi_batch_current_max_tokens / max batch total tokens
    # llm-d's picker maps no TGI metrics; TGI exports no KV gauge of its own (its usage is a ratio kvops computes)
    gateway_load_metrics = (QUEUE_SIZE, BATCH_SIZE)

    def image(self, vendor: str | None) -> str:
        return flags.image(vendor)

    def read_command(
        self, words: list[str], version: str | None = None, fallback: str | None = None
    ) -> StatedCommand | None:
        from kvops.engines.tgi import command  # one option table (TGI 3.3.7's) for every release

        return command.read_command(words)

    def plan_once(self, inputs: PlanInputs) -> Plan:
        from kvops.engines import targets
        from kvops.engines.tgi import plan

        if inputs.kv_offloading_size is not None:
            raise UsageError("--kv-offloading-size is vLLM's host KV tier; TGI has none")
        return targets.with_note(plan.plan_once(inputs), self.memory_fraction_flag)

    def kv_dtype_ways(self, inputs: PlanInputs) -> list[str]:
        from kvops.engines.tgi import plan

        return plan.kv_dtype_ways(inputs)

    def kv_dtype_spelling(self, inputs: PlanInputs, name: str) -> str:
        from kvops.engines.tgi import plan

        return plan.kv_dtype_spelling(inputs, name)

    def offload_ways(self, inputs: PlanInputs, failed: Plan) -> list[WayOut]:
        return []

    def kv_bytes_per_token(self, spec: ModelSpec, dtype: KvDtype, tp: int) -> int:
        from kvops.engines.tgi import budget

        return budget.kv_bytes_per_token(spec, dtype, tp)

    def simulation_arms(self, arms: Sequence[str]) -> dict[str, str]:
        raise UsageError(NOT_SIMULATED)

    def simulation_core(
        self, plan: Plan, arm: str, scheduler_flags: Mapping[str, Any]
    ) -> tuple[Any, str, dict[str, Any]]:
        raise UsageError(NOT_SIMULATED)

    def env_variables(self, plan: Plan) -> list[tuple[str, str]] | None:
        """Every launcher flag is also an environment variable (`#[clap(long, env)]`)."""
        return [(flags.env_name(name), _env_value(value)) for name, value in plan.flags.items()]

    def watch_capacity(self, plan: Plan) -> int | None:
        return plan.capacity.kv_tokens if plan.capacity else None

    def capacity_from(self, plan: str | None = None, startup_log: str | None = None) -> int:
        """The batch token capacity from a kvops plan file or the router's startup line."""
        from kvops.engines.tgi.metrics import capacity_from_log, capacity_from_plan

        if plan:
            return capacity_from_plan(plan)
        if startup_log:
            return capacity_from_log(startup_log)
        raise UsageError("TGI's batch token capacity needs a kvops plan file or the router's startup log")

    def usage_formula(self, capacity: int | None) -> str | None:
        return f"KV usage = tgi_batch_current_max_tokens / {capacity} (max batch total tokens)."

    def read_log(self, text: str, where: str) -> TgiLog:
        from kvops.engines.tgi.logs import parse_tgi_log

        log = parse_tgi_log(text)
        figures = ("max_batch_total_tokens", "warmup_max_prefill_tokens", "pool_out_of_memory")
        if all(log.get(name) is None for name in figures):
            raise KvopsError(
                f"{where}: no 'Setting max batch total tokens to N' line (nor a warmup's): is this a TGI launcher log?"
            )
        return log

    def run_config(self, metrics_text: str, where: str) -> None:
        raise UsageError(f"{where}: TGI's /metrics does not state its cache configuration; give its launcher log")

    def stated_options(self, log: TgiLog | None, config: None) -> DeploymentOptions:
        from kvops.engines.tgi import run

        return run.stated_options(log) if log is not None else DeploymentOptions.stated(engine=self.name)

    def calibrate(self, log: TgiLog | None, config: None, plan: Plan | None, source: str) -> Calibration:
        from kvops.engines.tgi import calibrate

        assert log is not None  # a TGI calibration reads its launcher log
        return calibrate.calibrate(log, plan, source)

    @property
    def metrics(self) -> ModuleType:
        from kvops.engines.tgi import metrics

        return metrics

    @property
    def api(self) -> ModuleType:
        from kvops.engines.tgi import api

        return api


def _env_value(value: object) -> str:
    if value is True:
        return "true"
    return f"{value:g}" if isinstance(value, float) else str(value)


ENGINE = TgiEngine()
