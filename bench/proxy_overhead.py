"""What the admission proxy and the in-process middleware cost: requests per second and added p50/p99 latency
against the same server without them, and their CPU time per request.

    python bench/proxy_overhead.py [--requests 3000] [--concurrency 16] [--rounds 3] [--baseline CHECKOUT]

One run, same machine: a fast local upstream (a separate process answering an OpenAI-style completion at once,
and serving a vLLM /metrics whose KV usage this script sets), `kvops watch --proxy` in front of it (a separate
process, as deployed), and this process as the client (aiohttp). With `--baseline`, a second `kvops watch --proxy`
runs the kvops of another checkout (e.g. `git worktree add /tmp/base <commit>`) beside this one: before and after,
in the same run. Rounds interleave direct and proxied runs, in reverse order every other round, so drift hits all
alike. Each path gets two passes per round: a throughput pass with `--concurrency` requests in flight (req/s, and
each server's own CPU time per request: its process's utime + stime, which a busy shared machine disturbs far less
than latency), then a latency pass with one request in flight (p50, p99). Latency under load would not measure
what a path adds to a request: with N requests in flight on cores that the client and the servers share, each
request waits for the others' CPU, so p50 grows by about N x the added CPU / cores (Little's law) and a path's CPU
cost is counted N times over. Three cases through the proxy:
  ok    - KV usage 0.10: the body is parsed and forwarded byte for byte;
  warn  - KV usage 0.75: max_tokens 1024 is capped at 512, the body re-serialised;
  get   - an unguarded GET /v1/models, streamed through untouched.

The middleware (`kvops_vllm.middleware.KVOpsMiddleware`) runs inside vLLM's API server, so it is measured inside an
ASGI server: uvicorn (the server vLLM runs, with the same defaults: uvloop, httptools) serving a minimal ASGI app that
answers like the fast upstream and keeps a `vllm:kv_cache_usage_perc` gauge as vLLM's stat logger does (POST /usage
sets it), once bare ("asgi") and once wrapped in the middleware ("middleware"), each its own process. vLLM's real
app (FastAPI, its own middleware, the engine) costs more per request in both arms alike and needs the engine; the
difference between the two arms is what the middleware adds. Its CPU per request is also measured in-process, a
no-op ASGI app wrapped and bare, free of the server's and the machine's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.metrics_server import vllm_exposition  # noqa: E402 - after the path set-up
from tests.support.processes import checkout_env  # noqa: E402
from tests.support.vllm_server import free_port  # noqa: E402

KV_USAGE = "vllm:kv_cache_usage_perc"  # the gauge vLLM's stat logger sets in its API server process

BODY = json.dumps({"model": "m", "prompt": "the cache grows with every token", "max_tokens": 1024}).encode()


def serve_asgi(port: int, guarded: bool) -> None:
    """uvicorn serving a minimal ASGI app that answers as the fast upstream does, wrapped in kvops' middleware or not."""
    import uvicorn
    from prometheus_client import Gauge

    usage = Gauge(KV_USAGE, "KV-cache usage.", labelnames=["model_name", "engine"]).labels("m", "0")
    usage.set(0.1)
    app = minimal_app(usage)
    if guarded:
        from kvops_vllm.middleware import KVOpsMiddleware

        app = KVOpsMiddleware(app)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off", interface="asgi3"
    )


def minimal_app(usage: Any) -> Callable[..., Awaitable[None]]:
    """The fast upstream as a pure ASGI app: it reads each request's body, as vLLM does, and answers at once."""
    completion = json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        }
    ).encode()
    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/usage":
            usage.set(float(body))
        answer = models if scope["method"] == "GET" else completion
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    return app


