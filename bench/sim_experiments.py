"""The public GPU measurements kvops simulate is fitted and scored on (bench/data/sim_to_real.json), as simulations.

Each experiment is a real vLLM run on a GPU whose setup is published (model, tp, engine flags, the inference-perf
workload: constant-rate stages with Poisson-like arrivals, fixed prompt and output lengths, shared system prompts).
It becomes a kvops plan (its logged KV block count where the run logged one: the pool is then the engine's, not
kvops' estimate) and one trace per stage. Used by bench/fit_steptime.py and bench/simulate_accuracy.py. The runs
that publish everything but their workload are built too, with the workload their name stands for
(assumed_experiments): scored apart by bench/simulate_accuracy.py, fitted on nowhere.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from kvops.simulate.trace import Trace, TraceRequest  # noqa: E402

DATA = REPO / "bench" / "data" / "sim_to_real.json"
# inference-sim/training's shared_prefix data (results/config.yaml of its runs): 10 system prompts, each with 10
# questions that repeat; the trainval runs' specs name the same workloads without the counts
DEFAULT_GROUPS, DEFAULT_PROMPTS = 10, 10
# sim-to-real's status of a queue-dominated run (thousands of requests failed, or the queue grew all run): scored
# apart
QUEUED = ("overloaded", "saturated")
HARNESS_MAX_MODEL_LEN = 4096  # the training runs' --max-model-len; the trainval runs do not state theirs


@dataclass(frozen=True)
class Stage:
    index: int
    rate_rps: float
    duration_s: float
    measured: dict[str, Any]


@dataclass(frozen=True)
class Experiment:
    id: str
    model: str
    gpu: str
    tp: int
    kind: str  # dense or moe
    workload: str
    engine: dict[str, Any]
    prompt_tokens: int
    output_tokens: int  # the requested length: with ignore_eos vLLM generates exactly max_tokens
    prefix_tokens: int
    groups: int
    prompts_per_group: int
    stages: tuple[Stage, ...]
    measured: dict[str, Any]
    peers: dict[str, Any]
    status: str = "steady"  # sim-to-real's word for the run: steady, overloaded or saturated (queue-dominated)
    vllm_version: str | None = None
    assumed: bool = False  # its workload is not published: the profile of the published runs of its name

    @property
    def queued(self) -> bool:
        return self.status in QUEUED

    @property
    def short(self) -> str:
        return self.id.split("-", 2)[-1] if self.id[:8].isdigit() else self.id


def cited(runs: list[Experiment]) -> tuple[str, str]:
    """Runs as a source names them: sim-to-real's run numbers, and their models."""
    numbers = ", ".join(run.id.split("-")[0] for run in runs)
    return numbers, ", ".join(sorted({run.model.split("/")[-1] for run in runs}))


def experiments(data: Path = DATA) -> list[Experiment]:
    """The experiments whose workload is published, in file order."""
    return [_experiment(item, item["workload"]) for item in _items(data) if _published(item)]


def assumed_experiments(data: Path = DATA) -> list[Experiment]:
    """The runs whose workload is not published, each given the profile that every published run of its workload
    name used (stage rates and lengths, prompt, output and shared-prefix tokens), where those runs agree on one and
    the run has its number of stages. sim-to-real names each run's workload and publishes its engine flags, its GPU
    and its measurements, but not whether it used that profile: these are scored apart, and fitted on nowhere."""
    items = _items(data)
    named: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        if _published(item):
            named.setdefault(item["workload"]["name"], []).append(item["workload"])
    found = []
    for item in items:
        same = named.get(item["workload"]["name"], [])
        if _published(item) or len({_profile(workload) for workload in same}) != 1:
            continue
        if len(same[-1]["stages"]) == len(item.get("stages") or ()):
            found.append(_experiment(item, same[-1], assumed=True))
    return found


def _items(data: Path) -> list[dict[str, Any]]:
    return json.loads(data.read_text())["experiments"]


def _published(item: dict[str, Any]) -> bool:
    workload = item.get("workload") or {}
    return bool(workload.get("kind") and workload.get("stages"))


def _profile(workload: dict[str, Any]) -> str:
    """What a workload sends, as one comparable value."""
    prefix = (workload.get("shared_prefix") or {}).get("prefix_tokens")
    sent = (
        workload["kind"],
        workload["stages"],
        workload["prompt_tokens"]["value"],
        workload["output_tokens"]["value"],
    )
    return json.dumps([*sent, prefix])


