"""Workloads (a) and (b) of bench/guard_goodput.py replayed through the real schedulers in-process, no engine.

    python bench/guard_replay.py [--workloads ab] [--seeds 0,1,2] [--scale 1] [--quantiles 0.95] [--pause-steps 0,1000]

Each scheduler (stock vLLM's AsyncScheduler, the KV guard v1 and v2) is built as
tests/engine/test_kv_guard_scheduler.py builds it, over the benchmark's pool (32 blocks of 128 tokens) and vLLM's
CPU defaults (2,048 batched tokens), and driven as the engine core drives it (two steps in flight); a stand-in
model runner samples one token per step, and each (b) request stops at a seeded length. Arrivals are mapped to
steps at STEP_MS per step; (b) is preceded by a warm-up the guard learns output lengths from. --scale N multiplies
the pool and the requests by N (same arrival window): the same overload on an engine N times larger, as GPU pools
are. No timing and no machine noise: what is counted is what each admission does to the batch, in steps:
  steps      steps until every request finished (at a fixed cost per step, goodput is 1 / steps)
  width      requests decoding per step, on average (what a wider batch buys)
  prefill    prompt tokens computed, recomputation of preempted requests included
  preempted  vLLM's preemptions
  paused     request-steps the guard paused in place for blocks (its fallback before a preemption)
Where the real engine's goodput ratio (bench/guard_goodput.py) differs from these, the difference is in the cost of
a step, not in what the guard admitted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins"), str(REPO / "bench")]

from guard_goodput import BLOCKS, MAX_MODEL_LEN, environment, exact_jobs, quantile_arm, unknown_jobs  # noqa: E402

from tests.support.vllm_scheduler import Run  # noqa: E402

STEP_MS = 10.0  # a decode step of the test model on 2 cores at about 8 requests (bench/guard_goodput.py's TPOT)
UNKNOWN_RATE = 30.0  # (b): requests per second (0.3 per step), above what the pool serves: a queue builds


def replay(scheduler_cls, model: Path, jobs, env: dict[str, str], blocks: int, warmup=(), lengths=None) -> dict:
    """Run `jobs` (after `warmup`, all at once, not counted) through one scheduler; `lengths`: request id -> the
    output length at which an unknown-length request samples its stop token."""
    from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

    with environment(KVOPS_LOG_SECONDS="3600", **env):  # each arm its own settings, none left for the next
        scheduler = build_scheduler(
            scheduler_cls,
            model,
            num_blocks=blocks,
            block_size=128,
            max_num_seqs=1024,
            max_num_batched_tokens=2048,
            max_model_len=MAX_MODEL_LEN,
        )
    requests, driver = Requests(block_size=128), Driver(scheduler, lengths=dict(lengths or {}))

    def add(request_id: str, job, first_token: int) -> None:
        request = requests.make(
            request_id, len(job.prompt), job.max_tokens, first_token=first_token, stops=not job.exact
        )
        scheduler.add_request(request)

    for index, job in enumerate(warmup):
        add(f"w{index}", job, 7 * index + 3)
    driver.drain()
    driver.run = Run()
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


def workload(name: str, seed: int, scale: int) -> tuple[list, list, dict[str, int]]:
    """(warm-up, jobs, stop lengths) of bench/guard_goodput.py's workload `name`, `scale` times the requests: the
    same seeded lengths the engine benchmark's requests stop at."""
    if name == "a":
        return [], exact_jobs(seed, 120 * scale, 9.0), {}
    warmup, jobs = unknown_jobs(seed, 48 * scale, None), unknown_jobs(seed, 160 * scale, UNKNOWN_RATE * scale)
    lengths = {f"w{index}": job.length for index, job in enumerate(warmup)}
    return warmup, jobs, {**lengths, **{f"r{index}": job.length for index, job in enumerate(jobs)}}


def variants(options) -> list[tuple]:
    """Guard v2 arms with one setting changed from its default: --quantiles, then --pause-steps."""
    from kvops_vllm.scheduler import KVGuardScheduler

    quantiles = [q for q in options.quantiles.split(",") if q]
    pauses = [p for p in options.pause_steps.split(",") if p]
    return [(quantile_arm(q), KVGuardScheduler, {"KVOPS_OUTPUT_QUANTILE": q}) for q in quantiles] + [
        (f"guard-v2 pause {p}", KVGuardScheduler, {"KVOPS_PAUSE_STEPS": p}) for p in pauses
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="ab", help="a (exact lengths), b (unknown lengths); default ab")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    parser.add_argument("--scale", type=int, default=1, help="pool and requests times this (default 1)")
    parser.add_argument(
        "--quantiles", default="", help="(b): guard v2 also at these KVOPS_OUTPUT_QUANTILE values, e.g. 0.95,0.9"
    )
    parser.add_argument(
        "--pause-steps", default="", help="(b): guard v2 also with these KVOPS_PAUSE_STEPS values, e.g. 0,1000"
    )
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvops_vllm.scheduler import KVGuardScheduler
    from tests.support.tiny_model import build_model

    arms = [
        ("stock", AsyncScheduler, {}),
        ("guard-v1", KVGuardScheduler, {"KVOPS_ADMISSION": "reserve"}),
        ("guard-v2", KVGuardScheduler, {"KVOPS_ADMISSION": "peak"}),
    ]
    blocks = BLOCKS * options.scale
    print(f"a pool of {blocks} blocks of 128 tokens, {STEP_MS:g} ms per step")
    print(
        f"  {'load':<4} {'seed':<4} {'arm':<19} {'steps':>6} {'vs stock':>8} {'width':>6} {'prefill':>8} {'preempted':>9} {'paused':>7}"
    )
    with tempfile.TemporaryDirectory(prefix="guard-replay-") as scratch:
        model = build_model(Path(scratch) / "model")
        for name in options.workloads:
            chosen = arms + (variants(options) if name == "b" else [])
            for seed in (int(seed) for seed in options.seeds.split(",")):
                warmup, jobs, lengths = workload(name, seed, options.scale)
                rows = {arm: replay(cls, model, jobs, env, blocks, warmup, lengths) for arm, cls, env in chosen}
                for arm, row in rows.items():
                    assert row["finished"] == len(jobs), (arm, row)
                    print(
                        f"  ({name})  {seed:<4} {arm:<19} {row['steps']:>6} {rows['stock']['steps'] / row['steps']:>8.2f} "
                        f"{row['decode_width']:>6.1f} {row['prefill_tokens']:>8} {row['preempted']:>9} {row['paused']:>7}"
                    )


if __name__ == "__main__":
    main()
