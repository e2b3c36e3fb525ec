"""Cold start of `kvops kv` and `kvops plan`: wall time of the whole command, and which heavy modules ride along.

    python bench/cold_start.py [--runs 10] [--python PATH]

Prints, for each command (a fresh interpreter each run, the commands taken in turn) and the bare interpreter, the
median and min wall and CPU time;
the ten slowest imports of each command (python -X importtime); and whether pandas, matplotlib, numpy,
huggingface_hub, vllm or prometheus_api_client were imported (they must not be).

`--python` measures another interpreter: a fresh virtual environment with kvops installed as a user installs it
(`python -m venv /tmp/v && /tmp/v/bin/pip install .`) starts without what this machine's site-packages run at every
start (a sandbox's .pth here imports certifi and importlib.resources, ~11 ms of the bare interpreter's time).

Before timing, kvops' bytecode is compiled (`compileall`, as `pip install` does). An editable install run with
PYTHONDONTWRITEBYTECODE=1 (this machine sets it) never writes it, and every start would compile kvops' sources
again: about 100 ms more on `kvops plan`, a cost no installed kvops pays.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "kvops kv": ["-m", "kvops", "kv", "--model", "mistral-7b-v0.1", "--tokens", "8192", "--batch", "4"],
    "kvops plan": [
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
    "bare interpreter": ["-c", "pass"],
}
HEAVY = ("pandas", "matplotlib", "numpy", "huggingface_hub", "vllm", "prometheus_api_client")


def timings(python: str, runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Each command's wall and CPU (user + system) seconds, the commands taken in turn so that a busy spell slows
    them alike; on a shared machine the CPU time is the steadier of the two."""
    times: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in COMMANDS}
    for _ in range(runs):
        for label, arguments in COMMANDS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run([python, *arguments], check=True, capture_output=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            times[label][0].append(wall)
            times[label][1].append(cpu)
    return times


def import_profile(python: str, arguments: list[str]) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) for every import the command makes."""
    result = subprocess.run([python, "-X", "importtime", *arguments], check=True, capture_output=True, text=True)
    rows = []
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((int(cumulative), name.strip()))
    return rows


def compile_bytecode(python: str) -> None:
    """kvops' .pyc files, where the interpreter finds kvops, written as `pip install` writes them."""
    find = "import kvops, os; print(os.path.dirname(kvops.__file__))"
    package = subprocess.run([python, "-c", find], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([python, "-m", "compileall", "-q", package], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--python", default=sys.executable, help="the interpreter to measure [this one]")
    options = parser.parse_args()
    runs = options.runs
    compile_bytecode(options.python)
    for label, (wall, cpu) in timings(options.python, runs).items():
        print(
            f"{label:<17} wall median {statistics.median(wall) * 1000:4.0f} ms (min {min(wall) * 1000:4.0f}), "
            f"CPU median {statistics.median(cpu) * 1000:4.0f} ms (min {min(cpu) * 1000:4.0f}) over {runs} runs"
        )
    for label, arguments in list(COMMANDS.items())[:2]:
        rows = import_profile(options.python, arguments)
        heavy = sorted({name.split(".")[0] for _, name in rows} & set(HEAVY))
        print(f"\n{label}: heavy modules imported: {', '.join(heavy) or 'none'}; slowest imports (cumulative):")
        for cumulative, name in sorted(rows, reverse=True)[:10]:
            print(f"  {cumulative / 1000:7.1f} ms  {name}")


if __name__ == "__main__":
    main()
