"""How fast kvops simulate runs: ShareGPT-like requests on an 8B model on one H100, wall seconds on this machine.

    python bench/simulate_speed.py [--requests 10000] [--rates 10,20,inf]

Each rate is one `kvops simulate` run in-process (the plan, the trace and vLLM's scheduler built once per run; the
interpreter's start and vLLM's import, ~10-25 s on 2 cores, are printed apart). The goal (issue 21): 10,000
requests in under 60 s on a 2-core machine. How long a run takes depends on the steps it simulates: at a low rate
few requests share a step, so more steps are needed for the same tokens.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--rates", default="10,20,inf", help="requests per second, comma-separated (inf: all at once)")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="H100")
    options = parser.parse_args()
    started = time.monotonic()
    from kvops.engines.vllm.simulator import vllm_version

    version = vllm_version()
    import vllm.v1.core.sched.scheduler  # noqa: F401  (the import is timed apart)

    print(f"vLLM {version} imported in {time.monotonic() - started:.1f} s")
    from kvops.deployment import DeploymentOptions
    from kvops.simulate import session
    from kvops.simulate.traffic import Traffic

    deployment = DeploymentOptions(model=options.model, gpu=options.gpu, max_model_len=8192)
    print(f"{'rate/s':>7} {'requests':>8} {'steps':>7} {'wall s':>7} {'simulated s':>11} {'steps/s':>8}")
    for text in options.rates.split(","):
        rate = math.inf if text == "inf" else float(text)
        traffic = Traffic(requests=options.requests, rate=None if rate == math.inf else rate, concurrency=None)
        if rate == math.inf:
            traffic = Traffic(requests=options.requests, concurrency=options.requests)
        began = time.monotonic()
        answer = session.run(session.Request(traffic=traffic), deployment)
        wall = time.monotonic() - began
        summary = answer.arms[0].summary
        print(
            f"{text:>7} {summary.requests:>8,} {summary.steps:>7,} {wall:>7.1f} {summary.duration_s:>11.1f} "
            f"{summary.steps / wall:>8,.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
