"""Goodput of the KV guard against stock vLLM: the same seeded requests, on the real vLLM CPU engine, one run.

    python bench/guard_goodput.py [--shapes tiny,8x] [--pools 32,128] [--workloads abc] [--arms stock,guard-v3]
                                  [--quantiles 0.95] [--reps 5] [--seed 0] [--cold] [--json] [--step-cost-only]
                                  [--degrade-policy FILE]

Arms (each a real engine, all of a shape started before the first measurement, so repetitions interleave
A B C D E A B C D E ... and the machine's noise hits every arm alike):
  stock            vLLM's own scheduler
  guard-v1         the KV guard reserving every request's prompt + max_tokens (KVOPS_ADMISSION=reserve)
  guard-v2         the KV guard admitting by the future peak of the whole batch, short of blocks pausing up to 32
                   steps, then preempting the request that computed least, which resumes first
  guard-v3         the same admission, short of blocks pausing up to 4 steps, then preempting the request that
                   computed most (never preempted before), which resumes after new requests (the default)
  guard-v3 pQ      the same at KVOPS_OUTPUT_QUANTILE=Q instead of its default (--quantiles Q, more than one allowed)
  stock+caps       vLLM's own scheduler with its queue cap (--max-num-queued-reqs: overflow answered 503, retried)
  stock+watermark  vLLM's own scheduler keeping 5% of the blocks free when it admits (--watermark 0.05): the
                   engine's own knob against preemption, the nearest peer that runs here
  stock+degrade    vLLM's own scheduler behind kvops' degrade in its API server (--middleware; the shipped policy,
                   where warn caps new tokens at 512 and critical answers 503 with Retry-After 1, or
                   --degrade-policy FILE)
  stock+degrade-dwell30  the same levelling with a 30 s dwell and Retry-After 10
                   (bench/data/policy-admission-dwell-30.yaml), as shipped before admission.min_dwell_seconds
  stock+degrade-retry10  the shipped levelling with Retry-After 10 (bench/data/policy-admission-retry-10.yaml), as
                   shipped before admission.retry_after_seconds

Workloads (prompts, max_tokens, lengths and arrivals seeded by --seed and the repetition; the same for every arm),
with a pool of P blocks each P/32 times as many requests:
  (a) exact lengths: 120 requests, ignore_eos, prompts 32-256 tokens, max_tokens 64-640, arrivals over 9 s
  (b) unknown lengths: 160 requests, prompts 16-128, max_tokens 900 and a stop token; each stops at a seeded
      length (geometric, a stop of 3 tokens in 512 at every step, mean about 170, as sampling at temperature 1
      with 3 stop tokens on the dummy-weight model gives), which the engine samples as that request's last token
      (tests/support/stop_at.py) and the scheduler cannot see; arriving at twice the request rate stock vLLM
      sustains (measured in the warm-up)
  (c) SLO goodput as DistServe defines it: requests per second that meet both a TTFT and a TPOT target (set from
      a lone request of 128 tokens on the stock engine: TTFT 10x, TPOT 3x), 60 requests like (b), streamed, at
      0.5, 1, 1.5 and 2x that sustained rate
  (n) like (b), but sent with max_tokens the rest of the context, what vLLM's API server gives a chat request sent
      without max_tokens (its /v1/completions reads a null as 16)
Every engine first serves the same warm-up (48 requests like (b)), so the guard has seen output lengths. --cold
measures a freshly started engine instead: every repetition starts fresh engines (and each of (b) and (n) its own:
(a)'s exact lengths teach the guard nothing, so (a) shares (b)'s), warmed with the warm-up's requests as exact
lengths (no stop token: the machine warms, the guard learns no length), so (b) and (n) start with nothing learned.

Shapes: the test model (2 layers, hidden 256) and one with about 10x its weights per token (4 layers, hidden
512, MLP 1536), so that a preemption's recompute costs more on the second. Pools (--pools): 32 blocks (31 usable blocks of
128 tokens: about 8 requests of (a) at once) and 128 (about 35, nearer a GPU's pool, which holds hundreds).
Goodput is completed tokens per second (a request that gets all its tokens), from the first send to the last
answer; "in steps" is stock's scheduling steps over the arm's for the same requests (the count of
vllm:iteration_tokens_total: the goodput ratio at a fixed cost per step, which the machine's noise does not reach,
nor a recompute's cost); mean KV usage and mean running are over /metrics scrapes every 0.1 s during the run. The
client retries a 503/429 after its Retry-After (vLLM's queue cap sends none: 0.5 s). Figures are medians over the
repetitions; ratios are the median of the ratios to stock within each repetition.

Before the engines: the admission's cost per scheduling step at 256 running requests (an in-process vLLM
scheduler, as tests/engine/test_kv_guard_scheduler.py builds it), against stock's own schedule(); and each engine
step's scheduling (schedule() and update_from_output) over workload (b)'s requests sent at once on its small pool,
from a cold start, where the guard's bookkeeping weighs most against a short step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from tests.support.burst import gauges, percentile  # noqa: E402
from tests.support.tiny_model import TINY_LLAMA, build_model  # noqa: E402
from tests.support.vllm_server import VllmServer  # noqa: E402

GUARD = "kvops_vllm.scheduler.KVGuardScheduler"
STOP_AT = "tests.support.stop_at:StopAt"  # ends an unknown-length request where its seeded length says
BLOCKS = 32  # KV pool of every shape: 32 blocks of 128 tokens (31 usable)
MAX_MODEL_LEN = 1024
SHAPES = {
    "tiny": TINY_LLAMA,
    "8x": {
        **TINY_LLAMA,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
    },
}
STOP_ID = 11  # the stop token of unknown-length requests (sampled where the request's length says: Job.body)
STOP_CHANCE = 3 / 512  # per step: the chance 3 stop tokens of 512 have at temperature 1 on the dummy model
RETRY_SECONDS = 0.5  # when a refusal carries no Retry-After (vLLM's queue cap)


@dataclass(frozen=True)
class Arm:
    name: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


ARMS = (
    "stock",
    "guard-v1",
    "guard-v2",
    "guard-v3",
    "stock+caps",
    "stock+watermark",
    "stock+degrade",
    "stock+degrade-dwell30",
    "stock+degrade-retry10",
)
MIDDLEWARE = "kvops_vllm.middleware.KVOpsMiddleware"
DWELL_30 = REPO / "bench" / "data" / "policy-admission-dwell-30.yaml"
RETRY_10 = REPO / "bench" / "data" / "policy-admission-retry-10.yaml"
# guard v2's fallback where the pool runs short (guard v3's is the plugin's default)
V2_FALLBACK = (("KVOPS_PAUSE_STEPS", "32"), ("KVOPS_PREEMPT", "least-computed"), ("KVOPS_RESUME", "first"))


def arms(queue_cap: int, quantiles: list[str], degrade_policy: str | None = None) -> list[Arm]:
    """The arms, and guard v3 at each of `quantiles` (KVOPS_OUTPUT_QUANTILE) besides its default."""
    return [
        Arm("stock"),
        Arm("guard-v1", ("--scheduler-cls", GUARD), (("KVOPS_ADMISSION", "reserve"), *V2_FALLBACK)),
        Arm("guard-v2", ("--scheduler-cls", GUARD), V2_FALLBACK),
        Arm("guard-v3", ("--scheduler-cls", GUARD)),
        *(Arm(quantile_arm(q), ("--scheduler-cls", GUARD), (("KVOPS_OUTPUT_QUANTILE", q),)) for q in quantiles),
        Arm("stock+caps", ("--max-num-queued-reqs", str(queue_cap))),
        Arm("stock+watermark", ("--watermark", "0.05")),
        Arm(
            "stock+degrade", ("--middleware", MIDDLEWARE), (("KVOPS_POLICY", degrade_policy),) if degrade_policy else ()
        ),
        Arm("stock+degrade-dwell30", ("--middleware", MIDDLEWARE), (("KVOPS_POLICY", str(DWELL_30)),)),
        Arm("stock+degrade-retry10", ("--middleware", MIDDLEWARE), (("KVOPS_POLICY", str(RETRY_10)),)),
    ]


def quantile_arm(quantile: str) -> str:
    return f"guard-v3 p{float(quantile) * 100:g}"


# --- the requests ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    at: float  # seconds after the start of the run
    prompt: list[int]
    max_tokens: int | None  # None: the client sends none, and vLLM allows the rest of the context
    length: int | None = None  # None: exact (it generates max_tokens); else it stops here, unknown to the scheduler
    stream: bool = False  # streamed where the first token's time counts (SLO goodput), else one answer

    @property
    def exact(self) -> bool:
        return self.length is None

    @property
    def limit(self) -> int:
        """The max_tokens the scheduler sees: vLLM's API server gives a request without one the rest of the context."""
        return MAX_MODEL_LEN - len(self.prompt) if self.max_tokens is None else self.max_tokens

    def body(self, model: str) -> dict:
        body = {
            "model": model,
            "prompt": self.prompt,
            # no max_tokens: what vLLM's API server gives a chat request sent without one (its /v1/completions
            # reads a null as 16)
            "max_tokens": self.limit,
            "stream": self.stream,
            "return_token_ids": True,
            "ignore_eos": True,
            "temperature": 0,
        }
        if self.exact:
            return body
        # A stop token makes the length unknown to the scheduler; the engine samples it as the `length`-th token
        # (tests/support/stop_at.py), so every arm serves the same lengths.
        return {**body, "stop_token_ids": [STOP_ID], "vllm_xargs": {"stop_at": self.length}}


