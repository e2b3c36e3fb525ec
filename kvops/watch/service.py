"""`kvops watch` as a service: the source, the watcher, its /kvops/* server, signals, shutdown.

`watch(options, setup_app=...)` runs until SIGINT/SIGTERM. `setup_app` receives the aiohttp application before
it starts, so another module (the admission proxy) can add routes to the same `--listen` server and read
`app[server.WATCHER].current` in-process.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvops.policy import Policy
from kvops.watch.sources import MetricsSource, PrometheusSource, ScrapeSource
from kvops.watch.watcher import EventLog, Snapshot, Watcher


@dataclass(frozen=True)
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
    return ScrapeSource(
        options.engine, options.metrics_url, timeout=options.timeout, capacity_tokens=options.capacity_tokens
    )


def make_watcher(options: WatchOptions, log: EventLog) -> Watcher:
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
        recorder=Recorder(options.record) if options.record else None,
        log=log,
    )


async def once(options: WatchOptions) -> Snapshot:
    """Poll once (post the alerts that fire, record the row) and return the snapshot."""
    watcher = make_watcher(options, EventLog(None))
    try:
        return await watcher.poll()
    finally:
        await watcher.close()
        if watcher.recorder:
            watcher.recorder.close()


async def watch(options: WatchOptions, log: EventLog, setup_app: Callable | None = None) -> None:
    watcher = make_watcher(options, log)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = None
    try:
        if options.listen:
            from kvops.watch.server import create_app, serve

            app = create_app(watcher, options.interval)
            if setup_app is not None:
                setup_app(app)
            runner = await serve(app, *options.listen)
        log.emit(
            "started",
            engine=options.engine,
            source=watcher.source.url,
            interval=options.interval,
            timeout=options.timeout,
            listen=f"{options.listen[0]}:{options.listen[1]}" if options.listen else None,
            webhook=options.webhook,
            policy=options.policy.to_dict(),
        )
        await watcher.run(options.interval, stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        await watcher.close()
        if watcher.recorder:
            watcher.recorder.close()
        log.emit(
            "stopped", polls=watcher.polls, poll_failures=watcher.poll_failures_total, level=watcher.current.level.label
        )
