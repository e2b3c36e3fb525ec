"""The KV guard on traffic that shares its prompts' start (prefix caching), in simulated time.

    python bench/guard_shared_prefix.py [--seeds 0,1,2] [--rates 0.5,0.7,0.9] [--arms stock,guard,watermark]

Llama-3.1-8B on one L4 at --max-model-len 8192 (the pool kvops plans: 1,792 blocks of 16 tokens), 1,500 requests
a trace: each starts with one of 24 system prompts of 1,500 tokens (a shared prefix), then its own text
(lognormal, median 148 tokens), and generates a lognormal length (median 148, at most 1,500) sent without
max_tokens; Poisson arrivals at each rate. Each trace goes through `kvops simulate --compare` (vLLM's own scheduler
with prefix caching, the shipped GPU step time); printed per seed and rate: each arm's SLO goodput and throughput
against stock's, its mean TTFT, p99 TPOT and preemptions. Needs vLLM installed (the CPU build is enough).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

PREFIXES, PREFIX_TOKENS, REQUESTS = 24, 1500, 1500


def write_trace(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    arrival = 0.0
    with path.open("w") as out:
        for _ in range(REQUESTS):
            arrival += rng.expovariate(3.0)  # scaled to each rate by --rate
            prefix = rng.randrange(PREFIXES)
            own = int(rng.lognormvariate(5.0, 0.8)) + 1
            row = {
                "arrival_s": round(arrival, 4),
                "prompt_tokens": PREFIX_TOKENS + own,
                "output_tokens": min(1500, int(rng.lognormvariate(5.0, 0.9)) + 1),
                "prefix_id": f"system-{prefix}",
                "prefix_tokens": PREFIX_TOKENS,
            }
            out.write(json.dumps(row) + "\n")


def simulate(trace: Path, rate: float, arms: str) -> dict:
    command = [
        sys.executable,
        "-m",
        "kvops",
        "simulate",
        "-m",
        "llama-3.1-8b",
        "--gpu",
        "L4",
        "--max-model-len",
        "8192",
        # the figures in docs/kv-guard.md were made at vLLM <= 0.33's 16-token blocks (0.34 defaults to 64)
        "--block-size",
        "16",
    ]
    command += ["--trace", str(trace), "--rate", str(rate), "--max-tokens", "none", "--compare", arms, "--json"]
    ran = subprocess.run(command, capture_output=True, text=True, check=True)
    return {arm["arm"]: arm for arm in json.loads(ran.stdout)["arms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rates", default="0.5,0.7,0.9", help="requests per second, comma-separated")
    parser.add_argument("--arms", default="stock,guard,watermark", help="as kvops simulate --compare takes them")
    options = parser.parse_args()
    print(
        f"{'seed':>4} {'rate/s':>6}  {'arm':<10} {'goodput':>8} {'thr':>5} {'TTFT mean':>10} {'p99 TPOT':>9} {'preempted':>9}"
    )
    with tempfile.TemporaryDirectory(prefix="guard-shared-") as folder:
        for seed in (int(text) for text in options.seeds.split(",")):
            trace = Path(folder) / f"shared-{seed}.jsonl"
            write_trace(trace, seed)
            for rate in (float(text) for text in options.rates.split(",")):
                arms = simulate(trace, rate, options.arms)
                stock = arms["stock"]
                for name, arm in arms.items():
                    goodput = arm["goodput_rps"] / stock["goodput_rps"] if stock["goodput_rps"] else float("nan")
                    print(
                        f"{seed:>4} {rate:>6g}  {name:<10} {goodput:>7.2f}x {arm['throughput_rps'] / stock['throughput_rps']:>4.2f}x "
                        f"{arm['ttft_ms']['mean'] / 1000:>9.1f}s {arm['tpot_ms']['p99']:>7.0f}ms {arm['preemptions']:>9,}"
                    )


if __name__ == "__main__":
    main()
