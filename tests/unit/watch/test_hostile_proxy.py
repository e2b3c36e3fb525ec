"""The admission proxy against hostile clients and upstreams (issue 11), over real sockets on 127.0.0.1: paths that
name a generation route without spelling it, every generation route of each engine, bodies that break parsers,
streams that must end early, half-closed, trickling and vanishing clients, garbage upstreams, the admin token."""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from kvops import engines
from kvops.policy import Level
from tests.support.aio import ServerThread
from tests.support.raw_http import RawUpstream, exchange, read_all, request_bytes, status_of
from tests.unit.watch.test_proxy import LevelHolder, make_proxy_app

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")


def guarded_proxy(upstream_url: str, level: Level = Level.OK, *, header_timeout: float = 20, **settings):
    holder = LevelHolder(level)
    server = ServerThread(make_proxy_app(upstream_url, holder, **settings), guarded=True, header_timeout=header_timeout)
    server.holder = holder
    return server


def post(port: int, target: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """POST with the target sent exactly as written (requests and urllib3 would resolve dot segments first)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST", target, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


DOT_SEGMENT_BYPASSES = [
    "/v1/./completions",
    "/v1/../v1/completions",
    "/x/../v1/chat/completions",
    "/v1//completions",
    "//v1/completions",
    "/v1/completions/",
    "/v1/%63ompletions",
    "/v1%2Fcompletions",
    "/v1/%2e/completions",
    "/v1/completions;jsessionid=1",
    "/%76%31/chat/completions?stream=false",
    "/v1/responses/.",
    "/./invocations",
    "/v1/messages//",
]


@pytest.mark.parametrize("target", DOT_SEGMENT_BYPASSES)
def test_dot_segment_and_encoded_paths_are_refused_at_critical(upstream, target):
    with guarded_proxy(upstream.url, Level.CRITICAL) as proxy:
        status, headers, _ = post(proxy.port, target, {"prompt": "x", "max_tokens": 4000, "n": 8})
    assert status == 503 and headers["Retry-After"] == "10"
    assert upstream.recorder.received == []


@pytest.mark.parametrize("target", ["/./generate", "/generate/", "//generate_stream", "/", "/x/..", "/vertex/."])
def test_tgi_paths_including_post_root_are_refused_at_critical(upstream, target):
    with guarded_proxy(upstream.url, Level.CRITICAL, engine="tgi") as proxy:
        status, _, body = post(proxy.port, target, {"inputs": "x", "parameters": {"max_new_tokens": 4000}})
    assert status == 503 and json.loads(body)["error_type"] == "overloaded"
    assert upstream.recorder.received == []


def test_a_dot_segment_path_is_clamped_and_forwarded_as_the_upstream_will_see_it(upstream):
    with guarded_proxy(upstream.url, Level.DEGRADE) as proxy:
        status, headers, _ = post(proxy.port, "/v1/./completions/?a=%2F", {"prompt": "x", "max_tokens": 4000, "n": 8})
    assert status == 200 and headers["X-KVops-Clamped"] == "max_tokens 4000->512, n 8->1"
    received = upstream.recorder.received[-1]
    assert received.raw_path == "/v1/completions?a=%2F"
    assert received.json() == {"prompt": "x", "max_tokens": 512, "n": 1}


def concrete(path: str) -> str:
    return path.replace("*", "m")


@pytest.mark.parametrize(
    "engine, path", [(name, concrete(r.path)) for name in engines.NAMES for r in engines.get(name).api.ROUTES]
)
def test_every_generation_route_of_each_engine_is_refused_at_critical(upstream, engine, path):
    with guarded_proxy(upstream.url, Level.CRITICAL, engine=engine) as proxy:
        response = requests.post(proxy.url + path, data=b"{}", headers={"Content-Type": "application/json"})
    assert response.status_code == 503 and response.headers["X-KVops-Level"] == "critical"
    assert upstream.recorder.received == []


CRITICAL = "KV cache pressure is critical; retry in 10 s"


@pytest.mark.parametrize(
    "path, expected",
    [
        (
            "/v1/completions",
            {"error": {"message": CRITICAL, "type": "ServiceUnavailableError", "param": None, "code": 503}},
        ),
        ("/v1/messages", {"type": "error", "error": {"type": "overloaded_error", "message": CRITICAL}}),
        ("/cohere/v2/chat", {"message": CRITICAL}),
        (
            "/v1/audio/transcriptions",
            {"error": {"message": CRITICAL, "type": "ServiceUnavailableError", "param": None, "code": 503}},
        ),
    ],
)
def test_each_vllm_api_refuses_in_its_own_error_shape(upstream, path, expected):
    with guarded_proxy(upstream.url, Level.CRITICAL) as proxy:
        assert requests.post(proxy.url + path, data=b"{}").json() == expected


@pytest.mark.parametrize(
    "engine, path, sent, forwarded, clamped",
    [
        (
            "vllm",
            "/v1/responses",
            {"input": "x", "max_output_tokens": 4000},
            {"max_output_tokens": 512},
            "max_tokens 4000->512",
        ),
        (
            "vllm",
            "/v1/messages",
            {"messages": [], "max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 2048}},
            {"max_tokens": 512, "thinking": {"type": "enabled", "budget_tokens": 511}},
            "max_tokens 4000->512, thinking.budget_tokens 2048->511",
        ),
        ("vllm", "/v1/messages", {"messages": []}, {}, None),  # max_tokens is required: vLLM refuses it, not kvops
        ("vllm", "/v1/completions", {"prompt": "x"}, {}, None),  # vLLM's own default, 16, is under the cap
        (
            "vllm",
            "/v1/completions",
            {"prompt": "x", "max_tokens": 900, "min_tokens": 800},
            {"max_tokens": 512, "min_tokens": 512},
            "max_tokens 900->512, min_tokens 800->512",
        ),
        (
            "vllm",
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {"max_tokens": 4000, "n": 4}},
            {"sampling_params": {"max_tokens": 512, "n": 1}},
            "max_tokens 4000->512, n 4->1",
        ),
        ("vllm", "/invocations", {"messages": [], "max_tokens": 900}, {"max_tokens": 512}, "max_tokens 900->512"),
        (
            "vllm",
            "/invocations",
            {"prompt": "x", "max_tokens": 900, "n": 3},
            {"max_tokens": 512, "n": 1},
            "max_tokens 900->512, n 3->1",
        ),
        (
            "vllm",
            "/v1/chat/completions/batch",
            {"messages": [[]]},
            {"max_completion_tokens": 512},
            "max_tokens unset->512",
        ),
        ("tgi", "/", {"inputs": "x"}, {"parameters": {"max_new_tokens": 512}}, "max_tokens unset->512"),
        ("tgi", "/v1/chat/completions", {"messages": []}, {"max_tokens": 512}, "max_tokens unset->512"),
        # one instance each: at degrade two instances count as two requests (test_proxy_holes.py)
        (
            "tgi",
            "/vertex",
            {"instances": [{"inputs": "x", "parameters": {"max_new_tokens": 900}}]},
            {"instances": [{"inputs": "x", "parameters": {"max_new_tokens": 512}}]},
            "max_tokens 900->512",
        ),
        (
            "tgi",
            "/vertex",
            {"instances": [{"messages": [], "max_tokens": 700}]},
            {"instances": [{"messages": [], "max_tokens": 512}]},
            "max_tokens 700->512",
        ),
        ("tgi", "/invocations", {"prompt": "x", "max_tokens": 900}, {"max_tokens": 512}, "max_tokens 900->512"),
        (
            "tgi",
            "/v2/models/m/versions/1/infer",
            {"id": "1", "inputs": [], "outputs": [], "parameters": {"best_of": 3}},
            {"parameters": {"best_of": 1, "max_new_tokens": 512}},
            "max_tokens unset->512, best_of 3->1",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and value.startswith("/") else None,
)
def test_each_route_clamps_the_fields_its_engine_reads(upstream, engine, path, sent, forwarded, clamped):
    with guarded_proxy(upstream.url, Level.DEGRADE, engine=engine) as proxy:
        response = requests.post(proxy.url + path, json=sent)
    assert response.status_code == 200
    body = upstream.recorder.received[-1].json()
    assert body == {**sent, **forwarded}
    assert response.headers.get("X-KVops-Clamped") == clamped


def test_a_stream_cut_for_silence_ends_with_an_error_event_and_a_clean_chunked_end(upstream):
    upstream.recorder.chunks, upstream.recorder.stall_after = 60, 40
    with guarded_proxy(upstream.url, idle_timeout=1.0) as proxy:
        raw = exchange(proxy.port, request_bytes("POST", "/v1/completions", b'{"prompt": "x", "stream": true}'))
        with requests.post(proxy.url + "/v1/completions", json={"prompt": "x", "stream": True}, stream=True) as stream:
            events = [line for line in stream.iter_lines() if line]  # raises on a broken chunked body
    assert b"HTTP/1.1 504" not in raw.split(b"\r\n\r\n", 1)[1] and raw.endswith(b"\r\n0\r\n\r\n")
    assert len(events) == 42 and events[:40] == [f'data: {{"index": {i}}}'.encode() for i in range(40)]
    error = json.loads(events[40][len(b"data: ") :])["error"]
    assert error["code"] == 504 and "sent nothing for 1 s" in error["message"] and events[41] == b"data: [DONE]"


def test_a_stream_longer_than_every_timeout_is_not_cut_while_it_flows(upstream):
    upstream.recorder.chunks, upstream.recorder.chunk_delay = 8, 0.4  # 3.2 s in all, never 1 s silent
    with (
        guarded_proxy(upstream.url, first_byte_timeout=1.0, idle_timeout=1.0) as proxy,
        requests.post(proxy.url + "/v1/completions", json={"prompt": "x", "stream": True}, stream=True) as stream,
    ):
        events = [line for line in stream.iter_lines() if line]
    assert len(events) == 9 and events[-1] == b"data: [DONE]"


@pytest.mark.parametrize(
    "answer",
    [
        b"garbage that is not HTTP\r\n\r\n",
        b"HTTP/1.1 2OO OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"",
    ],
    ids=["not-http", "bad-status", "short-body", "bad-chunk", "closed"],
)
def test_an_upstream_that_sends_garbage_is_502(answer):
    with RawUpstream(answer) as raw, guarded_proxy(raw.url) as proxy:
        response = requests.post(proxy.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
        unguarded = requests.get(proxy.url + "/v1/models", timeout=30)
    assert response.status_code == 502 and response.json()["error"]["type"] == "InternalServerError"
    assert unguarded.status_code in (502, 200) and unguarded.status_code != 500


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 128 levels"),
        (b'{"a": ' + b"[" * 129 + b"]" * 129 + b"}", "nested deeper than 128 levels"),
        (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "integer too long"),
        (b'{"prompt": "\xff\xfe"}', "not UTF-8"),
        (b'{"prompt": "x", "max_tokens": 1e999}', '"max_tokens" must be a whole number of tokens, 0 or more, got Inf'),
        (b'{"prompt": "x", "n": true}', '"n" must be a positive integer, got true'),
    ],
    ids=["100k-deep", "129-deep", "5000-digits", "not-utf8", "huge-float", "bool-n"],
)
def test_bodies_that_break_parsers_are_400_not_500(upstream, body, fragment):
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        response = requests.post(proxy.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]
    assert upstream.recorder.received == []


def test_a_body_nested_within_the_limit_and_full_of_unicode_passes(upstream):
    nested: object = "ꙮ \u0000 😀 \ud800"  # a NUL, an emoji, a lone surrogate
    for _ in range(120):
        nested = [nested]
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        response = requests.post(proxy.url + "/v1/chat/completions", json={"messages": nested, "max_tokens": 900})
    assert response.status_code == 200 and upstream.recorder.received[-1].json()["messages"] == nested


def test_a_half_closed_client_is_answered(upstream):
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        body = b'{"prompt": "x", "max_tokens": 900}'
        answer = exchange(proxy.port, request_bytes("POST", "/v1/completions", body), half_close=True)
        stream = exchange(
            proxy.port, request_bytes("POST", "/v1/completions", b'{"prompt": "x", "stream": true}'), half_close=True
        )
    assert status_of(answer) == 200 and b"X-KVops-Clamped: max_tokens 900->512" in answer
    assert status_of(stream) == 200 and b"data: [DONE]" in stream and stream.endswith(b"0\r\n\r\n")


def test_a_client_that_goes_away_still_cancels_a_non_streamed_request_at_once(upstream):
    with guarded_proxy(upstream.url) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.sendall(request_bytes("POST", "/hang", b"{}"))
            time.sleep(0.5)  # the request reached the upstream
        deadline = time.monotonic() + 10
        while not upstream.recorder.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
    assert upstream.recorder.cancelled == ["/hang"]


def test_slowloris_connections_get_408_and_are_closed_while_others_are_served(upstream):
    with guarded_proxy(upstream.url, header_timeout=1.0) as proxy:
        sockets = [socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(50)]
        try:
            for sock in sockets:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            assert requests.get(proxy.url + "/v1/models", timeout=10).status_code == 200
            started = time.monotonic()
            answers = [read_all(sock, 10) for sock in sockets]
            waited = time.monotonic() - started
        finally:
            for sock in sockets:
                sock.close()
    assert all(status_of(answer) == 408 for answer in answers) and waited < 5


def test_an_idle_connection_is_closed_after_the_header_timeout(upstream):
    with (
        guarded_proxy(upstream.url, header_timeout=1.0) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as sock,
    ):
        started = time.monotonic()
        answer = read_all(sock, 10)
    assert status_of(answer) == 408 and time.monotonic() - started < 5


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"], ids=["guarded", "streamed-through"])
def test_a_request_body_that_stalls_is_408(upstream, path):
    with guarded_proxy(upstream.url, body_timeout=1.0) as proxy:
        head = request_bytes("POST", path, b"x" * 100)[:-90]  # headers promise 100 bytes, 10 come
        started = time.monotonic()
        answer = exchange(proxy.port, head, timeout=10)
    assert status_of(answer) == 408 and time.monotonic() - started < 5
    assert not any(r.path == "/v1/completions" for r in upstream.recorder.received)


def test_the_admin_token_guards_kvops_endpoints_but_healthz(tmp_path):
    from kvops.watch.watcher import EventLog
    from tests.support.metrics_server import MetricsServer, vllm_exposition

    with MetricsServer(vllm_exposition(0.3)) as metrics:

        def make_app():
            from kvops.policy import load_policy
            from kvops.watch.server import create_app
            from kvops.watch.sources import ScrapeSource
            from kvops.watch.watcher import Watcher

            watcher = Watcher(load_policy(), "vllm", ScrapeSource("vllm", metrics.url, timeout=2), log=EventLog(None))
            return create_app(watcher, 1.0, token="t0ken")

        with ServerThread(make_app, guarded=True) as admin:
            answers = {
                (path, auth): requests.get(
                    admin.url + path, headers={"Authorization": auth} if auth else {}
                ).status_code
                for path in ("/kvops/policy", "/kvops/status", "/kvops/metrics", "/kvops/%70olicy", "/kvops/healthz")
                for auth in (None, "Bearer wrong", "Bearer t0ken")
            }
    for (path, auth), status in answers.items():
        expected = 200 if path == "/kvops/healthz" or auth == "Bearer t0ken" else 401
        assert status == expected, (path, auth, status)
