"""Workload (a) of bench/guard_goodput.py replayed through the real schedulers in-process, without an engine.

    python bench/guard_replay.py [--seeds 0,1,2] [--requests 120] [--spread 9]

Each scheduler (stock vLLM's AsyncScheduler, the KV guard v1 and v2) is built as tests/engine/test_kv_guard_scheduler.py
builds it, over the benchmark's pool (32 blocks of 128 tokens) and vLLM's CPU defaults (2,048 batched tokens), and
driven as the engine core drives it (two steps in flight); a stand-in model runner samples one token per step.
Arrivals are mapped to steps at STEP_MS per step. No timing and no machine noise: what is counted is what each
admission does to the batch, in scheduling steps:
  steps         steps until every request finished (at a fixed cost per step, goodput is 1 / steps)
  decode width  requests decoding per step, on average (what a wider batch buys)
  prefill       prompt tokens computed, recomputation of preempted requests included
  preempted     vLLM's preemptions
Where the real engine's goodput ratio (bench/guard_goodput.py) differs from these, the difference is in the cost of
a step, not in what the guard admitted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins"), str(REPO / "bench")]

from guard_goodput import BLOCKS, MAX_MODEL_LEN, exact_jobs  # noqa: E402

STEP_MS = 10.0  # a decode step of the test model on 2 cores at about 8 requests (bench/guard_goodput.py's TPOT)


def replay(scheduler_cls, model: Path, jobs, env: dict[str, str]) -> dict:
    from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

    os.environ.update({"KVOPS_LOG_SECONDS": "3600", **env})
    scheduler = build_scheduler(
        scheduler_cls,
        model,
        num_blocks=BLOCKS,
        block_size=128,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=MAX_MODEL_LEN,
    )
    requests, driver = Requests(block_size=128), Driver(scheduler)
    arrivals = sorted(
        ((round(job.at * 1000 / STEP_MS), index, job) for index, job in enumerate(jobs)), key=lambda a: a[:2]
    )
    step = decoded = prefilled = 0
    while arrivals or scheduler.has_requests() or driver.in_flight:
        while arrivals and arrivals[0][0] <= step:
            _, index, job = arrivals.pop(0)
            scheduler.add_request(requests.make(f"r{index}", len(job.prompt), job.max_tokens, first_token=7 * index))
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
        "peak_running": run.peak_running,
        "finished": len(run.finished),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of workload (a) (default 0,1,2)")
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--spread", type=float, default=9.0, help="seconds over which the requests arrive")
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvops_vllm.scheduler import KVGuardScheduler
    from tests.support.tiny_model import build_model

    arms = (
        ("stock", AsyncScheduler, {}),
        ("guard-v1", KVGuardScheduler, {"KVOPS_ADMISSION": "reserve"}),
        ("guard-v2", KVGuardScheduler, {"KVOPS_ADMISSION": "peak"}),
    )
    with tempfile.TemporaryDirectory(prefix="guard-replay-") as scratch:
        model = build_model(Path(scratch) / "model")
        print(f"workload (a): {options.requests} requests over {options.spread:g} s, {STEP_MS:g} ms per step")
        print(
            f"  {'seed':<4} {'arm':<9} {'steps':>6} {'vs stock':>8} {'decode width':>12} {'prefill':>8} {'preempted':>9}"
        )
        for seed in (int(seed) for seed in options.seeds.split(",")):
            jobs = exact_jobs(seed, options.requests, options.spread)
            rows = {name: replay(cls, model, jobs, env) for name, cls, env in arms}
            for name, row in rows.items():
                assert row["finished"] == len(jobs), (name, row)
                print(
                    f"  {seed:<4} {name:<9} {row['steps']:>6} {rows['stock']['steps'] / row['steps']:>8.2f} "
                    f"{row['decode_width']:>12.1f} {row['prefill_tokens']:>8} {row['preempted']:>9}"
                )


if __name__ == "__main__":
    main()
