"""Defects a hostile SRE found in the guard at runtime (the middleware in vLLM's API server, the admission proxy, the
policy and the KVOPS_* settings), each replayed as it was seen."""

from __future__ import annotations

import pytest

from kvops.policy import Level
from tests.support.vllm_server import free_port
from tests.unit.plugins.test_middleware import WARN, Stub, call, middleware, received
from tests.unit.watch.test_hostile_proxy import guarded_proxy, post

# --- /inference/v1/generate without max_tokens runs to the context, not 16 -----------------------------------------
# vLLM 0.32-0.34 (vllm/entrypoints/scale_out/token_in_token_out/serving.py, is_sampling_param_provided): a
# sampling_params without max_tokens gets the context's remainder; a null one too (vllm/v1/engine/input_processor.py).
# The guard read SamplingParams' dataclass default, 16, under the cap: at warn both passed uncapped.

UNLIMITED_GENERATE = [
    {"token_ids": [1, 2, 3], "sampling_params": {}},
    {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": None}},
    {"token_ids": [1, 2, 3], "sampling_params": {"temperature": 0}},
]


@pytest.mark.parametrize("body", UNLIMITED_GENERATE)
def test_the_middleware_caps_a_generate_request_without_max_tokens_at_warn(body):
    app = Stub()
    answer = call(middleware(app, WARN), "/inference/v1/generate", body)
    assert answer.status == 200 and answer.headers["x-kvops-clamped"] == "max_tokens unset->512"
    assert received(app)["sampling_params"]["max_tokens"] == 512


def test_the_proxy_caps_a_generate_request_without_max_tokens_at_warn(upstream):
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        status, headers, _ = post(proxy.port, "/inference/v1/generate", {"token_ids": [1], "sampling_params": {}})
    assert status == 200 and headers["X-KVops-Clamped"] == "max_tokens unset->512"
    assert upstream.recorder.received[-1].json()["sampling_params"] == {"max_tokens": 512}


# --- a misspelt KVOPS_* variable was ignored: its setting silently stayed at the default -----------------------------
# KVOPS_TRUST_PRIORITY=10.0.0.0/8 in vLLM's environment left every request standard (the gateway's protected
# requests refused at critical); KVOPS_ADMISION=reserve left the guard on peak, and nothing said so.


@pytest.mark.parametrize(
    ("name", "meant"),
    [("KVOPS_TRUST_PRIORITY", "KVOPS_TRUST_PRIORITY_FROM"), ("KVOPS_POLICY_PATH", "KVOPS_POLICY")],
)
def test_the_middleware_refuses_a_misspelt_setting_with_one_line(name, meant):
    from kvops_vllm.middleware import MiddlewareConfigError, MiddlewareSettings

    with pytest.raises(MiddlewareConfigError, match=f"^{name} is not a kvops setting .*did you mean {meant}\\?$"):
        MiddlewareSettings.from_env({name: "10.0.0.0/8"})


def test_the_guard_refuses_a_misspelt_setting_and_names_every_valid_one_when_none_is_near():
    from kvops_vllm.config import GuardConfig, GuardConfigError

    with pytest.raises(
        GuardConfigError, match=r"^KVOPS_ADMISION is not a kvops setting .*did you mean KVOPS_ADMISSION"
    ):
        GuardConfig.from_env({"KVOPS_ADMISION": "reserve"})
    with pytest.raises(GuardConfigError, match=r"^KVOPS_X is not a kvops setting .*valid: KVOPS_ADMIN_TOKEN, "):
        GuardConfig.from_env({"KVOPS_X": "1"})


def test_every_setting_the_guard_documents_and_the_middlewares_and_watchers_are_known():
    import re

    from kvops.settings import SETTINGS
    from kvops_vllm import config

    documented = set(re.findall(r"^(KVOPS_\w+)", config.__doc__ or "", re.MULTILINE))
    assert documented and documented <= SETTINGS
    assert {"KVOPS_POLICY", "KVOPS_TRUST_PRIORITY_FROM", "KVOPS_ADMIN_TOKEN"} <= SETTINGS
    config.GuardConfig.from_env(dict.fromkeys(SETTINGS, ""))  # blank: each at its default


def test_the_watcher_refuses_a_misspelt_setting_with_one_line(run_kvops, monkeypatch):
    """KVOPS_TRUST_PRIORITY_FORM=10.0.0.0/8 beside `kvops watch --proxy` left every request standard, unsaid."""
    monkeypatch.setenv("KVOPS_TRUST_PRIORITY_FORM", "10.0.0.0/8")
    ran = run_kvops("watch", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:1/metrics", "--once", expect=4)
    assert ran.stderr.splitlines() == [
        "kvops: error: KVOPS_TRUST_PRIORITY_FORM is not a kvops setting (it would be ignored); "
        "did you mean KVOPS_TRUST_PRIORITY_FROM?"
    ]


# --- max_tokens 0 (a prompt scored, nothing generated) was refused 400 at every clamping level ----------------------
# vLLM's completions serve {"echo": true, "max_tokens": 0} (vllm/entrypoints/openai/completion/protocol.py,
# echo_without_generation): how lm-evaluation-harness scores log-likelihoods. From warn on the guard answered
# '"max_tokens" must be a positive integer, got 0', and evaluation jobs failed only while the pool was under pressure.

SCORE_PROMPT = {"model": "m", "prompt": "the cache grows", "echo": True, "logprobs": 1, "max_tokens": 0}


def test_the_middleware_passes_a_prompt_scored_with_max_tokens_0_at_warn_and_degrade():
    from tests.unit.plugins.test_middleware import DEGRADE

    for usage in (WARN, DEGRADE):
        app = Stub()
        answer = call(middleware(app, usage), "/v1/completions", SCORE_PROMPT)
        assert answer.status == 200 and "x-kvops-clamped" not in answer.headers
        assert received(app) == SCORE_PROMPT


def test_the_proxy_passes_a_prompt_scored_with_max_tokens_0_and_still_refuses_a_negative_one(upstream):
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        status, headers, _ = post(proxy.port, "/v1/completions", SCORE_PROMPT)
        refused, _, body = post(proxy.port, "/v1/completions", {**SCORE_PROMPT, "max_tokens": -1})
    assert status == 200 and "X-KVops-Clamped" not in headers
    assert upstream.recorder.received[-1].json() == SCORE_PROMPT
    assert refused == 400 and b'\\"max_tokens\\" must be a whole number of tokens, 0 or more, got -1' in body


# --- kvops watch --proxy with credentials or a query in the URL dropped them unsaid ---------------------------------
# `--proxy http://user:pw@10.0.0.5:8000` started and sent the upstream no Authorization (401 to every client);
# `--proxy http://10.0.0.5:8000?api-version=1` started and sent no query: the proxy keeps only scheme, host, port, path.


@pytest.mark.parametrize(
    "url", ["http://user:pw@127.0.0.1:8000", "http://127.0.0.1:8000/v1?api-version=1", "http://127.0.0.1:8000#x"]
)
def test_watch_refuses_a_proxy_url_whose_credentials_or_query_it_would_drop(run_kvops, url):
    ran = run_kvops(
        "watch",
        "--engine",
        "vllm",
        "--metrics-url",
        "http://127.0.0.1:1/metrics",
        "--listen",
        f"127.0.0.1:{free_port()}",  # were the URL let through, it would listen there, not on a port others assume closed
        "--proxy",
        url,
        expect=2,
    )
    assert f"Invalid value for --proxy: {url!r}: the proxy sends no credentials, query or fragment" in ran.stderr
    assert "Traceback" not in ran.stderr and len(ran.stderr.strip().splitlines()) == 1
