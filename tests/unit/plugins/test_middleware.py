"""The ASGI middleware (`kvops_vllm.middleware.KVOpsMiddleware`) against a stub ASGI app: what reaches vLLM's app and
what the client receives at each level; the KV usage read from vLLM's gauge in-process."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from kvops.policy import Policy, load_policy
from kvops.watch.guard import parse_networks
from kvops_vllm.middleware import KVOpsMiddleware, MiddlewareConfigError, MiddlewareSettings
from kvops_vllm.stats import KV_USAGE, GaugeUsage
from tests.support.extras import needs
from tests.support.servers import captured_log

OK, WARN, DEGRADE, CRITICAL = 0.10, 0.75, 0.90, 0.97


@dataclass
class Stub:
    """vLLM's app as the middleware sees it: records what it received, answers 200 with a small JSON body."""

    calls: list[tuple[dict, bytes]] = field(default_factory=list)
    after_body: list[dict] = field(default_factory=list)  # what a later receive() gave it (the client's disconnect)
    listen: bool = False

    async def __call__(self, scope, receive, send) -> None:
        body = b""
        if scope["type"] == "http":
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if self.listen:
                self.after_body.append(await receive())
        self.calls.append((scope, body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Usage:
    def __init__(self, value: float | None = OK):
        self.value = value

    def __call__(self) -> float | None:
        return self.value


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def middleware(
    app,
    usage: float | Usage | None = OK,
    *,
    trust: str = "",
    clock: Clock | None = None,
    registry=None,
    policy: Policy | None = None,
) -> KVOpsMiddleware:
    """The middleware on `app` with `policy` (default: the shipped one), reading `usage` (a Usage a test changes, or
    a fixed value), X-KVops-Priority read from the networks in `trust`."""
    return KVOpsMiddleware(
        app,
        settings=MiddlewareSettings(policy or load_policy(), "test", parse_networks(trust)),
        usage=usage if isinstance(usage, Usage) else Usage(usage),
        clock=clock or Clock(),
        registry=registry if registry is not None else CollectorRegistry(),
    )


def call(
    guard,
    path: str = "/v1/completions",
    body: Any = None,
    *,
    method: str = "POST",
    chunks: list[bytes] | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    disconnect_first: bool = False,
    root_path: str = "",
    client: str = "10.0.0.7",
) -> Answer:
    raw = json.dumps(body if body is not None else {"model": "m", "prompt": "hi", "max_tokens": 1024}).encode()
    parts = chunks if chunks is not None else [raw]
    messages: list[dict] = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1} for i, part in enumerate(parts)
    ]
    if disconnect_first:
        messages = messages[:1] + [{"type": "http.disconnect"}]
        messages[0]["more_body"] = True
    messages.append({"type": "http.disconnect"})
    scope = {
        "type": "http",
        "method": method,
        "path": root_path + path,
        "root_path": root_path,
        "client": (client, 40000),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        + (headers or []),
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(_run(guard(scope, receive, send)))
    if not sent:
        return Answer(0, {}, b"")
    start = sent[0]
    return Answer(
        start["status"],
        {name.decode(): value.decode() for name, value in start["headers"]},
        b"".join(message.get("body", b"") for message in sent[1:]),
    )


async def _run(awaitable) -> None:
    await awaitable


def received(app: Stub) -> dict:
    return json.loads(app.calls[-1][1])


def test_at_ok_a_generation_request_passes_untouched_and_unread():
    app = Stub()
    chunks = [b'{"model": "m", "prompt": "hi", ', b'"max_tokens": 1024, "n": 4}']
    answer = call(middleware(app), chunks=chunks)
    assert answer.status == 200 and answer.headers["x-kvops-level"] == "ok" and "x-kvops-clamped" not in answer.headers
    assert app.calls[-1][1] == b"".join(chunks)  # the very bytes the client sent


def test_warn_caps_the_tokens_and_vllm_reads_the_clamped_body_with_its_length():
    app = Stub()
    answer = call(middleware(app, WARN), chunks=[b'{"model": "m", "prompt": "hi",', b' "max_tokens": 1024}'])
    assert answer.status == 200 and answer.headers["x-kvops-level"] == "warn"
    assert answer.headers["x-kvops-clamped"] == "max_tokens 1024->512"
    scope, body = app.calls[-1]
    assert json.loads(body)["max_tokens"] == 512
    assert dict(scope["headers"])[b"content-length"] == str(len(body)).encode()


def test_warn_leaves_a_request_within_the_cap_byte_for_byte():
    app = Stub()
    raw = b'{"model":  "m", "prompt": "hi", "max_tokens": 16}'
    answer = call(middleware(app, WARN), chunks=[raw])
    assert "x-kvops-clamped" not in answer.headers and app.calls[-1][1] == raw


def test_a_chat_request_without_a_limit_gets_the_cap():
    app = Stub()
    answer = call(middleware(app, WARN), "/v1/chat/completions", {"model": "m", "messages": []})
    assert answer.headers["x-kvops-clamped"] == "max_tokens unset->512"
    assert received(app)["max_completion_tokens"] == 512


def test_degrade_forces_one_sequence():
    app = Stub()
    body = {"model": "m", "prompt": "hi", "max_tokens": 64, "n": 3, "best_of": 3}
    answer = call(middleware(app, DEGRADE), body=body)
    assert answer.headers["x-kvops-level"] == "degrade" and answer.headers["x-kvops-clamped"] == "n 3->1, best_of 3->1"
    assert received(app)["n"] == 1 and received(app)["best_of"] == 1


def test_critical_answers_503_with_retry_after_in_vllms_shape_and_vllm_sees_nothing():
    app = Stub()
    answer = call(middleware(app, CRITICAL))
    assert answer.status == 503 and answer.headers["retry-after"] == "1"
    assert answer.headers["x-kvops-level"] == "critical" and answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert (
        error["type"] == "ServiceUnavailableError" and error["code"] == 503 and "KV cache pressure" in error["message"]
    )
    assert app.calls == []


def test_the_anthropic_route_refuses_in_its_own_shape():
    answer = call(middleware(Stub(), CRITICAL), "/v1/messages", {"model": "m", "max_tokens": 10, "messages": []})
    assert answer.status == 503 and answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "overloaded_error"  # vLLM 0.33+: anthropic/protocol.py


def test_the_priority_header_counts_only_from_the_gateways_networks():
    shed = [(b"x-kvops-priority", b"5")]
    protected = [(b"x-kvops-priority", b"-1")]
    # no network trusted (the default): a client's header is ignored, every request is standard
    assert call(middleware(Stub(), DEGRADE), headers=shed).status == 200
    assert call(middleware(Stub(), CRITICAL), headers=protected).status == 503
    # from the gateway's network: degrade refuses the sheddable with 429, critical serves the protected, clamped
    answer = call(middleware(Stub(), DEGRADE, trust="10.0.0.0/8"), headers=shed)
    assert answer.status == 429 and answer.headers["retry-after"] == "1"
    assert answer.json()["error"]["type"] == "Too Many Requests"
    app = Stub()
    answer = call(middleware(app, CRITICAL, trust="10.0.0.0/8"), headers=protected)
    assert answer.status == 200 and received(app)["max_tokens"] == 512
    answer = call(middleware(Stub(), CRITICAL, trust="10.0.0.0/8"), headers=[(b"x-kvops-priority", b"high")])
    assert answer.status == 400 and "must be an integer" in answer.json()["error"]["message"]
    # from anywhere else: ignored
    assert call(middleware(Stub(), CRITICAL, trust="10.0.0.0/8"), headers=protected, client="192.0.2.1").status == 503


def test_a_list_of_prompts_counts_as_that_many_requests_where_the_level_runs_one_sequence():
    body = {"model": "m", "prompt": ["a", "b", "c"], "max_tokens": 16}
    app = Stub()
    assert call(middleware(app, WARN), body=body).status == 200  # warn: one request, capped
    answer = call(middleware(app, DEGRADE), body=body)
    assert (
        answer.status == 429
        and answer.headers["retry-after"] == "1"
        and "3 prompts" in answer.json()["error"]["message"]
    )
    assert len(app.calls) == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "request body is not JSON"),
        (b'{"max_tokens": "100000"}', '"max_tokens" must be a whole number of tokens'),
        (b"[" * 200 + b"]" * 200, "nested deeper than 128"),
    ],
)
def test_a_body_it_cannot_read_at_a_clamping_level_is_400_and_never_reaches_vllm(raw, message):
    app = Stub()
    answer = call(middleware(app, WARN), chunks=[raw])
    assert answer.status == 400 and message in answer.json()["error"]["message"]
    assert answer.json()["error"]["type"] == "BadRequestError" and app.calls == []


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"), ("POST", "/tokenize"), ("GET", "/v1/completions")],
)
def test_other_paths_and_methods_pass_at_critical(method, path):
    app = Stub()
    answer = call(middleware(app, CRITICAL), path, method=method)
    assert answer.status == 200 and "x-kvops-level" not in answer.headers and len(app.calls) == 1