def inprocess_cpu(method: str, path: str, usage: float, calls: int = 20000) -> float:
    """The middleware's own CPU per request in microseconds: a no-op ASGI app called wrapped, less called bare."""
    from prometheus_client import CollectorRegistry

    from kvops.policy import load_policy
    from kvops_vllm.middleware import KVOpsMiddleware, MiddlewareSettings

    async def noop(scope: dict, receive: Callable, send: Callable) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    wrapped = KVOpsMiddleware(
        noop, settings=MiddlewareSettings(load_policy(), "bench"), usage=lambda: usage, registry=CollectorRegistry()
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}

    async def receive() -> dict:
        return {"type": "http.request", "body": BODY if method == "POST" else b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    async def run(app: Callable) -> float:
        began = time.process_time()
        for _ in range(calls):
            await app(dict(scope), receive, send)
        return time.process_time() - began

    bare, guarded = asyncio.run(run(noop)), asyncio.run(run(wrapped))
    return (guarded - bare) / calls * 1e6


def serve_upstream(port: int) -> None:
    """The fast upstream: answers completions at once; /metrics serves the usage last POSTed to /usage."""
    from aiohttp import web

    state = {"usage": 0.1}
    answer = json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        }
    )

    async def completion(request):
        await request.read()
        return web.Response(text=answer, content_type="application/json")

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def metrics(request):
        return web.Response(text=vllm_exposition(state["usage"]), content_type="text/plain")

    async def usage(request):
        state["usage"] = float(await request.text())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completion)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/usage", usage)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def load(url: str, method: str, total: int, concurrency: int) -> tuple[float, list[float]]:
    """(requests per second, latencies in seconds) for `total` requests, `concurrency` at a time."""
    from aiohttp import ClientSession, TCPConnector

    latencies: list[float] = []
    remaining = iter(range(total))

    async def worker(session):
        for _ in remaining:
            start = time.perf_counter()
            async with session.request(
                method, url, data=BODY if method == "POST" else None, headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url} answered {response.status}")
            latencies.append(time.perf_counter() - start)

    async with ClientSession(connector=TCPConnector(limit=concurrency)) as session:
        began = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return total / elapsed, latencies


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def set_level(upstream: str, proxies: list[str], usage: float, level: str) -> None:
    urllib.request.urlopen(
        urllib.request.Request(upstream + "/usage", data=str(usage).encode(), method="POST"), timeout=5
    ).read()
    deadline = time.monotonic() + 30
    for proxy in proxies:
        while json.loads(urllib.request.urlopen(proxy + "/kvops/policy", timeout=5).read())["level"] != level:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the watcher at {proxy} did not reach {level}")
            time.sleep(0.1)


def percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(percent / 100 * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_asgi(port: int, guarded: bool) -> subprocess.Popen:
    flag = "--serve-middleware" if guarded else "--serve-asgi"
    return subprocess.Popen([sys.executable, __file__, flag, str(port)], env=checkout_env())


def start_watch(checkout: Path, upstream: str, port: int) -> subprocess.Popen:
    """`kvops watch --proxy` of the kvops in `checkout`."""
    env = {**checkout_env(), "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "plugins")])}
    args = ["--engine", "vllm", "--metrics-url", upstream + "/metrics", "--interval", "0.5"]
    args += ["--listen", f"127.0.0.1:{port}", "--proxy", upstream]
    return subprocess.Popen(
        [sys.executable, "-m", "kvops", "watch", *args], env=env, cwd=checkout, stdout=subprocess.DEVNULL
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout whose kvops runs a second proxy: before/after")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-asgi", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-middleware", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.serve_upstream)
    if args.serve_asgi or args.serve_middleware:
        return serve_asgi(args.serve_asgi or args.serve_middleware, guarded=bool(args.serve_middleware))

    upstream = f"http://127.0.0.1:{free_port()}"
    processes = [
        subprocess.Popen([sys.executable, __file__, "--serve-upstream", upstream.rsplit(":", 1)[1]], env=checkout_env())
    ]
    try:
        wait_http(upstream + "/v1/models")
        checkouts = {"proxy": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
        proxies: dict[str, tuple[str, subprocess.Popen]] = {}
        for via, checkout in checkouts.items():
            port = free_port()
            processes.append(start_watch(checkout, upstream, port))
            proxies[via] = (f"http://127.0.0.1:{port}", processes[-1])
            wait_http(proxies[via][0] + "/kvops/healthz")
        servers: dict[str, tuple[str, subprocess.Popen]] = {}
        for via in ("asgi", "middleware"):
            port = free_port()
            processes.append(start_asgi(port, guarded=via == "middleware"))
            servers[via] = (f"http://127.0.0.1:{port}", processes[-1])
            wait_http(servers[via][0] + "/v1/models")
        print(
            f"{args.requests} requests x {args.rounds} rounds per case: req/s and CPU with {args.concurrency} in flight, "
            f"p50 and p99 with one; client, proxies, ASGI servers and upstream on one {os.cpu_count()}-core machine"
            + (f"; baseline: the kvops of {args.baseline}" if args.baseline else "")
            + "\n"
        )
        print(f"{'case':<44} {'path':<11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11}")
        for name, (method, path, usage, level) in CASES.items():
            set_level(upstream, [url for url, _ in proxies.values()], usage, level)
            for url, _ in servers.values():
                post_usage(url, usage)
            bases = {"direct": (upstream, None)} | {
                via: (url, p.pid) for via, (url, p) in {**proxies, **servers}.items()
            }
            summary = measure(bases, method, path, args)
            print_case(name, summary, list(proxies), args.requests * args.rounds)
            cpu = inprocess_cpu(method, path, usage)
            print(f"{'':<44} {'middleware in-process':<21} {cpu:29.1f} us/req (its own CPU, no server)")
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=20)


# case -> (method, path, KV usage, the level it gives); levels only rise, so the policy's dwell never holds one up
CASES = {
    "POST /v1/completions, level ok": ("POST", "/v1/completions", 0.10, "ok"),
    "GET /v1/models (unguarded)": ("GET", "/v1/models", 0.10, "ok"),
    "POST /v1/completions, level warn (clamped)": ("POST", "/v1/completions", 0.75, "warn"),
}


def post_usage(url: str, usage: float) -> None:
    """Set an ASGI server's vllm:kv_cache_usage_perc (the middleware reads it at its next guarded request)."""
    request = urllib.request.Request(url + "/usage", data=str(usage).encode(), method="POST")
    urllib.request.urlopen(request, timeout=5).read()


def measure(bases: dict[str, tuple[str, int | None]], method: str, path: str, args: argparse.Namespace) -> dict:
    """via -> (median req/s, p50 ms, p99 ms, CPU seconds of its process): req/s and CPU with `--concurrency` in
    flight, p50 and p99 with one; rounds interleave every path, in reverse order every other round."""
    results: dict[str, list] = {via: [[], [], 0.0] for via in bases}
    order = list(bases.items())
    for round_ in range(args.rounds):
        for via, (base, pid) in order if round_ % 2 == 0 else reversed(order):
            before = cpu_seconds(pid) if pid else 0.0
            rate, _ = asyncio.run(load(base + path, method, args.requests, args.concurrency))
            results[via][2] += (cpu_seconds(pid) - before) if pid else 0.0
            results[via][0].append(rate)
            results[via][1].extend(asyncio.run(load(base + path, method, args.requests, 1))[1])
    return {
        via: (statistics.median(rates), percentile(lat, 50) * 1000, percentile(lat, 99) * 1000, cpu)
        for via, (rates, lat, cpu) in results.items()
    }


def print_case(name: str, summary: dict, proxies: list[str], total: int) -> None:
    """One row per path, then what each adds: the proxies over direct, the middleware over the bare ASGI server."""
    for index, (via, (rate, p50, p99, cpu)) in enumerate(summary.items()):
        per_request = f"{cpu / total * 1e6:11.0f}" if via != "direct" else f"{'':>11}"
        print(f"{name if index == 0 else '':<44} {via:<11} {rate:8.0f} {p50:8.2f} {p99:8.2f} {per_request}")
    pairs = [(via, "direct") for via in proxies] + [("middleware", "asgi")]
    for via, base in pairs:
        rate, p50, p99, cpu = summary[via]
        b_rate, b50, b99, b_cpu = summary[base]
        added_cpu = f"{(cpu - b_cpu) / total * 1e6:+11.0f}" if base != "direct" else f"{'':>11}"
        print(f"{'':<44} {'+' + via:<11} {rate / b_rate - 1:+8.0%} {p50 - b50:+8.2f} {p99 - b99:+8.2f} {added_cpu}")


if __name__ == "__main__":
    main()