def prompt(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(20, 500) for _ in range(rng.randint(low, high))]


def stop_length(rng: random.Random, limit: int) -> int:
    """Where a request stops: geometric, a stop of 3 tokens in 512 at every step (mean about 170), as sampling at
    temperature 1 with 3 stop tokens on the dummy-weight model gives; at most `limit`."""
    return min(limit, 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - STOP_CHANCE)))


def exact_jobs(seed: int, count: int = 120, spread: float = 9.0) -> list[Job]:
    rng = random.Random(f"exact-{seed}")
    times = sorted(rng.uniform(0, spread) for _ in range(count))
    return [Job(at, prompt(rng, 32, 256), rng.randint(64, 640)) for at in times]


def unknown_jobs(
    seed: int, count: int, rate: float | None, stream: bool = False, max_tokens: int | None = 900
) -> list[Job]:
    """Poisson arrivals at `rate` requests per second (None: all at once), each stopping at a seeded length;
    `max_tokens` None: sent without one (vLLM then allows the rest of the context)."""
    rng = random.Random(f"unknown-{seed}-{rate}")
    at, jobs = 0.0, []
    for _ in range(count):
        text = prompt(rng, 16, 128)
        limit = MAX_MODEL_LEN - len(text) if max_tokens is None else max_tokens
        jobs.append(Job(at, text, max_tokens, stop_length(rng, limit), stream))
        if rate:
            at += rng.expovariate(rate)
    return jobs


