"""Raw HTTP/1.1 over a socket, for what an HTTP library will not send or receive: dot segments in the target,
control bytes in a header, a half-closed or trickled request, an upstream that answers garbage."""

from __future__ import annotations

import socket
import socketserver
import threading
import time


def request_bytes(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """One request, `Connection: close` unless `headers` say otherwise (so that reading to the close ends)."""
    headers = {"Connection": "close", **(headers or {})}
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def exchange(port: int, data: bytes, *, half_close: bool = False, timeout: float = 15, close: bool = True) -> bytes:
    """Send `data` (then shut down the sending side when half_close) and read until the server closes or `timeout`
    passes; the bytes received."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        return read_all(sock, timeout)


def read_all(sock: socket.socket, timeout: float) -> bytes:
    received = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    return bytes(received)


def status_of(response: bytes) -> int | None:
    """The final status of a response (interim 1xx responses skipped), or None when nothing parseable came back."""
    for head in response.split(b"\r\n\r\n"):
        parts = head.split(b" ", 2)
        if len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1].isdigit():
            status = int(parts[1])
            if not 100 <= status < 200:
                return status
    return None


def response_body(response: bytes) -> bytes:
    """The body of the final response in `response` (interim 1xx responses skipped, chunked framing undone)."""
    rest = response
    while True:
        head, _, rest = rest.partition(b"\r\n\r\n")
        status = head.split(b" ", 2)[1] if head.count(b" ") >= 1 else b""
        if not (status.isdigit() and 100 <= int(status) < 200):
            break
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    body = bytearray()
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        length = int(size.split(b";")[0], 16)
        if length == 0:
            break
        body += rest[:length]
        rest = rest[length + 2 :]
    return bytes(body)


class _Answer(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(5)
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                received += chunk
            self.server.received.append(received)
            self.request.sendall(self.server.answer)
        except OSError:
            pass


class RawUpstream(socketserver.ThreadingTCPServer):
    """An upstream that answers every request with the same bytes (garbage, a broken status line, ...) and closes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: bytes):
        super().__init__(("127.0.0.1", 0), _Answer)
        self.answer = answer
        self.received: list[bytes] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> RawUpstream:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
