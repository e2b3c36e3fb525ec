"""A FAKE Text Generation Inference router: it serves TGI's /metrics, and nothing else of TGI.

TGI cannot run here (it needs its Rust router, Python shards and a CUDA GPU), so this stands in for the one thing
the watcher reads from it. It speaks TGI's exact wire format, as read in huggingface/text-generation-inference
(db931fcf, v3.3.7+1) and metrics-exporter-prometheus 0.15.3 (TGI's Cargo.lock):

- names and types as the router sets them: gauges `tgi_queue_size` (queue.rs), `tgi_batch_current_size` and
  `tgi_batch_current_max_tokens` (backends/v3/src/backend.rs), counters `tgi_request_count`,
  `tgi_request_success` (router/src/server.rs), `tgi_request_failure{err}`, `tgi_batch_inference_count{method}`,
  `tgi_batch_inference_success{method}`, the histogram `tgi_request_queue_duration` and the summary
  `tgi_request_skipped_tokens` (no buckets configured for it, so the exporter writes quantiles);
- rendered as that exporter renders: `# HELP` from the router's describe_* calls, `# TYPE`, counters as integers
  with no `_total` suffix, gauges as Rust prints an f64 (`8192`, `0.5`), a blank line after each family;
- a metric appears only once first touched: a fresh router serves an empty body;
- `tgi_batch_max_total_tokens` is absent (the router sets it before installing the recorder); the capacity is
  in the startup log, which `write_startup_log` writes as the router logs it.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.support.servers import BackgroundServer

HELP = {
    "tgi_request_count": "Total number of requests",
    "tgi_request_success": "Number of successful requests",
    "tgi_batch_inference_count": "Inference calls per method (prefill or decode)",
    "tgi_batch_inference_success": "Number of successful inference calls per method (prefill or decode)",
    "tgi_queue_size": "Current queue size",
    "tgi_batch_current_size": "Current batch size",
    "tgi_batch_current_max_tokens": "Maximum tokens for the current batch",
    "tgi_request_queue_duration": "Time spent in the queue per request",
    "tgi_request_skipped_tokens": "Speculated tokens per request",
}
QUEUE_BUCKETS = [0.0001 * 1.5 ** (i + 1) for i in range(35)]  # router/src/server.rs: duration buckets
QUANTILES = [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]  # the exporter's default


def rust_f64(value: float) -> str:
    """How Rust's Display prints an f64: 8192 not 8192.0, 0.5, inf, NaN."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class TgiMetrics:
    """The router's metric state; each setter touches its metrics as the router would."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counters: dict[tuple[str, tuple], int] = {}
        self.gauges: dict[str, float] = {}
        self.queue_durations: list[float] = []
        self.skipped: list[float] = []

    def request(self, *, queued_seconds: float = 0.01) -> None:
        """A request arrives, is queued and later succeeds (the counters TGI bumps on the way)."""
        with self.lock:
            self._count("tgi_request_count")
            self._count("tgi_request_success")
            self.queue_durations.append(queued_seconds)

    def batch(self, *, size: int, max_tokens: int, queue: int, decode_steps: int = 1) -> None:
        """The running batch as backend.rs reports it each loop, plus the queue and the decode calls made."""
        with self.lock:
            self.gauges.update(
                {
                    "tgi_batch_current_size": float(size),
                    "tgi_batch_current_max_tokens": float(max_tokens),
                    "tgi_queue_size": float(queue),
                }
            )
            for _ in range(decode_steps):
                self._count("tgi_batch_inference_count", method="decode")
                self._count("tgi_batch_inference_success", method="decode")

    def prefill(self) -> None:
        with self.lock:
            self._count("tgi_batch_inference_count", method="prefill")
            self._count("tgi_batch_inference_success", method="prefill")
            self.skipped.append(0.0)

    def fail(self, err: str) -> None:
        with self.lock:
            self._count("tgi_request_failure", err=err)

    def _count(self, name: str, **labels: str) -> None:
        key = (name, tuple(labels.items()))
        self.counters[key] = self.counters.get(key, 0) + 1

    def render(self) -> str:
        with self.lock:
            out: list[str] = []
            for name in sorted({name for name, _ in self.counters}):
                self._family(
                    out,
                    name,
                    "counter",
                    [
                        f"{name}{_labels(dict(labels))} {value}"
                        for (n, labels), value in sorted(self.counters.items())
                        if n == name
                    ],
                )
            for name, value in sorted(self.gauges.items()):
                self._family(out, name, "gauge", [f"{name} {rust_f64(value)}"])
            if self.queue_durations:
                lines = [
                    f'tgi_request_queue_duration_bucket{{le="{rust_f64(le)}"}} {sum(1 for d in self.queue_durations if d <= le)}'
                    for le in QUEUE_BUCKETS
                ]
                lines += [
                    f'tgi_request_queue_duration_bucket{{le="+Inf"}} {len(self.queue_durations)}',
                    f"tgi_request_queue_duration_sum {rust_f64(sum(self.queue_durations))}",
                    f"tgi_request_queue_duration_count {len(self.queue_durations)}",
                ]
                self._family(out, "tgi_request_queue_duration", "histogram", lines)
            if self.skipped:
                ordered = sorted(self.skipped)
                lines = [
                    f'tgi_request_skipped_tokens{{quantile="{rust_f64(q)}"}} {rust_f64(ordered[min(len(ordered) - 1, int(q * len(ordered)))])}'
                    for q in QUANTILES
                ]
                lines += [
                    f"tgi_request_skipped_tokens_sum {rust_f64(sum(ordered))}",
                    f"tgi_request_skipped_tokens_count {len(ordered)}",
                ]
                self._family(out, "tgi_request_skipped_tokens", "summary", lines)
            return "".join(out)

    @staticmethod
    def _family(out: list[str], name: str, kind: str, lines: list[str]) -> None:
        if name in HELP:
            out.append(f"# HELP {name} {HELP[name]}\n")
        out.append(f"# TYPE {name} {kind}\n")
        out.extend(line + "\n" for line in lines)
        out.append("\n")


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def write_startup_log(path: Path, max_batch_total_tokens: int) -> Path:
    """The router's startup lines around the capacity, in its default (tracing, non-JSON) format."""
    path.write_text(
        "2026-01-08T10:00:00.000000Z  INFO text_generation_launcher: Starting Webserver\n"
        "2026-01-08T10:00:01.000000Z  INFO text_generation_router_v3: backends/v3/src/lib.rs:125: Warming up model\n"
        f"2026-01-08T10:00:09.000000Z  INFO text_generation_router_v3: backends/v3/src/lib.rs:137: Setting max batch total tokens to {max_batch_total_tokens}\n"
        "2026-01-08T10:00:09.100000Z  INFO text_generation_router::server: router/src/server.rs:2400: Connected\n"
    )
    return path


class _Handler(BaseHTTPRequestHandler):
    server: TgiFake

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = self.server.metrics.render().encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain; charset=utf-8")  # axum's String response
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class TgiFake(BackgroundServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.metrics = TgiMetrics()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"
