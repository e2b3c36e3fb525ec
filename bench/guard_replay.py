"""Workloads (a) and (b) of bench/guard_goodput.py replayed through the real schedulers in-process, no engine.

    python bench/guard_replay.py [--workloads abnh] [--seeds 0,1,2] [--scale 1] [--blocks 32] [--cold] [--burst N]
                                 [--quantiles 0.95] [--pause-steps 0,1000] [--cold-starts max_tokens]

Each scheduler (stock vLLM's AsyncScheduler, the KV guard v1, v2 and v3) is built as
tests/engine/test_kv_guard_scheduler.py builds it, over the benchmark's pool (32 blocks of 128 tokens) and vLLM's
CPU defaults (2,048 batched tokens), and driven as the engine core drives it (two steps in flight); a stand-in
model runner samples one token per step, and each (b) request stops at a seeded length. Arrivals are mapped to
steps at STEP_MS per step; (b) is preceded by a warm-up the guard learns output lengths from. --scale N multiplies
the pool and the requests by N (same arrival window): the same overload on an engine N times larger, as GPU pools
are. Cold start (a freshly started engine, nothing learned): --cold drops the warm-up; workload (n) is (b) sent
without max_tokens (vLLM's API server then allows the rest of the context); --burst N sends the workload's first N
(times --scale) requests at once instead of on its schedule, as a client's burst reaches a fresh engine; --blocks
sets the pool before --scale (the issue's burst: --cold --burst 28 --blocks 11). Workload (h) is a GPU-sized engine
(2,048 blocks of 16 tokens, an 8,192-token context and token budget) with heavy-tailed lengths (lognormal, median
200), sent without max_tokens, 600 requests at one per step (its warm-up: 1,000 of the same, all at once): where
the first lengths a fresh engine learns (its shortest) and requests past every length seen matter.
No timing and no machine noise: what is counted is what each admission does to the batch, in steps:
  steps      steps until every request finished (at a fixed cost per step, goodput is 1 / steps)
  width      requests decoding per step, on average (what a wider batch buys)
  prefill    prompt tokens computed, recomputation of preempted requests included
  preempted  vLLM's preemptions
  paused     request-steps the guard paused in place for blocks (its fallback before a preemption)
Where the real engine's goodput ratio (bench/guard_goodput.py) differs from these, the difference is in the cost of
a step, not in what the guard admitted: a recompute costs a step nothing here (its prompt tokens share the step's
budget), so stock's admit-then-evict is at its best in these counts.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins"), str(REPO / "bench")]

from guard_goodput import (  # noqa: E402
    BLOCKS,
    MAX_MODEL_LEN,
    V2_FALLBACK,
    Job,
    environment,
    exact_jobs,
    prompt,
    quantile_arm,
    unknown_jobs,
)

from tests.support.vllm_scheduler import Run  # noqa: E402

STEP_MS = 10.0  # a decode step of the test model on 2 cores at about 8 requests (bench/guard_goodput.py's TPOT)
UNKNOWN_RATE = 30.0  # (b): requests per second (0.3 per step), above what the pool serves: a queue builds
LONG_CONTEXT = 8192  # (h): a GPU-sized engine's context, pool and token budget
HEAVY_RATE = 100.0  # (h): requests per second (one per step), above what its pool serves


@dataclass(frozen=True)
class Engine:
    """The engine a scheduler is built for: its pool, block size, context and token budget per step."""

    blocks: int
    block_size: int = 128
    max_model_len: int = MAX_MODEL_LEN
    batched_tokens: int = 2048
    model: str = "model"  # which of the models built in main(): "long" has an 8,192-token context


def heavy_jobs(seed: int, count: int) -> list[Job]:
    """(h): prompts of 100-500 tokens sent without max_tokens to an 8,192-token context, stopping at lognormal
    lengths (median 200, sigma 1.2: a tenth past 930 tokens, one in a hundred past 3,200), one arriving per step."""
    rng = random.Random(f"heavy-{seed}")
    jobs, at = [], 0.0
    for _ in range(count):
        text = prompt(rng, 100, 500)
        length = max(1, min(LONG_CONTEXT - len(text), int(rng.lognormvariate(math.log(200), 1.2))))
        jobs.append(Job(at, text, None, length))
        at += rng.expovariate(HEAVY_RATE)
    return jobs


def replay(scheduler_cls, model: Path, jobs, env: dict[str, str], engine: Engine, warmup=(), lengths=None) -> dict:
    """Run `jobs` (after `warmup`, all at once, not counted) through one scheduler; `lengths`: request id -> the
    output length at which an unknown-length request samples its stop token."""
    from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

    with environment(KVOPS_LOG_SECONDS="3600", **env):  # each arm its own settings, none left for the next
        scheduler = build_scheduler(
            scheduler_cls,
            model,
            num_blocks=engine.blocks,
            block_size=engine.block_size,
            max_num_seqs=1024,
            max_num_batched_tokens=engine.batched_tokens,
            max_model_len=engine.max_model_len,
        )
    requests, driver = Requests(block_size=engine.block_size), Driver(scheduler, lengths=dict(lengths or {}))

    def add(request_id: str, job, first_token: int) -> None:
        # a request sent without max_tokens: vLLM's API server allows it the rest of the context
        limit = engine.max_model_len - len(job.prompt) if job.max_tokens is None else job.max_tokens
        request = requests.make(request_id, len(job.prompt), limit, first_token=first_token, stops=not job.exact)
        scheduler.add_request(request)

    for index, job in enumerate(warmup):
        add(f"w{index}", job, 7 * index + 3)
    driver.drain()
    driver.run = Run()
    if hasattr(scheduler, "guard_counts"):
        scheduler.guard_counts = type(scheduler.guard_counts)()  # the warm-up's pauses are not the workload's
    arrivals = sorted(((round(job.at * 1000 / STEP_MS), index) for index, job in enumerate(jobs)))
    step = decoded = prefilled = 0
    while arrivals or scheduler.has_requests() or driver.in_flight:
        while arrivals and arrivals[0][0] <= step:
            index = arrivals.pop(0)[1]
            add(f"r{index}", jobs[index], 7 * index)
        if not scheduler.has_requests():
            if driver.in_flight:
                driver.settle()
            else:
                step = arrivals[0][0]  # idle until the next arrival
            continue
        driver.step()
        step += 1
        scheduled = driver.in_flight[-1][0].num_scheduled_tokens.values() if driver.in_flight else ()
        decoded += sum(1 for tokens in scheduled if tokens == 1)
        prefilled += sum(tokens for tokens in scheduled if tokens > 1)
    run = driver.run
    return {
        "steps": run.steps,
        "decode_width": decoded / max(1, run.steps),
        "prefill_tokens": prefilled,
        "preempted": run.preemptions,
        "paused": scheduler.guard_counts.paused if hasattr(scheduler, "guard_counts") else 0,
        "finished": len(run.finished),
    }


def workload(name: str, seed: int, options) -> tuple[list, list, dict[str, int]]:
    """(warm-up, jobs, stop lengths) of bench/guard_goodput.py's workload `name`, --scale times the requests: the
    same seeded lengths the engine benchmark's requests stop at; --cold: no warm-up; --burst: all at once."""
    scale, burst = options.scale, options.burst * options.scale
    if name == "h":
        jobs = heavy_jobs(seed, burst or 600 * scale)
        warmup = [] if options.cold else heavy_jobs(seed + 1000, 1000 * scale)
        jobs = [replace(job, at=job.at / scale) for job in jobs]  # --scale times the rate
        return warmup, [replace(job, at=0.0) for job in jobs] if burst else jobs, stop_lengths(warmup, jobs)
    if name == "a":
        jobs = exact_jobs(seed, burst or 120 * scale, 9.0)
        return [], [replace(job, at=0.0) for job in jobs] if burst else jobs, {}
    limit = None if name == "n" else 900
    warmup = [] if options.cold else unknown_jobs(seed, 48 * scale, None, max_tokens=limit)
    jobs = unknown_jobs(seed, burst or 160 * scale, None if burst else UNKNOWN_RATE * scale, max_tokens=limit)
    return warmup, jobs, stop_lengths(warmup, jobs)