# --- the client -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: float
    first: float | None = None
    done: float | None = None
    tokens: int = 0
    finish: str | None = None
    refusals: int = 0
    streamed_refusals: int = 0  # of them, refusals sent as an error event in an HTTP 200 stream
    error: str | dict | None = None

    def refused_in_stream(self) -> bool:
        """The stream carried no token, only an error whose code is a retryable refusal (429, 503)."""
        return self.tokens == 0 and isinstance(self.error, dict) and self.error.get("code") in (429, 503)

    @property
    def complete(self) -> bool:
        return self.finish in ("length", "stop") and self.error is None

    @property
    def ttft(self) -> float:
        return (self.first or math.inf) - self.sent

    @property
    def tpot(self) -> float:
        if self.first is None or self.done is None or self.tokens < 2:
            return 0.0
        return (self.done - self.first) / (self.tokens - 1)

    @property
    def e2e(self) -> float:
        return (self.done or math.inf) - self.sent


async def send(session, url: str, model: str, job: Job, start: float) -> Outcome:
    import aiohttp

    await asyncio.sleep(max(0.0, start + job.at - time.monotonic()))
    outcome = Outcome(sent=time.monotonic())
    while True:
        async with session.post(url + "/v1/completions", json=job.body(model)) as response:
            if response.status in (429, 503):
                outcome.refusals += 1
                await response.read()
                await asyncio.sleep(float(response.headers.get("Retry-After", RETRY_SECONDS)))
                continue
            if response.status != 200:
                outcome.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return outcome
            try:
                await (read_stream(response, outcome) if job.stream else read_answer(response, outcome))
            except (aiohttp.ClientError, ValueError) as exc:
                outcome.error = str(exc)
            if outcome.refused_in_stream():  # vLLM's queue caps refuse a stream as HTTP 200 + an error event
                outcome.refusals += 1
                outcome.streamed_refusals += 1
                outcome.error = outcome.finish = None
                await asyncio.sleep(RETRY_SECONDS)
                continue
            return outcome


async def read_answer(response, outcome: Outcome) -> None:
    """One JSON answer: its tokens and why it finished."""
    answer = await response.json()
    outcome.done = time.monotonic()
    choice = answer["choices"][0]
    outcome.tokens, outcome.finish = answer["usage"]["completion_tokens"], choice["finish_reason"]


async def read_stream(response, outcome: Outcome) -> None:
    """Read the answer's chunks, counting its tokens (token ids: a dummy model's pieces may have no text)."""
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        if "error" in chunk:
            outcome.error = chunk["error"]
        for choice in chunk.get("choices", ()):
            # a token arrives as a chunk even when its text is empty (a dummy model's byte pieces): time the chunk
            if choice.get("token_ids") and outcome.first is None:
                outcome.first = time.monotonic()
            outcome.tokens += len(choice.get("token_ids") or ())
            if choice.get("finish_reason"):
                outcome.finish = choice["finish_reason"]
    outcome.done = time.monotonic()
    if outcome.first is None and outcome.tokens:
        outcome.first = outcome.done


