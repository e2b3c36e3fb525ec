"""Run an aiohttp application on 127.0.0.1 in a background thread, for synchronous tests and benchmarks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from tests.support.vllm_server import free_port


class ServerThread:
    """`with ServerThread(make_app) as server: server.url` — make_app() runs inside the server's own loop.

    With `guarded=True` the app is served as `kvops watch` serves it (kvops.watch.connection: the header deadline,
    half-close), its events written to `log` (an EventLog, default none)."""

    def __init__(
        self,
        make_app: Callable,
        port: int | None = None,
        *,
        guarded: bool = False,
        header_timeout: float = 20,
        log=None,
    ):
        self.make_app = make_app
        self.port = port or free_port()
        self.guarded, self.header_timeout, self.log = guarded, header_timeout, log
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self.loop)

        async def start():
            if self.guarded:
                from kvops.watch.connection import serve
                from kvops.watch.watcher import EventLog

                self.listener = await serve(
                    self.make_app(),
                    "127.0.0.1",
                    self.port,
                    header_timeout=self.header_timeout,
                    log=self.log or EventLog(None),
                )
                self.runner = self.listener.runner
            else:
                self.runner = web.AppRunner(self.make_app(), handler_cancellation=True)
                await self.runner.setup()
                await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
            self.ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()
        self.loop.run_until_complete(self.listener.close() if self.guarded else self.runner.cleanup())
        self.loop.close()

    def call(self, coroutine_function: Callable, *args):
        """Run a coroutine on the server's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine_function(*args), self.loop).result(timeout=30)

    def start(self) -> ServerThread:
        self.thread.start()
        if not self.ready.wait(timeout=30):
            raise RuntimeError("server did not start")
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
