"""Workloads (a), (b) and (n) of bench/guard_goodput.py on a freshly started engine, in simulated time: what the
real CPU engine's noise hides.

    python bench/guard_cold_simulated.py [--workloads abn] [--pools 32,128] [--seeds 0,1,2,3,4,5]
                                         [--arms stock,guard,guard-v2]

The same seeded requests as the real-engine benchmark (its generators: prompts, max_tokens, the lengths where
unknown-length requests stop, arrivals), served by the installed vLLM's own scheduler over the benchmark's pool
(the test model, 32 or 128 blocks of 128 tokens, vLLM's CPU defaults), each arm from a cold start: nothing learned,
no warm-up. Each step is priced by the CPU step time fitted on one machine's vLLM engine serving the test model
(kvops/catalog/step_time.json, profile "cpu"; bench/simulate_vs_engine.py scores it against the engine), so a
preempted request's recompute costs its prefill as on the engine, and no other process on the two cores shifts the
figures: a run gives the same numbers every time.

  (a) exact lengths: 120 requests per 32 blocks (ignore_eos, max_tokens 64-640), arrivals over 9 s
  (b) unknown lengths: 160 requests per 32 blocks, max_tokens 900, each stopping at its seeded length, which the
      scheduler cannot see; Poisson arrivals at twice the rate stock sustains (its throughput with all of them
      sent at once, as the real benchmark measures it in its warm-up)
  (n) like (b), sent without max_tokens (vLLM allows the rest of the context)

Arms: stock vLLM; guard (the KV guard as shipped: guard v3); guard-v2 (its fallback before v3:
KVOPS_PAUSE_STEPS=32 KVOPS_PREEMPT=least-computed KVOPS_RESUME=first). Goodput as bench/guard_goodput.py counts
it: tokens of completed requests per second from the first send to the last answer. Printed per seed and, over the
seeds, each arm's goodput against stock's (median, range) and its preemptions as a share of stock's. The goal
(issue 20): a cold guard at >= 0.95 x stock on (a) and (b).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins"), str(REPO / "bench")]

from guard_goodput import V2_FALLBACK, Job, environment, exact_jobs, unknown_jobs  # noqa: E402
from simulate_vs_engine import KV_BYTES, cpu_plan  # noqa: E402

from kvops.simulate import cost, steptime  # noqa: E402
from kvops.simulate.results import Slo  # noqa: E402
from kvops.simulate.run import ClientSettings, RunLog  # noqa: E402
from kvops.simulate.simulation import Setup, all_at_once, run_arm  # noqa: E402
from kvops.simulate.trace import Trace, TraceRequest  # noqa: E402

BLOCK_BYTES = KV_BYTES // 32  # one block of 128 tokens of the test model: 4 MiB hold the benchmark's 32 blocks
ARMS = {"stock": ("stock", ()), "guard": ("guard", ()), "guard-v2": ("guard", V2_FALLBACK)}
NO_SLO = Slo(1e9, 1e9)  # (a), (b) and (n) count tokens, not an SLO


def setup_for(model: Path, blocks: int) -> Setup:
    """The test model on the CPU over `blocks` blocks of KV (block 0 is vLLM's null block), as the benchmark runs it."""
    plan = cpu_plan(model, blocks * BLOCK_BYTES)
    empty = Trace((), "none")
    step_time = cost.step_time(plan, steptime.coefficients("cpu"))
    return Setup(plan, empty, step_time, ClientSettings(None, "trace"), NO_SLO, {})


def as_trace(name: str, jobs: list[Job]) -> Trace:
    """The benchmark's jobs as a trace: an exact job generates its max_tokens; another stops at its length."""
    requests = [
        TraceRequest(job.at, len(job.prompt), job.length or job.limit, max_tokens=job.max_tokens) for job in jobs
    ]
    return Trace(tuple(requests), name)


def goodput(log: RunLog) -> float:
    """Tokens of completed requests per second, from the first send to the last answer (bench/guard_goodput.py)."""
    done = [entry for entry in log.requests if entry.finished >= 0]
    span = max(entry.finished for entry in done) - min(entry.sent for entry in log.requests)
    return sum(entry.tokens for entry in done) / span


def run(setup: Setup, arm: str, trace: Trace) -> RunLog:
    scheduler, variables = ARMS[arm]
    with environment(**dict(variables)):
        result = run_arm(setup, scheduler, trace)
    if result.summary.completed != len(trace.requests):
        raise SystemExit(f"{arm} completed {result.summary.completed} of {len(trace.requests)} requests")
    return result.log


def workloads(setup: Setup, seed: int, scale: int, chosen: str) -> dict[str, Trace]:
    """(a), (b), (n) for one seed; (b) and (n) at twice the rate stock sustains on their requests sent at once."""
    found = {}
    if "a" in chosen:
        found["a"] = as_trace("a", exact_jobs(seed, 120 * scale))
    for name, max_tokens in (("b", 900), ("n", None)):
        if name not in chosen:
            continue
        at_once = as_trace(name, unknown_jobs(seed, 160 * scale, None, max_tokens=max_tokens))
        sustained = run_arm(setup, "stock", all_at_once(at_once)).summary.throughput_rps
        found[name] = as_trace(name, unknown_jobs(seed, 160 * scale, 2 * sustained, max_tokens=max_tokens))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="abn")
    parser.add_argument("--pools", default="32,128", help="KV pools in blocks of 128 tokens (default 32,128)")
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}; the first is the reference")
    options = parser.parse_args()
    arms = options.arms.split(",")
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        parser.error(f"--arms {','.join(unknown)}; valid: {', '.join(ARMS)}")
    from tests.support.tiny_model import build_model

    spread: dict[tuple[int, str, str], list[tuple[float, float | None]]] = {}
    with tempfile.TemporaryDirectory(prefix="guard-cold-simulated-") as scratch:
        model = build_model(Path(scratch) / "model")
        for pool in (int(blocks) for blocks in options.pools.split(",")):
            setup = setup_for(model, pool)
            scale = max(1, pool // 32)
            for seed in (int(text) for text in options.seeds.split(",")):
                for name, trace in workloads(setup, seed, scale, options.workloads).items():
                    logs = {arm: run(setup, arm, trace) for arm in arms}
                    reference = logs[arms[0]]
                    cells = []
                    for arm, log in logs.items():
                        ratio = goodput(log) / goodput(reference)
                        share = log.preemptions / reference.preemptions if reference.preemptions else None
                        spread.setdefault((pool, name, arm), []).append((ratio, share))
                        cells.append(f"{arm} {goodput(log):7.1f} tok/s {ratio:4.2f}x, {log.preemptions:3d} preempted")
                    print(f"pool {pool}, ({name}), seed {seed}: " + "; ".join(cells), flush=True)
    print_spread(spread, arms, len(options.seeds.split(",")))


def print_spread(spread: dict[tuple[int, str, str], list[tuple[float, float | None]]], arms: list[str], n: int) -> None:
    print(f"\nover {n} seeds, cold: goodput / {arms[0]}'s, median (min-max); preemptions as a share of {arms[0]}'s")
    for (pool, name, arm), points in spread.items():
        if arm == arms[0]:
            continue
        ratios = [ratio for ratio, _ in points]
        shares = [share for _, share in points if share is not None]
        preempted = f"{statistics.median(shares):.0%} ({min(shares):.0%}-{max(shares):.0%})" if shares else "-"
        print(
            f"  pool {pool:>4} ({name}) {arm:<9} {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), "
            f"preempted {preempted}"
        )


if __name__ == "__main__":
    main()