def test_non_http_scopes_pass():
    app = Stub()
    guard = middleware(app, CRITICAL)

    async def receive() -> dict:
        return {"type": "lifespan.startup"}

    async def send(message: dict) -> None:
        pass

    asyncio.run(_run(guard({"type": "lifespan"}, receive, send)))
    assert app.calls[-1][0] == {"type": "lifespan"}


@pytest.mark.parametrize(
    "path", ["/v1/./completions", "/v1//completions", "/x/../v1/completions/", "/v1/completions;a"]
)
def test_a_path_that_may_name_a_generation_route_is_guarded(path):
    assert call(middleware(Stub(), CRITICAL), path).status == 503


def test_the_route_is_matched_below_the_apps_root_path():
    assert call(middleware(Stub(), CRITICAL), root_path="/llm").status == 503


def test_a_client_gone_before_its_body_is_complete_reaches_nothing():
    app = Stub()
    answer = call(middleware(app, WARN), disconnect_first=True)
    assert answer.status == 0 and app.calls == []


def test_after_the_replayed_body_vllm_still_hears_the_client_leave():
    app = Stub(listen=True)
    call(middleware(app, WARN))
    assert app.after_body == [{"type": "http.disconnect"}]


def test_levels_rise_at_once_and_fall_with_hysteresis_and_a_log_line():
    usage, clock = Usage(OK), Clock()
    guard = middleware(Stub(), usage, clock=clock)  # the shipped policy: the admission steps down with no dwell
    with captured_log("vllm.kvops_middleware") as (_, lines):
        usage.value = CRITICAL
        assert call(guard).status == 503
        usage.value, clock.now = 0.92, clock.now + 1  # 0.92 + the hysteresis (0.05) is still critical
        assert call(guard).status == 503
        usage.value = 0.78  # 0.78 + 0.05 is under degrade's 0.85: down to warn in one step
        assert call(guard).headers["x-kvops-level"] == "warn"
    assert lines == [
        "kvops middleware: level ok -> critical (KV 97.0%): rejected with 503 and Retry-After: 1",
        "kvops middleware: level critical -> warn (KV 78.0%): capped at 512 new tokens",
    ]


