"""Test HTTP servers (http.server) that serve from a background thread inside a `with` block."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer


class BackgroundServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (a poll timeout, a test that has its answer) is no error of the server's."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)

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
