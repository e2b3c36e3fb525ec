"""Cold start of `kvops kv` and `kvops plan`: wall time of the whole command, and which heavy modules ride along.

    python bench/cold_start.py [--runs 10]

Prints, for each command (a fresh interpreter each run) and the bare interpreter, the median and min wall time;
the ten slowest imports of each command (python -X importtime); and whether pandas, matplotlib, numpy,
huggingface_hub, vllm or prometheus_api_client were imported (they must not be).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "kvops kv": [sys.executable, "-m", "kvops", "kv", "--model", "mistral-7b-v0.1", "--tokens", "8192", "--batch", "4"],
    "kvops plan": [
        sys.executable,
        "-m",
        "kvops",
        "plan",
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100",
        "--max-model-len",
        "8192",
        "--format",
        "shell",
    ],
    "bare interpreter": [sys.executable, "-c", "pass"],
}
HEAVY = ("pandas", "matplotlib", "numpy", "huggingface_hub", "vllm", "prometheus_api_client")


def wall_times(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def import_profile(command: list[str]) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) for every import the command makes."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *command[1:]], check=True, capture_output=True, text=True
    )
    rows = []
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((int(cumulative), name.strip()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    for label, command in COMMANDS.items():
        times = wall_times(command, runs)
        print(
            f"{label:<17} median {statistics.median(times) * 1000:5.0f} ms, min {min(times) * 1000:5.0f} ms over {runs} runs"
        )
    for label, command in list(COMMANDS.items())[:2]:
        rows = import_profile(command)
        heavy = sorted({name.split(".")[0] for _, name in rows} & set(HEAVY))
        print(f"\n{label}: heavy modules imported: {', '.join(heavy) or 'none'}; slowest imports (cumulative):")
        for cumulative, name in sorted(rows, reverse=True)[:10]:
            print(f"  {cumulative / 1000:7.1f} ms  {name}")


if __name__ == "__main__":
    main()
