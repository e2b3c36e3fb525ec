"""A fast local upstream for proxy tests and benchmarks: records what it receives, answers at once.

It is not an engine: the proxy's mechanics (what reaches the upstream, streaming, cancellation, errors) are
what it measures. With `forward_to` it records and passes each request on to a real engine instead, so a test
in front of the real vLLM engine can see exactly what the proxy sent.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    raw_path: str = ""  # the target as it arrived, undecoded, query included

    def json(self):
        return json.loads(self.body)


@dataclass
class RecordingUpstream:
    chunks: int = 5
    chunk_delay: float = 0.0
    stall_after: int | None = None  # stop sending (without ending the stream) after this many events
    forward_to: str | None = None
    received: list[Received] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def app(self):
        from aiohttp import web

        # bodies recorded as they came, Content-Encoding and all: vLLM's uvicorn and TGI's axum decode none
        app = web.Application(client_max_size=64 << 20, handler_args={"auto_decompress": False})
        app.router.add_route("*", "/hang", self.hang)
        app.router.add_route("*", "/{tail:.*}", self.answer)
        return app

    async def answer(self, request):
        from aiohttp import web

        body = await request.read()
        self.received.append(
            Received(request.method, request.path, request.query_string, dict(request.headers), body, request.raw_path)
        )
        if self.forward_to:
            return await self.forward(request, body)
        streaming = request.path.endswith("_stream") or (body[:1] == b"{" and json.loads(body).get("stream") is True)
        if not streaming:
            return web.json_response({"path": request.path, "bytes": len(body)})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for index in range(self.chunks):
                if index == self.stall_after:
                    await asyncio.sleep(3600)
                await response.write(f"data: {json.dumps({'index': index})}\n\n".encode())
                await asyncio.sleep(self.chunk_delay)
            await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled.append(request.path)
            raise
        return response

    async def forward(self, request, body: bytes):
        from aiohttp import ClientSession, web

        async with (
            ClientSession() as session,
            session.request(
                request.method,
                self.forward_to + request.path_qs,
                data=body or None,
                headers={"Content-Type": request.content_type},
            ) as upstream,
        ):
            response = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def hang(self, request):
        await request.read()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.append(request.path)
            raise