@dataclass
class Result:
    arm: str
    outcomes: list[Outcome]
    seconds: float
    preemptions: int
    peak_kv: float
    peak_running: int
    mean_kv: float  # over the scrapes that answered, evenly spaced in time: the pool's use over the run
    mean_running: float
    guard: dict[str, float] = field(default_factory=dict)
    steps: int = 0  # the engine's scheduling steps (vllm:iteration_tokens_total's count): free of the machine's noise
    engine_means: dict[str, float] = field(default_factory=dict)  # ENGINE_LATENCIES' means over the run, in seconds

    @property
    def goodput(self) -> float:
        return sum(outcome.tokens for outcome in self.outcomes if outcome.complete) / self.seconds

    def slo_goodput(self, ttft: float, tpot: float) -> float:
        met = sum(1 for o in self.outcomes if o.complete and o.ttft <= ttft and o.tpot <= tpot)
        return met / self.seconds

    def summary(self) -> dict:
        e2e = [o.e2e for o in self.outcomes if o.complete]
        lengths: list[float] = [o.tokens for o in self.outcomes if o.complete]
        return {
            "arm": self.arm,
            "completed": sum(o.complete for o in self.outcomes),
            "sent": len(self.outcomes),
            "refused_then_retried": sum(o.refusals for o in self.outcomes),
            "refused_in_a_200_stream": sum(o.streamed_refusals for o in self.outcomes),
            "errors": sum(o.error is not None for o in self.outcomes),
            "seconds": round(self.seconds, 2),
            "goodput_tokens_per_s": round(self.goodput, 1),
            "preemptions": self.preemptions,
            "engine_steps": self.steps,
            "peak_kv_usage": round(self.peak_kv, 3),
            "peak_running": self.peak_running,
            "mean_kv_usage": round(self.mean_kv, 3),
            "mean_running": round(self.mean_running, 1),
            "p50_e2e_s": round(percentile(e2e, 0.5), 2),
            "p99_e2e_s": round(percentile(e2e, 0.99), 2),
            "lengths_p5_p50_p95": [percentile(lengths, q) for q in (0.05, 0.5, 0.95)] if lengths else None,
            **self.guard,
        }


GUARD_LINE = re.compile(
    r"kvops guard: in the last \d+ s: (\d+) queued for KV, \d+ max_tokens capped, \d+ kept waiting by the level, "
    r"(\d+) paused a step for blocks, (\d+) preempted \((\d+) tokens to recompute\), (\d+) past their projected length; "
    r"peak KV usage [\d.]+% \((\d+) of (\d+) blocks\)"
)


def guard_counts(log: str) -> dict[str, float]:
    """The guard's own counts in a stretch of its log (its summary lines), and its peak KV usage there."""
    totals: dict[str, float] = dict.fromkeys(
        ("queued_for_kv", "paused_steps", "guard_preempted", "recomputed_tokens", "mispredicted"), 0
    )
    peak = 0.0
    for match in GUARD_LINE.finditer(log):
        *counts, used, usable = match.groups()
        for key, value in zip(totals, counts):
            totals[key] += int(value)
        peak = max(peak, int(used) / int(usable))
    return {**totals, "guard_peak_kv_usage": round(peak, 3)}


class Sampler(threading.Thread):
    """/metrics every 0.1 s from a thread of its own, so the client's event loop never delays it. The API server
    answers late while it streams to many clients: a scrape that fails or times out is skipped, and the peaks
    are those of the scrapes that answered (the guard's own peak, from inside the engine, is exact)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.scrapes = url, threading.Event(), 0
        self.peak_kv = self.peak_running = self.sum_kv = self.sum_running = 0.0

    def run(self) -> None:
        import urllib.request

        while not self.stop.is_set():
            with suppress(OSError, ValueError, KeyError):
                with urllib.request.urlopen(self.url + "/metrics", timeout=2) as response:
                    values = gauges(response.read().decode())
                self.peak_kv = max(self.peak_kv, values["vllm:kv_cache_usage_perc"])
                self.peak_running = max(self.peak_running, values["vllm:num_requests_running"])
                self.sum_kv += values["vllm:kv_cache_usage_perc"]
                self.sum_running += values["vllm:num_requests_running"]
                self.scrapes += 1
            self.stop.wait(0.1)


async def run_jobs(server: VllmServer, name: str, jobs: list[Job]) -> Result:
    """Send `jobs` on their schedule, sample /metrics meanwhile, and read the guard's log lines."""
    import aiohttp

    log_start = len(server.log_text())
    before = gauges(server.metrics())
    histograms_before = server.metrics()
    sampler = Sampler(server.url)
    timeout = aiohttp.ClientTimeout(total=1800)
    # a connection per request: uvicorn closes idle keep-alive connections after 5 s, and a POST that aiohttp
    # writes on one it is closing fails ("Cannot write to closing transport") without reaching the engine
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        sampler.start()
        start = time.monotonic()
        outcomes = await asyncio.gather(*(send(session, server.url, str(server.model), job, start) for job in jobs))
        seconds = max(o.done or time.monotonic() for o in outcomes) - start
        sampler.stop.set()
        histograms_after = await asyncio.to_thread(server.metrics)
        # one small request after the run: the guard logs its summary when it drains
        await send(session, server.url, str(server.model), Job(0, [5, 6, 7], 2), time.monotonic())
    sampler.join()
    await asyncio.sleep(0.3)
    after = gauges(server.metrics())
    return Result(
        name,
        list(outcomes),
        seconds,
        int(after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"]),
        sampler.peak_kv,
        int(sampler.peak_running),
        sampler.sum_kv / max(1, sampler.scrapes),
        sampler.sum_running / max(1, sampler.scrapes),
        guard_counts(server.log_text()[log_start:]) if "scheduler-cls" in " ".join(server.args) else {},
        int(histogram_total(histograms_after, STEPS, "count") - histogram_total(histograms_before, STEPS, "count")),
        engine_means(histograms_before, histograms_after),
    )


STEPS = "vllm:iteration_tokens_total"  # a histogram of tokens per step: its count is the engine's scheduling steps
# vLLM's own latency histograms (vllm/v1/metrics/loggers.py, stats.py): TTFT and E2E from the API server's arrival
# stamp to the iteration that carried the token (the frontend's clock); TPOT between the engine core's stamps of a
# request's first and last token. None of them sees the client's read of the stream. Queue, prefill and inference
# are the engine core's alone: from its QUEUED stamp (the scheduler received the request) to its first SCHEDULED, from
# that to the first token's step, and to the last token's step; TTFT less queue and prefill is the two hand-offs
# between the API server and the engine core (the request in, the token out).
ENGINE_LATENCIES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
}


