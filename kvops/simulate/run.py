"""A trace through an engine's scheduler on a simulated clock: the engine core's loop, with a step-time model in
place of the GPU.

The clock follows the engine core (vllm/v1/engine/core.py): with one batch in flight a step is scheduled when the
previous one has finished; with two (async scheduling) the next batch is scheduled when the one before the running
one has finished, and runs when the device is free. The API server hands requests to the engine core one at a
time, `input_s` each (its processing of the request and the hand-off to the core's input thread): a request is
visible to the scheduler from the first schedule after that, so a burst reaches the core spread out, and a busy
core picks each up at its next step anyway where an idle one waits it out. Its tokens reach the client when their
step ends plus the API server's time (`api_s`: parsing, tokenizing, detokenizing and streaming, which the client
sees in TTFT and E2E). An API server that applies an admission policy (kvops' degrade: `door`) answers each request
as it is sent, from the engine's KV usage then: it serves it, its new tokens capped, or refuses it, and the client
sends it again after the answer's Retry-After, up to `ClientSettings.retries` times. Nothing here knows an engine or a device: the core and the step time are given.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import insort
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
    # sends of a refused request after the first, each after the answer's Retry-After: the OpenAI Python client's
    # default (DEFAULT_MAX_RETRIES = 2 in openai/_constants.py; _base_client.py honors Retry-After)
    retries: int = 2


@frozen
class Admission:
    """The API server's answer to a request sent now: serve it, its new tokens capped at `max_tokens` (None: as it
    asks), or refuse it (`retry_after_s` set: the client may send it again that much later)."""

    max_tokens: int | None = None
    retry_after_s: float | None = None


Door = Callable[[float, float], Admission]  # (now, the engine's KV usage as a 0-1 fraction) -> the answer


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
    outcome: str = "pending"  # "stop", "length", "rejected: ...", "refused: ...", "unserved"
    last_token: float = -1.0
    reach: int = 0  # the furthest its cache has been computed; anything below it computed again is recompute
    refusals: int = 0  # times the API server refused it (door)
    capped: bool = False  # the API server capped its new tokens below what it would have generated (door)
    queued: float = -1.0  # when the scheduler received it (vLLM's QUEUED stamp): once the API server has handed it
    # in, or at the end of the step the engine core was running then
    line: int | None = None  # its line in the trace file (None: not read from a file's lines)


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
    """Who sends next, and when: the trace's arrivals, held back while `max_concurrency` requests are in flight.

    The loop hands a finished step's tokens to their clients before it sends the requests that arrived during that
    step, so a request's send time is worked out from when it arrived: at its arrival, unless every slot was taken
    then, in which case when the first slot freed after it."""

    def __init__(self, trace: Trace, limit: int | None):
        self.requests = trace.requests
        self.limit = limit
        self.next = 0
        self.in_flight = 0
        self.released: deque[float] = deque()  # when slots freed, after the next request's arrival (with a limit)
        # (when, index) of refused requests to send again; each keeps its slot while its client waits
        self.retries: list[tuple[float, int]] = []

    def due(self) -> float | None:
        """When the next request is sent, a new one or one sent again (None: none left, or every slot taken)."""
        when = min(self.due_new(), self.retries[0][0] if self.retries else math.inf)
        return None if when == math.inf else when

    def due_new(self) -> float:
        """When the trace's next request is sent (inf: none left, or every slot taken)."""
        if self.next >= len(self.requests) or (self.limit is not None and self.in_flight >= self.limit):
            return math.inf
        arrival = self.requests[self.next].arrival_s
        if self.limit is None:
            return arrival
        while self.released and self.released[0] <= arrival:
            self.released.popleft()
        # the slots taken when it arrived: those in flight now and those freed since
        excess = self.in_flight + len(self.released) - self.limit
        return arrival if excess < 0 else self.released[excess]

    def retry(self, when: float, index: int) -> None:
        heapq.heappush(self.retries, (when, index))

    def release(self, now: float) -> None:
        self.in_flight -= 1
        if self.limit is not None:
            insort(self.released, now)  # a request refused or rejected at its send frees its slot then


