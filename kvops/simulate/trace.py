"""A request trace: when each request arrives, how long its prompt is, how much it generates, what prefix it shares.

kvops' own trace format is JSONL, one request per line:

    {"arrival_s": 0.25, "prompt_tokens": 512, "output_tokens": 128}

and optionally `max_tokens` (what the client sends; absent or null: omitted), `priority` (vLLM's: lower is served
first) and the shared start of the prompt: one segment (`"prefix_id": "system-a", "prefix_tokens": 200`) or several
(`"prefix": [["system-a", 200], ["doc-7", 1024]]`). `arrival_s` is on every line or on none: a file without it is
untimed, and the caller gives a rate or a concurrency. An unknown field is an error (a typo must not pass silently),
except that the lines `kvops tokens --out` writes ({"source", "prompt_tokens", "gen_tokens"}, kvops/cli/tokens.py)
read as an untimed trace whose gen_tokens are the output tokens. Pure: the caller opens the file
(`kvops.simulate.formats.read_trace`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, TypeGuard

from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.workload import percentile

Segment = tuple[str, int]

EXAMPLE = '{"arrival_s": 0.25, "prompt_tokens": 512, "output_tokens": 128}'
FIELDS = (
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "priority",
    "prefix_id",
    "prefix_tokens",
    "prefix",
)
TOKENS_FIELDS = ("source", "prompt_tokens", "gen_tokens")
POSITIVE = "a positive integer"
SEGMENTS = 'a list of [key, tokens] pairs, e.g. [["system", 200]]'
MISSING = object()


class TraceError(UsageError):
    """A trace that cannot be read, in one line: the file, the line and the field, and what would be valid."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request. `output_tokens` is what it really generates before it stops; `max_tokens` is what the client sends
    (None: omitted, so the engine allows up to max-model-len minus the prompt). `prefix` is the shared start of the
    prompt as segments (key, tokens): two requests whose prompts start with the same segments (key and tokens alike)
    share those tokens exactly; the rest of the prompt is the request's own. `line` is the line of the trace file it
    was read from (None: a JSON document's entry, or generated); it does not count in comparisons."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None
    priority: int = 0
    prefix: tuple[Segment, ...] = ()
    line: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (0 <= self.arrival_s < math.inf and self.prompt_tokens >= 1 and self.output_tokens >= 1):
            raise ValueError(f"not a request: {self}")
        if self.max_tokens is not None and self.output_tokens > self.max_tokens:
            raise ValueError(f"output_tokens over max_tokens: {self}")
        if self.prefix and self.prefix_tokens > self.prompt_tokens:
            raise ValueError(f"prefix longer than the prompt: {self}")

    @property
    def prefix_tokens(self) -> int:
        return sum(tokens for _, tokens in self.prefix)


@frozen
class Trace:
    """Requests in arrival order and where they came from. `timed` is False when the file had no arrival times (all
    arrive at 0: the caller gives a rate or a concurrency); `skipped` counts rows a reader's documented rule dropped.
    `drawn_rate` is the rate arrivals were drawn at (`--rate`), where they were: vLLM's benchmark draws n gaps and
    puts the last arrival at n / rate, so the mean gap from the first arrival to the last is not exactly 1 / rate."""

    requests: tuple[TraceRequest, ...]
    source: str
    timed: bool = True
    skipped: int = 0
    drawn_rate: float | None = None

    def __post_init__(self) -> None:
        requests = tuple(self.requests)
        if any(later.arrival_s < earlier.arrival_s for earlier, later in pairwise(requests)):
            requests = tuple(sorted(requests, key=_arrival))
        object.__setattr__(self, "requests", requests)

    def __len__(self) -> int:
        return len(self.requests)

    def with_arrivals(self, arrivals: Sequence[float]) -> Trace:
        """The same requests, in order, at these arrival times (e.g. `synthetic.arrivals`): a timed trace."""
        if len(arrivals) != len(self.requests):
            raise ValueError(f"{len(arrivals)} arrival times for {len(self.requests)} requests")
        timed = tuple(replace(request, arrival_s=float(at)) for request, at in zip(self.requests, arrivals))
        return replace(self, requests=timed, timed=True, drawn_rate=None)

    def scaled(self, rate_factor: float) -> Trace:
        """Time compressed by `rate_factor`: 2 replays the trace at twice its rate, every arrival at half its time."""
        if not 0 < rate_factor < math.inf:
            raise UsageError(f"rate factor {rate_factor}: expected a positive number (2 replays at twice the rate)")
        faster = tuple(replace(request, arrival_s=request.arrival_s / rate_factor) for request in self.requests)
        drawn = self.drawn_rate * rate_factor if self.drawn_rate is not None else None
        return replace(self, requests=faster, drawn_rate=drawn)

    def head(self, n: int) -> Trace:
        """The first n requests."""
        return replace(self, requests=self.requests[: max(n, 0)])

    @property
    def span_s(self) -> float | None:
        """From the first arrival to the last (None untimed)."""
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.timed and self.requests else None

    @property
    def nominal_rate(self) -> float | None:
        """The rate `--rate` names for these arrivals: the rate they were drawn at, else their mean rate."""
        return self.drawn_rate if self.drawn_rate is not None else self.rate

    @property
    def rate(self) -> float | None:
        """Requests per second: one over the mean gap between arrivals (None untimed, or all at once)."""
        span = self.span_s
        return (len(self.requests) - 1) / span if span else None

    def summary(self) -> dict[str, Any]:
        """Requests, duration (the first arrival to the last), mean rate, and the prompt and output tokens' mean and
        p50/p90/p99 (nearest rank); duration and rate are None for an untimed trace."""
        return {
            "source": self.source,
            "requests": len(self.requests),
            "skipped": self.skipped,
            "timed": self.timed,
            "duration_s": self.span_s,
            "mean_rate_per_s": self.rate,
            "prompt_tokens": _stats([request.prompt_tokens for request in self.requests]),
            "output_tokens": _stats([request.output_tokens for request in self.requests]),
        }


def first_arrivals(requests: list[TraceRequest], limit: int | None) -> list[TraceRequest]:
    """The first `limit` requests to arrive (all: None), in arrival order; a file's lines need not be in it, so a
    timed file is read whole before it is cut."""
    ordered = sorted(requests, key=_arrival)
    return ordered if limit is None else ordered[: max(limit, 0)]


def _arrival(request: TraceRequest) -> float:
    return request.arrival_s


def _stats(values: list[int]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered = sorted(values)
    stats: dict[str, float | None] = {"mean": sum(ordered) / len(ordered)}
    return stats | {f"p{pct}": percentile(ordered, pct) for pct in (50, 90, 99)}


def parse_jsonl(lines: Iterable[str], where: str, limit: int | None = None) -> Trace:
    """kvops' JSONL trace (the module docstring), its first `limit` arrivals; `where` names the file in errors."""
    requests: list[TraceRequest] = []
    timed_at: tuple[bool, int] | None = None  # whether the first request line had arrival_s, and its number
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where} line {number}"
        request, timed = _request(json_object(line, at, EXAMPLE), at)
        timed_at = timed_at or (timed, number)
        if timed != timed_at[0]:
            state = "missing, but line {} has one" if timed_at[0] else "given, but line {} has none"
            raise TraceError(f'{at}: field "arrival_s": {state.format(timed_at[1])} (give it on every line or on none)')
        requests.append(replace(request, line=number))
        if limit is not None and len(requests) >= limit and not timed:
            break
    if not requests:
        raise TraceError(f"{where}: no requests (kvops JSONL: one JSON object per line, e.g. {EXAMPLE})")
    timed = timed_at is not None and timed_at[0]
    requests = first_arrivals(requests, limit)
    return Trace(tuple(requests), f"{where} (kvops JSONL, {len(requests):,} requests)", timed=timed)


def json_object(line: str, at: str, example: str) -> dict[str, Any]:
    """One JSONL line that must hold an object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{at}: not JSON ({exc.msg} at column {exc.colno}); expected an object like {example}"
        ) from None
    except RecursionError:
        raise TraceError(f"{at}: nested too deeply; expected an object like {example}") from None
    if not isinstance(record, dict):
        raise TraceError(f"{at}: expected a JSON object like {example}, got {shown(record)}")
    return record


def _request(record: dict[str, Any], at: str) -> tuple[TraceRequest, bool]:
    if "gen_tokens" in record and "output_tokens" not in record:
        _known(record, TOKENS_FIELDS, at)
        return TraceRequest(0.0, positive(record, "prompt_tokens", at), positive(record, "gen_tokens", at)), False
    _known(record, FIELDS, at)
    prompt = positive(record, "prompt_tokens", at)
    output = positive(record, "output_tokens", at, hint="kvops tokens writes it as gen_tokens when given --gen-tokens")
    max_tokens = None if record.get("max_tokens") is None else positive(record, "max_tokens", at)
    if max_tokens is not None and output > max_tokens:
        raise TraceError(
            f'{at}: field "output_tokens": {output} is over max_tokens {max_tokens} (a request stops there)'
        )
    prefix = _prefix(record, at)
    shared = sum(tokens for _, tokens in prefix)
    if shared > prompt:
        raise TraceError(f'{at}: field "prefix": its segments hold {shared} tokens, more than prompt_tokens {prompt}')
    timed = "arrival_s" in record
    arrival = seconds(record, "arrival_s", at) if timed else 0.0
    priority = integer(record, "priority", at) if "priority" in record else 0
    return TraceRequest(arrival, prompt, output, max_tokens, priority, prefix), timed


def _known(record: dict[str, Any], fields: tuple[str, ...], at: str) -> None:
    unknown = [key for key in record if key not in fields]
    if unknown:
        names = ", ".join(f'"{key}"' for key in unknown)
        raise TraceError(f"{at}: unknown field {names} (valid: {', '.join(fields)})")


def _prefix(record: dict[str, Any], at: str) -> tuple[Segment, ...]:
    single = "prefix_id" in record or "prefix_tokens" in record
    if single and "prefix" in record:
        raise TraceError(f'{at}: fields "prefix" and "prefix_id": give prefix_id + prefix_tokens or prefix, not both')
    if single:
        key = record.get("prefix_id", MISSING)
        if not isinstance(key, str) or not key:
            raise bad_field(at, "prefix_id", "a non-empty string, with prefix_tokens", key)
        return ((key, positive(record, "prefix_tokens", at)),)
    segments = record.get("prefix", [])
    if not isinstance(segments, list):
        raise bad_field(at, "prefix", SEGMENTS, segments)
    return tuple(_segment(segment, f"prefix[{index}]", at) for index, segment in enumerate(segments))


def _segment(segment: Any, name: str, at: str) -> Segment:
    if isinstance(segment, list) and len(segment) == 2:
        key, tokens = segment
        if isinstance(key, str) and key and is_integer(tokens) and tokens >= 1:
            return key, tokens
    raise bad_field(at, name, "a [key, tokens] pair: a non-empty string and a positive integer", segment)


def is_integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def positive(record: dict[str, Any], name: str, at: str, hint: str = "") -> int:
    """record[name], which must be a positive integer."""
    value = record.get(name, MISSING)
    if not is_integer(value) or value < 1:
        raise bad_field(at, name, POSITIVE + (f"; {hint}" if hint and value is MISSING else ""), value)
    return int(value)


def integer(record: dict[str, Any], name: str, at: str) -> int:
    value = record.get(name, MISSING)
    if not is_integer(value):
        raise bad_field(at, name, "an integer", value)
    return int(value)


def seconds(record: dict[str, Any], name: str, at: str, per_second: int = 1) -> float:
    """record[name], a time of at least 0 counted in 1/per_second seconds, as seconds."""
    value = record.get(name, MISSING)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise bad_field(at, name, "a number of at least 0", value)
    return value / per_second


def bad_field(at: str, name: str, expected: str, value: Any) -> TraceError:
    if value is MISSING:
        return TraceError(f'{at}: field "{name}": missing (expected {expected})')
    return TraceError(f'{at}: field "{name}": expected {expected}, got {shown(value)}')


def shown(value: Any) -> str:
    """A value as the file wrote it, cut to fit on the error's line."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def write_jsonl(trace: Trace) -> str:
    """The trace in kvops' JSONL, one request per line: `parse_jsonl` reads it back to the same requests."""
    return "".join(json.dumps(_record(request, trace.timed)) + "\n" for request in trace.requests)


def _record(request: TraceRequest, timed: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"arrival_s": request.arrival_s} if timed else {}
    record |= {"prompt_tokens": request.prompt_tokens, "output_tokens": request.output_tokens}
    if request.max_tokens is not None:
        record["max_tokens"] = request.max_tokens
    if request.priority:
        record["priority"] = request.priority
    if request.prefix:
        record["prefix"] = [list(segment) for segment in request.prefix]
    return record
