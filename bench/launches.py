"""How many real launches kvops can plan, tried as a new user would: the command as posted, `--gpu` as the thread
names the GPU, offline (HF_HUB_OFFLINE=1: configs from the catalog or a local folder, nothing asked of the Hub).

bench/launches.json holds the launches (engine logs posted in public issue threads, blog posts and recipes, each with
its source): the posted command where there was one, with a local model path replaced by the Hub id it names, else a
command rebuilt from the arguments the log prints. A launch counts as planned when `kvops plan` prints a plan or says
why it does not fit, with its figures (several of these launches failed on the real GPU); else the line kvops gave.

    python bench/launches.py [--engine vllm|tgi] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

LAUNCHES = Path(__file__).with_name("launches.json")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's kvops


def plan_launch(launch: dict) -> tuple[bool, str]:
    """(planned, the plan's first line or kvops's refusal) for one launch, run in-process."""
    from click.testing import CliRunner

    from kvops.cli import main

    args = ["plan", "--engine", launch["engine"], "--gpu", launch["gpu"], "--from-command", launch["command"]]
    result = CliRunner().invoke(main, args)
    printed = result.stdout.strip()
    if " plan: " in printed.split("\n", 1)[0]:
        return True, printed.split("\n", 1)[0]
    refusal = result.stderr.strip() or f"exit {result.exit_code}: {result.exception!r}"
    answer = next((line for line in refusal.splitlines() if line.startswith("kvops: error: does not fit")), None)
    return (True, answer) if answer else (False, refusal.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "tgi"))
    parser.add_argument("--verbose", action="store_true", help="print every launch, not only those not planned")
    options = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    launches = [entry for entry in json.loads(LAUNCHES.read_text()) if options.engine in (None, entry["engine"])]
    planned: Counter[str] = Counter()
    for launch in launches:
        ok, line = plan_launch(launch)
        planned[launch["engine"]] += ok
        if options.verbose or not ok:
            print(f"{'planned' if ok else 'NOT    '}  {launch['id']}: {line}")
    totals = Counter(entry["engine"] for entry in launches)
    by_engine = ", ".join(f"{engine} {planned[engine]}/{count}" for engine, count in sorted(totals.items()))
    print(f"\nplanned {sum(planned.values())} of {len(launches)} launches ({by_engine})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
