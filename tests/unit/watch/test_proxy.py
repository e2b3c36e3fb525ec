"""The admission proxy over real HTTP on 127.0.0.1: clamping, rejection, streaming, refusals, upstream faults."""

from __future__ import annotations

import logging
import time
from ipaddress import ip_network

import pytest
from aiohttp import web

from kvops.policy import Level, load_policy
from kvops.watch.proxy import AdmissionProxy, ProxyMetrics, ProxySettings
from tests.support.aio import ServerThread
from tests.support.vllm_server import free_port

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")

POLICY = load_policy()
REGISTRY = web.AppKey("registry", object)


class LevelHolder:
    def __init__(self, level: Level = Level.OK):
        self.level = level

    def limits(self):
        return POLICY.limits(self.level)


# The tests' clients stand in for a gateway the proxy trusts to set X-KVops-Priority (by default it trusts no one).
LOOPBACK = (ip_network("127.0.0.0/8"), ip_network("::1/128"))


def make_proxy_app(upstream: str, holder: LevelHolder, **settings):
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    settings.setdefault("trust_priority_from", LOOPBACK)

    def make():
        app = web.Application()
        registry = CollectorRegistry()
        app[REGISTRY] = registry
        AdmissionProxy(ProxySettings(upstream, **settings), holder.limits, ProxyMetrics(registry)).attach(app)
        return app

    return make


@pytest.fixture
def proxy(upstream):
    holder = LevelHolder()
    with ServerThread(make_proxy_app(upstream.url, holder)) as server:
        server.holder = holder
        yield server


def counter(server, name: str, **labels) -> float:
    registry = server.runner.app[REGISTRY]
    return registry.get_sample_value(name, labels) or 0.0


def test_ok_forwards_the_body_byte_for_byte(proxy, upstream):
    raw = b'{"model": "m", "prompt": "hi",   "max_tokens": 4000, "n": 3}'
    response = requests.post(proxy.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"})
    assert (
        response.status_code == 200
        and response.headers["X-KVops-Level"] == "ok"
        and "X-KVops-Clamped" not in response.headers
    )
    assert upstream.recorder.received[-1].body == raw


def test_warn_caps_max_tokens_and_gives_unlimited_requests_the_cap(proxy, upstream):
    proxy.holder.level = Level.WARN
    response = requests.post(proxy.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1024, "n": 2})
    assert response.headers["X-KVops-Clamped"] == "max_tokens 1024->512"
    assert upstream.recorder.received[-1].json() == {"prompt": "hi", "max_tokens": 512, "n": 2}
    requests.post(proxy.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert upstream.recorder.received[-1].json()["max_completion_tokens"] == 512
    requests.post(
        proxy.url + "/v1/chat/completions", json={"messages": [], "max_tokens": 900, "max_completion_tokens": 700}
    )
    assert {key: upstream.recorder.received[-1].json()[key] for key in ("max_tokens", "max_completion_tokens")} == {
        "max_tokens": 512,
        "max_completion_tokens": 512,
    }
    requests.post(proxy.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 100})
    assert upstream.recorder.received[-1].json()["max_tokens"] == 100
    assert counter(proxy, "kvops_proxy_clamped_total", field="max_tokens") == 3


def test_degrade_forces_one_sequence(proxy, upstream):
    proxy.holder.level = Level.DEGRADE
    response = requests.post(
        proxy.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 10, "n": 4, "best_of": 6}
    )
    assert response.headers["X-KVops-Clamped"] == "n 4->1, best_of 6->1"
    assert upstream.recorder.received[-1].json() == {"prompt": "hi", "max_tokens": 10, "n": 1, "best_of": 1}
    response = requests.post(
        proxy.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 10, "n": 3, "use_beam_search": True}
    )
    assert response.headers["X-KVops-Clamped"] == "beam_width 3->1" and upstream.recorder.received[-1].json()["n"] == 1


