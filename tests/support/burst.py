"""An overload burst against a real OpenAI-compatible engine: the same requests every time (fixed seed), released
to the scheduler at once and in the same order, with the engine's /metrics sampled while they run. Shared by the KV
guard's tests, the simulator's engine test and their benchmarks."""

from __future__ import annotations

import http.client
import json
import math
import random
import re
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

GAUGES = (
    "vllm:num_preemptions_total",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
)


@dataclass(frozen=True)
class BurstRequest:
    prompt: list[int]  # token ids, so the prompt length is exact
    max_tokens: int


@dataclass
class Answer:
    status: int
    finish_reason: str | None
    completion_tokens: int
    seconds: float  # end to end, as the client sees it
    error: str | None = None
    client_port: int = 0  # the client's end of the connection, as the engine's access log names it


@dataclass
class BurstRun:
    requests: list[BurstRequest]
    answers: list[Answer]
    seconds: float  # until the last answer
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # (seconds since start, gauges)
    preemptions: int = 0

    @property
    def complete(self) -> list[Answer]:
        """Answers that generated every token asked for (ignore_eos: finish_reason "length")."""
        return [
            a
            for a, r in zip(self.answers, self.requests)
            if a.finish_reason == "length" and a.completion_tokens == r.max_tokens
        ]

    def peak(self, gauge: str) -> float:
        return max((sample[gauge] for _, sample in self.samples), default=0.0)

    @property
    def waiting_drained_seconds(self) -> float:
        """Burst start until vllm:num_requests_waiting was last seen above 0."""
        return next((at for at, sample in reversed(self.samples) if sample["vllm:num_requests_waiting"] > 0), 0.0)


def burst(
    count: int, seed: int, *, prompt_tokens: tuple[int, int] = (32, 384), new_tokens: tuple[int, int] = (64, 640)
) -> list[BurstRequest]:
    """Mixed lengths: prompts of random token ids, and a random max_tokens, each drawn uniformly from the ranges."""
    rng = random.Random(seed)
    return [
        BurstRequest([rng.randrange(10, 500) for _ in range(rng.randint(*prompt_tokens))], rng.randint(*new_tokens))
        for _ in range(count)
    ]


def complete(
    url: str, model: str, request: BurstRequest, request_id: str | None = None, timeout: float = 1800
) -> Answer:
    """`request` as a completion on a connection of its own; `request_id`, when given, as its X-Request-Id header."""
    body = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    headers = {"Content-Type": "application/json", **({"X-Request-Id": request_id} if request_id else {})}
    address = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=timeout)
    started = time.monotonic()
    try:
        connection.connect()
        port = connection.sock.getsockname()[1]
        connection.request("POST", "/v1/completions", json.dumps(body), headers)
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    seconds = time.monotonic() - started
    if response.status != 200:
        return Answer(response.status, None, 0, seconds, payload.decode(errors="replace")[:300], port)
    answer = json.loads(payload)
    choice = answer["choices"][0]
    return Answer(response.status, choice["finish_reason"], answer["usage"]["completion_tokens"], seconds, None, port)


def served_order(server, answers: list[Answer], since: int) -> list[int]:
    """The indices of `answers` in the order vLLM's API server answered them, from its access log after byte
    `since` (uvicorn logs each response as it starts it, `INFO: 127.0.0.1:PORT - "POST ..." 200 OK`, and the API
    server answers in the order the engine finished them): unlike the time an answer reaches its client, this order
    holds however long the machine keeps the client from running."""
    where = {answer.client_port: index for index, answer in enumerate(answers)}
    ports = re.findall(r'127\.0\.0\.1:(\d+) - "POST /v1/completions', server.log_after(since))
    return [where[int(port)] for port in ports if int(port) in where]


def gauges(metrics_text: str) -> dict[str, float]:
    values = {}
    for name in GAUGES:
        match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", metrics_text, re.MULTILINE)
        values[name] = float(match.group(1)) if match else 0.0
    return values


def engine_call(server, path: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(server.url + path, b"", method="POST"), timeout=300):
        pass


def release_together(server, pool: ThreadPoolExecutor, count: int, send: Callable[[int, str], T]) -> list[Future[T]]:
    """`send(index, request_id)` for `count` requests that reach vLLM's scheduler together and in index order,
    however busy the machine: the scheduler paused (POST /pause?mode=keep), each request sent once the engine has
    added the one before (it logs "Added request <id>"), then resumed (POST /resume) before this returns; `server` is
    a VllmServer, which starts vLLM so (vllm/entrypoints/rl/online/api_router.py, vllm/v1/engine/async_llm.py).
    `send` passes request_id as the X-Request-Id header, from which vLLM builds its own
    (vllm/entrypoints/serve/engine/serving.py: `_base_request_id`)."""
    tag, since = uuid.uuid4().hex[:8], server.log_size()
    answers: list[Future[T]] = []
    engine_call(server, "/pause?mode=keep")
    try:
        for index in range(count):
            request_id = f"burst-{tag}-r{index}"
            answers.append(pool.submit(send, index, request_id))
            server.wait_logged(f"Added request cmpl-{request_id}-", since)
    finally:
        engine_call(server, "/resume")
    return answers


def run_burst(server, requests: list[BurstRequest], sample_every: float = 0.25) -> BurstRun:
    """Release every request at once to `server` (a VllmServer, `release_together`) and wait for all answers."""
    model = str(server.model)
    before = gauges(server.metrics())["vllm:num_preemptions_total"]
    samples: list[tuple[float, dict[str, float]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic() - started, gauges(server.metrics())))
            done.wait(sample_every)

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        sent = release_together(
            server,
            pool,
            len(requests),
            lambda index, request_id: complete(server.url, model, requests[index], request_id),
        )
        started = time.monotonic()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        answers = [answer.result() for answer in sent]
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    after = gauges(server.metrics())
    samples.append((time.monotonic() - started, after))
    return BurstRun(requests, answers, seconds, samples, int(after["vllm:num_preemptions_total"] - before))


def percentile(values: list[float], fraction: float) -> float:
    """Nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]
