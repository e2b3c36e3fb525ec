"""The traffic a simulation replays: a trace file (any format kvops reads), or synthetic requests; timed by the
file, or by a rate, or sent as fast as a number of clients allows."""

from __future__ import annotations

import math

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.simulate.formats import read_trace
from kvops.simulate.synthetic import arrivals, synthetic_trace, timing
from kvops.simulate.trace import Trace

SYNTHETIC_REQUESTS = 1000


@frozen
class Traffic:
    """What the user asked for: a `trace` file or synthetic lengths, and how requests arrive."""

    trace: str | None = None
    trace_format: str | None = None
    trace_model: str | None = None  # BurstGPT's Model column
    requests: int | None = None  # the first N of the trace; synthetic: how many (default 1,000)
    rate: float | None = None  # requests per second: a synthetic or untimed trace's, or a timed trace scaled to it
    burstiness: float | None = None  # gamma shape of drawn inter-arrival times: 1 (None) is Poisson, below 1 burstier
    prompt_tokens: str = "sharegpt"
    output_tokens: str = "sharegpt"
    seed: int = 0
    concurrency: int | None = None  # clients: at most this many requests in flight


def build_trace(traffic: Traffic, tokenizer=None) -> Trace:
    """The requests, timed: a file's own times, or arrivals at `rate`; untimed only with a concurrency."""
    if traffic.trace is None:
        _check_burstiness(traffic, timed=False)
        count = traffic.requests or SYNTHETIC_REQUESTS
        trace = synthetic_trace(
            count, traffic.rate, _shape(traffic), traffic.prompt_tokens, traffic.output_tokens, traffic.seed
        )
    else:
        trace = read_trace(
            traffic.trace,
            traffic.trace_format,
            tokenizer=tokenizer,
            model_filter=traffic.trace_model,
            limit=traffic.requests,
        )
        if not trace.requests:
            raise UsageError(f"--trace {traffic.trace}: no requests in it")
        _check_burstiness(traffic, trace.timed)
        if traffic.rate is not None:
            trace = _at_rate(trace, traffic)
    if not trace.timed and traffic.concurrency is None:
        raise UsageError(
            f"{trace.source} has no arrival times: give --rate (requests per second) or --concurrency (clients)"
        )
    return trace


def _at_rate(trace: Trace, traffic: Traffic) -> Trace:
    """An untimed trace's requests sent at `rate`; a timed one's gaps scaled to it (its burstiness kept)."""
    rate = traffic.rate or 0.0
    if not trace.timed:
        timed = trace.with_arrivals(arrivals(len(trace.requests), rate, _shape(traffic), traffic.seed))
        source = f"{trace.source}, {timing(rate, _shape(traffic))}"
        return Trace(timed.requests, source, True, trace.skipped, drawn_rate=rate)
    if math.isinf(rate):
        at_once = trace.with_arrivals((0.0,) * len(trace.requests))
        return Trace(at_once.requests, f"{trace.source}, all sent at once", True, trace.skipped)
    own = trace.rate
    if own is None:
        raise UsageError(f"--rate: the requests of {trace.source} all arrive at once; nothing to scale")
    scaled = trace.scaled(rate / own)
    return Trace(scaled.requests, f"{trace.source}, scaled to {rate:g}/s", True, trace.skipped)


def _shape(traffic: Traffic) -> float:
    return 1.0 if traffic.burstiness is None else traffic.burstiness


def _check_burstiness(traffic: Traffic, timed: bool) -> None:
    """--burstiness shapes the gaps drawn at --rate: a trace's own arrival times keep theirs (--rate scales them),
    and requests sent by --concurrency clients draw none."""
    if traffic.burstiness is None:
        return
    if timed:
        raise UsageError(
            f"--burstiness draws arrival gaps; --trace {traffic.trace} has its own arrival times (--rate scales them, "
            "their burstiness kept): leave it out"
        )
    if traffic.rate is None:
        raise UsageError("--burstiness shapes the arrivals drawn at --rate: give --rate too, or leave it out")