def test_critical_rejects_without_touching_the_upstream(proxy, upstream):
    proxy.holder.level = Level.CRITICAL
    before = len(upstream.recorder.received)
    response = requests.post(proxy.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert (
        response.status_code == 503
        and response.headers["Retry-After"] == "10"
        and response.headers["X-KVops-Level"] == "critical"
    )
    error = response.json()["error"]
    assert error["type"] == "ServiceUnavailableError" and error["code"] == 503 and "retry in 10 s" in error["message"]
    assert len(upstream.recorder.received) == before
    assert counter(proxy, "kvops_proxy_rejected_total") == 1
    assert requests.get(proxy.url + "/v1/models").status_code == 200  # unguarded paths still pass


def test_the_priority_header_refuses_the_sheddable_first_and_the_protected_never(proxy, upstream):
    """X-KVops-Priority carries vLLM's priority (lower is served first); with the shipped policy's classes, > 0
    is sheddable (429 from degrade), 0 or absent standard (503 at critical), < 0 protected (served, clamped)."""
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 900, "n": 2}

    def send(priority: str | None):
        headers = {} if priority is None else {"X-KVops-Priority": priority}
        return requests.post(proxy.url + "/v1/chat/completions", json=chat, headers=headers)

    proxy.holder.level = Level.WARN
    assert [send(p).status_code for p in ("5", None, "-5")] == [200, 200, 200]
    forwarded = len(upstream.recorder.received)

    proxy.holder.level = Level.DEGRADE
    shed = send("5")
    assert (shed.status_code, shed.headers["Retry-After"], shed.headers["X-KVops-Level"]) == (429, "10", "degrade")
    assert shed.json()["error"] == {
        "message": "KV cache pressure is degrade: sheddable requests are refused; retry in 10 s",
        "type": "Too Many Requests",
        "param": None,
        "code": 429,
    }
    assert [send(p).status_code for p in ("+1", "0", None, "-1")] == [429, 200, 200, 200]
    assert len(upstream.recorder.received) == forwarded + 3  # the refused never reached the upstream

    proxy.holder.level = Level.CRITICAL
    assert [send(p).status_code for p in ("5", "0", None)] == [429, 503, 503]
    protected = send("-5")
    assert protected.status_code == 200 and protected.headers["X-KVops-Clamped"] == "max_tokens 900->512, n 2->1"
    assert upstream.recorder.received[-1].json() == {**chat, "max_tokens": 512, "n": 1}
    assert upstream.recorder.received[-1].headers["X-KVops-Priority"] == "-5"  # passed on as sent
    assert counter(proxy, "kvops_proxy_rejected_total") == 5
    assert counter(proxy, "kvops_proxy_rejected_by_status_total", status="429") == 3
    assert counter(proxy, "kvops_proxy_rejected_by_status_total", status="503") == 2


@pytest.mark.parametrize("value", ["high", "1.5", "", "0x10", "1" * 19, "\xb2", "- 1"])
def test_a_priority_header_that_is_not_an_integer_is_400_at_every_level(proxy, upstream, value):
    for level in (Level.OK, Level.CRITICAL):
        proxy.holder.level = level
        response = requests.post(
            proxy.url + "/v1/completions", json={"prompt": "hi"}, headers={"X-KVops-Priority": value}
        )
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert message.startswith("X-KVops-Priority ") and message.endswith(
            "must be an integer (a vLLM request priority: lower is served first)"
        )
    assert upstream.recorder.received == []


def test_the_policy_s_own_classes_apply(upstream):
    """A policy whose priorities section moves the bounds: the proxy classes requests by it, as the guard does."""
    from dataclasses import replace

    from kvops.policy import Priorities

    policy = replace(POLICY, priorities=Priorities(sheddable_above=10, protected_below=0))

    def make():
        from prometheus_client import CollectorRegistry

        app = web.Application()
        app[REGISTRY] = CollectorRegistry()
        limits = lambda: policy.limits(Level.CRITICAL)  # noqa: E731
        settings = ProxySettings(upstream.url, trust_priority_from=LOOPBACK)
        AdmissionProxy(settings, limits, ProxyMetrics(app[REGISTRY]), None, policy.priorities).attach(app)
        return app

    with ServerThread(make) as proxy:
        statuses = [
            requests.post(proxy.url + "/v1/completions", json={"prompt": "hi"}, headers={"X-KVops-Priority": p})
            for p in ("11", "10", "-1")
        ]
    assert [response.status_code for response in statuses] == [429, 503, 200]


