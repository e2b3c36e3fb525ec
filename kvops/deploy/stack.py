"""One engine and its kvops sidecar: what every deployment target puts side by side.

Where the engine has an admission middleware and one API server serves it (vLLM without data parallelism:
`Stack.middleware`), the engine applies the policy's levels itself (`--middleware`, with the same policy file) and
clients reach the engine's own port, with no second hop; the sidecar runs `kvops watch --engine E --metrics-url
<engine>/metrics --listen 0.0.0.0:PORT` for the alerts, /kvops/{policy,metrics,healthz} and the KV guard's levels.
Elsewhere (TGI; vLLM serving data-parallel ranks from several API servers; a fleet behind a gateway) the sidecar is
also the admission proxy, `--proxy <engine> --proxy-listen 0.0.0.0:PORT+1`, the only port the clients' Service or
published port reaches.
The middleware and the KV-guard scheduler need `kvops_vllm` importable in the engine's Python: the official vLLM
image does not have it, so an init step of the kvops image copies the pure-Python `kvops` and `kvops_vllm` packages
into a shared volume that the engine puts on PYTHONPATH (the engine image stays the official one).
"""

from __future__ import annotations

from typing import Any

from kvops import engines
from kvops.frozen import frozen
from kvops.plan import Plan
from kvops.policy import Policy
from kvops.render.quote import comment
from kvops.watch.rules import PlanFigures

PLUGIN_DIR = "/opt/kvops/python"  # the shared volume on the engine's PYTHONPATH
POLICY_DIR = "/etc/kvops"
POLICY_FILE = f"{POLICY_DIR}/policy.yaml"
# The init step, run by the kvops image's Python: copy the two packages (pure Python, their data files included).
PLUGIN_COPY = f"""\
import pathlib, shutil, kvops, kvops_vllm
for package in (kvops, kvops_vllm):
    source = pathlib.Path(package.__file__).parent
    shutil.copytree(source, pathlib.Path("{PLUGIN_DIR}", source.name), dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
print("kvops: copied kvops and kvops_vllm", kvops.__version__, "to {PLUGIN_DIR}")
"""


@frozen
class Stack:
    plan: Plan
    rules: str  # `kvops alerts` output, in the target's format
    policy_text: str  # the policy file the sidecar (and the guard) read
    command: str  # the `kvops manifests ...` line that generated it
    name: str
    kvops_image: str
    kvops_port: int = 9400
    scrape_interval: int = 15
    replicas: int = 1
    policy: Policy | None = None  # the policy text's, parsed
    figures: PlanFigures | None = None  # the plan's pool, request and memory split (headroom, GPU memory)
    # behind a gateway that routes over the replicas (llm-d): the proxy applies the levels, never a middleware
    fleet: bool = False
    namespace: str | None = None  # where the files are applied (kubectl -n): the queries read its series alone

    @property
    def engine(self) -> str:
        return self.plan.engine

    @property
    def engine_port(self) -> int:
        return self.plan.port

    @property
    def proxy_port(self) -> int:
        """The admission proxy's port, apart from the /kvops/* endpoints' so that clients reach only the proxy."""
        return self.kvops_port + 1

    @property
    def guarded(self) -> bool:
        """The plan names the KV-guard scheduler: the engine must import kvops_vllm."""
        scheduler = engines.get(self.engine).guard_scheduler
        return scheduler is not None and self.plan.flags.get("scheduler-cls") == scheduler

    @property
    def middleware(self) -> str | None:
        """The engine's admission middleware, where it applies: the engine has one, the plan runs one API server (vLLM
        starts one per data-parallel rank, each levelling on the stats it alone receives) and no gateway routes over
        a fleet. None: the sidecar's proxy applies the levels."""
        middleware = engines.get(self.engine).admission_middleware
        flags = self.plan.flags
        several = any(int(str(flags.get(flag) or 1)) > 1 for flag in ("data-parallel-size", "api-server-count"))
        return None if several or self.fleet else middleware

    @property
    def proxied(self) -> bool:
        """Clients go through the sidecar's admission proxy (no middleware in the engine)."""
        return self.middleware is None

    @property
    def with_plugin(self) -> bool:
        """The engine imports kvops_vllm: the guard's scheduler, the middleware, or both."""
        return self.guarded or self.middleware is not None

    def engine_args(self) -> list[str]:
        """The plan's arguments, and the middleware's flag where it applies (the plan names it only with the guard)."""
        args = list(self.plan.args)
        if self.middleware is not None and self.middleware not in args:
            args += ["--middleware", self.middleware]
        return args

    @property
    def engine_job(self) -> str:
        """Prometheus job of the engine's /metrics: the deployment's name (by default the engine's, what `kvops alerts`
        selects by default: {job="<engine>"}), so that two deployments' series and rules stay apart."""
        return self.name

    @property
    def kvops_job(self) -> str:
        """Prometheus job of the sidecar's /kvops/metrics (a job of its own: `up` of the engine job feeds KVMetricsStale)."""
        return f"kvops-{self.name}"

    @property
    def capacity_tokens(self) -> int | None:
        """What the watcher needs to read the engine's KV usage, from the plan (TGI: its batch token capacity)."""
        return engines.get(self.engine).watch_capacity(self.plan)

    def watch_args(self, engine_host: str) -> list[str]:
        """`kvops watch` arguments for the sidecar, the engine reachable at engine_host."""
        engine_url = f"http://{engine_host}:{self.engine_port}"
        args = [
            "watch",
            "--engine",
            self.engine,
            "--metrics-url",
            f"{engine_url}/metrics",
            "--listen",
            f"0.0.0.0:{self.kvops_port}",
        ]
        if self.proxied:
            args += ["--proxy", engine_url, "--proxy-listen", f"0.0.0.0:{self.proxy_port}"]
        args += ["--policy", POLICY_FILE]
        if self.capacity_tokens is not None:
            args += ["--max-batch-total-tokens", str(self.capacity_tokens)]
        if self.figures is not None:
            args += ["--request-tokens", str(self.figures.request_tokens)]
        return args

    def plugin_env(self) -> dict[str, str]:
        """The engine's environment for kvops_vllm: the plugin on the path and the same policy. The KV guard gets no
        watcher's levels: the door applies them (the middleware, or the sidecar's proxy), classing a request by its
        trusted X-KVops-Priority header, where the guard can class it only by vLLM's own priority, so a protected
        request the door let through at critical would wait in the guard's queue until the level fell."""
        return {"PYTHONPATH": PLUGIN_DIR, "KVOPS_POLICY": POLICY_FILE}

    def header(self, what: str) -> str:
        return comment(f"{what}, generated by `{self.command}`; regenerate rather than edit.")


def dump_yaml(document: Any) -> str:
    """Block-style YAML with multi-line strings as literal blocks (scripts and policy files stay readable)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # no &anchors: each object spelled out, as kubectl users read them

    def represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
        style = "|" if "\n" in text and not any(line != line.rstrip() for line in text.splitlines()) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    Dumper.add_representer(str, represent_str)
    return yaml.dump(document, Dumper=Dumper, sort_keys=False, width=1000, allow_unicode=True)