def stop_lengths(warmup: list[Job], jobs: list[Job]) -> dict[str, int]:
    """Request id -> where it samples its stop token (replay's ids: w<index> for the warm-up, r<index> after)."""
    lengths = {f"w{index}": job.length or 0 for index, job in enumerate(warmup)}
    return {**lengths, **{f"r{index}": job.length or 0 for index, job in enumerate(jobs)}}


def variants(options) -> list[tuple]:
    """Guard v3 arms with one setting changed from its default: --quantiles, --pause-steps, --cold-starts."""
    from kvops_vllm.scheduler import KVGuardScheduler

    def values(text: str) -> list[str]:
        return [value for value in text.split(",") if value]

    return (
        [(quantile_arm(q), KVGuardScheduler, {"KVOPS_OUTPUT_QUANTILE": q}) for q in values(options.quantiles)]
        + [(f"guard-v3 pause {p}", KVGuardScheduler, {"KVOPS_PAUSE_STEPS": p}) for p in values(options.pause_steps)]
        + [(f"guard-v3 cold {c}", KVGuardScheduler, {"KVOPS_COLD_START": c}) for c in values(options.cold_starts)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads",
        default="ab",
        help="a (exact lengths), b (unknown lengths), n (b sent without max_tokens), h (heavy-tailed lengths, no "
        "max_tokens, a GPU-sized pool); default ab",
    )
    parser.add_argument("--cold", action="store_true", help="no warm-up: every engine freshly started")
    parser.add_argument("--burst", type=int, default=0, help="this many requests (times --scale) sent at once")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    parser.add_argument("--scale", type=int, default=1, help="pool and requests times this (default 1)")
    parser.add_argument("--blocks", type=int, default=BLOCKS, help=f"the pool before --scale (default {BLOCKS})")
    parser.add_argument(
        "--quantiles", default="", help="guard v3 also at these KVOPS_OUTPUT_QUANTILE values (b, n, h), e.g. 0.95"
    )
    parser.add_argument(
        "--pause-steps", default="", help="guard v3 also with these KVOPS_PAUSE_STEPS values (b, n, h), e.g. 0,1000"
    )
    parser.add_argument(
        "--cold-starts", default="", help="guard v3 also with these KVOPS_COLD_START values (b, n, h): max_tokens"
    )
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvops_vllm.scheduler import KVGuardScheduler
    from tests.support.tiny_model import TINY_LLAMA, build_model

    arms = [
        ("stock", AsyncScheduler, {}),
        ("guard-v1", KVGuardScheduler, {"KVOPS_ADMISSION": "reserve", **dict(V2_FALLBACK)}),
        ("guard-v2", KVGuardScheduler, {"KVOPS_ADMISSION": "peak", **dict(V2_FALLBACK)}),
        ("guard-v3", KVGuardScheduler, {"KVOPS_ADMISSION": "peak"}),
    ]
    start = "every engine freshly started (no warm-up)" if options.cold else "(b), (n), (h) after a warm-up"
    sent = f"{options.burst * options.scale} requests at once" if options.burst else "on the workload's schedule"
    with tempfile.TemporaryDirectory(prefix="guard-replay-") as scratch:
        models = {
            "model": build_model(Path(scratch) / "model"),
            "long": build_model(Path(scratch) / "long", {**TINY_LLAMA, "max_position_embeddings": LONG_CONTEXT}),
        }
        shown = None
        for name in options.workloads:
            engine = engine_for(name, options)
            if engine != shown:
                print(
                    f"a pool of {engine.blocks} blocks of {engine.block_size} tokens, context {engine.max_model_len}, "
                    f"{STEP_MS:g} ms per step, {start}, {sent}"
                )
                print(
                    f"  {'load':<4} {'seed':<4} {'arm':<24} {'steps':>6} {'vs stock':>8} {'width':>6} {'prefill':>8} "
                    f"{'preempted':>9} {'paused':>7}"
                )
                shown = engine
            chosen = arms + (variants(options) if name != "a" else [])
            for seed in (int(seed) for seed in options.seeds.split(",")):
                warmup, jobs, lengths = workload(name, seed, options)
                model = models[engine.model]
                rows = {arm: replay(cls, model, jobs, env, engine, warmup, lengths) for arm, cls, env in chosen}
                for arm, row in rows.items():
                    assert row["finished"] == len(jobs), (arm, row)
                    ratio = rows["stock"]["steps"] / row["steps"]
                    print(
                        f"  ({name})  {seed:<4} {arm:<24} {row['steps']:>6} {ratio:>8.2f} {row['decode_width']:>6.1f} "
                        f"{row['prefill_tokens']:>8} {row['preempted']:>9} {row['paused']:>7}"
                    )


def engine_for(name: str, options) -> Engine:
    """(h) runs on a GPU-sized engine of its own (2,048 blocks of 16 tokens, 8,192-token context and budget, times
    --scale); the rest on --blocks times --scale blocks of 128 tokens."""
    if name == "h":
        blocks = 2048 * options.scale + 1  # block 0 is vLLM's null block
        return Engine(blocks, block_size=16, max_model_len=LONG_CONTEXT, batched_tokens=LONG_CONTEXT, model="long")
    return Engine(options.blocks * options.scale)


if __name__ == "__main__":
    main()
