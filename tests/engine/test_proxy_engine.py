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
