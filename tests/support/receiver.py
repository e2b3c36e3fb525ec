"""A plain webhook receiver on 127.0.0.1: records every JSON body POSTed to it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

from tests.support.servers import BackgroundServer


class _Handler(BaseHTTPRequestHandler):
    server: WebhookReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.posts.append(
                {"path": self.path, "content_type": self.headers.get("Content-Type"), "body": json.loads(body)}
            )
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class WebhookReceiver(BackgroundServer):
    def __init__(self, status: int = 200):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[dict] = []
        self.status = status
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/v2/alerts"

    def alerts(self) -> list[dict]:
        with self.lock:
            return [alert for post in self.posts for alert in post["body"]]

    def wait_for(self, predicate, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alerts = self.alerts()
            if predicate(alerts):
                return alerts
            time.sleep(0.05)
        raise AssertionError(
            f"webhook did not receive the expected alerts within {timeout:.0f} s; got {json.dumps(self.alerts(), indent=1)[:3000]}"
        )
