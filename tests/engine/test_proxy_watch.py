"""`kvops watch --proxy` in front of the real vLLM engine: the level follows real KV usage, and at each level the
engine receives the clamped request (caps, n=1) or, at critical, nothing while the client gets 503 + Retry-After.

The KV load goes to the engine directly; the probes go through the proxy, and a recording hop between the proxy
and the engine keeps exactly what the proxy sent.
"""

import json

import pytest

from tests.support.aio import ServerThread
from tests.support.kv_load import DEGRADE, FULL, STAGED_POLICY, WARN, KvLoad
from tests.support.upstream import RecordingUpstream
from tests.support.watch_process import WatchProcess

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")

pytestmark = pytest.mark.vllm


def probe(watch, model: str, **fields) -> requests.Response:
    body = {"model": model, "prompt": "the cache grows", "ignore_eos": True, **fields}
    return requests.post(watch.url + "/v1/completions", json=body, timeout=300)


def test_levels_from_real_usage_clamp_and_reject_what_reaches_the_engine(vllm_engine, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(STAGED_POLICY)
    model = str(vllm_engine.model)
    hop = RecordingUpstream(forward_to=vllm_engine.url)
    with (
        ServerThread(hop.app) as recorder,
        WatchProcess(
            "--engine",
            "vllm",
            "--metrics-url",
            vllm_engine.url + "/metrics",
            "--policy",
            str(policy),
            "--interval",
            "0.2",
            "--timeout",
            "5",
            "--proxy",
            recorder.url,
        ) as watch,
    ):
        watch.wait_level("ok")
        response = probe(watch, model, max_tokens=4, n=2)
        assert response.headers["X-KVops-Level"] == "ok" and len(response.json()["choices"]) == 2
        assert hop.received[-1].json()["n"] == 2

        load = KvLoad(vllm_engine.url, model).start(WARN)
        try:
            watch.wait_level("warn", timeout=180)
            response = probe(watch, model, max_tokens=600)
            assert response.headers["X-KVops-Level"] in ("warn", "degrade", "critical")
            if response.status_code == 200:
                assert response.headers["X-KVops-Clamped"] == "max_tokens 600->512"
                assert (
                    hop.received[-1].json()["max_tokens"] == 512
                    and response.json()["usage"]["completion_tokens"] == 512
                )

            load.switch(DEGRADE)
            watch.wait_level("degrade", timeout=180)
            response = probe(watch, model, max_tokens=4, n=3)
            if response.headers["X-KVops-Level"] == "degrade":
                assert response.headers["X-KVops-Clamped"] == "n 3->1" and len(response.json()["choices"]) == 1
                assert hop.received[-1].json()["n"] == 1

            load.switch(FULL)  # the pool held at 97%: critical lasts, where a preempting pool's 95% is a moment
            watch.wait_level("critical", timeout=180)
            reached = len(hop.received)
            response = probe(watch, model, max_tokens=4)
            assert response.status_code == 503 and response.headers["Retry-After"] == "10"
            assert response.json()["error"]["type"] == "ServiceUnavailableError"
            assert len(hop.received) == reached  # the engine received nothing
        finally:
            load.stop()
        watch.wait_level("ok", timeout=120)
        streamed = {"model": model, "prompt": "x", "max_tokens": 6, "ignore_eos": True, "stream": True}
        with requests.post(
            watch.url + "/v1/completions",
            json={**streamed, "stream_options": {"include_usage": True}},
            stream=True,
            timeout=120,
        ) as stream:
            events = [line for line in stream.iter_lines() if line.startswith(b"data: ")]
        # a busy engine may send several tokens in one chunk: the tokens are counted, not the chunks
        chunks = [json.loads(event[6:]) for event in events[:-1]]
        assert events[-1] == b"data: [DONE]" and chunks[0]["choices"][0]["index"] == 0
        assert chunks[-1]["usage"]["completion_tokens"] == 6
        _, metrics = watch.get("/kvops/metrics")
    assert "kvops_proxy_rejected_total 1.0" in metrics
    assert 'kvops_proxy_requests_total{guarded="true",level="critical"} 1.0' in metrics
