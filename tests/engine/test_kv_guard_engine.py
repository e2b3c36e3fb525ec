"""The KV guard in the real vLLM engine (CPU build): `--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler`,
the same 4 MiB pool as the stock `vllm_engine` (31 usable blocks of 128 tokens), what the HTTP client receives."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from kvops.policy import Level, Limits
from tests.support.burst import BurstRequest, burst, gauges, release_together, run_burst
from tests.support.vllm_server import DEFAULT_KV_BYTES, VllmServer

pytestmark = pytest.mark.vllm


def post(engine, path: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(
        engine.url + path,
        json.dumps({"model": str(engine.model), **body}).encode(),
        {"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def completion(engine, **body) -> dict:
    status, text = post(
        engine, "/v1/completions", {"prompt": "the cache grows with every token", "ignore_eos": True, **body}
    )
    assert status == 200, text
    return json.loads(text)


@contextmanager
def watcher_at(endpoint, level: str, usage: float, limits: Limits | None = None):
    """The followed watcher answers `level` until the block ends (3 reads: the follower holds the new answer)."""
    endpoint.follow(level, usage, limits=limits)
    endpoint.wait_reads(3)
    try:
        yield
    finally:
        endpoint.follow("ok", 0.0)
        endpoint.wait_reads(3)


def test_the_guard_starts_and_says_how_it_admits(kv_guard_engine):
    log = kv_guard_engine.log_text()
    assert "Using custom scheduler class kvops_vllm.scheduler.KVGuardScheduler" in log
    assert "kvops guard: admitting by the future peak of the whole batch (lengths: max_tokens where known" in log
    assert "over 31 usable blocks, headroom 0; groups: full attention (128-token blocks); policy " in log
    assert (
        "policy.yaml (warn 70%, degrade 85%, critical 95%); levels from own KV usage, and the watcher at http://127.0.0.1:"
        in log
    )


def test_an_overload_burst_preempts_on_stock_and_queues_on_the_guard(vllm_engine, kv_guard_engine):
    # 24 requests at once, 32-384 prompt tokens and 64-512 new tokens each (within the policy's warn cap, so a
    # request that reaches the engine after usage passed 70% is not capped: every answer is complete either way).
    requests = burst(24, seed=7, new_tokens=(64, 512))
    stock = run_burst(vllm_engine, requests)
    since = kv_guard_engine.log_size()
    guarded = run_burst(kv_guard_engine, requests)

    assert stock.preemptions > 0
    assert guarded.preemptions == 0
    assert len(guarded.complete) == len(requests)  # every request admitted, and each got all its tokens
    # it queued instead, as its first step's summary says (the engine's own log: a /metrics sample of the waiting
    # queue can miss it where the machine keeps the API server from running)
    assert re.search(r"kvops guard: in the last [^:]*: [1-9]\d* queued for KV", kv_guard_engine.log_after(since))
    drained = gauges(kv_guard_engine.metrics())
    assert drained["vllm:num_requests_waiting"] == drained["vllm:num_requests_running"] == 0


def test_the_warn_cap_reaches_the_client(kv_guard_engine, policy_endpoint):
    with watcher_at(policy_endpoint, "warn", 0.75, Limits(Level.WARN, max_tokens_cap=16)):
        answer = completion(kv_guard_engine, max_tokens=40)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 16
    assert "kvops guard: level ok -> warn (watcher at 75.0%): capped at 16 new tokens" in kv_guard_engine.log_text()
    assert completion(kv_guard_engine, max_tokens=40)["usage"]["completion_tokens"] == 40  # back at ok


def in_background(call, *args, **kwargs) -> Future:
    return ThreadPoolExecutor(1).submit(call, *args, **kwargs)


def still_waiting(*answers: Future, seconds: float = 3.0) -> bool:
    """None of `answers` came back within `seconds` (the guard polls the watcher every 0.2 s and steps meanwhile)."""
    time.sleep(seconds)
    return not any(answer.done() for answer in answers)


def ended_badly(engine) -> dict[str, float]:
    """vLLM's count of requests that finished as an abort or an error, by reason."""
    pattern = r'^vllm:request_success_total\{[^}]*finished_reason="(abort|error)"[^}]*\} (\S+)$'
    return {reason: float(count) for reason, count in re.findall(pattern, engine.metrics(), re.MULTILINE)}


def test_degrade_runs_n_one_sequence_at_a_time(kv_guard_engine, policy_endpoint):
    """Degrade holds the n>1 siblings after the first in the queue (none is answered empty); they run once the
    level drops, each with every token it asked for."""
    with watcher_at(policy_endpoint, "degrade", 0.9):
        answer = in_background(completion, kv_guard_engine, max_tokens=20, n=3)
        assert still_waiting(answer)
    choices = answer.result(timeout=300)["choices"]
    assert [(choice["finish_reason"], choice["stop_reason"]) for choice in choices] == [("length", None)] * 3
    assert answer.result()["usage"]["completion_tokens"] == 60
    assert (
        "-> degrade (watcher at 90.0%): capped at 512 new tokens, run one sequence at a time"
        in kv_guard_engine.log_text()
    )