def histogram_total(metrics: str, name: str, part: str) -> float:
    """A histogram's _sum or _count so far (0 when the engine does not export it)."""
    match = re.search(rf"^{re.escape(name)}_{part}(?:\{{[^}}]*\}})? (\S+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def engine_means(before: str, after: str) -> dict[str, float]:
    """The mean of each of vLLM's latency histograms over the requests that finished between two scrapes."""
    means = {}
    for key, name in ENGINE_LATENCIES.items():
        count = histogram_total(after, name, "count") - histogram_total(before, name, "count")
        if count > 0:
            means[key] = (histogram_total(after, name, "sum") - histogram_total(before, name, "sum")) / count
    return means


def run(server: VllmServer, name: str, jobs: list[Job]) -> Result:
    return asyncio.run(run_jobs(server, name, jobs))


# --- the admission's cost per scheduling step --------------------------------------------------------------------


@contextmanager
def environment(**values: str):
    """These KVOPS_* variables for the scheduler built inside (it reads them once, at construction)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def step_cost(model: Path, running: int = 256, steps: int = 200) -> dict:
    """Median wall time of schedule() with `running` requests decoding and a queue waiting that does not fit,
    stock against the guard's two admissions: an in-process scheduler (a stand-in model runner samples one
    token per step), the pool just large enough for the running requests' prompt + max_tokens, seats to spare."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvops_vllm.scheduler import KVGuardScheduler
    from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

    rng = random.Random(1)
    prompts = [rng.randint(16, 512) for _ in range(running + 64)]
    pool = sum(-(-(prompt + 1000) // 16) for prompt in prompts[:running]) + 2
    figures = {}
    for name, cls, env in (
        ("stock", AsyncScheduler, {}),
        ("guard-v1", KVGuardScheduler, {"KVOPS_ADMISSION": "reserve"}),
        ("guard-v2, v3", KVGuardScheduler, {"KVOPS_ADMISSION": "peak"}),
    ):
        seats = running if cls is AsyncScheduler else 2 * running  # stock: its seats keep the queue waiting
        with environment(KVOPS_LOG_SECONDS="3600", **env):
            scheduler = build_scheduler(
                cls, model, num_blocks=pool, max_num_seqs=seats, max_num_batched_tokens=8192, max_model_len=2048
            )
        requests = Requests()
        driver = Driver(scheduler)
        for index in range(running):
            scheduler.add_request(requests.make(f"r{index}", prompts[index], 1000, first_token=index))
        while len(scheduler.running) < running or scheduler.waiting:
            driver.step()
        for index in range(running, running + 64):  # a queue that waits throughout
            scheduler.add_request(requests.make(f"r{index}", prompts[index], 1000, first_token=index))
        times = timed_steps(driver, steps)
        figures[name] = {
            "running": len(scheduler.running),
            "waiting": len(scheduler.waiting),
            "median_ms": round(statistics.median(times) * 1000, 3),
        }
    return figures


def burst_cost(model: Path, seed: int = 0) -> dict:
    """Wall time of each engine step's scheduling, schedule() and update_from_output as the engine core runs them,
    over workload (b)'s 160 requests queued at once on its pool of 31 usable 128-token blocks, each arm from a cold
    start (the guard learning lengths as requests end): what the guard's bookkeeping adds to a step where a pool
    holds few requests, which the simulator's step time does not price (it prices the batch alone)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvops_vllm.scheduler import KVGuardScheduler
    from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

    jobs = unknown_jobs(seed, 160, None)
    figures = {}
    for name, cls in (("stock", AsyncScheduler), ("guard-v2, v3", KVGuardScheduler)):
        with environment(KVOPS_LOG_SECONDS="3600"):
            scheduler = build_scheduler(
                cls, model, num_blocks=BLOCKS, block_size=128, max_num_seqs=256, max_model_len=MAX_MODEL_LEN
            )
        requests = Requests(block_size=128)
        driver = Driver(scheduler, lengths={f"r{index}": job.length for index, job in enumerate(jobs)})
        for index, job in enumerate(jobs):
            scheduler.add_request(requests.make(f"r{index}", len(job.prompt), job.limit, first_token=index, stops=True))
        times = []
        while scheduler.has_requests():
            begin = time.perf_counter()
            driver.step()
            times.append(time.perf_counter() - begin)
        figures[name] = {
            "steps": len(times),
            "preempted": driver.run.preemptions,
            "mean_ms": round(statistics.mean(times) * 1000, 3),
        }
    return figures


def timed_steps(driver, steps: int) -> list[float]:
    """Seconds each of `steps` schedule() calls took, driven as the engine core drives them."""
    scheduler, times = driver.scheduler, []
    schedule = scheduler.schedule

    def timed(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return schedule(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - begin)

    scheduler.schedule = timed
    for _ in range(steps):
        driver.step()
    return times


# --- the whole benchmark ------------------------------------------------------------------------------------


def engine_args(shape: dict, arm: Arm, blocks: int) -> list[str]:
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 2
    return [
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes",
        str(blocks * 128 * per_token),
        "--logits-processors",
        STOP_AT,
        *arm.args,
    ]


def parameters(shape: dict) -> int:
    """Weights touched per token, embeddings aside: what a forward pass costs per token, roughly."""
    hidden, layers = shape["hidden_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    attention = 2 * hidden * shape["num_attention_heads"] * shape["head_dim"] + 2 * hidden * kv
    return layers * (attention + 3 * hidden * shape["intermediate_size"]) + hidden * shape["vocab_size"]


@contextmanager
def engines(model: Path, shape: dict, pool: int, arm_list: list[Arm], logs: Path) -> Iterator[dict[str, VllmServer]]:
    """One engine per arm, started side by side and stopped on the way out; their logs `logs`-<arm>.log."""
    servers: dict[str, VllmServer] = {}
    try:
        for arm in arm_list:
            env = {"KVOPS_LOG_SECONDS": "1", **dict(arm.env)}
            server = VllmServer(
                model, logs.with_name(f"{logs.name}-{arm.name}.log"), args=engine_args(shape, arm, pool), env=env
            )
            servers[arm.name] = server.start()
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def warm_up(
    servers: dict[str, VllmServer], arm_list: list[Arm], seed: int, scale: int, cold: bool
) -> dict[str, Result]:
    """48 requests like (b)'s, all at once, on every engine: stock's goodput on them is the rate it sustains. Cold,
    each stops at its length as an exact-length request (no stop token): the machine warms up, and the guard
    learns no output length from it."""
    jobs = unknown_jobs(seed, 48 * scale, None)
    if cold:
        jobs = [replace(job, max_tokens=job.length, length=None) for job in jobs]
    return {arm.name: run(servers[arm.name], arm.name, jobs) for arm in arm_list}


def slo_targets(server: VllmServer, seed: int) -> dict[str, float]:
    """(c)'s SLO from five lone streamed requests on the stock engine (exact lengths: a lone request that stops at
    its first token has no TPOT)."""
    lone = [
        run(server, "stock", [Job(0, job.prompt, 128, stream=True)]).outcomes[0]
        for job in unknown_jobs(seed + 1000, 5, None)
    ]
    return {
        "ttft_s": round(10 * statistics.median(o.ttft for o in lone), 3),
        "tpot_s": round(3 * statistics.median(o.tpot for o in lone), 4),
    }


def rep_workloads(seed: int, scale: int, rate: float, chosen: str) -> dict[str, list[Job]]:
    """The repetition's requests of each chosen workload (a, b, n, c at four rates)."""
    workloads = {
        "a": exact_jobs(seed, 120 * scale),
        "b": unknown_jobs(seed, 160 * scale, 2 * rate),
        "n": unknown_jobs(seed, 160 * scale, 2 * rate, max_tokens=None),
        **{
            f"c{factor:g}": unknown_jobs(seed + 100, 60 * scale, factor * rate, stream=True)
            for factor in (0.5, 1, 1.5, 2)
        },
    }
    return {key: jobs for key, jobs in workloads.items() if key[0] in chosen}


def cold_groups(chosen: str) -> list[str]:
    """The workloads each set of fresh engines serves: exact lengths (a) teach the guard nothing, so they go with
    the first workload of unknown lengths; each of those needs engines of its own."""
    unknown = [workload for workload in "bn" if workload in chosen]
    exact = "a" if "a" in chosen else ""
    return [exact + workload for workload in unknown] if unknown else [exact]


def serve(servers, arm_list: list[Arm], rep: int, workloads: dict[str, list[Job]], slo: dict, rows: dict, label: str):
    """Every workload on every arm, the arms' order rotated by the repetition; a row per run into `rows`."""
    order = arm_list[rep % len(arm_list) :] + arm_list[: rep % len(arm_list)]  # rotate who goes first
    for workload, jobs in workloads.items():
        for arm in order:
            result = run(servers[arm.name], arm.name, jobs)
            row = {"workload": workload, "rep": rep, **result.summary()}
            if workload.startswith("c"):
                row["slo_goodput_rps"] = round(result.slo_goodput(slo["ttft_s"], slo["tpot_s"]), 3)
            rows.setdefault(workload, []).append(row)
            print(f"  {label} rep {rep} ({workload}) {arm.name}: {json.dumps(row)}", file=sys.stderr)


def bench_shape(name: str, shape: dict, pool: int, folder: Path, options) -> dict:
    """One shape on one pool: warm engines serving every repetition, or with --cold fresh ones per repetition."""
    model = build_model(folder / name, shape)
    scale = pool // BLOCKS  # requests in proportion to the pool: the same overload on a larger engine
    quantiles = [q for q in options.quantiles.split(",") if q]
    chosen = set(options.arms.split(",")) | {quantile_arm(q) for q in quantiles}
    arm_list = [arm for arm in arms(options.queue_cap * scale, quantiles, options.degrade_policy) if arm.name in chosen]
    label, rows = f"{name} pool {pool}", {}  # type: tuple[str, dict[str, list[dict]]]
    warm: dict[str, Result] = {}
    rate, slo = 0.0, {}
    runs = [(rep, group) for rep in range(options.reps) for group in cold_groups(options.workloads)]
    for rep, group in runs if options.cold else [(0, options.workloads)]:
        tag = f"-rep{rep}-{group}" if options.cold else ""
        with engines(model, shape, pool, arm_list, folder / f"{name}-{pool}{tag}") as servers:
            warmed = warm_up(servers, arm_list, options.seed, scale, options.cold)
            if not warm:
                warm, stock = warmed, warmed["stock"]
                rate = stock.summary()["completed"] / stock.seconds  # requests per second stock sustains, saturated
                slo = slo_targets(servers["stock"], options.seed)
            for each in [rep] if options.cold else range(options.reps):
                workloads = rep_workloads(options.seed + each, scale, rate, group)
                serve(servers, arm_list, each, workloads, slo, rows, label)
    return {
        "shape": name,
        "config": {key: shape[key] for key in ("num_hidden_layers", "hidden_size", "intermediate_size")},
        "parameters_per_token": parameters(shape),
        "pool_blocks": pool,
        "cold": options.cold,
        "stock_rate_rps": round(rate, 3),
        "slo": slo,
        "warmup": {arm: result.summary() for arm, result in warm.items()},
        "rows": rows,
    }


def arm_names(rows) -> list[str]:
    """The arms in `rows`, in the order of the first repetition (the arms' own order)."""
    return list(dict.fromkeys(row["arm"] for row in rows if row["rep"] == 0))


def medians(rows: list[dict], arm: str, key: str) -> float:
    values = [row[key] for row in rows if row["arm"] == arm and row.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def paired_ratio(rows: list[dict], arm: str, key: str, inverse: bool = False) -> float:
    """The median over repetitions of arm / stock (`inverse`: stock / arm), each ratio within one repetition (the
    arms of a repetition run back to back: the machine's slow drifts cancel in the ratio)."""
    stock = {row["rep"]: row[key] for row in rows if row["arm"] == "stock"}
    pairs = [(row[key], stock[row["rep"]]) for row in rows if row["arm"] == arm and stock.get(row["rep"])]
    ratios = [theirs / own if inverse else own / theirs for own, theirs in pairs if own or not inverse]
    return statistics.median(ratios) if ratios else float("nan")


def peak_kv(rows: list[dict], arm: str) -> str:
    """The guard's own peak (exact) where it reports one, else the sampled /metrics peak, marked ~."""
    own = medians(rows, arm, "guard_peak_kv_usage")
    return f"{own:.0%}" if not math.isnan(own) else f"~{medians(rows, arm, 'peak_kv_usage'):.0%}"


def print_costs(heading: str, arms: dict[str, dict], line: Callable[[dict], str]) -> None:
    """One scheduling-cost table (step_cost, burst_cost): its heading, then each arm's figures as `line` says them."""
    print(heading)
    for arm, figures in arms.items():
        print(f"  {arm:<13} {line(figures)}")


def print_shape(result: dict) -> None:
    """One shape and pool's table, printed as soon as it is measured (a long run cut short keeps what it had)."""
    base = parameters(SHAPES["tiny"])
    config = result["config"]
    print(
        f"\n{result['shape']}, pool {result['pool_blocks']}: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, MLP "
        f"{config['intermediate_size']} ({result['parameters_per_token'] / base:.1f}x the test model's weights per "
        f"token); KV {result['pool_blocks'] - 1} usable blocks of 128 tokens; stock sustains {result['stock_rate_rps']} req/s; SLO TTFT "
        f"{result['slo']['ttft_s']} s, TPOT {result['slo']['tpot_s'] * 1000:.0f} ms"
    )
    if result.get("cold"):
        print("  cold: fresh engines every repetition, warmed with exact lengths only (the guard learned nothing)")
    header = (
        f"  {'workload':<8} {'arm':<15} {'goodput':>9} {'vs stock':>8} {'in steps':>8} {'preempt':>7} {'paused':>7} {'recomp':>7} "
        f"{'mispred':>7} {'peak KV':>7} {'mean KV':>7} {'running':>7} {'p99 e2e':>8} {'vs stock':>8} {'refused':>7} {'lengths p5/50/95':>17}"
    )
    print(header)
    for workload in ("a", "b", "n"):
        rows = result["rows"].get(workload)
        for arm in arm_names(rows or ()):
            lengths = next((row["lengths_p5_p50_p95"] for row in rows if row["arm"] == arm), None) or ["-"] * 3
            print(
                f"  {workload:<8} {arm:<15} {medians(rows, arm, 'goodput_tokens_per_s'):>7.0f}/s "
                f"{paired_ratio(rows, arm, 'goodput_tokens_per_s'):>8.2f} "
                f"{paired_ratio(rows, arm, 'engine_steps', inverse=True):>8.2f} "
                f"{medians(rows, arm, 'preemptions'):>7.0f} {_figure(medians(rows, arm, 'paused_steps')):>7} {_figure(medians(rows, arm, 'recomputed_tokens')):>7} "
                f"{_figure(medians(rows, arm, 'mispredicted')):>7} {peak_kv(rows, arm):>7} "
                f"{medians(rows, arm, 'mean_kv_usage'):>7.0%} {medians(rows, arm, 'mean_running'):>7.1f} "
                f"{medians(rows, arm, 'p99_e2e_s'):>7.1f}s {paired_ratio(rows, arm, 'p99_e2e_s'):>8.2f} "
                f"{medians(rows, arm, 'refused_then_retried'):>7.0f} {'/'.join(str(x) for x in lengths):>17}"
            )
    factors = sorted({key for key in result["rows"] if key.startswith("c")}, key=lambda key: float(key[1:]))
    if not factors:
        return
    print(
        f"  (c) SLO goodput, req/s meeting both targets, at {', '.join(f[1:] + 'x' for f in factors)} stock's rate"
        " (median; in brackets the median ratio to stock):"
    )
    for arm in arm_names(result["rows"][factors[0]]):
        curve = [
            f"{medians(result['rows'][factor], arm, 'slo_goodput_rps'):5.2f} "
            f"({paired_ratio(result['rows'][factor], arm, 'slo_goodput_rps'):4.2f})"
            for factor in factors
        ]
        print(f"  {'c':<8} {arm:<15} " + "  ".join(curve))


def _figure(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,8x", help="comma-separated: tiny, 8x (default both)")
    parser.add_argument("--workloads", default="abc", help="which of a, b, c (default all: abc)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="write the models and engine logs here, and keep them")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pools",
        default=str(BLOCKS),
        help=f"comma-separated KV pools in blocks of 128 tokens, multiples of {BLOCKS}; the requests scale with each "
        f"(default {BLOCKS})",
    )
    parser.add_argument(
        "--queue-cap", type=int, default=12, help="stock+caps: --max-num-queued-reqs per 32 blocks of pool (default 12)"
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)} (default all)")
    parser.add_argument(
        "--quantiles", default="", help="guard v3 also at these KVOPS_OUTPUT_QUANTILE values, as more arms, e.g. 0.95"
    )
    parser.add_argument("--degrade-policy", help="the policy YAML of the stock+degrade arm [default: the shipped one]")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="fresh engines for every repetition (and each of b, n), warmed with exact lengths only: nothing learned",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--step-cost-only", action="store_true")
    options = parser.parse_args()
    names = [name.strip() for name in options.shapes.split(",") if name.strip()]
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        parser.error(f"--shapes {unknown[0]!r}; valid: {', '.join(SHAPES)}")
    chosen = options.arms.split(",")
    if "stock" not in chosen or not set(chosen) <= set(ARMS):
        parser.error(f"--arms {options.arms!r}: stock (the baseline) and any of {', '.join(ARMS[1:])}")
    if options.cold and "c" in options.workloads:
        parser.error("--cold measures workloads a, b and n (c's four rates on one engine would not stay cold)")
    pools = options.pools.split(",")
    if not all(pool.strip().isdigit() and int(pool) >= BLOCKS and int(pool) % BLOCKS == 0 for pool in pools):
        parser.error(f"--pools {options.pools!r}: multiples of {BLOCKS} blocks, comma-separated")
    results = []
    with tempfile.TemporaryDirectory(prefix="guard-goodput-") as scratch:
        folder = options.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        scheduler_model = build_model(folder / "scheduler-model")
        step, burst = step_cost(scheduler_model), burst_cost(scheduler_model)
        if not options.json:
            print_costs(
                "admission cost per scheduling step, 256 requests running and a queue waiting (in-process scheduler):",
                step,
                lambda f: f"{f['median_ms']:>7.3f} ms per schedule() ({f['running']} running, {f['waiting']} waiting)",
            )
            print_costs(
                "scheduling per engine step, workload (b)'s 160 requests at once on 31 blocks, cold (in-process):",
                burst,
                lambda f: (
                    f"{f['mean_ms']:>7.3f} ms per step (schedule + update_from_output; {f['steps']:,} steps, "
                    f"{f['preempted']} preempted)"
                ),
            )
        measured = [] if options.step_cost_only else [(name, int(pool)) for name in names for pool in pools]
        for name, pool in measured:
            results.append(bench_shape(name, SHAPES[name], pool, folder, options))
            if not options.json:
                print_shape(results[-1])
                sys.stdout.flush()
    if options.json:
        print(
            json.dumps(
                {"seed": options.seed, "reps": options.reps, "step_cost": step, "burst_cost": burst, "shapes": results},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
