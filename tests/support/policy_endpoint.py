"""A stand-in for the watcher's `GET /kvops/policy` (kvops watch is built separately): a real HTTP server on
127.0.0.1 that serves the contract's JSON, with the level and limits taken from kvops.policy, or a failure
(a status, a body that is not the contract), as the test sets it."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

from kvops.policy import Level, Limits, load_policy
from tests.support.servers import BackgroundServer


def policy_document(
    level: str, usage: float | None = 0.5, *, limits: Limits | None = None, updated_at: float | None = None
) -> dict:
    """The watcher's answer: {"level", "kv_usage", "limits", "updated_at", "source"}."""
    limits = limits or load_policy().limits(Level.parse(level))
    return {
        "level": level,
        "kv_usage": usage,
        "limits": limits.to_dict(),
        "updated_at": time.time() if updated_at is None else updated_at,
        "source": "http://127.0.0.1:8000/metrics",
    }


class PolicyEndpoint:
    def __init__(self):
        self.body = b""
        self.status = 200
        self.document: dict | None = None  # served with a fresh updated_at at every read
        self.reads = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                endpoint.reads += 1
                body = endpoint.body
                if endpoint.document is not None:
                    body = json.dumps({**endpoint.document, "updated_at": time.time()}).encode()
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = BackgroundServer(("127.0.0.1", 0), Handler).__enter__()
        self.url = f"http://127.0.0.1:{self.server.server_port}/kvops/policy"

    def serve(self, payload: dict | bytes, status: int = 200) -> None:
        """Serve this body as is (a dict is sent as JSON, its updated_at unchanged)."""
        self.document = None
        self.body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.status = status

    def follow(self, level: str, usage: float | None = 0.5, *, limits: Limits | None = None) -> None:
        """Serve a live watcher's answer at `level`, fresh at every read."""
        self.document = policy_document(level, usage, limits=limits)
        self.status = 200

    def wait_reads(self, count: int, timeout: float = 10.0) -> None:
        """Block until `count` more reads came in (the follower then holds what is served now)."""
        target = self.reads + count
        deadline = time.monotonic() + timeout
        while self.reads < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url} was read {self.reads} times, expected {target}")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.__exit__()

    def __enter__(self) -> PolicyEndpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