def test_critical_holds_new_requests_in_the_queue_and_never_answers_them_empty(kv_guard_engine, policy_endpoint):
    """At critical the guard, a scheduler, cannot answer a request: it keeps new ones waiting (never a 200 without
    tokens, never a 500); they are served when the level drops. A retryable 503/429 is the proxy's answer
    (test_proxy_engine.py)."""
    before = ended_badly(kv_guard_engine)
    with watcher_at(policy_endpoint, "critical", 0.97):
        plain = in_background(completion, kv_guard_engine, max_tokens=20)
        chat = in_background(
            post,
            kv_guard_engine,
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "ignore_eos": True},
        )
        stream = in_background(
            post,
            kv_guard_engine,
            "/v1/completions",
            {"prompt": "the cache", "max_tokens": 20, "ignore_eos": True, "stream": True},
        )
        assert still_waiting(plain, chat, stream)
        with urllib.request.urlopen(kv_guard_engine.url + "/health", timeout=10) as health:
            assert health.status == 200
        assert gauges(kv_guard_engine.metrics())["vllm:num_requests_waiting"] == 3

    assert plain.result(timeout=300)["usage"]["completion_tokens"] == 20
    status, text = chat.result(timeout=300)
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 20
    status, text = stream.result(timeout=300)
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(event) for event in events[:-1]]
    assert status == 200 and events[-1] == "[DONE]" and not any("error" in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    log = kv_guard_engine.log_text()
    assert (
        "-> critical (watcher at 97.0%): capped at 512 new tokens" in log
        and "held in the queue unless protected" in log
    )
    assert "kvops guard: level critical -> ok (watcher at 0.0%): no limits" in log
    assert "EngineCore encountered a fatal error" not in log
    assert ended_badly(kv_guard_engine) == before  # nothing finished as an abort or an error


def test_an_unusable_watcher_leaves_the_level_to_own_usage(kv_guard_engine, policy_endpoint):
    policy_endpoint.serve(b"not json")
    policy_endpoint.wait_reads(3)
    try:
        assert completion(kv_guard_engine, max_tokens=24)["usage"]["completion_tokens"] == 24  # own usage: ok
    finally:
        policy_endpoint.follow("ok", 0.0)
        policy_endpoint.wait_reads(3)
    log = kv_guard_engine.log_text()
    assert (
        f"kvops guard: watcher at {policy_endpoint.url} unusable (body is not JSON); levels from own KV usage until it answers"
        in log
    )
    deadline = time.monotonic() + 10
    while log.count(f"kvops guard: following the watcher at {policy_endpoint.url}") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        log = kv_guard_engine.log_text()
    assert log.count(f"kvops guard: following the watcher at {policy_endpoint.url}") >= 2


def test_a_misprediction_falls_back_to_preemption_without_hanging(kv_guard_engine):
    """The past says requests end after a token or two (stop tokens covering most of the vocabulary); then 12
    requests whose stop string never appears (EOS ignored) run to max_tokens, past every projection, 48 blocks' worth in a pool
    of 31: the guard pauses the overflow in place or vLLM preempts, and every request still gets all its tokens."""
    with ThreadPoolExecutor(12) as pool:
        short = {"max_tokens": 64, "temperature": 1.0, "stop_token_ids": list(range(20, 500))}
        list(pool.map(lambda i: post(kv_guard_engine, "/v1/completions", {"prompt": f"past {i}", **short}), range(40)))
        long = {"max_tokens": 400, "temperature": 1.0, "ignore_eos": True, "stop": ["never in this text: 0x5eed"]}
        prompt = "the cache grows with every token " * 4

        def send(index: int, request_id: str) -> dict:
            return completion_unknown(kv_guard_engine, prompt, long, request_id)

        # released together: on the loaded 2-core machine, twelve sends spread by the client did not overlap enough
        # to outgrow the pool once (peak 13%: nothing paused, nothing preempted)
        answers = [answer.result() for answer in release_together(kv_guard_engine, pool, 12, send)]
    assert [answer["usage"]["completion_tokens"] for answer in answers] == [400] * 12
    log = kv_guard_engine.log_text()
    assert re.search(r"kvops guard: in the last .*, [1-9]\d* past their projected length", log)
    assert re.search(r"kvops guard: in the last .*, ([1-9]\d* paused a step for blocks|[1-9]\d* preempted)", log)


def test_unknown_lengths_end_where_the_engine_samples_the_stop_and_the_overflow_waits(kv_guard_engine):
    """bench/guard_goodput.py's unknown-length requests, 24 at once: each may stop (a stop token), and the engine
    samples the stop as its seeded last token (tests/support/stop_at.py), which the scheduler cannot see. 24 of
    them hold more than the pool at their max_tokens: every one ends at its length, the rest wait."""
    lengths = [5 + 37 * i % 300 for i in range(24)]
    body = {"max_tokens": 600, "ignore_eos": True, "stop_token_ids": [11], "temperature": 0}
    prompt = "the cache grows with every token " * 4
    with ThreadPoolExecutor(24) as pool:
        answers = list(
            pool.map(
                lambda length: completion_unknown(kv_guard_engine, prompt, {**body, "vllm_xargs": {"stop_at": length}}),
                lengths,
            )
        )
    assert [answer["usage"]["completion_tokens"] for answer in answers] == lengths
    assert {answer["choices"][0]["finish_reason"] for answer in answers} == {"stop"}


def completion_unknown(engine, prompt: str, body: dict, request_id: str | None = None) -> dict:
    headers = {"X-Request-Id": request_id} if request_id else {}
    status, text = post(engine, "/v1/completions", {"prompt": prompt, **body}, headers)
    assert status == 200, text
    return json.loads(text)


# --- a freshly started engine: nothing learned yet -------------------------------------------------------------

STOP_AT = ["--logits-processors", "tests.support.stop_at:StopAt"]  # a request ends where its vllm_xargs say


@pytest.fixture(scope="module")
def fresh_engines(tiny_model, tmp_path_factory):
    """A stock and a guarded engine started for this module alone, side by side (vllm_engine's pool): the guard
    has seen no request end."""
    args = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES), *STOP_AT]
    logs = tmp_path_factory.mktemp("logs")
    stock = VllmServer(tiny_model, logs / "vllm-fresh-stock.log", args=args)
    guard = VllmServer(
        tiny_model,
        logs / "vllm-fresh-guard.log",
        args=[*args, "--scheduler-cls", "kvops_vllm.scheduler.KVGuardScheduler"],
        env={"KVOPS_LOG_SECONDS": "1"},
    )
    try:
        stock.start(), guard.start()
        yield stock.wait_ready(), guard.wait_ready()
    finally:
        stock.stop(), guard.stop()


