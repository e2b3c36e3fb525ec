"""`kvops watch` as a service: the source, the watcher, its /kvops/* server, the admission proxy, signals, shutdown.

`watch(options, log)` runs until SIGINT/SIGTERM. The /kvops/* endpoints listen on `options.listen`; the proxy, when
configured, on `options.proxy_listen`, or beside the endpoints on `options.listen` when it has no address of its
own. Either way the proxy reads the watcher's limits in-process, and opens after the watcher's first poll.
`run(coroutine)` runs it on uvloop when installed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvops.errors import KvopsError, UsageError
from kvops.frozen import frozen
from kvops.policy import Policy
from kvops.watch.sources import MetricsSource, PrometheusSource, ScrapeSource
from kvops.watch.watcher import EventLog, Snapshot, Watcher

if TYPE_CHECKING:
    from kvops.watch.connection import Listener
    from kvops.watch.proxy import ProxySettings

DEFAULT_HOST = "127.0.0.1"  # a --listen given as a port only: the endpoints stay on this machine unless asked


@frozen
class WatchOptions:
    engine: str
    policy: Policy
    metrics_url: str | None = None
    prometheus: str | None = None
    selector: str | None = None
    replica_label: str = "instance"
    interval: float = 1.0
    timeout: float = 1.0
    listen: tuple[str, int] | None = None
    webhook: str | None = None
    runbook_url: str = "runbooks"
    record: Path | None = None
    capacity_tokens: int | None = None
    proxy: ProxySettings | None = None
    proxy_listen: tuple[str, int] | None = None  # None: the proxy shares `listen`
    header_timeout: float = 20.0  # a request's headers must arrive within this (Apache mod_reqtimeout's 20 s)
    admin_token: str | None = None  # bearer token the /kvops/* endpoints (but healthz) require
    request_tokens: int | None = None  # the headroom's R (None: the policy's, else the engine's max-model-len)


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run on uvloop when it is installed (the proxy's per-request cost falls by about a third), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def admin_token(path: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The admin token from a file (its first line), or from KVOPS_ADMIN_TOKEN; None when neither is given."""
    if path is not None:
        from kvops.files import read_text

        text = read_text(path, "--admin-token-file", 64 << 10).strip()  # a regular file: a FIFO is refused
        if not text:
            raise KvopsError(f"--admin-token-file {path}: the file is empty; put the token on its first line")
        return text.splitlines()[0].strip()
    token = (os.environ if environ is None else environ).get("KVOPS_ADMIN_TOKEN", "").strip()
    return token or None


def make_source(options: WatchOptions) -> MetricsSource:
    if options.prometheus:
        return PrometheusSource(
            options.engine,
            options.prometheus,
            selector=options.selector,
            replica_label=options.replica_label,
            timeout=options.timeout,
            capacity_tokens=options.capacity_tokens,
        )
    if options.metrics_url is None:
        raise UsageError("kvops watch needs --metrics-url URL or --prometheus URL")
    return ScrapeSource(
        options.engine, options.metrics_url, timeout=options.timeout, capacity_tokens=options.capacity_tokens
    )


def make_watcher(options: WatchOptions, log: EventLog, polls_once: bool = False) -> Watcher:
    """The watcher of `options`; its record names a run of one poll when `polls_once`, else the poll interval."""
    from kvops.watch.record import Recorder

    generator = None
    if options.listen:
        host, port = options.listen
        generator = f"http://{socket.gethostname() if host in ('', '0.0.0.0', '::') else host}:{port}/kvops/status"
    return Watcher(
        options.policy,
        options.engine,
        make_source(options),
        webhook=options.webhook,
        runbook_url=options.runbook_url,
        generator_url=generator,
        recorder=Recorder(options.record, None if polls_once else options.interval) if options.record else None,
        request_tokens=options.request_tokens,
        log=log,
    )


async def once(options: WatchOptions) -> Snapshot:
    """Poll once (post the alerts that fire, record the row) and return the snapshot."""
    watcher = make_watcher(options, EventLog(None), polls_once=True)
    try:
        snapshot = await watcher.poll()
        refuse_wrong_url(watcher)
        return snapshot
    finally:
        await _close(watcher)


async def watch(options: WatchOptions, log: EventLog) -> None:
    watcher = make_watcher(options, log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        listeners = await serve(options, watcher, log)
    except KvopsError:
        await _close(watcher)
        raise
    try:
        # bound (a port in use has failed already), but listening only once the first poll is done: a request before
        # it would get the limits for missing data (fail-closed: critical's) whatever the engine's usage
        await watcher.poll_or_stop(stop)
        if stop.is_set():
            return
        refuse_wrong_url(watcher)
        for listener in listeners:
            await listener.start()
        log.emit(
            "started",
            engine=options.engine,
            source=watcher.source.url,
            interval=options.interval,
            timeout=options.timeout,
            listen=_address(options.listen),
            proxy_listen=_address(options.proxy_listen or (options.listen if options.proxy else None)),
            webhook=options.webhook,
            policy=options.policy.to_dict(),
        )
        await watcher.run(options.interval, stop)
    finally:
        for listener in listeners:
            await listener.close()
        await _close(watcher)
        log.emit(
            "stopped", polls=watcher.polls, poll_failures=watcher.poll_failures_total, level=watcher.current.level.label
        )


def refuse_wrong_url(watcher: Watcher) -> None:
    """UsageError when the first poll's answer showed --prometheus is not Prometheus' base URL (an API path, an
    engine's /metrics): a bad option, not an engine of unknown level. Once Prometheus has answered, a later such
    answer is missing data like any other."""
    source = watcher.source
    if isinstance(source, PrometheusSource) and not source.answered and source.not_prometheus:
        raise UsageError(source.not_prometheus)


async def _close(watcher: Watcher) -> None:
    await watcher.close()
    if watcher.recorder:
        watcher.recorder.close()


async def serve(options: WatchOptions, watcher: Watcher, log: EventLog) -> list[Listener]:
    """Bind the /kvops/* endpoints and the proxy to their addresses (each serves from its `start()`); KvopsError
    naming the option whose address cannot be bound."""
    if not options.listen and not options.proxy_listen:
        return []
    from aiohttp import web

    from kvops.watch.connection import capture_library_logs
    from kvops.watch.proxy import mount
    from kvops.watch.server import REGISTRY, create_app

    capture_library_logs(log)
    admin = create_app(watcher, options.interval, options.admin_token)
    apps: list[tuple[str, tuple[str, int], web.Application]] = []
    if options.listen:
        apps.append(("--listen", options.listen, admin))
    if options.proxy is not None:
        shared = options.proxy_listen is None
        client_app = admin if shared else web.Application()
        mount(
            client_app, options.proxy, lambda: watcher.current.limits, admin[REGISTRY], log, watcher.policy.priorities
        )
        if options.proxy_listen is not None:
            apps.append(("--proxy-listen", options.proxy_listen, client_app))
    listeners: list[Listener] = []
    try:
        for option, address, app in apps:
            listeners.append(await _listen(option, address, app, options.header_timeout, log))
    except KvopsError:
        for listener in listeners:
            await listener.close()
        raise
    return listeners


async def _listen(option: str, address: tuple[str, int], app: Any, header_timeout: float, log: EventLog) -> Listener:
    from kvops.watch.connection import serve

    host, port = address
    try:
        return await serve(app, host, port, header_timeout=header_timeout, log=log, start_serving=False)
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise KvopsError(f"{option} {host}:{port}: cannot listen there ({reason}); choose another address") from None


def _address(address: tuple[str, int] | None) -> str | None:
    return f"{address[0]}:{address[1]}" if address else None
