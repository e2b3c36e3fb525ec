"""The KV guard in the real vLLM engine (CPU build): `--scheduler-cls kvops_vllm.scheduler.KVGuardScheduler`,
the same 4 MiB pool as the stock `vllm_engine` (31 usable blocks of 128 tokens), what the HTTP client receives."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from kvops.policy import Level, Limits
from tests.support.burst import burst, gauges, run_burst

pytestmark = pytest.mark.vllm


def post(engine, path: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        engine.url + path,
        json.dumps({"model": str(engine.model), **body}).encode(),
        {"Content-Type": "application/json"},
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
    assert (
        "kvops guard: admitting by projected KV (prompt + max_tokens) over 31 usable blocks, headroom 0; "
        "groups: full attention (128-token blocks); policy "
    ) in log
    assert (
        "policy.yaml (warn 70%, degrade 85%, critical 95%); levels from own KV usage, and the watcher at http://127.0.0.1:"
        in log
    )


def test_an_overload_burst_preempts_on_stock_and_queues_on_the_guard(vllm_engine, kv_guard_engine):
    # 24 requests at once, 32-384 prompt tokens and 64-512 new tokens each (within the policy's warn cap, so a
    # request that reaches the engine after usage passed 70% is not capped: every answer is complete either way).
    requests = burst(24, seed=7, new_tokens=(64, 512))
    stock = run_burst(vllm_engine, requests)
    guarded = run_burst(kv_guard_engine, requests)

    assert stock.preemptions > 0
    assert guarded.preemptions == 0
    assert len(guarded.complete) == len(requests)  # every request admitted, and each got all its tokens
    assert guarded.peak("vllm:num_requests_waiting") > 0  # it queued instead
    drained = gauges(kv_guard_engine.metrics())
    assert drained["vllm:num_requests_waiting"] == drained["vllm:num_requests_running"] == 0


def test_the_warn_cap_reaches_the_client(kv_guard_engine, policy_endpoint):
    with watcher_at(policy_endpoint, "warn", 0.75, Limits(Level.WARN, max_tokens_cap=16)):
        answer = completion(kv_guard_engine, max_tokens=40)
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 16
    assert "kvops guard: level ok -> warn (watcher at 75.0%): max_tokens capped at 16" in kv_guard_engine.log_text()
    assert completion(kv_guard_engine, max_tokens=40)["usage"]["completion_tokens"] == 40  # back at ok


def test_degrade_serves_n_as_one_sequence(kv_guard_engine, policy_endpoint):
    with watcher_at(policy_endpoint, "degrade", 0.9):
        answer = completion(kv_guard_engine, max_tokens=20, n=3)
        status, stream = post(
            kv_guard_engine,
            "/v1/completions",
            {"prompt": "the cache", "max_tokens": 10, "n": 3, "ignore_eos": True, "stream": True},
        )
    first, *others = sorted(answer["choices"], key=lambda choice: choice["index"])
    assert first["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 20
    for choice in others:
        assert (choice["finish_reason"], choice["text"]) == ("abort", "")
        assert choice["stop_reason"] == "kvops: KV cache degrade (watcher at 90.0%): n>1 served as one sequence"
    chunks = [json.loads(line[len("data: ") :]) for line in stream.splitlines() if line.startswith("data: {")]
    assert status == 200 and {choice["index"] for chunk in chunks for choice in chunk["choices"]} == {0}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_critical_rejects_with_a_clear_reason_and_the_engine_stays_up(kv_guard_engine, policy_endpoint):
    reason = "kvops: KV cache critical (watcher at 97.0%): request rejected; retry after 10 s"
    with watcher_at(policy_endpoint, "critical", 0.97):
        plain = completion(kv_guard_engine, max_tokens=20)
        status, chat = post(
            kv_guard_engine, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
        )
        stream_status, stream = post(
            kv_guard_engine, "/v1/completions", {"prompt": "the cache", "max_tokens": 20, "stream": True}
        )

    choice = plain["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"], plain["usage"]["completion_tokens"]) == ("abort", reason, 0)
    assert status == 200 and json.loads(chat)["choices"][0]["stop_reason"] == reason
    # A stream drops a token-less "abort"; the guard finishes a streamed request as an error, which the stream shows.
    events = [line[len("data: ") :] for line in stream.splitlines() if line.startswith("data: ")]
    assert stream_status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 500

    with urllib.request.urlopen(kv_guard_engine.url + "/health", timeout=10) as health:
        assert health.status == 200
    assert completion(kv_guard_engine, max_tokens=12)["usage"]["completion_tokens"] == 12
    log = kv_guard_engine.log_text()
    # A level is re-read when the engine has work, so the line names the level it left as the engine last saw it.
    assert (
        "-> critical (watcher at 97.0%): max_tokens capped at 512, n>1 served as one sequence, new requests rejected"
        in log
    )
    assert "kvops guard: level critical -> ok (watcher at 0.0%): no limits" in log
    assert "EngineCore encountered a fatal error" not in log
    finished = {
        reason: float(count)
        for reason, count in re.findall(
            r'^vllm:request_success_total\{[^}]*finished_reason="(\w+)"[^}]*\} (\S+)$',
            kv_guard_engine.metrics(),
            re.MULTILINE,
        )
    }
    assert finished["abort"] >= 2 and finished["error"] >= 1  # what an operator sees of the rejections in /metrics


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