def test_a_policy_with_an_admission_dwell_keeps_refusing_through_it(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("admission:\n  min_dwell_seconds: 30\n")
    usage, clock = Usage(CRITICAL), Clock()
    guard = middleware(Stub(), usage, clock=clock, policy=load_policy(path))
    assert call(guard).status == 503
    usage.value, clock.now = 0.50, clock.now + 10  # far below, but within the dwell
    assert call(guard).status == 503
    clock.now += 21
    assert call(guard).headers["x-kvops-level"] == "ok"


def test_no_reading_keeps_the_last_level_through_the_grace_then_fails_closed():
    usage = Usage(CRITICAL)
    guard = middleware(Stub(), usage)
    assert call(guard).status == 503
    usage.value = None
    answers = [call(guard) for _ in range(4)]
    assert [answer.status for answer in answers] == [503] * 4  # fail-closed: the last level's limits
    assert answers[-1].headers["x-kvops-level"] == "unknown"


def test_counters_on_vllms_metrics():
    registry = CollectorRegistry()
    usage = Usage(WARN)
    guard = middleware(Stub(), usage, registry=registry)
    call(guard)
    usage.value = CRITICAL
    call(guard)
    value = registry.get_sample_value
    assert value("kvops_middleware_requests_total", {"level": "warn"}) == 1
    assert value("kvops_middleware_clamped_total", {"field": "max_tokens"}) == 1
    assert value("kvops_middleware_rejected_total", {"status": "503"}) == 1
    assert value("kvops_middleware_level") == 3
    call(middleware(Stub(), usage, registry=registry))  # a second instance in the process counts into the same series
    assert value("kvops_middleware_rejected_total", {"status": "503"}) == 2


def test_settings_from_the_environment(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("levels: {warn: 0.5, degrade: 0.6, critical: 0.7}\n")
    settings = MiddlewareSettings.from_env(
        {"KVOPS_POLICY": str(policy), "KVOPS_TRUST_PRIORITY_FROM": "10.0.0.0/8, fd00::/8"}
    )
    assert settings.policy.thresholds[max(settings.policy.thresholds)] == 0.7
    assert [str(n) for n in settings.trust_priority_from] == ["10.0.0.0/8", "fd00::/8"]
    assert settings.policy_source == str(policy) and MiddlewareSettings.from_env({}).trust_priority_from == ()
    with pytest.raises(MiddlewareConfigError, match=r"KVOPS_TRUST_PRIORITY_FROM: '10.0.0.1/8' has host bits set"):
        MiddlewareSettings.from_env({"KVOPS_TRUST_PRIORITY_FROM": "10.0.0.1/8"})


def test_without_vllms_gauge_the_middleware_stops_the_startup_with_one_line():
    with captured_log("vllm.kvops_middleware") as (_, lines), pytest.raises(MiddlewareConfigError):
        KVOpsMiddleware(Stub(), settings=MiddlewareSettings(load_policy(), "test"), registry=CollectorRegistry())
    assert lines == [
        "kvops middleware: vLLM's vllm:kv_cache_usage_perc is not in this process's metrics (--disable-log-stats?): "
        "the middleware levels on it; start vLLM with its stats on"
    ]


def test_the_usage_is_vllms_gauge_the_highest_engine_and_follows_a_new_gauge():
    registry = CollectorRegistry()
    usage = GaugeUsage(registry)
    assert usage() is None and not usage.registered()
    gauge = Gauge(KV_USAGE, "KV-cache usage.", labelnames=["model_name", "engine"], registry=registry)
    gauge.labels("m", "0").set(0.4)
    assert usage() == 0.4
    gauge.labels("m", "1").set(0.7)
    assert usage() == 0.7
    registry.unregister(gauge)  # vLLM's PrometheusStatLogger unregisters and re-creates its gauges
    Gauge(KV_USAGE, "KV-cache usage.", labelnames=["model_name", "engine"], registry=registry).labels("m", "0").set(0.2)
    assert usage() == 0.2


@needs("starlette")
def test_added_as_vllm_adds_it(monkeypatch):
    """`vllm serve --middleware kvops_vllm.middleware.KVOpsMiddleware` is `app.add_middleware(KVOpsMiddleware)` on
    vLLM's FastAPI app, a Starlette app (vllm/entrypoints/serve/middleware/register.py): built with the app alone, settings from the environment, the
    usage from vLLM's gauge in the process's registry."""
    from prometheus_client import REGISTRY
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    monkeypatch.delenv("KVOPS_POLICY", raising=False)
    gauge = Gauge(KV_USAGE, "KV-cache usage.", labelnames=["model_name", "engine"])
    try:
        gauge.labels("m", "0").set(WARN)

        async def completions(request):
            return JSONResponse({"max_tokens": (await request.json())["max_tokens"]})

        app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
        app.add_middleware(KVOpsMiddleware)
        with TestClient(app) as client:
            response = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 900})
            assert response.json() == {"max_tokens": 512} and response.headers["x-kvops-level"] == "warn"
            gauge.labels("m", "0").set(CRITICAL)
            response = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 900})
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
    finally:
        REGISTRY.unregister(gauge)
        for name in ("kvops_middleware_requests", "kvops_middleware_clamped", "kvops_middleware_rejected"):
            REGISTRY.unregister(REGISTRY._names_to_collectors[name])
        for name in ("kvops_middleware_refused", "kvops_middleware_level"):
            REGISTRY.unregister(REGISTRY._names_to_collectors[name])


