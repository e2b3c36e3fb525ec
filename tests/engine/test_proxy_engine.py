"""The admission proxy in front of the real vLLM CPU engine."""

from __future__ import annotations

import gzip
import json
import re
import time
from urllib.parse import urlsplit

import pytest

from kvops.policy import Level
from tests.support.aio import ServerThread
from tests.support.raw_http import exchange, status_of
from tests.unit.watch.test_hostile_proxy import guarded_proxy
from tests.unit.watch.test_proxy import LevelHolder, make_proxy_app
from tests.unit.watch.test_proxy_holes import completions_request, send, smuggling_gzip

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")


@pytest.mark.vllm
def test_in_front_of_the_real_engine(vllm_engine):
    holder = LevelHolder(Level.WARN)
    with ServerThread(make_proxy_app(vllm_engine.url, holder)) as proxy:
        model = requests.get(proxy.url + "/v1/models").json()["data"][0]["id"]
        response = requests.post(
            proxy.url + "/v1/completions",
            json={"model": model, "prompt": "the cache", "max_tokens": 600, "ignore_eos": True},
        )
        assert response.status_code == 200 and response.headers["X-KVops-Clamped"] == "max_tokens 600->512"
        assert response.json()["usage"]["completion_tokens"] == 512
        body = {"model": model, "prompt": "the cache", "max_tokens": 8, "ignore_eos": True, "stream": True}
        with requests.post(
            proxy.url + "/v1/completions", json={**body, "stream_options": {"include_usage": True}}, stream=True
        ) as stream:
            events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith(b"data: {")]
        texts = [event["choices"][0]["text"] for event in events if event["choices"]]
        # one chunk a token, or fewer: a busy machine's API server sends tokens that arrived together in one chunk
        assert 1 <= len(texts) <= 8 and all(text is not None for text in texts)
        assert events[-1]["usage"]["completion_tokens"] == 8


@pytest.mark.vllm
def test_sheddable_are_refused_first_and_critical_answers_a_retryable_refusal(vllm_engine):
    """Degrade refuses the sheddable (X-KVops-Priority above 0) with 429 and serves the others; critical refuses the
    standard with 503 and serves the protected: each refusal with Retry-After in vLLM's error shape, and no request
    the engine would not serve comes back as a 200 without tokens."""
    holder = LevelHolder(Level.DEGRADE)
    with ServerThread(make_proxy_app(vllm_engine.url, holder)) as proxy:
        model = requests.get(proxy.url + "/v1/models").json()["data"][0]["id"]

        def ask(priority: int | None) -> requests.Response:
            headers = {} if priority is None else {"X-KVops-Priority": str(priority)}
            body = {"model": model, "prompt": "the cache", "max_tokens": 6, "ignore_eos": True}
            return requests.post(proxy.url + "/v1/completions", json=body, headers=headers, timeout=300)

        shed, standard = ask(5), ask(None)
        holder.level = Level.CRITICAL
        refused, protected = ask(0), ask(-1)

    for response, status in ((shed, 429), (refused, 503)):
        assert response.status_code == status and int(response.headers["Retry-After"]) >= 1
        error = response.json()["error"]  # vLLM's ErrorResponse: {"error": {"message", "type", "code"}}
        assert error["code"] == status and "KV cache pressure" in error["message"]
    for response in (standard, protected):
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 6


def completions_received(metrics_text: str) -> float:
    """POSTs the engine's API server answered on /v1/completions, any status (vLLM's http_requests_total)."""
    pattern = r'^http_requests_total\{[^}]*handler="/v1/completions"[^}]*\} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, metrics_text, re.MULTILINE))


@pytest.mark.vllm
def test_a_gzip_body_smuggles_no_request_into_the_real_engine(vllm_engine):
    """The proxy's worst hole (issue 20), against the real engine at critical: a gzip body on a path the proxy does
    not guard, exactly as long as the first part of what it inflates to. The proxy once forwarded it inflated under
    the compressed Content-Length, and vLLM's HTTP server read the rest as a second request, a completion the
    critical level refuses. Now the engine gets the compressed bytes under their own length: one request. First,
    the control: those inflated bytes under the compressed length, sent to the engine directly, do run a second
    request there."""
    model = requests.get(vllm_engine.url + "/v1/models").json()["data"][0]["id"]
    smuggled = json.dumps({"model": model, "prompt": "x", "max_tokens": 4, "n": 2, "ignore_eos": True}).encode()
    packed = smuggling_gzip(completions_request(smuggled))
    before = completions_received(vllm_engine.metrics())
    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(packed)}\r\n\r\n"
    )
    exchange(urlsplit(vllm_engine.url).port, head.encode() + gzip.decompress(packed), timeout=5)
    assert completions_received(vllm_engine.metrics()) == before + 1  # the hole, as the old proxy opened it

    before = completions_received(vllm_engine.metrics())
    with guarded_proxy(vllm_engine.url, Level.CRITICAL) as proxy:
        answer = send(proxy.port, "/v1/embeddings", packed, {"Content-Encoding": "gzip"})
        time.sleep(2)  # a smuggled completion of 4 tokens would have been answered by now
        refused = send(proxy.port, "/v1/completions", smuggled, {})
    assert status_of(answer) != 0 and status_of(refused) == 503
    assert completions_received(vllm_engine.metrics()) == before


@pytest.mark.vllm
def test_max_completion_tokens_beside_max_tokens_is_capped_on_the_real_engine(vllm_engine):
    """vLLM's chat generates max_completion_tokens where it is set, max_tokens otherwise: at warn the proxy caps the
    field the engine reads (issue 20: it once capped max_tokens alone and 600 tokens ran)."""
    holder = LevelHolder(Level.WARN)
    with ServerThread(make_proxy_app(vllm_engine.url, holder)) as proxy:
        model = requests.get(proxy.url + "/v1/models").json()["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "the cache"}],
            "max_tokens": 10,
            "max_completion_tokens": 600,
            "ignore_eos": True,
        }
        response = requests.post(proxy.url + "/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200 and response.headers["X-KVops-Clamped"] == "max_tokens 600->512"
    assert response.json()["usage"]["completion_tokens"] == 512
