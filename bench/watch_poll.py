"""What the watcher costs and how fast it reacts (a benchmark that prints figures, not a test).

1. CPU per poll: `kvops watch`'s poll (GET /metrics, prometheus_client's parser, the engine reading, signals, level,
   alerts) against a recorded vLLM /metrics (52 KB, 369 vllm: samples) served by another process; and the same
   through a real Prometheus with two replicas when `prometheus` is installed.
2. Reaction: the time from the served usage crossing a threshold (the file behind the server replaced at a known
   instant) to the watcher's level change, for several poll intervals.

    python bench/watch_poll.py [--polls 400] [--trials 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from kvops.engines.metrics import Samples  # noqa: E402
from kvops.engines.vllm import metrics as vllm  # noqa: E402
from kvops.policy import Level, load_policy  # noqa: E402
from kvops.watch.sources import PrometheusSource, ScrapeSource  # noqa: E402
from kvops.watch.watcher import Watcher  # noqa: E402
from tests.support.daemons import PROMETHEUS, PrometheusServer  # noqa: E402
from tests.support.metrics_server import VLLM_RECORDED, spawn, vllm_exposition  # noqa: E402
from tests.support.vllm_server import free_port  # noqa: E402


def serve(text: str, folder: Path):
    path = folder / f"metrics-{free_port()}.prom"
    path.write_text(text)
    port = free_port()
    return spawn(port, path), path, f"http://127.0.0.1:{port}/metrics", f"127.0.0.1:{port}"


def stop(process) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=10)


async def cpu_per_poll(source, polls: int) -> tuple[float, float]:
    watcher = Watcher(load_policy(), "vllm", source)
    for _ in range(20):  # warm up: imports, connections
        await watcher.poll()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(polls):
        await watcher.poll()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await watcher.close()
    return cpu / polls, wall / polls


async def reaction(url: str, path: Path, interval: float, trials: int) -> list[float]:
    """Replace the served body (usage 0.50 -> 0.90) at t0; the latency is the first snapshot at degrade minus t0."""
    policy = load_policy()
    delays = []
    for _ in range(trials):
        path.write_text(vllm_exposition(0.50))
        watcher = Watcher(policy, "vllm", ScrapeSource("vllm", url, timeout=5))
        stop_event = asyncio.Event()
        runner = asyncio.create_task(watcher.run(interval, stop_event))
        while watcher.current.level != Level.OK:
            await asyncio.sleep(0.001)
        await asyncio.sleep(interval * (len(delays) + 0.5) / trials)  # crossings spread evenly over the poll cycle
        pending = path.with_suffix(".next")
        pending.write_text(vllm_exposition(0.90))
        crossed = time.perf_counter()
        os.replace(pending, path)
        while watcher.current.level != Level.DEGRADE:
            await asyncio.sleep(0.0005)
        delays.append(time.perf_counter() - crossed)
        stop_event.set()
        await runner
        await watcher.close()
    return delays


def describe(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   max {ordered[-1] * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=400)
    parser.add_argument("--trials", type=int, default=20)
    arguments = parser.parse_args()
    text = VLLM_RECORDED.read_text()
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"recorded vLLM /metrics: {len(text.encode())} bytes, {samples} samples")

    for label, only in (("every line", None), ("the watcher's metrics only", vllm.SERIES)):
        start = time.process_time()
        for _ in range(200):
            vllm.reading(Samples.from_exposition(text, only=only))
        print(f"parse + reading, {label + ':':<27} {(time.process_time() - start) / 200 * 1000:6.2f} ms CPU")

    with tempfile.TemporaryDirectory() as folder:
        server, path, url, target = serve(text, Path(folder))
        try:
            cpu, wall = asyncio.run(cpu_per_poll(ScrapeSource("vllm", url, timeout=5), arguments.polls))
            print(
                f"direct scrape, one poll:                     {cpu * 1000:6.2f} ms CPU, {wall * 1000:6.2f} ms wall   "
                f"({cpu * 100:.2f}% of one core at the default 1 s interval)"
            )
            if PROMETHEUS:
                second, _, _, second_target = serve(vllm_exposition(0.72), Path(folder))
                try:
                    with PrometheusServer(
                        Path(folder) / "prometheus", {"vllm": [target, second_target]}, scrape_interval="1s"
                    ) as prometheus:
                        prometheus.wait_for_series("vllm:kv_cache_usage_perc", count=2)
                        source = PrometheusSource(
                            "vllm", prometheus.url, selector='{job="vllm"}', replica_label="instance", timeout=5
                        )
                        cpu, wall = asyncio.run(cpu_per_poll(source, arguments.polls // 4))
                        print(
                            f"Prometheus, 2 replicas, one poll:            {cpu * 1000:6.2f} ms CPU, {wall * 1000:6.2f} ms wall   (one instant query)"
                        )
                finally:
                    stop(second)
            print(f"\ntime from usage crossing 85% to the level change ({arguments.trials} trials each):")
            for interval in (1.0, 0.5, 0.1):
                delays = asyncio.run(reaction(url, path, interval, arguments.trials))
                print(f"  --interval {interval:<4g}  {describe(delays)}")
        finally:
            stop(server)


if __name__ == "__main__":
    main()
