"""One overload burst, run twice on the real vLLM CPU engine: the stock scheduler, then the KV guard.

    python bench/kv_guard_burst.py [--requests 32] [--seed 0] [--json]

Both runs start the same engine (the locally built tiny llama, dummy weights, a 4 MiB KV pool: 31 usable blocks
of 128 tokens) and send the same requests at once: fixed seed, prompts of random token ids, ignore_eos so every
request generates exactly max_tokens. Figures: requests completed, vllm:num_preemptions_total, end-to-end latency
p50/p99 seen by the client, and queue drain (burst start until vllm:num_requests_waiting is 0 for good, and
until the last request completes). Takes 5-10 minutes on 2 cores, most of it engine startup.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from tests.support.tiny_model import build_model  # noqa: E402
from tests.support.vllm_server import DEFAULT_KV_BYTES, VllmServer  # noqa: E402

GUARD = "kvops_vllm.scheduler.KVGuardScheduler"
ENGINE_ARGS = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)]


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass
class Result:
    status: int
    finish_reason: str | None
    completion_tokens: int
    seconds: float
    error: str | None = None


@dataclass
class RunFigures:
    scheduler: str
    sent: int
    completed: int  # finish_reason "length" with every token asked for
    other: int  # rejected, aborted or failed
    preemptions: int
    p50_seconds: float
    p99_seconds: float
    waiting_drained_seconds: float  # until vllm:num_requests_waiting stays 0
    all_done_seconds: float
    peak_waiting: int
    peak_running: int
    peak_kv_usage: float


def burst(count: int, seed: int) -> list[Request]:
    """Mixed lengths: prompts of 32-384 tokens, 64-640 new tokens (a request projects to 1-8 of the 31 blocks)."""
    rng = random.Random(seed)
    return [Request([rng.randrange(10, 500) for _ in range(rng.randint(32, 384))], rng.randint(64, 640)) for _ in range(count)]


def send(url: str, model: str, request: Request) -> Result:
    body = json.dumps({"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens, "ignore_eos": True, "temperature": 0}).encode()
    started = time.monotonic()
    try:
        http = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(http, timeout=1800) as response:
            answer = json.loads(response.read())
            choice = answer["choices"][0]
            return Result(response.status, choice["finish_reason"], answer["usage"]["completion_tokens"], time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return Result(exc.code, None, 0, time.monotonic() - started, exc.read().decode(errors="replace")[:200])


def scrape(server: VllmServer) -> dict[str, float]:
    values = {}
    for name in ("vllm:num_preemptions_total", "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", server.metrics(), re.MULTILINE)
        values[name] = float(match.group(1)) if match else 0.0
    return values


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))]


def run(server: VllmServer, name: str, requests: list[Request]) -> RunFigures:
    model = str(server.model)
    before = scrape(server)["vllm:num_preemptions_total"]
    samples: list[tuple[float, dict[str, float]]] = []
    done = threading.Event()

    def watch(started: float) -> None:
        while not done.is_set():
            samples.append((time.monotonic() - started, scrape(server)))
            done.wait(0.25)

    started = time.monotonic()
    watcher = threading.Thread(target=watch, args=(started,), daemon=True)
    watcher.start()
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        results = list(pool.map(lambda request: send(server.url, model, request), requests))
    all_done = time.monotonic() - started
    done.set()
    watcher.join()
    after = scrape(server)
    complete = [r for r, q in zip(results, requests) if r.finish_reason == "length" and r.completion_tokens == q.max_tokens]
    waiting_drained = next((t for t, s in reversed(samples) if s["vllm:num_requests_waiting"] > 0), 0.0)
    return RunFigures(
        scheduler=name,
        sent=len(requests),
        completed=len(complete),
        other=len(requests) - len(complete),
        preemptions=int(after["vllm:num_preemptions_total"] - before),
        p50_seconds=percentile([r.seconds for r in complete], 0.50),
        p99_seconds=percentile([r.seconds for r in complete], 0.99),
        waiting_drained_seconds=waiting_drained,
        all_done_seconds=all_done,
        peak_waiting=int(max((s["vllm:num_requests_waiting"] for _, s in samples), default=0)),
        peak_running=int(max((s["vllm:num_requests_running"] for _, s in samples), default=0)),
        peak_kv_usage=max((s["vllm:kv_cache_usage_perc"] for _, s in samples), default=0.0),
    )


def engine(model: Path, logs: Path, scheduler: str | None) -> VllmServer:
    args = ENGINE_ARGS + (["--scheduler-cls", scheduler] if scheduler else [])
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return VllmServer(model, logs / f"vllm-{'guard' if scheduler else 'stock'}.log", args=args, env=env)


def print_table(runs: list[RunFigures], requests: list[Request], seed: int) -> None:
    tokens = sum(len(r.prompt) + r.max_tokens for r in requests)
    print(f"burst: {len(requests)} requests at once (seed {seed}), prompts {min(len(r.prompt) for r in requests)}-{max(len(r.prompt) for r in requests)} tokens, "
          f"max_tokens {min(r.max_tokens for r in requests)}-{max(r.max_tokens for r in requests)}, ignore_eos; {tokens} tokens projected in all")
    print("engine: tiny llama (2 layers, 2 KV heads x 64), bf16, --kv-cache-memory-bytes 4194304 = 32 blocks of 128 tokens (31 usable)\n")
    header = f"{'scheduler':<10} {'completed':>9} {'other':>5} {'preemptions':>11} {'p50 e2e':>8} {'p99 e2e':>8} {'queue drained':>13} {'all done':>8} {'peak waiting':>12} {'peak running':>12} {'peak KV':>7}"
    print(header)
    for r in runs:
        print(f"{r.scheduler:<10} {r.completed:>5}/{r.sent:<3} {r.other:>5} {r.preemptions:>11} {r.p50_seconds:>7.1f}s {r.p99_seconds:>7.1f}s "
              f"{r.waiting_drained_seconds:>12.1f}s {r.all_done_seconds:>7.1f}s {r.peak_waiting:>12} {r.peak_running:>12} {r.peak_kv_usage:>7.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    requests = burst(options.requests, options.seed)
    runs = []
    with tempfile.TemporaryDirectory(prefix="kv-guard-burst-") as folder:
        model = build_model(Path(folder) / "tiny-llama")
        for name, scheduler in (("stock", None), ("kv-guard", GUARD)):
            with engine(model, Path(folder), scheduler) as server:
                runs.append(run(server, name, requests))
                if scheduler:
                    guard_lines = [line for line in server.log_text().splitlines() if "kvops guard" in line]
    if options.json:
        print(json.dumps({"seed": options.seed, "runs": [asdict(r) for r in runs]}, indent=2))
    else:
        print_table(runs, requests, options.seed)
        print("\nKV guard log:\n" + "\n".join("  " + line.split("] ", 1)[-1] for line in guard_lines))


if __name__ == "__main__":
    main()
