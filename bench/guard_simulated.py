"""The KV guard at GPU scale, in simulated time: stock vLLM, vLLM's --watermark 0.05 and the KV guard on GPU-sized
pools, on ShareGPT-like and bursty traffic, from half to twice stock's saturation rate.

    python bench/guard_simulated.py [--deployments 8b-h100,8b-l4,70b-4xh100] [--requests 1500] [--arms stock,watermark,guard]
                                    [--seeds 0,1,2] [--policy FILE]

Every arm runs the same seeded trace through the installed vLLM's own scheduler (the guard: its plugin class) over
the pool `kvops plan` sizes, each step priced by the fitted GPU step time (kvops simulate). Saturation is stock's
throughput with every request of the trace sent at once; each rate scales the trace's arrival gaps. The SLO:
TTFT <= 2 s and TPOT <= 3 x a lone request's TPOT on that deployment. Clients send no max_tokens ("none"): the
requests stop by themselves and no scheduler knows their lengths, the case the guard is for; --max-tokens exact
runs the benchmark style (every length known). An arm `ARM+degrade` (e.g. stock+degrade) runs ARM behind the
degrade policy in vLLM's API server (the middleware; --policy, default the shipped one), as `kvops simulate` does.
Printed per point: SLO goodput (requests/s meeting both targets) and its ratio to stock, p99 TTFT and TPOT,
preemptions, recomputed tokens, requests given up after refusals and answers capped; with several seeds, each
arm's median and range over them. --why adds, per point and arm, where its SLO goodput differs from stock's: the
requests that met the SLO under stock alone (the target they missed under the arm, how many stock had preempted,
when they were sent) and under the arm alone, and the arm's paused request-steps. This is workload (c) of the guard's
benchmark (bench/guard_goodput.py), which the 2-core machine could not read, at the scale users run.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from kvops.deployment import DeploymentOptions  # noqa: E402
from kvops.simulate import session  # noqa: E402
from kvops.simulate.results import Slo, ttft  # noqa: E402
from kvops.simulate.run import RunLog  # noqa: E402
from kvops.simulate.simulation import Setup, all_at_once, at_rate, run_arm  # noqa: E402
from kvops.simulate.traffic import Traffic  # noqa: E402

# block_size=16: the figures in docs/kv-guard.md were made at vLLM <= 0.33's 16-token blocks (0.34 defaults to 64)
DEPLOYMENTS = {
    "8b-h100": DeploymentOptions(model="llama-3.1-8b-instruct", gpu="H100", max_model_len=8192, block_size=16),
    "8b-l4": DeploymentOptions(model="llama-3.1-8b-instruct", gpu="L4", max_model_len=8192, block_size=16),
    "70b-4xh100": DeploymentOptions(
        model="llama-3.1-70b-instruct", gpu="H100", tp=4, max_model_len=8192, block_size=16
    ),
}
# ShareGPT-like lengths with Poisson arrivals, and the same lengths in bursts (gamma inter-arrivals of shape 0.25:
# BurstGPT's conversation traffic fits a gamma of shape well below 1, Wang et al., KDD '25)
TRAFFIC = {"sharegpt": 1.0, "bursty": 0.25}
FACTORS = (0.5, 1.0, 1.5, 2.0)
TTFT_TARGET_S = 2.0
TPOT_TARGET_FACTOR = 3.0


def setup_for(name: str, traffic: str, seed: int, arms: list[str], options: argparse.Namespace) -> Setup:
    request = session.Request(
        traffic=Traffic(requests=options.requests, rate=1.0, burstiness=TRAFFIC[traffic], seed=seed),
        max_tokens=options.max_tokens,
        arms=tuple(arms),
        policy_path=options.policy,
    )
    answer_setup = session.prepare(request, DEPLOYMENTS[name])
    lone = run_arm(answer_setup, "stock", all_at_once(answer_setup.trace.head(1))).summary.tpot.mean
    return replace(answer_setup, slo=Slo(TTFT_TARGET_S, TPOT_TARGET_FACTOR * lone))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", default=",".join(DEPLOYMENTS))
    parser.add_argument("--traffic", default=",".join(TRAFFIC))
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--arms", default="stock,watermark,guard")
    parser.add_argument("--factors", default=",".join(f"{factor:g}" for factor in FACTORS))
    parser.add_argument("--max-tokens", default="none", help="what clients send: none (default), exact, cap:N")
    parser.add_argument("--seeds", default="0", help="traces to run, e.g. 0,1,2: each seed draws another trace")
    parser.add_argument("--policy", help="the degrade policy YAML of ARM+degrade arms [default: the shipped one]")
    parser.add_argument(
        "--why", action="store_true", help="per point, the requests that met the SLO under one arm alone"
    )
    options = parser.parse_args()
    arms = options.arms.split(",")
    factors = [float(factor) for factor in options.factors.split(",")]
    seeds = [int(seed) for seed in options.seeds.split(",")]
    # per point and arm, one per seed: (goodput ratio, preemption share, goodput, stock's goodput)
    spread: dict[tuple[str, str, float, str], list[tuple[float, float, float, float]]] = {}
    differences: dict[tuple[str, str, float, str], SloDifference] = {}  # --why, summed over the seeds
    for name, traffic, seed in itertools.product(options.deployments.split(","), options.traffic.split(","), seeds):
        started = time.monotonic()
        setup = setup_for(name, traffic, seed, arms, options)
        at_once = run_arm(setup, "stock", all_at_once(setup.trace))
        saturated, stock = at_once.summary.throughput_rps, at_once.settings
        print(
            f"\n{name}, {traffic}, seed {seed} ({options.requests} requests, max_tokens {options.max_tokens}): stock's pool "
            f"{stock['num_blocks']:,} blocks of {stock['block_size']} (at vLLM's --max-num-seqs "
            f"{stock['max_num_seqs']}); stock saturates at {saturated:.3g} req/s; "
            f"SLO TTFT <= {setup.slo.ttft_s:g} s, TPOT <= {setup.slo.tpot_s * 1000:.3g} ms",
            flush=True,
        )
        print(
            f"  {'x sat':>5} {'arm':<13} {'goodput':>8} {'vs stock':>8} {'TTFT p99':>9} {'TPOT p99':>9} {'preempted':>9} "
            f"{'recomputed':>10} {'refused':>7} {'capped':>6}"
        )
        for factor in factors:
            trace = at_rate(setup.trace, factor * saturated)
            logs = {arm: run_arm(setup, arm, trace) for arm in arms}
            results = {arm: result.summary for arm, result in logs.items()}
            stock, stock_preempted = results[arms[0]].goodput_rps, results[arms[0]].preemptions
            for arm, summary in results.items():
                ratio = summary.goodput_rps / stock if stock else float("nan")
                share = summary.preemptions / stock_preempted if stock_preempted else float("nan")
                spread.setdefault((name, traffic, factor, arm), []).append((ratio, share, summary.goodput_rps, stock))
                print(
                    f"  {factor:>5g} {arm:<13} {summary.goodput_rps:>8.3g} {ratio:>8.2f} "
                    f"{summary.ttft.p99:>8.2f}s {summary.tpot.p99 * 1000:>7.1f}ms {summary.preemptions:>9,} "
                    f"{summary.recomputed_tokens:>10,} {summary.refused:>7,} {summary.capped:>6,}",
                    flush=True,
                )
                if options.why and arm != arms[0]:
                    difference = slo_difference(logs[arms[0]].log, logs[arm].log, setup.slo)
                    key = (name, traffic, factor, arm)
                    differences[key] = differences.get(key, SloDifference()).plus(difference)
                    print(f"        {difference.describe(arms[0], arm)}; paused {summary.counters.get('paused', 0):,}")
        print(f"  ({time.monotonic() - started:.0f} s)")
    if len(seeds) > 1:
        print_spread(spread, arms[1:], len(seeds))
        for (name, traffic, factor, arm), difference in differences.items():
            print(f"  {name} {traffic} {factor:g} x {arm}, summed: {difference.describe(arms[0], arm)}")


COUNTED = ("stock_alone", "arm_ttft_missed", "stock_preempted", "arm_alone", "stock_ttft_missed")


@dataclass(frozen=True)
class SloDifference:
    """Requests that met the SLO under stock alone, and under the arm alone; what the other missed."""

    stock_alone: int = 0
    arm_ttft_missed: int = 0  # of those, the arm's first token came too late (else its TPOT missed)
    stock_preempted: int = 0  # of those, stock had preempted (a TPOT target of several lone TPOTs lets it still meet)
    arm_alone: int = 0
    stock_ttft_missed: int = 0
    first_sent: float = float("inf")  # the earliest and latest sends among the requests either met alone
    last_sent: float = 0.0

    def plus(self, other: SloDifference) -> SloDifference:
        counts = [getattr(self, name) + getattr(other, name) for name in COUNTED]
        return SloDifference(*counts, min(self.first_sent, other.first_sent), max(self.last_sent, other.last_sent))

    def describe(self, stock: str, arm: str) -> str:
        sent = f", sent {self.first_sent:.1f}-{self.last_sent:.1f} s" if self.stock_alone or self.arm_alone else ""
        return (
            f"met the SLO under {stock} alone {self.stock_alone} ({arm}'s TTFT missed {self.arm_ttft_missed}, its "
            f"TPOT {self.stock_alone - self.arm_ttft_missed}; {self.stock_preempted} preempted under {stock}), under "
            f"{arm} alone {self.arm_alone} ({stock}'s TTFT missed {self.stock_ttft_missed}, its TPOT "
            f"{self.arm_alone - self.stock_ttft_missed}){sent}"
        )


def slo_difference(stock: RunLog, arm: RunLog, slo: Slo) -> SloDifference:
    """Where two runs of one trace differ on the SLO, request by request (the same index is the same request)."""
    stock_alone, arm_alone = [], []
    for ours, theirs in zip(stock.requests, arm.requests):
        if slo.met(ours) != slo.met(theirs):
            (stock_alone if slo.met(ours) else arm_alone).append((ours, theirs))
    alone = stock_alone + arm_alone
    return SloDifference(
        len(stock_alone),
        sum(ttft(theirs) > slo.ttft_s for _, theirs in stock_alone),
        sum(ours.preemptions > 0 for ours, _ in stock_alone),
        len(arm_alone),
        sum(ttft(ours) > slo.ttft_s for ours, _ in arm_alone),
        min((ours.sent for ours, _ in alone), default=float("inf")),
        max((ours.sent for ours, _ in alone), default=0.0),
    )


def print_spread(
    spread: dict[tuple[str, str, float, str], list[tuple[float, float, float, float]]], arms: list[str], n: int
) -> None:
    """Over the seeds, each arm's goodput against stock's (the traces' summed goodput, then the median trace and its
    range, below stock on how many) and its preemptions as a share of stock's: median (range)."""
    print(
        f"\nover {n} seeds: summed goodput / stock's; the median trace (min-max), traces below stock; preemptions /"
        " stock's: median (min-max; - where stock preempted none)"
    )
    for (name, traffic, factor, arm), points in spread.items():
        if arm not in arms:
            continue
        ratios = [ratio for ratio, *_ in points]
        shares = [share for _, share, *_ in points if share == share]  # NaN: stock preempted none
        summed = sum(goodput for *_, goodput, _ in points) / (sum(stock for *_, stock in points) or float("nan"))
        below = sum(ratio < 1 for ratio in ratios)
        preempted = f"{statistics.median(shares):.0%} ({min(shares):.0%}-{max(shares):.0%})" if shares else "-"
        print(
            f"  {name} {traffic} {factor:g} x {arm}: summed {summed:.3f}; {statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}), {below} below; preempted {preempted}"
        )


if __name__ == "__main__":
    main()
