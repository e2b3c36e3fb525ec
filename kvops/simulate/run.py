"""A trace through an engine's scheduler on a simulated clock: the engine core's loop, with a step-time model in
place of the GPU.

The clock follows the engine core (vllm/v1/engine/core.py): with one batch in flight a step is scheduled when the
previous one has finished; with two (async scheduling) the next batch is scheduled when the one before the running
one has finished, and runs when the device is free. A request is visible to the scheduler from the first schedule
after it is sent; its tokens reach the client when their step ends plus the API server's time (`api_s`: parsing,
tokenizing, detokenizing and streaming, which the client sees in TTFT and E2E). Nothing here knows an engine or a
device: the core and the step time are given.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvops.engines.scheduling import Batch, SchedulerCore
from kvops.frozen import frozen
from kvops.simulate.trace import Trace, TraceRequest

StepSeconds = Callable[[Batch], float]
STUCK_SCHEDULES = 8  # empty schedules in a row, nothing running and nothing to arrive: the rest cannot be served


@frozen
class ClientSettings:
    """How the clients send: at most `max_concurrency` requests in flight (None: as the trace's arrivals say), and
    what they ask for `max_tokens`: "trace" (each request's own; exact where the trace has none), "exact" (the
    output length, with ignore_eos: the engine knows every length), "none" (omitted: the engine allows up to
    max-model-len and the request stops by itself) or "cap:N" (N: the request stops by itself, at N at most)."""

    max_concurrency: int | None = None
    max_tokens: str = "trace"


@dataclass
class RequestLog:
    """What one request saw, in seconds from the trace's start."""

    sent: float
    prompt_tokens: int
    output_tokens: int  # what it generates (its trace length, within max_tokens and the context)
    first_token: float = -1.0
    finished: float = -1.0
    tokens: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first schedule
    outcome: str = "pending"  # "stop", "length", "rejected: ...", "unserved"
    last_token: float = -1.0
    reach: int = 0  # the furthest its cache has been computed; anything below it computed again is recompute


@dataclass
class Timeline:
    """The engine's state after each step."""

    time: array = field(default_factory=lambda: array("d"))
    usage: array = field(default_factory=lambda: array("d"))
    running: array = field(default_factory=lambda: array("l"))
    waiting: array = field(default_factory=lambda: array("l"))


@dataclass
class RunLog:
    """A whole run: each request, every token gap, the timeline and the engine's counters."""

    requests: list[RequestLog]
    gaps: array  # seconds between consecutive tokens of a request (its ITL), every request's
    timeline: Timeline
    steps: int = 0
    busy_s: float = 0.0
    end_s: float = 0.0
    preemptions: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    label: str = ""


class _Clients:
    """Who sends next, and when: the trace's arrivals, held back while `max_concurrency` requests are in flight."""

    def __init__(self, trace: Trace, limit: int | None):
        self.requests = trace.requests
        self.limit = limit
        self.next = 0
        self.in_flight = 0
        self.freed_at = 0.0  # when the last slot freed (a held-back request is sent then)

    def due(self) -> float | None:
        """When the next request is sent (None: none left, or every slot taken)."""
        if self.next >= len(self.requests) or (self.limit is not None and self.in_flight >= self.limit):
            return None
        return max(self.requests[self.next].arrival_s, self.freed_at)

    def release(self, now: float) -> None:
        self.in_flight -= 1
        self.freed_at = now


def run_trace(
    core: SchedulerCore,
    trace: Trace,
    step_seconds: StepSeconds,
    *,
    max_model_len: int,
    api_s: float,
    clients: ClientSettings | None = None,
    prompt: Callable[[int, TraceRequest], list[int]],
    progress: Callable[[int], None] | None = None,
) -> RunLog:
    """Replay `trace` through `core`; `prompt(index, request)` builds a request's token ids (shared prefixes)."""
    settings = clients or ClientSettings()
    senders = _Clients(trace, settings.max_concurrency)
    logs: list[RequestLog] = []
    log = RunLog(logs, array("d"), Timeline(), label=core.label)
    in_flight: deque[tuple[Batch, float]] = deque()
    now = device_free = 0.0
    empty = 0
    done = 0
    while True:
        while (due := senders.due()) is not None and due <= now:
            _send(core, senders, logs, settings, max_model_len, prompt)
        if core.has_requests() and len(in_flight) < core.batches_in_flight:
            batch = core.schedule()
            if batch.request_ids:
                empty = 0
                start = max(now, device_free)
                seconds = step_seconds(batch)
                device_free = start + seconds
                log.steps += 1
                log.busy_s += seconds
                _account(batch, logs, log)
                in_flight.append((batch, device_free))
                if len(in_flight) < core.batches_in_flight:
                    continue
            else:
                empty += 1
        if in_flight:
            batch, finished = in_flight.popleft()
            now = max(now, finished)
            done += _complete(core, batch, now + api_s, logs, log, senders)
            _sample(log.timeline, now, core)
            if progress is not None:
                progress(done)
            continue
        due = senders.due()
        if due is not None:
            now = max(now, due)
            continue
        if not core.has_requests() or empty >= STUCK_SCHEDULES:
            break
    for entry in logs:
        if entry.outcome == "pending":
            entry.outcome = "unserved"
    log.end_s = now
    log.counters = core.counters()
    return log


def _send(
    core: SchedulerCore,
    senders: _Clients,
    logs: list[RequestLog],
    settings: ClientSettings,
    max_model_len: int,
    prompt: Callable[[int, TraceRequest], list[int]],
) -> None:
    index = senders.next
    request = senders.requests[index]
    sent = max(request.arrival_s, senders.freed_at)
    senders.next += 1
    senders.in_flight += 1
    room = max_model_len - request.prompt_tokens
    asked = _asked_max_tokens(request, settings.max_tokens)
    cap = room if asked is None else min(asked, room)
    entry = RequestLog(sent, request.prompt_tokens, min(request.output_tokens, max(cap, 0)))
    logs.append(entry)
    if room < 1:
        entry.outcome = (
            f"rejected: a prompt of {request.prompt_tokens} tokens leaves no room in max-model-len {max_model_len}"
        )
        senders.release(sent)
        return
    exact = asked is not None and asked <= request.output_tokens
    core.add(
        str(index),
        prompt(index, request),
        output_tokens=entry.output_tokens,
        max_tokens=cap,
        exact=exact,
        priority=request.priority,
        arrival=sent,
    )


def _asked_max_tokens(request: TraceRequest, mode: str) -> int | None:
    if mode == "exact":
        return request.output_tokens
    if mode == "none":
        return None
    if mode.startswith("cap:"):
        return int(mode[4:])
    return request.max_tokens if request.max_tokens is not None else request.output_tokens


def _account(batch: Batch, logs: list[RequestLog], log: RunLog) -> None:
    """Preemptions, recomputed and prefix-cached tokens of a scheduled batch."""
    for request_id in batch.preempted:
        logs[int(request_id)].preemptions += 1
        log.preemptions += 1
    for request_id, new, context in zip(batch.request_ids, batch.new_tokens, batch.context):
        entry = logs[int(request_id)]
        if entry.reach == 0 and context > 0 and entry.first_token < 0:
            entry.cached_tokens = context
        entry.recomputed_tokens += max(0, min(context + new, entry.reach) - context)
        entry.reach = max(entry.reach, context + new)


def _complete(
    core: SchedulerCore, batch: Batch, seen: float, logs: list[RequestLog], log: RunLog, senders: _Clients
) -> int:
    """Hand a finished step's tokens to their requests; `seen` is when the client has them."""
    result = core.complete(batch)
    now = seen
    for request_id, count in result.tokens:
        entry = logs[int(request_id)]
        if entry.first_token < 0:
            entry.first_token = now
        else:
            log.gaps.append(now - entry.last_token)
            log.gaps.extend([0.0] * (count - 1))
        entry.last_token = now
        entry.tokens += count
    for request_id, reason in result.finished:
        entry = logs[int(request_id)]
        entry.finished = now
        entry.outcome = reason
        senders.release(now)
    return len(result.finished)


def _sample(timeline: Timeline, now: float, core: SchedulerCore) -> None:
    timeline.time.append(now)
    timeline.usage.append(core.usage)
    timeline.running.append(core.running)
    timeline.waiting.append(core.waiting)
