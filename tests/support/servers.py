"""Test HTTP servers (http.server) that serve from a background thread inside a `with` block."""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Iterator


class BackgroundServer(ThreadingHTTPServer):
    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


@contextmanager
def captured_log(name: str) -> Iterator[tuple[logging.Logger, list[str]]]:
    """The messages logged to `name` at INFO and above while the block runs."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    log = logging.getLogger(name)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield log, records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