def _experiment(item: dict[str, Any], workload: dict[str, Any], assumed: bool = False) -> Experiment:
    """One run, its stages timed by `workload` (its own, or the profile assumed for it)."""
    measured = item["measured"]
    prefix = workload.get("shared_prefix") or {}
    stages = item.get("stages") or [{"stage_index": 0, **workload["stages"][0], "measured": measured}]
    return Experiment(
        id=item["id"],
        model=item["model"],
        gpu=item["gpu"],
        tp=item["tp"],
        kind=item["model_kind"],
        workload=workload["name"],
        engine=item["engine"],
        prompt_tokens=workload["prompt_tokens"]["value"],
        output_tokens=workload["output_tokens"]["value"],
        prefix_tokens=prefix.get("prefix_tokens") or 0,
        groups=prefix.get("num_groups") or DEFAULT_GROUPS,
        prompts_per_group=prefix.get("prompts_per_group") or DEFAULT_PROMPTS,
        stages=tuple(
            Stage(
                stage["stage_index"],
                stage.get("rate_rps") or timed["rate_rps"],
                stage.get("duration_s") or timed["duration_s"],
                _per_token(stage["measured"], workload),
            )
            for stage, timed in zip(stages, workload["stages"])
        ),
        measured=_per_token(measured, workload),
        peers=item.get("peers") or {},
        status=item.get("status", "steady"),
        vllm_version=item.get("vllm_version"),
        assumed=assumed,
    )


