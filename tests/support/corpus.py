"""The corpus of public engine startup logs (tests/fixtures/corpus): each entry's log, what it measured, and the
deployment a kvops user would state to plan that launch. Shared by the corpus tests and `bench/accuracy.py`.

An entry's `kvops` block (tests/fixtures/corpus/README.md) names the catalog model and GPU, the release, and the
launch options its source states; options kvops has no input for (speculative decoding, a KV connector, expert or
data parallelism), gaps in the source (no GPU named) and a model not in kvops' catalog (the corpus never asks the
Hub) make it "not planned", with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache
from typing import Any

import yaml

from kvops import engines
from kvops.deployment import DeploymentOptions
from kvops.engines.logs import LogFacts
from kvops.engines.overhead_fit import fit_overheads
from kvops.engines.tgi import calibrate as tgi_calibrate
from kvops.engines.tgi import releases as tgi_releases
from kvops.engines.vllm import calibrate as vllm_calibrate
from kvops.engines.vllm import releases as vllm_releases
from kvops.errors import KvopsError
from kvops.model import catalog
from kvops.overheads import Observation, OverheadFit
from kvops.plan import Plan
from kvops.planner import predict
from tests.support.paths import FIXTURES

CORPUS = FIXTURES / "corpus"
OPTION_FIELDS = {item.name for item in fields(DeploymentOptions)}


class NotPlanned(Exception):
    """Why kvops cannot plan an entry's launch."""


@dataclass(frozen=True)
class Entry:
    data: dict[str, Any]

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def engine(self) -> str:
        return self.data["engine"]

    @property
    def kvops(self) -> dict[str, Any]:
        return self.data.get("kvops", {})

    @property
    def started(self) -> bool:
        return self.data["outcome"] == "started"

    @property
    def lora(self) -> bool:
        """Launched with LoRA adapters (its args say so, or the entry does where a launcher enabled them unseen):
        they ran releases older than those whose LoRA layers kvops has read (0.32 on), so the memory the adapters
        take is in none of the terms it plans."""
        return bool((self.data.get("args") or {}).get("enable_lora") or self.kvops.get("lora"))

    @property
    def post_fit(self) -> bool:
        """Published after the shipped overhead fit (`post_fit: true`): held out of the fit and scored apart, so its
        error is an out-of-sample one."""
        return bool(self.kvops.get("post_fit"))

    @property
    def fit(self) -> bool:
        """Its measured terms may train the overhead fit: not a fork of the engine's (`fit: false`), nor a launch with
        LoRA adapters, whose memory would pass for the engine's own overheads in every other log's plan, nor one
        published after the fit (scored apart)."""
        return self.kvops.get("fit", True) and not self.lora and not self.post_fit

    @property
    def text(self) -> str:
        return (CORPUS / self.engine / f"{self.id}.log").read_text()

    @cached_property
    def log(self) -> LogFacts:
        from kvops.engines.tgi.logs import parse_tgi_log
        from kvops.engines.vllm.logs import parse_vllm_log

        return (parse_vllm_log if self.engine == "vllm" else parse_tgi_log)(self.text)

    def options(self) -> DeploymentOptions:
        """The deployment a kvops user states for this launch: the entry's model, GPU, release and options, the
        run's own statement (its args, its log lines) for the rest; never the log's device total, which kvops must
        know itself. Raises NotPlanned when the source leaves out what a plan needs or the launch uses an option
        kvops has no input for."""
        block = self.kvops
        if block.get("not_planned"):
            raise NotPlanned(block["not_planned"])
        stated = dict(block.get("options", {}))
        unknown = sorted(name for name in stated if name not in OPTION_FIELDS)
        if unknown:
            raise NotPlanned(f"launched with {', '.join(unknown)}, which kvops has no input for")
        for key in ("model", "gpu", "engine_version"):
            if block.get(key):
                stated[key] = block[key]
        missing = [key for key in ("model", "gpu") if key not in stated]
        if missing:
            raise NotPlanned(f"the source does not name the {' or the '.join(missing)}")
        if catalog.find(stated["model"]) is None:  # offline and the same on every machine: never the Hub
            raise NotPlanned(f"{stated['model']} is not in kvops' catalog (the corpus is planned offline)")
        adapter = engines.get(self.engine)
        run = adapter.stated_options(self.log, None)
        run = DeploymentOptions.stated(**{name: getattr(run, name) for name in run.given if name != "gpu_memory"})
        return DeploymentOptions.stated(engine=self.engine, **stated).under(run)


@lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    return tuple(Entry(item) for item in yaml.safe_load((CORPUS / "index.yaml").read_text()))


def entry(entry_id: str) -> Entry:
    return next(item for item in entries() if item.id == entry_id)


# --- kvops on the corpus: plans, and the measured overheads the fit takes ------------------------------------

FAMILIES = {"vllm": vllm_releases.FAMILIES, "tgi": tgi_releases.FAMILIES}
FALLBACKS = {"vllm": vllm_releases.FALLBACKS, "tgi": {}}
GRAPH_FAMILIES = {"vllm": vllm_releases.GRAPH_FAMILIES, "tgi": ()}
SAMPLER_FALLBACKS = {"vllm": vllm_releases.SAMPLER_FALLBACKS, "tgi": {}}
NON_TORCH_PRIORS = {"vllm": None, "tgi": tgi_releases.NON_TORCH_PRIOR}


def plan_entry(entry: Entry, fit: OverheadFit | None = None, pinned_kv: int | None = None) -> Plan:
    """kvops' plan of an entry's launch (with this overhead fit, or the shipped one; optionally its KV pinned)."""
    inputs = replace(entry.options().plan_inputs(), overhead_fit=fit)
    if pinned_kv is not None:
        inputs = replace(inputs, kv_cache_memory_bytes=pinned_kv)
    return predict(inputs)


def observations() -> dict[str, Observation]:
    """Every fit-eligible entry's measured overheads, by entry id: a planned launch's against kvops' model of it,
    an unplanned vLLM launch's CUDA-graph estimate alone. Entries kvops cannot plan give nothing else."""
    found = {}
    for item in entries():
        if not item.fit:
            continue
        try:
            plan = plan_entry(item)
        except (NotPlanned, KvopsError):
            observed = _graph_only(item)
        else:
            observe = vllm_calibrate.observation if item.engine == "vllm" else tgi_calibrate.observation
            observed = observe(item.log, plan, item.id)
        if observed is not None:
            found[item.id] = observed
    return found


def fit_corpus(engine: str, found: dict[str, Observation]) -> OverheadFit:
    engine_of = {item.id: item.engine for item in entries()}
    return fit_overheads(
        engine,
        [item for source, item in found.items() if engine_of[source] == engine],
        FAMILIES[engine],
        FALLBACKS[engine],
        GRAPH_FAMILIES[engine],
        SAMPLER_FALLBACKS[engine],
        NON_TORCH_PRIORS[engine],
    )


def _graph_only(item: Entry) -> Observation | None:
    if item.engine != "vllm":
        return None
    release = item.log.release() or (
        vllm_releases.release(item.kvops["engine_version"]) if item.kvops.get("engine_version") else None
    )
    return vllm_calibrate.graph_observation(item.log, item.id, release) if release else None
