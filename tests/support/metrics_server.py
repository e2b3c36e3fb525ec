"""A real HTTP server on 127.0.0.1 that serves whatever exposition (or fault) a test sets.

Used as a stand-in replica (a recorded vLLM /metrics with chosen values), as the second scrape target of a real
Prometheus, and for faults: HTTP 500, a hang longer than the watcher's timeout, garbage, NaN, a renamed metric.
Run as a script (`python -m tests.support.metrics_server --port P --file F`) it is a separate process that serves
F's current content, which a test can kill mid-watch and a benchmark can change at a known instant.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.support.servers import BackgroundServer

DATA = Path(__file__).resolve().parent / "data"
# Recorded from the vLLM 0.32.0 CPU build (tiny llama, 32 blocks of 128 tokens) in the middle of a burst of
# ignore_eos requests; model_name relabelled "tiny-llama".
VLLM_RECORDED = DATA / "vllm-0.32-cpu-metrics.prom"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def vllm_exposition(
    kv_usage: float | str = 0.0,
    *,
    running: float = 0,
    waiting: float = 0,
    preemptions: float = 0,
    generated: float = 0,
    prefix_hits: float = 0,
    prefix_queries: float = 0,
    rename: dict[str, str] | None = None,
) -> str:
    """The recorded vLLM /metrics with the samples the watcher reads set to these values (NaN: kv_usage="NaN")."""
    text = VLLM_RECORDED.read_text()
    values = {
        "vllm:kv_cache_usage_perc": kv_usage,
        "vllm:num_requests_running": running,
        "vllm:num_requests_waiting": waiting,
        "vllm:num_preemptions_total": preemptions,
        "vllm:generation_tokens_total": generated,
        "vllm:prefix_cache_hits_total": prefix_hits,
        "vllm:prefix_cache_queries_total": prefix_queries,
    }
    for name, value in values.items():
        text = re.sub(
            rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$",
            lambda m: f"{m.group(1)} {float(value) if not isinstance(value, str) else value}",
            text,
            flags=re.M,
        )
    for old, new in (rename or {}).items():
        text = text.replace(old, new)
    return text


# The host KV tier's families as vLLM 0.32.0 renders them (written by tests/support/offload_exposition.py with
# vLLM's own OffloadPromMetrics: the CPU build cannot run the tier).
VLLM_OFFLOAD_RECORDED = DATA / "vllm-0.32-offload-metrics.prom"


def offload_exposition(usage: float, loads: int, load_seconds: float, load_bytes: int, *, tier_gib: int = 4) -> str:
    """The recorded vLLM CPU /metrics with a host KV tier: `loads` loads so far, taking `load_seconds` in all (each
    name vLLM exports for it, the deprecated CPU_to_GPU series too), the tier `usage` pinned."""
    values = {
        "vllm:kv_offload_cpu_cache_usage_perc": usage,
        "vllm:kv_offload_load_size_count": loads,
        "vllm:kv_offload_load_size_sum": load_bytes,
        "vllm:kv_offload_load_time_total": load_seconds,
        "vllm:kv_offload_load_bytes_total": load_bytes,
        'vllm:kv_offload_size_count{engine="0",model_name="tiny-llama",transfer_type="CPU_to_GPU"}': loads,
        'vllm:kv_offload_size_sum{engine="0",model_name="tiny-llama",transfer_type="CPU_to_GPU"}': load_bytes,
        'vllm:kv_offload_total_time_total{engine="0",model_name="tiny-llama",transfer_type="CPU_to_GPU"}': load_seconds,
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="tiny-llama",transfer_type="CPU_to_GPU"}': load_bytes,
    }
    text = VLLM_OFFLOAD_RECORDED.read_text()
    for name, value in values.items():
        selector = re.escape(name) if "{" in name else rf"{re.escape(name)}\{{[^}}]*\}}"
        text, count = re.subn(rf"^({selector}) \S+$", lambda m: f"{m.group(1)} {float(value)}", text, flags=re.M)
        assert count == 1, name
    engine = vllm_exposition(0.2).replace('kv_offloading_size="None"', f'kv_offloading_size="{tier_gib}"')
    return engine + text


def data_parallel_exposition(usages: list[float], *, padding_bytes: int = 200_000, adapters: int = 0) -> str:
    """A vLLM /metrics of a data-parallel engine (one `engine` label value per rank, each with its own KV usage),
    in the Prometheus text format: every family once, its samples together, with `padding_bytes` or more of other
    series (the e2e latency histogram for `adapters` LoRA adapters: enough to reach the padding when 0) ahead of
    the KV usage family, the last one."""
    families = _families(vllm_exposition(0.0))
    kv_name = "vllm:kv_cache_usage_perc"
    histogram = "vllm:e2e_request_latency_seconds"
    blocks = []
    for name, lines in families.items():
        if name == kv_name:
            continue
        samples = [line for line in lines if not line.startswith("#")]
        if name == histogram:
            per_adapter = sum(len(line) + 1 for line in samples) * len(usages)
            count = adapters or -(-padding_bytes // per_adapter)
            samples = [
                line.replace('model_name="tiny-llama"', f'model_name="adapter-{a}"')
                for a in range(count)
                for line in samples
            ]
        ranks = [line.replace('engine="0"', f'engine="{rank}"') for line in samples for rank in range(len(usages))]
        blocks.append("\n".join([line for line in lines if line.startswith("#")] + ranks))
    kv_head = [line for line in families[kv_name] if line.startswith("#")]
    kv_samples = [f'{kv_name}{{engine="{rank}",model_name="tiny-llama"}} {usage}' for rank, usage in enumerate(usages)]
    return "\n".join(blocks + ["\n".join(kv_head + kv_samples)]) + "\n"


def _families(text: str) -> dict[str, list[str]]:
    """Exposition lines grouped by the family their HELP line opens, in order."""
    families: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split()[2]
            families[current] = []
        if current is not None and line:
            families[current].append(line)
    return families


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:
        self.server.hits += 1
        if self.server.delay:
            time.sleep(self.server.delay)
        routed = self.server.routes.get(self.path.split("?")[0])
        body = (routed if routed is not None else self.server.current_body()).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", self.server.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # a client that gave up (a watcher's poll timeout) is BackgroundServer's to ignore
        if not self.server.trickle:
            self.wfile.write(body)
            return
        for start in range(0, len(body), 16384):  # the way a big exposition arrives: in pieces, over time
            self.wfile.write(body[start : start + 16384])
            self.wfile.flush()
            time.sleep(0.002)

    def log_message(self, *args) -> None:
        pass


class MetricsServer(BackgroundServer):
    """`with MetricsServer(body) as server:` serves `body` at every path but those in `routes` (vLLM's `/version`,
    say); change `.body`, `.status`, `.delay` live."""

    def __init__(self, body: str = "", port: int = 0, routes: dict[str, str] | None = None):
        super().__init__(("127.0.0.1", port), _Handler)
        self.routes = routes or {}
        self.body, self.status, self.delay, self.content_type, self.hits = body, 200, 0.0, PROMETHEUS_TEXT, 0
        self.trickle = False  # send the body in 16 KiB pieces, 2 ms apart

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def current_body(self) -> str:
        return self.body

    def set(self, body: str | None = None, *, status: int = 200, delay: float = 0.0) -> None:
        if body is not None:
            self.body = body
        self.status, self.delay = status, delay


def spawn(port: int, body_file: Path) -> subprocess.Popen:
    """The server in its own process (to be killed); returns once it answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.metrics_server", "--port", str(port), "--file", str(body_file)],
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"metrics server on port {port} did not start")


class FileMetricsServer(MetricsServer):
    """Serves a file's current content: replace the file (os.replace) to change what the next scrape sees."""

    def __init__(self, path: Path, port: int):
        super().__init__("", port)
        self.path = path

    def current_body(self) -> str:
        return self.path.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--file", type=Path, required=True)
    arguments = parser.parse_args()
    FileMetricsServer(arguments.file, arguments.port).serve_forever()


if __name__ == "__main__":
    main()