def run_trace(
    core: SchedulerCore,
    trace: Trace,
    step_seconds: StepSeconds,
    *,
    max_model_len: int,
    api_s: float,
    input_s: float = 0.0,
    clients: ClientSettings | None = None,
    prompt: Callable[[int, TraceRequest], list[int]],
    progress: Callable[[int], None] | None = None,
    door: Door | None = None,
) -> RunLog:
    """Replay `trace` through `core`; `prompt(index, request)` builds a request's token ids (shared prefixes);
    `door` answers each send (None: every request is served as it asks)."""
    settings = clients or ClientSettings()
    senders = _Clients(trace, settings.max_concurrency)
    logs: list[RequestLog] = []
    log = RunLog(logs, array("d"), Timeline(), label=core.label)
    in_flight: deque[tuple[Batch, float]] = deque()
    now = device_free = 0.0
    handed = 0.0  # when the API server has handed in the last request it took (it takes one at a time)
    empty = 0
    done = 0
    while True:
        while (due := senders.due()) is not None and max(due, handed) + input_s <= now:
            handed = max(due, handed) + input_s
            _send(core, senders, logs, settings, max_model_len, prompt, door, now)
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
            now = max(now, max(due, handed) + input_s)
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
    door: Door | None,
    now: float,
) -> None:
    """Send the request that is due: a refused one again if its time has come first, else the trace's next; the
    scheduler receives it `now`."""
    if senders.retries and senders.retries[0][0] <= senders.due_new():
        when, index = heapq.heappop(senders.retries)
        _offer(core, senders, logs[index], index, when, settings, max_model_len, prompt, door, now)
        return
    index = senders.next
    request = senders.requests[index]
    sent = senders.due_new()
    senders.next += 1
    senders.in_flight += 1
    entry = RequestLog(sent, request.prompt_tokens, 0, line=request.line)  # its output length is set when served
    logs.append(entry)
    if max_model_len - request.prompt_tokens < 1:
        entry.outcome = (
            f"rejected: a prompt of {request.prompt_tokens} tokens leaves no room in max-model-len {max_model_len}"
        )
        senders.release(sent)
        return
    _offer(core, senders, entry, index, sent, settings, max_model_len, prompt, door, now)


def _offer(
    core: SchedulerCore,
    senders: _Clients,
    entry: RequestLog,
    index: int,
    now: float,
    settings: ClientSettings,
    max_model_len: int,
    prompt: Callable[[int, TraceRequest], list[int]],
    door: Door | None,
    queued: float,
) -> None:
    """The request at the API server when sent (`now`): refused (sent again later, or given up), or handed to the
    scheduler, which receives it at `queued`."""
    request = senders.requests[index]
    admission = door(now, core.usage) if door is not None else Admission()
    if admission.retry_after_s is not None:
        entry.refusals += 1
        if entry.refusals <= settings.retries:
            senders.retry(now + admission.retry_after_s, index)
        else:
            entry.outcome = f"refused: {entry.refusals} times, with Retry-After"
            senders.release(now)
        return
    room = max_model_len - request.prompt_tokens
    asked = _asked_max_tokens(request, settings.max_tokens)
    cap = room if asked is None else min(asked, room)
    wanted = min(request.output_tokens, max(cap, 0))  # what it generates when served as it asks
    if admission.max_tokens is not None and admission.max_tokens < cap:
        cap = asked = admission.max_tokens
    entry.output_tokens = min(request.output_tokens, max(cap, 0))
    entry.capped = entry.output_tokens < wanted
    exact = asked is not None and asked <= request.output_tokens
    entry.queued = queued
    core.add(
        str(index),
        prompt(index, request),
        output_tokens=entry.output_tokens,
        max_tokens=cap,
        exact=exact,
        priority=request.priority,
        arrival=now,
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