def test_the_plan_names_the_middleware_with_the_guard_for_one_api_server():
    from kvops.engines.vllm.flags import MIDDLEWARE, middleware

    assert middleware(plugin=True, data_parallel=1) == MIDDLEWARE == "kvops_vllm.middleware.KVOpsMiddleware"
    assert middleware(plugin=True, data_parallel=2) is None  # an API server per rank: each sees a share of the stats
    assert middleware(plugin=False, data_parallel=1) is None  # kvops may not be in vLLM's Python


def test_the_official_images_command_leaves_the_middleware_out_and_says_so():
    """A plan that names the middleware runs in vLLM's own Python; the official image has no kvops_vllm, so --format
    docker/k8s drop its flag as they drop the guard's, and say so."""
    from kvops.engines.vllm.flags import GUARD_SCHEDULER, MIDDLEWARE
    from kvops.gpus import find_gpu
    from kvops.model import load_model
    from kvops.plan import PlanInputs
    from kvops.planner import plan
    from kvops.render.plan import guard_left_out, image_args

    guarded = plan(PlanInputs("vllm", load_model("llama-3-8b"), find_gpu("H100-80GB"), max_model_len=8192, guard=True))
    named = replace(guarded, args=(*guarded.args, "--middleware", MIDDLEWARE))
    plugin_words = ("--scheduler-cls", GUARD_SCHEDULER, "--middleware", MIDDLEWARE)
    assert image_args(named) == [word for word in named.args if word not in plugin_words]
    told = guard_left_out(named, "docker")
    assert told is not None and f"--scheduler-cls {GUARD_SCHEDULER}, --middleware {MIDDLEWARE}" in told