def engine_steps(engine) -> float:
    """Scheduling steps the engine has run: the count of vLLM's histogram of tokens per step."""
    match = re.search(r"^vllm:iteration_tokens_total_count(?:\{[^}]*\})? (\S+)$", engine.metrics(), re.MULTILINE)
    assert match, "vllm:iteration_tokens_total is not in /metrics"
    return float(match.group(1))


def unknown_lengths_burst(engine, requests: list[BurstRequest]) -> tuple[list[dict], float, float]:
    """`requests` released at once (`release_together`) with a stop token, each stopping after its max_tokens tokens
    (unknown to the scheduler) and allowed the rest of the context (what vLLM's API server gives a chat request sent
    without max_tokens; its /v1/completions reads a null as 16): the answers, the engine's steps and preemptions
    meanwhile."""
    body = {"ignore_eos": True, "stop_token_ids": [11], "temperature": 0}

    def send(index: int, request_id: str) -> dict:
        request = requests[index]
        limits = {"max_tokens": 1024 - len(request.prompt), "vllm_xargs": {"stop_at": request.max_tokens}}
        return completion_unknown(engine, request.prompt, {**body, **limits}, request_id)

    steps, preempted = engine_steps(engine), gauges(engine.metrics())["vllm:num_preemptions_total"]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = [answer.result() for answer in release_together(engine, pool, len(requests), send)]
    return (
        answers,
        engine_steps(engine) - steps,
        gauges(engine.metrics())["vllm:num_preemptions_total"] - preempted,
    )


def test_a_fresh_guarded_engine_serves_a_burst_of_unknown_lengths_in_stocks_steps(fresh_engines):
    """The overload burst above, its lengths unknown and each allowed the rest of the context (no max_tokens sent),
    on engines that have served nothing: the guard admits and preempts as stock vLLM does until requests
    have ended, so it takes stock's steps (projected at the whole context, it served them about one at a time).
    Steps, counted by the engine, not seconds, and the burst released at once in one order to both: the 2-core
    machine's noise does not reach them."""
    stock, guard = fresh_engines
    requests = burst(24, seed=7, new_tokens=(64, 512))
    runs = {name: unknown_lengths_burst(engine, requests) for name, engine in (("stock", stock), ("guard", guard))}
    for answers, _, _ in runs.values():
        assert [answer["usage"]["completion_tokens"] for answer in answers] == [r.max_tokens for r in requests]
        assert {answer["choices"][0]["finish_reason"] for answer in answers} == {"stop"}
    (_, stock_steps, stock_preempted), (_, guard_steps, guard_preempted) = runs["stock"], runs["guard"]
    assert stock_preempted > 0  # the burst overloads the pool
    assert (guard_steps, guard_preempted) == (stock_steps, stock_preempted)  # 959 steps and 15 preemptions each
    assert "by what they hold now, as stock vLLM admits, until 32 ended" in guard.log_text()
