"""Defects in the guard at runtime replayed on the real vLLM CPU engine (tests/unit/test_defects_guard.py holds the
fast replays): one engine with kvops' middleware in its API server and vLLM's token-in/token-out route
(`--enable-scale-out`), held at warn by a policy whose warn threshold any running request crosses."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.vllm_server import DEFAULT_KV_BYTES, VllmServer

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")

pytestmark = pytest.mark.vllm

# One running request holds a block of the 31 (3%): warn from then on, and it never steps down (the hysteresis is
# larger than the threshold), so every later request meets warn's cap of 512.
HELD_AT_WARN = """\
levels: {warn: 0.01, degrade: 0.98, critical: 0.99}
hysteresis: 0.05
admission: {min_dwell_seconds: 0}
"""


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text(HELD_AT_WARN)
    args = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES), "--enable-scale-out"]
    args += ["--middleware", "kvops_vllm.middleware.KVOpsMiddleware"]
    log = tmp_path_factory.mktemp("logs") / "vllm-defects.log"
    with VllmServer(tiny_model, log, args=args, env={"KVOPS_POLICY": str(policy)}) as server:
        raise_to_warn(server)
        yield server


def complete(engine, **fields) -> requests.Response:
    body = {"model": str(engine.model), "prompt": "the cache grows", **fields}
    return requests.post(engine.url + "/v1/completions", json=body, timeout=300)


def raise_to_warn(engine, timeout: float = 600) -> None:
    """Probe while a long request runs until the middleware answers at warn. On a loaded machine the level can lag
    the request, which may end before it shows: another long request then starts, until warn is seen."""
    deadline = time.monotonic() + timeout
    long: threading.Thread | None = None
    try:
        while True:
            if long is None or not long.is_alive():
                long = threading.Thread(target=complete, args=(engine,), kwargs={"max_tokens": 900, "ignore_eos": True})
                long.start()
            if complete(engine, max_tokens=1).headers["X-KVops-Level"] == "warn":
                return
            assert time.monotonic() < deadline, engine.log_tail()
            time.sleep(0.2)
    finally:
        if long is not None:
            long.join(timeout=300)


def test_a_generate_request_without_max_tokens_is_capped_at_warn(engine):
    """vLLM runs a sampling_params without max_tokens to the context (1024 less the prompt), not to 16."""
    body = {"model": str(engine.model), "token_ids": [5, 6, 7], "sampling_params": {"ignore_eos": True}}
    response = requests.post(engine.url + "/inference/v1/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    assert response.headers["X-KVops-Level"] == "warn"
    assert response.headers["X-KVops-Clamped"] == "max_tokens unset->512"
    assert response.json()["usage"]["completion_tokens"] == 512  # what vLLM ran


def test_a_prompt_scored_with_echo_and_max_tokens_0_is_served_at_warn(engine):
    """lm-evaluation-harness's log-likelihood request: vLLM answers it; the guard had refused it 400 from warn."""
    response = complete(engine, echo=True, logprobs=1, max_tokens=0)
    assert response.status_code == 200, response.text
    assert response.headers["X-KVops-Level"] == "warn" and "X-KVops-Clamped" not in response.headers
    assert response.json()["choices"][0]["text"] == "the cache grows"  # the prompt echoed, nothing generated
