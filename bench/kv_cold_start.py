"""Cold start of `kvops kv`: wall time of the whole command, and which heavy modules its imports pull in.

    python bench/kv_cold_start.py [--runs 10]

Prints the median and min wall time of `kvops kv` (a fresh interpreter each run), the interpreter's own
start for comparison, the ten slowest imports (python -X importtime) and whether pandas, matplotlib,
huggingface_hub, vllm or prometheus_api_client were imported (they must not be).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMAND = [sys.executable, "-m", "kvops", "kv", "--model", "mistral-7b-v0.1", "--tokens", "8192", "--batch", "4"]
HEAVY = ("pandas", "matplotlib", "huggingface_hub", "vllm", "prometheus_api_client", "numpy")


def wall_times(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def import_profile() -> list[tuple[int, str]]:
    """(cumulative microseconds, module) for every import of the kv command."""
    result = subprocess.run([sys.executable, "-X", "importtime", *COMMAND[1:]], check=True, capture_output=True, text=True)
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
    python = wall_times([sys.executable, "-c", "pass"], runs)
    kv = wall_times(COMMAND, runs)
    print(f"kvops kv wall time over {runs} runs: median {statistics.median(kv) * 1000:.0f} ms, min {min(kv) * 1000:.0f} ms")
    print(f"bare interpreter start:           median {statistics.median(python) * 1000:.0f} ms, min {min(python) * 1000:.0f} ms")
    rows = import_profile()
    top_level = {name.split(".")[0] for _, name in rows}
    print("\nslowest imports (cumulative):")
    for cumulative, name in sorted(rows, reverse=True)[:10]:
        print(f"  {cumulative / 1000:7.1f} ms  {name}")
    print("\nheavy modules imported: " + (", ".join(sorted(top_level & set(HEAVY))) or "none"))
    for module in HEAVY:
        print(f"  {module:<22} {'IMPORTED' if module in top_level else 'not imported'}")


if __name__ == "__main__":
    main()