def test_tgi_shapes_and_fields(upstream):
    holder = LevelHolder(Level.DEGRADE)
    with ServerThread(make_proxy_app(upstream.url, holder, engine="tgi")) as proxy:
        requests.post(proxy.url + "/generate", json={"inputs": "hi", "parameters": {"best_of": 2, "do_sample": True}})
        assert upstream.recorder.received[-1].json()["parameters"] == {
            "best_of": 1,
            "do_sample": True,
            "max_new_tokens": 512,
        }
        holder.level = Level.CRITICAL
        response = requests.post(proxy.url + "/generate_stream", json={"inputs": "hi"})
        assert response.status_code == 503 and response.json() == {
            "error": "KV cache pressure is critical; retry in 10 s",
            "error_type": "overloaded",
        }


def test_streams_chunk_by_chunk(upstream, proxy):
    upstream.recorder.chunk_delay = 0.3
    start = time.monotonic()
    with requests.post(proxy.url + "/v1/completions", json={"prompt": "hi", "stream": True}, stream=True) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        arrivals = [(time.monotonic() - start, line) for line in response.iter_lines() if line]
    assert [line for _, line in arrivals][-1] == b"data: [DONE]"
    # The upstream sends [DONE] 5 x 0.3 s after the first event: a proxy that buffered would deliver them together.
    # A lower bound only, so a busy machine cannot fail it.
    assert arrivals[-1][0] - arrivals[0][0] > 1.0


def test_client_disconnect_cancels_the_upstream(upstream, proxy):
    upstream.recorder.chunk_delay = 0.5
    upstream.recorder.chunks = 40
    with requests.post(proxy.url + "/v1/completions", json={"prompt": "hi", "stream": True}, stream=True) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 10
    while not upstream.recorder.cancelled and time.monotonic() < deadline:
        time.sleep(0.1)
    assert upstream.recorder.cancelled == ["/v1/completions"]


def test_headers_and_other_paths_pass_untouched_and_secrets_are_not_logged(proxy, upstream, caplog):
    caplog.set_level(logging.DEBUG)
    response = requests.get(
        proxy.url + "/v1/models?limit=3", headers={"Authorization": "Bearer sk-secret", "X-Custom": "1"}
    )
    received = upstream.recorder.received[-1]
    assert response.status_code == 200 and received.query == "limit=3"
    assert received.headers["Authorization"] == "Bearer sk-secret" and received.headers["X-Custom"] == "1"
    requests.post(proxy.url + "/v1/embeddings", data=b'{"input": "x"}', headers={"Authorization": "Bearer sk-secret"})
    assert upstream.recorder.received[-1].body == b'{"input": "x"}'
    assert "sk-secret" not in caplog.text


@pytest.mark.parametrize(
    "data, status, fragment",
    [
        (b"{nope", 400, "request body is not JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"prompt": "x", "n": "four"}', 400, '"n" must be a positive integer, got "four"'),
        (b'{"prompt": "x", "max_tokens": -1}', 400, '"max_tokens" must be a whole number of tokens, 0 or more, got -1'),
        (b'{"prompt": "' + b"x" * 2048 + b'"}', 413, "exceeds the proxy's limit of 1024 bytes"),
    ],
)
def test_bad_bodies_get_400_or_413(upstream, data, status, fragment):
    with ServerThread(make_proxy_app(upstream.url, LevelHolder(), max_body_bytes=1024)) as proxy:
        response = requests.post(proxy.url + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
        assert response.status_code == status and fragment in response.json()["error"]["message"]
        assert upstream.recorder.received == []


def test_upstream_down_is_502_and_a_hang_is_504_within_the_timeout(upstream):
    with ServerThread(make_proxy_app(f"http://127.0.0.1:{free_port()}", LevelHolder(), connect_timeout=1)) as proxy:
        start = time.monotonic()
        response = requests.post(proxy.url + "/v1/completions", json={"prompt": "x"})
        assert (
            response.status_code == 502
            and "unreachable" in response.json()["error"]["message"]
            and time.monotonic() - start < 5
        )
    with ServerThread(make_proxy_app(upstream.url, LevelHolder(), first_byte_timeout=1.5)) as proxy:
        start = time.monotonic()
        response = requests.post(proxy.url + "/hang", json={})
        assert response.status_code == 504 and 1.4 < time.monotonic() - start < 5
