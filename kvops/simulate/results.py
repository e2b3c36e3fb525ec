"""What a run's clients saw, summed up as vLLM's serving benchmark reports it (vllm/benchmarks/serve.py): TTFT,
TPOT, ITL and E2E latency (mean, p50, p90, p99, in milliseconds), throughput, and SLO goodput as DistServe
defines it: completed requests per second that met both the TTFT and the TPOT target (Zhong et al., OSDI '24).
TPOT is a request's (E2E - TTFT) / (output tokens - 1); ITL is every gap between two tokens of a request."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from kvops.frozen import frozen
from kvops.simulate.run import RequestLog, RunLog

QUANTILES = (50, 90, 99)


@frozen
class Slo:
    """Targets a request must meet to count toward goodput, in seconds."""

    ttft_s: float
    tpot_s: float

    def met(self, entry: RequestLog) -> bool:
        return completed(entry) and ttft(entry) <= self.ttft_s and tpot(entry) <= self.tpot_s

    def to_dict(self) -> dict[str, float]:
        return {"ttft_ms": self.ttft_s * 1000, "tpot_ms": self.tpot_s * 1000}


@frozen
class Distribution:
    mean: float
    p50: float
    p90: float
    p99: float

    def to_dict(self, scale: float = 1000.0) -> dict[str, float]:
        return {name: round(getattr(self, name) * scale, 3) for name in ("mean", "p50", "p90", "p99")}


@frozen
class Summary:
    requests: int
    completed: int
    rejected: int
    unserved: int
    refused: int  # given up by their clients after the API server refused every send (a degrade policy)
    refusals: int  # the API server's refusals (429/503 with Retry-After), sends again included
    capped: int  # served with their new tokens capped below what they would have generated
    duration_s: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    throughput_rps: float
    output_tokens_per_s: float
    slo: Slo
    slo_met: int
    goodput_rps: float
    preemptions: int
    preempted_requests: int
    recomputed_tokens: int
    cached_tokens: int
    prompt_tokens: int
    peak_usage: float
    mean_usage: float
    peak_waiting: int
    mean_running: float
    steps: int
    busy_s: float
    counters: dict[str, int]

    @property
    def attainment(self) -> float:
        """The share of all requests (rejected, refused and unserved ones included) that met the SLO."""
        return self.slo_met / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "rejected": self.rejected,
            "unserved": self.unserved,
            "refused": self.refused,
            "refusals": self.refusals,
            "capped": self.capped,
            "duration_s": round(self.duration_s, 3),
            "ttft_ms": self.ttft.to_dict(),
            "tpot_ms": self.tpot.to_dict(),
            "itl_ms": self.itl.to_dict(),
            "e2e_ms": self.e2e.to_dict(),
            "throughput_rps": round(self.throughput_rps, 4),
            "output_tokens_per_s": round(self.output_tokens_per_s, 2),
            "slo": self.slo.to_dict(),
            "slo_met": self.slo_met,
            "slo_attainment": round(self.attainment, 4),
            "goodput_rps": round(self.goodput_rps, 4),
            "preemptions": self.preemptions,
            "preempted_requests": self.preempted_requests,
            "recomputed_tokens": self.recomputed_tokens,
            "prefix_cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "kv_usage": {"peak": round(self.peak_usage, 4), "mean": round(self.mean_usage, 4)},
            "queue": {"peak_waiting": self.peak_waiting, "mean_running": round(self.mean_running, 2)},
            "steps": self.steps,
            "busy_s": round(self.busy_s, 3),
            "scheduler_counters": self.counters,
        }


def completed(entry: RequestLog) -> bool:
    return entry.finished >= 0


def ttft(entry: RequestLog) -> float:
    return entry.first_token - entry.sent


def e2e(entry: RequestLog) -> float:
    return entry.finished - entry.sent


def tpot(entry: RequestLog) -> float:
    return (entry.finished - entry.first_token) / (entry.tokens - 1) if entry.tokens > 1 else 0.0


def _last_answer(log: RunLog) -> float:
    """When the run ends as vLLM's benchmark times it: the last answer a client has (its step's end plus the API
    server's time; a prompt rejected at its send is answered then). Not the engine's last step, which with async
    scheduling can be a step scheduled after a request's last token, for a request that stopped by itself. Where a
    request was refused or left unserved, it has no answer time: the run then ends with the engine's last step."""
    entries = log.requests
    if any(not completed(entry) and not entry.outcome.startswith("rejected") for entry in entries):
        return max([log.end_s, *(entry.finished for entry in entries)])
    return max((max(entry.finished, entry.sent) for entry in entries), default=log.end_s)


