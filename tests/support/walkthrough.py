"""The walkthrough page's shell block (docs/walkthrough.md), and the same block on free ports.

The block is written for users with the engine on port 18000 and the watcher (with its admission proxy) on 19400.
A shared machine may have either busy, so the test runs it with every occurrence of each moved to a free port;
nothing else in the block changes.
"""

from __future__ import annotations

import contextlib
import errno
import re
import socket
from collections.abc import Iterator

from tests.support.paths import REPO

PAGE = REPO / "docs" / "walkthrough.md"
ENGINE_PORT, WATCH_PORT = 18000, 19400
PORTS = (ENGINE_PORT, WATCH_PORT)


def walkthrough_block() -> str:
    """The page's shell block (its first ```sh fence), as users paste it."""
    found = re.search(r"^```sh\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    assert found, f"{PAGE}: no ```sh block"
    return found.group(1)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on every interface (the engine binds the wildcard address)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]


def on_free_ports(block: str) -> tuple[str, dict[int, int]]:
    """The block with each of PORTS, every occurrence, replaced by a free port: (block, {written: used})."""
    moved = dict(zip(PORTS, free_ports(len(PORTS))))
    for written, used in moved.items():
        pattern = rf"(?<!\d){written}(?!\d)"
        assert re.search(pattern, block), f"the walkthrough no longer uses port {written}"
        block = re.sub(pattern, str(used), block)
    return block, moved


def port_is_busy(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


@contextlib.contextmanager
def holding(ports: tuple[int, ...]) -> Iterator[None]:
    """Keep `ports` busy with listening sockets on every interface (a port another process already holds is
    busy as it is), the way another program on a shared machine would."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("", port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            sock.listen()
        assert all(port_is_busy(port) for port in ports)
        yield