def _per_token(measured: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """The measured TPOT per generated token. sim-to-real divides E2E - TTFT by inference-perf's mean output length,
    which for the Llama-2-7B runs is below the requested length (median 247 of 247, p10 31, mean 195) although
    ignore_eos was on, so vLLM generated every token asked for: their count is a re-tokenized text, not the
    engine's. Where so, TPOT is (E2E - TTFT) / (requested - 1)."""
    requested = workload["output_tokens"]["value"]
    counted = measured.get("output_len_mean")
    if not workload.get("ignore_eos") or not counted or counted >= requested - 1:
        return measured
    return {**measured, "tpot_mean_ms": (measured["e2e_mean_ms"] - measured["ttft_mean_ms"]) / (requested - 1)}


def plan_for(experiment: Experiment):
    """kvops' plan of the experiment's deployment."""
    from kvops.deployment import DeploymentOptions
    from kvops.errors import KvopsError
    from kvops.planner import plan

    engine = experiment.engine
    if (engine.get("data_parallel_size") or 1) > 1:
        raise KvopsError("data parallel: several engines behind one endpoint, where kvops simulate runs one")
    options = DeploymentOptions(
        model=experiment.model,
        engine_version=experiment.vllm_version,
        gpu=experiment.gpu,
        tp=experiment.tp,
        memory_fraction=engine.get("gpu_memory_utilization"),
        max_model_len=engine.get("max_model_len") or HARNESS_MAX_MODEL_LEN,
        max_num_seqs=engine.get("max_num_seqs"),
        batched_tokens=engine.get("max_num_batched_tokens"),
        block_size=engine.get("block_size"),
        # a KV connector (these runs offload KV to CPU) turns vLLM's hybrid KV cache manager off: chunked and
        # sliding layers are then allocated as full attention (vllm/config/vllm.py)
        hybrid_manager=not engine.get("kv_offloading"),
    )
    return plan(options.plan_inputs())


def scheduler_flags(experiment: Experiment, plan) -> dict[str, Any]:
    """The engine flags besides the plan's: the run's logged pool, when it logged one. The block counts come from
    BLIS's testdata, which records vLLM's logged "GPU KV cache size" in tokens over 16: a pool's blocks where the
    model has one KV cache group; with several (Llama 4's chunked and full layers), each request takes blocks in
    every group, and vLLM's tokens figure is max-model-len times the requests the pool holds at it, so the blocks
    are those requests times the blocks one takes (vllm/v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config)."""
    blocks = experiment.engine.get("num_gpu_blocks")
    if not blocks:
        return {}
    capacity = plan.capacity
    if len(capacity.cache_groups) > 1:
        tokens = blocks * 16
        blocks = -(-tokens * capacity.blocks_per_request_at_max_model_len // capacity.max_model_len)
    return {"num_gpu_blocks_override": blocks}


def stage_trace(experiment: Experiment, stage: Stage, window_s: float | None = None) -> Trace:
    """The stage's arrivals (the first `window_s` seconds of it), each prompt a shared system prompt followed by one
    of its group's repeating questions, as inference-perf's shared_prefix data sends them.

    inference-perf's "constant" load is not evenly spaced: since 2025-08 (kubernetes-sigs/inference-perf 5e1649d,
    inference_perf/loadgen/load_timer.py `ConstantLoadTimer`) it draws rate x duration exponential gaps and scales
    them to sum to the stage's duration, a Poisson process held to its count. The same here, from a seed of the
    experiment and stage, so that every fit and score sees the same arrivals.

    A stage whose requests live long against the window is sent whole (`simulated_seconds`)."""
    seconds = simulated_seconds(experiment, stage, window_s)
    question = experiment.prompt_tokens - experiment.prefix_tokens
    requests = []
    for index, sent in enumerate(_arrivals(experiment, stage)):
        if sent >= seconds:
            break
        group = index % experiment.groups
        asked = (index // experiment.groups) % experiment.prompts_per_group
        prefix = ((f"system-{group}", experiment.prefix_tokens), (f"question-{group}-{asked}", question))
        requests.append(
            TraceRequest(
                sent,
                experiment.prompt_tokens,
                experiment.output_tokens,
                max_tokens=experiment.output_tokens,
                prefix=tuple(segment for segment in prefix if segment[1] > 0),
            )
        )
    return Trace(tuple(requests), f"{experiment.short} stage {stage.index} ({stage.rate_rps:g} rps, {seconds:g} s)")


# slower than any of these runs' TPOT, so that no stage of long requests is mistaken for a short one
PESSIMISTIC_TPOT_S = 0.030


def simulated_seconds(experiment: Experiment, stage: Stage, window_s: float | None) -> float:
    """How much of the stage is simulated: its first `window_s` seconds, or all of it where a request may live
    longer than a tenth of the window (its output tokens at PESSIMISTIC_TPOT_S each).

    A window starts empty and its last requests finish with none arriving after them, so the requests sent in
    its first and last lifetime run beside fewer others than the stage's (a ramp and a drain the real stage
    has once in its whole length). With short requests that is a few percent of the window's; with 1,448-token
    requests living 10-40 s ("reasoning-lite"), most of a 100 s window's requests met a half-full batch, and
    the simulated TPOT came out 8-18% fast. Simulated whole, the stage ramps and drains as the real one did."""
    if window_s is None or experiment.output_tokens * PESSIMISTIC_TPOT_S > window_s / 10:
        return stage.duration_s
    return min(window_s, stage.duration_s)


def _arrivals(experiment: Experiment, stage: Stage) -> list[float]:
    """inference-perf's send times for a constant-rate stage (see stage_trace). KVOPS_BENCH_ARRIVALS picks another
    draw (an integer added to the seed) or `even`: evenly spaced, the reading of "constant" this bench used before."""
    count = int(stage.rate_rps * stage.duration_s)
    draw = os.environ.get("KVOPS_BENCH_ARRIVALS", "0")
    if draw == "even":
        return [index / stage.rate_rps for index in range(count)]
    rng = np.random.default_rng(zlib.crc32(f"{experiment.id}/{stage.index}".encode()) + int(draw))
    gaps = rng.exponential(1 / stage.rate_rps, count)
    return [float(sent) for sent in np.cumsum(gaps * (stage.duration_s / gaps.sum()))]


def request_weights(experiment: Experiment, stage: Stage, sent: int) -> list[float]:
    """How many of the real stage's requests each of the first `sent` simulated ones stands for.

    A stage is simulated from an empty prefix cache. Until every distinct prompt (groups x prompts per group) has
    been sent once, each is computed in full; afterwards each is found in the cache. The real run does that once:
    in its first stage, for the first cycle of its requests, and later stages find the cache the earlier ones left.
    So the first cycle counts once in the first stage and not at all in a later one, and the requests after it
    stand for the rest of the stage. Weighted alike, a short window is not a run whose every prompt was new one
    time in six (roleplay's 100 prompts at 6 requests/s over a 100 s window, against 1 in 72 over its 1,200 s)."""
    cycle = min(sent, experiment.groups * experiment.prompts_per_group)
    real = stage.rate_rps * stage.duration_s
    if sent <= cycle:  # the window ends within the first cycle: every request as it came
        return [real / max(sent, 1)] * sent
    cold = 1.0 if stage.index == experiment.stages[0].index else 0.0
    return [cold] * cycle + [(real - cold * cycle) / (sent - cycle)] * (sent - cycle)


METRICS = ("ttft_mean_ms", "e2e_mean_ms", "tpot_mean_ms", "e2e_p90_ms", "throughput_rps")


def predicted(summary) -> dict[str, float]:
    """A simulated run's figures under the measurement's names."""
    return {
        "ttft_mean_ms": summary.ttft.mean * 1000,
        "e2e_mean_ms": summary.e2e.mean * 1000,
        "tpot_mean_ms": summary.tpot.mean * 1000,
        "e2e_p90_ms": summary.e2e.p90 * 1000,
        "throughput_rps": summary.throughput_rps,
    }
