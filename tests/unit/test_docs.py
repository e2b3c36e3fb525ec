"""The front page and the walkthrough page: what CI, the walkthrough test and new users rely on."""

from __future__ import annotations

import re
import socket

from tests.support.paths import REPO
from tests.support.walkthrough import (
    ENGINE_PORT,
    PORTS,
    WATCH_PORT,
    holding,
    on_free_ports,
    port_is_busy,
    walkthrough_block,
)


def test_the_readme_opens_with_the_install_and_the_test_command():
    first = REPO.joinpath("README.md").read_text().splitlines()[:8]
    assert any(
        line.startswith("pip install -e . && kvops plan --model mistral-7b-v0.1 --gpu H100-80GB") for line in first
    )
    assert any(line.startswith("bash .ci/run") for line in first)


def test_the_walkthrough_block_is_written_with_ports_18000_and_19400():
    """Users read the engine on 18000 and the watcher on 19400; only the test moves them."""
    block = walkthrough_block()
    assert f"--port {ENGINE_PORT}" in block and f"--listen 127.0.0.1:{WATCH_PORT}" in block
    assert f"127.0.0.1:{ENGINE_PORT}/health" in block and f"127.0.0.1:{WATCH_PORT}/v1/completions" in block


def test_every_port_of_the_walkthrough_moves_to_a_free_one_and_nothing_else_changes():
    written = walkthrough_block()
    with holding(PORTS):
        moved_block, moved = on_free_ports(written)
        assert all(port_is_busy(port) for port in PORTS)
        for used in moved.values():
            assert used not in PORTS and not port_is_busy(used)
    assert len(set(moved.values())) == 2
    assert not re.search(r"(?<!\d)(18000|19400)(?!\d)", moved_block)
    back = moved_block
    for port, used in moved.items():
        assert back.count(str(used)) == written.count(str(port))
        back = back.replace(str(used), str(port))
    assert back == written


def test_held_ports_refuse_a_server_even_with_reuse_flags():
    """vLLM binds with SO_REUSEADDR and SO_REUSEPORT, the watcher with SO_REUSEADDR: a held port still refuses them."""
    with holding(PORTS):
        for host, port in (("", PORTS[0]), ("127.0.0.1", PORTS[1])):
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                raise AssertionError(f"port {port} was held, yet {host or '*'}:{port} could be bound")
