"""The degrade inside vLLM's own API server: the real vLLM CPU engine started with `--middleware
kvops_vllm.middleware.KVOpsMiddleware` (tests/conftest.py `middleware_engine`: the stock scheduler, the 4 MiB pool of
31 usable blocks of 128 tokens, a 15 s dwell), real KV load in stages (tests/support/kv_load.py), and what a client
of that same server receives at each level."""

from __future__ import annotations

import time

import pytest

from tests.support.kv_load import DEGRADE, FULL, WARN, KvLoad

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")

pytestmark = pytest.mark.vllm


def probe(engine, priority: int | None = None, **fields) -> requests.Response:
    body = {"model": str(engine.model), "prompt": "the cache grows", "ignore_eos": True, **fields}
    headers = {} if priority is None else {"X-KVops-Priority": str(priority)}
    return requests.post(engine.url + "/v1/completions", json=body, headers=headers, timeout=300)


RANK = {"ok": 0, "warn": 1, "degrade": 2, "critical": 3}


def wait_level(engine, level: str, timeout: float = 180) -> str:
    """Probe (one token each) until the middleware's level is `level` or above; the level it answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = probe(engine, max_tokens=1).headers["X-KVops-Level"]
        if RANK[seen] >= RANK[level]:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"the middleware did not reach {level} in {timeout:.0f} s; log:\n{engine.log_tail()}")


def wait_ok(engine, timeout: float = 120) -> None:
    """Until the level is ok (after a load, usage falls at once and the level after the 15 s dwell)."""
    deadline = time.monotonic() + timeout
    while probe(engine, max_tokens=1).headers["X-KVops-Level"] != "ok":
        assert time.monotonic() < deadline, engine.log_tail()
        time.sleep(1)


def test_three_levels_from_the_servers_own_kv_usage_then_back_to_ok(middleware_engine):
    engine = middleware_engine
    wait_ok(engine)  # the engine is the session's: another test's load may have raised the level
    response = probe(engine, max_tokens=4, n=2)
    assert response.status_code == 200 and response.headers["X-KVops-Level"] == "ok"
    assert len(response.json()["choices"]) == 2 and "X-KVops-Clamped" not in response.headers

    load = KvLoad(engine.url, str(engine.model)).start(WARN)
    try:
        if wait_level(engine, "warn") == "warn":
            response = probe(engine, max_tokens=600)
            if response.headers["X-KVops-Level"] in ("warn", "degrade"):  # it may have risen meanwhile
                assert response.headers["X-KVops-Clamped"] == "max_tokens 600->512"
                assert response.json()["usage"]["completion_tokens"] == 512  # what vLLM ran

        load.switch(DEGRADE)
        if wait_level(engine, "degrade") == "degrade":
            response = probe(engine, max_tokens=4, n=3)
            if response.headers["X-KVops-Level"] == "degrade":
                assert response.headers["X-KVops-Clamped"] == "n 3->1" and len(response.json()["choices"]) == 1
            shed = probe(engine, priority=5, max_tokens=4)
            if shed.headers["X-KVops-Level"] == "degrade":  # sheddable: 429 from degrade
                assert shed.status_code == 429 and shed.headers["Retry-After"] == "1"
                assert shed.json()["error"]["code"] == 429

        load.switch(FULL)  # the pool held at 97%: critical lasts, where a preempting pool's 95% is a moment
        wait_level(engine, "critical")
        refused = probe(engine, max_tokens=4)
        protected = probe(engine, priority=-1, max_tokens=4)
        others = [requests.get(engine.url + path, timeout=60).status_code for path in ("/health", "/v1/models")]
    finally:
        load.stop()

    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    error = refused.json()["error"]  # vLLM's ErrorResponse
    assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
    assert "KV cache pressure is critical" in error["message"]
    assert protected.status_code == 200 and protected.json()["usage"]["completion_tokens"] == 4
    assert others == [200, 200]  # only generation routes are guarded

    log = engine.log_text()
    assert "kvops middleware: levels from this API server's KV usage, policy " in log
    assert "kvops middleware: level ok -> " in log and "-> critical (KV " in log
    assert "Traceback" not in log

    wait_ok(engine)
    response = probe(engine, max_tokens=4, n=2)
    assert response.status_code == 200 and len(response.json()["choices"]) == 2
    metrics = engine.metrics().splitlines()  # its counters, on vLLM's own /metrics
    assert any(line.startswith('kvops_middleware_rejected_total{status="503"}') for line in metrics)
    assert "kvops_middleware_level 0.0" in metrics
    assert "-> ok (KV " in engine.log_text()
