"""The proxy's own upstream client (kvops/watch/upstream.py) over real sockets: what it sends, what it passes back,
keep-alive, HEAD, chunked bodies both ways, an upstream that closes idle connections."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from tests.support.aio import ServerThread
from tests.support.raw_http import RawUpstream, exchange, status_of
from tests.unit.watch.test_proxy import LevelHolder, make_proxy_app

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")


@pytest.fixture
def proxy(upstream):
    with ServerThread(make_proxy_app(upstream.url, LevelHolder()), guarded=True) as server:
        yield server


def test_only_what_the_client_sent_is_forwarded(proxy, upstream):
    raw = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Trace: 1\r\nX-Trace: 2\r\nConnection: close, X-Hop\r\nX-Hop: h\r\n\r\n"
    assert status_of(exchange(proxy.port, raw)) == 200
    headers = upstream.recorder.received[-1].headers
    assert "User-Agent" not in headers and "Accept-Encoding" not in headers and "X-Hop" not in headers
    assert headers["Host"] == upstream.url.removeprefix("http://") and headers["X-Trace"] in ("1", "1,2", "1, 2")


def test_an_upstream_cookie_never_rides_on_another_clients_request(upstream):
    def make_app():
        from aiohttp import web

        seen = []

        async def answer(request):
            seen.append(request.headers.get("Cookie"))
            return web.json_response(seen, headers={"Set-Cookie": "session=alice; Path=/"})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        return app

    with ServerThread(make_app) as cookies, ServerThread(make_proxy_app(cookies.url, LevelHolder())) as proxy:
        first = requests.get(proxy.url + "/v1/models")
        second = requests.get(proxy.url + "/v1/models")
    assert first.headers["Set-Cookie"] == "session=alice; Path=/"  # passed back to the client it was for
    assert second.json() == [None, None]  # and not kept by the proxy


def test_connections_are_kept_alive_and_an_upstream_that_closes_idle_ones_is_survived():
    """uvicorn (vLLM) closes an idle connection after 5 s; the pool must never hand out one it has closed."""
    connections = []

    def make_app():
        from aiohttp import web

        async def answer(request):
            connections.append(request.transport.get_extra_info("peername"))
            return web.json_response({})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        return app

    from aiohttp import web

    class ShortKeepAlive(ServerThread):
        def _run(self):
            asyncio.set_event_loop(self.loop)

            async def start():
                self.runner = web.AppRunner(self.make_app(), keepalive_timeout=0.5)
                await self.runner.setup()
                await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
                self.ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

    with ShortKeepAlive(make_app) as closing, ServerThread(make_proxy_app(closing.url, LevelHolder())) as proxy:
        statuses = [requests.get(proxy.url + "/v1/models").status_code for _ in range(3)]
        time.sleep(1.5)  # the upstream has closed the pooled connection meanwhile
        statuses += [requests.get(proxy.url + "/v1/models").status_code for _ in range(3)]
    assert statuses == [200] * 6
    assert len(set(connections[:3])) == 1 and connections[3] not in connections[:3]


def test_head_answers_carry_the_length_and_no_body(proxy, upstream):
    response = requests.head(proxy.url + "/v1/models")
    assert response.status_code == 200 and response.content == b"" and int(response.headers["Content-Length"]) > 0
    assert requests.get(proxy.url + "/v1/models").status_code == 200  # the connection after a HEAD is not reused


def test_a_chunked_request_body_is_streamed_through(proxy, upstream):
    def pieces():  # no length: requests sends it chunked
        yield b'{"input": "'
        for index in range(5):
            yield f"part {index} ".encode()
        yield b'"}'

    response = requests.post(proxy.url + "/v1/embeddings", data=pieces())
    assert response.status_code == 200
    assert upstream.recorder.received[-1].body == b"".join(pieces())


def test_a_chunked_answer_without_length_streams_back_intact():
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer += b"3\r\n[1,\r\n2\r\n2]\r\n0\r\n\r\n"
    with RawUpstream(answer) as raw, ServerThread(make_proxy_app(raw.url, LevelHolder())) as proxy:
        response = requests.get(proxy.url + "/v1/models")
    assert response.status_code == 200 and response.json() == [1, 2]


def test_a_body_delimited_by_the_close_is_passed_whole():
    answer = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 100_000
    with RawUpstream(answer) as raw, ServerThread(make_proxy_app(raw.url, LevelHolder())) as proxy:
        response = requests.get(proxy.url + "/v1/models")
    assert response.status_code == 200 and response.content == b"x" * 100_000


def test_a_large_answer_is_streamed_with_its_length(upstream):
    body = b"y" * (3 << 20)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    with RawUpstream(answer) as raw, ServerThread(make_proxy_app(raw.url, LevelHolder())) as proxy:
        response = requests.get(proxy.url + "/v1/models")
    assert response.headers["Content-Length"] == str(len(body)) and response.content == body


def test_an_upstream_that_answers_before_the_body_is_sent_is_passed_on():
    answer = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with RawUpstream(answer) as raw, ServerThread(make_proxy_app(raw.url, LevelHolder())) as proxy:

        def slowly():
            yield b"a" * 1000
            time.sleep(0.5)
            yield b"b" * 1000

        response = requests.post(proxy.url + "/v1/embeddings", data=slowly())
    assert response.status_code == 413


def test_connect_refused_is_502_without_waiting(upstream):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with ServerThread(make_proxy_app(f"http://127.0.0.1:{port}", LevelHolder())) as proxy:
        started = time.monotonic()
        response = requests.get(proxy.url + "/v1/models")
    assert response.status_code == 502 and "unreachable (cannot connect" in response.json()["error"]["message"]
    assert time.monotonic() - started < 3
