"""A third engine for the tests, as small as a new adapter can be: it serves vLLM's API and metrics under another
name, program, image and container, and plans as vLLM does. Registering it is the one line of
kvops/engines/__init__.py a real engine adds (the tests patch the registry instead)."""

from __future__ import annotations

from dataclasses import replace

from kvops.engines.base import Container
from kvops.engines.vllm.engine import VllmEngine
from kvops.plan import Plan, PlanInputs

NAME = "fork"


class ForkEngine(VllmEngine):
    name = NAME
    title = "Fork"
    program = ("fork-serve",)
    container = Container(
        name="fork",
        port=30000,
        host_port=30000,
        model_cache="/models",
        docker_cache="~/models",
        compose_cache="fork-models",
        compose_cache_is_volume=True,
        docker_shared_memory=("--shm-size", "8g"),
        compose_shared_memory=(("shm_size", "8g"),),
        k8s_shared_memory=False,
    )
    guard_scheduler = None
    admission_middleware = None

    def image(self, vendor: str | None) -> str:
        return "example.org/fork:1.0"

    def plan_once(self, inputs: PlanInputs) -> Plan:
        plan = super().plan_once(inputs)
        flags = {name: value for name, value in plan.flags.items() if name != "scheduler-cls"}
        args = tuple(word for word in plan.args if word not in ("--scheduler-cls", plan.flags.get("scheduler-cls")))
        return replace(
            plan,
            program=inputs.launcher or self.program,
            image=self.image(None),
            port=self.container.port,
            flags=flags,
            args=args,
        )


ENGINE = ForkEngine()