def summarize(log: RunLog, slo: Slo) -> Summary:
    entries = log.requests
    done = [entry for entry in entries if completed(entry)]
    start = min((entry.sent for entry in entries), default=0.0)
    duration = max(_last_answer(log) - start, 1e-9)
    met = sum(1 for entry in done if slo.met(entry))
    timeline = log.timeline
    return Summary(
        requests=len(entries),
        completed=len(done),
        rejected=sum(1 for entry in entries if entry.outcome.startswith("rejected")),
        unserved=sum(1 for entry in entries if entry.outcome == "unserved"),
        refused=sum(1 for entry in entries if entry.outcome.startswith("refused")),
        refusals=sum(entry.refusals for entry in entries),
        capped=sum(1 for entry in entries if entry.capped),
        duration_s=duration,
        ttft=distribution([ttft(entry) for entry in done]),
        tpot=distribution([tpot(entry) for entry in done if entry.tokens > 1]),
        itl=distribution(log.gaps),
        e2e=distribution([e2e(entry) for entry in done]),
        throughput_rps=len(done) / duration,
        output_tokens_per_s=sum(entry.tokens for entry in done) / duration,
        slo=slo,
        slo_met=met,
        goodput_rps=met / duration,
        preemptions=log.preemptions,
        preempted_requests=sum(1 for entry in entries if entry.preemptions),
        recomputed_tokens=sum(entry.recomputed_tokens for entry in entries),
        cached_tokens=sum(entry.cached_tokens for entry in entries),
        prompt_tokens=sum(entry.prompt_tokens for entry in entries),
        peak_usage=max(timeline.usage, default=0.0),
        mean_usage=_time_weighted(timeline.time, timeline.usage, start),
        peak_waiting=max(timeline.waiting, default=0),
        mean_running=_time_weighted(timeline.time, timeline.running, start),
        steps=log.steps,
        busy_s=log.busy_s,
        counters=dict(log.counters),
    )


def distribution(values: Sequence[float]) -> Distribution:
    if not values:
        return Distribution(0.0, 0.0, 0.0, 0.0)
    ordered = sorted(values)
    return Distribution(sum(ordered) / len(ordered), *(quantile(ordered, q) for q in QUANTILES))


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default, as vLLM's benchmark computes it)."""
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _time_weighted(times: Sequence[float], values: Sequence[float], start: float) -> float:
    """The mean of a step function sampled after each step, each value held until the next sample."""
    if len(times) < 2:
        return float(values[0]) if len(values) else 0.0
    total = sum(value * (later - earlier) for earlier, later, value in zip(times, times[1:], values))
    span = times[-1] - times[0]
    return total / span if span > 0 else float(values[-1])


def request_rows(log: RunLog, slo: Slo) -> list[dict[str, Any]]:
    """One row per request for `--csv`: times in milliseconds from the trace's start."""
    rows = []
    for index, entry in enumerate(log.requests):
        done = completed(entry)
        rows.append(
            {
                "request": index,
                "sent_ms": round(entry.sent * 1000, 3),
                "prompt_tokens": entry.prompt_tokens,
                "output_tokens": entry.tokens,
                "ttft_ms": round(ttft(entry) * 1000, 3) if entry.first_token >= 0 else "",
                "tpot_ms": round(tpot(entry) * 1000, 3) if done and entry.tokens > 1 else "",
                "e2e_ms": round(e2e(entry) * 1000, 3) if done else "",
                "preemptions": entry.preemptions,
                "recomputed_tokens": entry.recomputed_tokens,
                "prefix_cached_tokens": entry.cached_tokens,
                "slo_met": slo.met(entry),
                "refusals": entry.refusals,
                "capped": entry.capped,
                "outcome": entry.outcome,
                "trace_line": "" if entry.line is None else entry.line,
            }
        )
    return rows


# what `kvops simulate --draws` reports over the draws of the traffic: (its --json name, its column, the figure,
# its unit)
SPREAD_FIGURES: tuple[tuple[str, str, Callable[[Summary], float], str], ...] = (
    ("ttft_mean_ms", "TTFT mean", lambda summary: summary.ttft.mean * 1000, "ms"),
    ("ttft_p99_ms", "TTFT p99", lambda summary: summary.ttft.p99 * 1000, "ms"),
    ("tpot_mean_ms", "TPOT mean", lambda summary: summary.tpot.mean * 1000, "ms"),
    ("tpot_p99_ms", "TPOT p99", lambda summary: summary.tpot.p99 * 1000, "ms"),
    ("e2e_p99_ms", "E2E p99", lambda summary: summary.e2e.p99 * 1000, "ms"),
    ("goodput_rps", "goodput", lambda summary: summary.goodput_rps, "/s"),
    ("slo_attainment", "SLO met", lambda summary: summary.attainment, "share"),
    ("preemptions", "preemptions", lambda summary: float(summary.preemptions), "count"),
)


@frozen
class Spread:
    """One arm's figures over several draws of the same traffic (seeds): each figure's value per draw."""

    arm: str
    seeds: tuple[int, ...]
    values: dict[str, tuple[float, ...]]  # SPREAD_FIGURES' name -> one value per seed

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "seeds": list(self.seeds),
            **{
                name: {
                    "median": round(self.median(name), 4),
                    "min": round(min(values), 4),
                    "max": round(max(values), 4),
                    "per_seed": [round(value, 4) for value in values],
                }
                for name, values in self.values.items()
            },
        }


def spread(arm: str, seeds: Sequence[int], summaries: Sequence[Summary]) -> Spread:
    """`arm`'s summaries, one per seed, as a Spread."""
    return Spread(
        arm,
        tuple(seeds),
        {name: tuple(figure(summary) for summary in summaries) for name, _, figure, _ in SPREAD_FIGURES},
    )
