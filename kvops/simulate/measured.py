"""A vLLM serving benchmark's result read back: its requests as a trace, and what its clients measured of each.

The file is what `vllm bench serve --save-result --save-detailed` writes (vLLM 0.32, vllm/benchmarks/serve.py:
`benchmark` builds the result's per-request lists in the order the requests were sent out, and `main` drops them
without --save-detailed): `start_times` (the client's time.perf_counter() just before it sent each request, in
seconds), `input_lens` (prompt tokens), `output_lens` (output tokens as `calculate_metrics` counted them; 0 for a
failed request), `ttfts` and `latencies` (seconds), `errors` ("" for a request that succeeded). A failed request is
left out of both the trace and the measurements, and counted. Pure: the caller reads the JSON
(`kvops.simulate.formats.read_bench_result`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvops.frozen import frozen
from kvops.simulate.results import Distribution, Summary, distribution
from kvops.simulate.trace import Trace, TraceError, TraceRequest, is_integer, shown

LISTS = ("start_times", "input_lens", "output_lens", "ttfts", "latencies")
DETAILED = "run `vllm bench serve` with --save-result --save-detailed, which keeps each request's figures"
FORMAT_NAME = "vLLM bench serve result"


@frozen
class Figures:
    """What clients saw, in seconds: a benchmark's, or a simulation's."""

    ttft: Distribution
    tpot: Distribution
    e2e: Distribution

    @classmethod
    def of(cls, summary: Summary) -> Figures:
        return cls(summary.ttft, summary.tpot, summary.e2e)

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {"ttft_ms": self.ttft.to_dict(), "tpot_ms": self.tpot.to_dict(), "e2e_ms": self.e2e.to_dict()}


@frozen
class MeasuredRequest:
    """What a benchmark client measured of one request, in seconds."""

    ttft_s: float
    e2e_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float:
        """(E2E - TTFT) / (output tokens - 1), as vllm/benchmarks/serve.py `calculate_metrics` computes it."""
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@frozen
class Measured:
    """The benchmark's requests in the order they were sent, each beside what its client measured."""

    trace: Trace
    requests: tuple[MeasuredRequest, ...]
    failed: int
    model: str | None = None  # the served model the benchmark names (model_id)

    def figures(self) -> Figures:
        return Figures(
            distribution([request.ttft_s for request in self.requests]),
            distribution([request.tpot_s for request in self.requests if request.output_tokens > 1]),
            distribution([request.e2e_s for request in self.requests]),
        )


def parse_result(data: Any, where: str) -> Measured:
    """The benchmark result `data` (the decoded JSON of `where`) as a trace and its measurements."""
    if not isinstance(data, Mapping):
        raise TraceError(f"{where}: not a {FORMAT_NAME} (expected a JSON object, got {shown(data)})")
    lists = {name: _list(data, name, where) for name in LISTS}
    count = len(lists["start_times"])
    uneven = [name for name in LISTS if len(lists[name]) != count]
    if uneven:
        raise TraceError(
            f"{where}: {', '.join(uneven)} hold(s) a different number of requests than start_times ({count})"
        )
    errors = data.get("errors") or [""] * count
    if not isinstance(errors, list) or len(errors) != count:
        raise TraceError(f"{where}: errors: expected a list of {count} strings, one per request")
    sent = sorted(range(count), key=lambda index: _seconds(lists["start_times"], index, "start_times", where))
    start = _seconds(lists["start_times"], sent[0], "start_times", where) if sent else 0.0
    requests, measured, failed = [], [], 0
    for index in sent:
        if errors[index] or not lists["output_lens"][index]:
            failed += 1
            continue
        request, figures = _request(lists, index, start, where)
        requests.append(request)
        measured.append(figures)
    if not requests:
        raise TraceError(f"{where}: no request succeeded ({count} in the file, {failed} failed)")
    dropped = f", {failed:,} failed requests left out" if failed else ""
    source = f"{where} ({FORMAT_NAME}, {len(requests):,} requests{dropped})"
    model = data.get("model_id")
    trace = Trace(tuple(requests), source, timed=True, skipped=failed)
    return Measured(trace, tuple(measured), failed, model if isinstance(model, str) else None)


def _list(data: Mapping[str, Any], name: str, where: str) -> Sequence[Any]:
    value = data.get(name)
    if value is None:
        raise TraceError(f"{where}: no {name}: {DETAILED}")
    if not isinstance(value, list):
        raise TraceError(f"{where}: {name}: expected a list, one entry per request, got {shown(value)}")
    return value


def _request(
    lists: Mapping[str, Sequence[Any]], index: int, start: float, where: str
) -> tuple[TraceRequest, MeasuredRequest]:
    prompt = _tokens(lists["input_lens"], index, "input_lens", where)
    output = _tokens(lists["output_lens"], index, "output_lens", where)
    ttft = _seconds(lists["ttfts"], index, "ttfts", where)
    e2e = _seconds(lists["latencies"], index, "latencies", where)
    if e2e < ttft:
        raise TraceError(f"{where}: request {index}: latencies {e2e} is below its ttfts {ttft}")
    arrival = _seconds(lists["start_times"], index, "start_times", where) - start
    return TraceRequest(arrival, prompt, output), MeasuredRequest(ttft, e2e, output)


def _tokens(values: Sequence[Any], index: int, name: str, where: str) -> int:
    value = values[index]
    if not is_integer(value) or value < 1:
        raise TraceError(f"{where}: {name}[{index}]: expected a positive number of tokens, got {shown(value)}")
    return int(value)


def _seconds(values: Sequence[Any], index: int, name: str, where: str) -> float:
    value = values[index]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise TraceError(f"{where}: {name}[{index}]: expected a number of seconds of at least 0, got {shown(value)}")
    return float(value)
