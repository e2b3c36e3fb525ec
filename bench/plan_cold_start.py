"""Cold start of `kvops plan`: wall time of the whole command, and whether heavy modules ride along.

    python bench/plan_cold_start.py [--runs 10]

Prints the median and min wall time of a `kvops plan ... --format shell` (a fresh interpreter each run), the same
for `kvops kv` and the bare interpreter, and whether pandas, matplotlib, numpy, huggingface_hub or vllm were
imported on the plan's path (they must not be).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

PLAN = [sys.executable, "-m", "kvops", "plan", "--model", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192", "--format", "shell"]
KV = [sys.executable, "-m", "kvops", "kv", "--model", "llama-3-8b", "--tokens", "8192"]
HEAVY = ("pandas", "matplotlib", "numpy", "huggingface_hub", "vllm", "prometheus_api_client")


def wall_times(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def imported(command: list[str]) -> set[str]:
    result = subprocess.run([sys.executable, "-X", "importtime", *command[1:]], check=True, capture_output=True, text=True)
    return {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if line.startswith("import time:") and "|" in line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    for label, command in (("kvops plan", PLAN), ("kvops kv", KV), ("bare interpreter", [sys.executable, "-c", "pass"])):
        times = wall_times(command, runs)
        print(f"{label:<17} median {statistics.median(times) * 1000:5.0f} ms, min {min(times) * 1000:5.0f} ms over {runs} runs")
    heavy = sorted(imported(PLAN) & set(HEAVY))
    print("heavy modules imported by kvops plan: " + (", ".join(heavy) or "none"))


if __name__ == "__main__":
    main()
