"""What kvops needs to know of a serving engine: the `Engine` interface every adapter in `kvops/engines/<name>/`
implements. Nothing outside `kvops/engines/` asks which engine it is; it asks the adapter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from kvops.frozen import frozen

if TYPE_CHECKING:
    from kvops.calibration import Calibration
    from kvops.deployment import DeploymentOptions
    from kvops.dtypes import KvDtype
    from kvops.engines.command import StatedCommand
    from kvops.engines.logs import LogFacts
    from kvops.engines.scheduling import SchedulerCore
    from kvops.model.spec import ModelSpec
    from kvops.plan import Plan, PlanInputs, WayOut


@frozen
class Container:
    """How the engine's official image runs: its container, the port it serves and where it keeps models."""

    name: str  # container and compose service name
    port: int  # the port the image serves inside the container
    host_port: int  # what `docker run -p` publishes it as
    model_cache: str  # where the image keeps downloaded models
    docker_cache: str  # the `docker run -v` source of that cache, as the user's shell expands it
    compose_cache: str  # the compose volume source of that cache: a named volume or a relative path
    compose_cache_is_volume: bool  # the source is a named volume the compose file declares
    docker_shared_memory: tuple[str, ...]  # `docker run` options for shared memory
    compose_shared_memory: tuple[tuple[str, str], ...]  # the same as compose service keys
    k8s_shared_memory: bool  # mount a memory-backed /dev/shm in Kubernetes


class Engine(Protocol):
    name: str  # as users type it: "vllm"
    title: str  # as users read it: "vLLM"
    program: tuple[str, ...]  # what starts it: ("vllm", "serve")
    container: Container
    memory_fraction_flag: str  # the flag naming the share of the device it may use
    data_parallel: bool  # one launch can run several replicas (--data-parallel-size)
    guard_scheduler: str | None  # the KV-guard scheduler a plan may name, or None where the engine has no plugin
    # the middleware that applies the degrade policy in the engine's own API server, or None: the proxy does
    admission_middleware: str | None
    signals: tuple[str, ...]  # the saturation signals its metrics support (the policy's signal names)
    needs_capacity: bool  # its KV usage is computed from a capacity the watcher must be given
    # its (waiting, running) gauges, for a gateway that has no mapping of its own for this engine (llm-d's picker
    # maps vLLM's); None: the gateways read the engine already
    gateway_load_metrics: tuple[str, str] | None

    def image(self, vendor: str | None) -> str:
        """The official image for the device's vendor (None: no device given)."""
        ...

    def read_command(
        self, words: list[str], version: str | None = None, fallback: str | None = None
    ) -> StatedCommand | None:
        """What a pasted launch command states, when its words start this engine (None: they do not), to the release
        planned: `version` typed, else one the line names (an image tag), else `fallback` (a file's)."""
        ...

    def plan_once(self, inputs: PlanInputs) -> Plan:
        """The engine's plan for these inputs, fitting or not."""
        ...

    def kv_dtype_ways(self, inputs: PlanInputs) -> list[str]:
        """The quantized KV dtypes the engine takes, in the order the planner tries them."""
        ...

    def kv_dtype_spelling(self, inputs: PlanInputs, name: str) -> str:
        """How the engine is told to keep the KV cache in `name`, for the ways out's notes."""
        ...

    def offload_ways(self, inputs: PlanInputs, failed: Plan) -> list[WayOut]:
        """Ways out through host memory the engine offers (described, not re-planned)."""
        ...

    def kv_bytes_per_token(self, spec: ModelSpec, dtype: KvDtype, tp: int) -> int:
        """KV bytes per cached token per GPU, as the engine lays the cache out (the sweep's column)."""
        ...

    def simulation_arms(self, arms: Sequence[str]) -> dict[str, str]:
        """Each of `arms` (`kvops simulate --compare`) -> what it adds to the engine's command; UsageError naming a
        bad one, or saying why the engine's scheduler cannot be simulated."""
        ...

    def simulation_core(
        self, plan: Plan, arm: str, scheduler_flags: Mapping[str, Any]
    ) -> tuple[SchedulerCore, str, dict[str, Any]]:
        """The engine's own scheduler over the plan's pool, as `arm` runs it: the core, what the arm adds to the
        command, and the settings it ran with. UsageError where the engine's scheduler cannot run here."""
        ...

    def env_variables(self, plan: Plan) -> list[tuple[str, str]] | None:
        """The plan as the engine's environment variables, or None when it reads its flags only as arguments."""
        ...

    def watch_capacity(self, plan: Plan) -> int | None:
        """What the watcher needs to turn this engine's metrics into KV usage, from the plan (None: nothing)."""
        ...

    def capacity_from(self, plan: str | None = None, startup_log: str | None = None) -> int:
        """The capacity the watcher needs (needs_capacity), from a kvops plan file or the engine's startup log."""
        ...

    def usage_formula(self, capacity: int | None) -> str | None:
        """How KV usage is computed from the engine's metrics, for alert headers (None: exported directly)."""
        ...

    def read_log(self, text: str, where: str) -> LogFacts:
        """The engine's startup log: what it measured and sized; KvopsError when it holds none of that."""
        ...

    def run_config(self, metrics_text: str, where: str) -> Any:
        """What a running engine's /metrics states of its configuration (for calibration)."""
        ...

    def stated_options(self, log: Any, config: Any) -> DeploymentOptions:
        """The deployment options a run states about itself (its args, its cache config, its device total)."""
        ...

    def calibrate(self, log: Any, config: Any, plan: Plan | None, source: str) -> Calibration:
        """The run's measured figures against the plan's, and the profile they make."""
        ...

    @property
    def metrics(self) -> ModuleType:
        """The engine's /metrics: `SERIES`, `reading(samples, capacity_tokens)`, `promql(matchers, capacity_tokens)`."""
        ...

    @property
    def api(self) -> ModuleType:
        """The engine's HTTP API as the admission proxy sees it: the generation routes and their token fields."""
        ...
