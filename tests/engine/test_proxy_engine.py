"""The admission proxy in front of the real vLLM CPU engine."""

from __future__ import annotations

import json

import pytest
import requests

from kvops.policy import Level
from tests.support.aio import ServerThread
from tests.unit.watch.test_proxy import LevelHolder, make_proxy_app


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
        chunks = []
        with requests.post(
            proxy.url + "/v1/completions",
            json={"model": model, "prompt": "the cache", "max_tokens": 8, "ignore_eos": True, "stream": True},
            stream=True,
        ) as stream:
            chunks = [line for line in stream.iter_lines() if line.startswith(b"data: {")]
        assert len(chunks) == 8 and all(json.loads(line[6:])["choices"][0]["text"] is not None for line in chunks)


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
