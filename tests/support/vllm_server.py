"""A real vLLM engine (the CPU build) in a subprocess, for tests and benchmarks.

Start one per test session where possible: startup takes 40-70 s on 2 cores.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.processes import checkout_env, stop_group

DEFAULT_KV_BYTES = 4 * 1024 * 1024  # 32 blocks of 128 tokens for the tiny model: preemptions come easily
STARTUP_TIMEOUT = 420


def vllm_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` with dummy weights, on 127.0.0.1.

    It logs each request it adds to the engine (`--enable-log-requests`) and serves vLLM's dev-mode routes
    (VLLM_SERVER_DEV_MODE=1: POST /pause and /resume, vllm/entrypoints/rl/online/api_router.py), so a test can queue a
    burst in a known order and release it in one step (tests/support/burst.py: `release_together`)."""

    def __init__(
        self,
        model: Path,
        log: Path,
        *,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ):
        self.model = model
        self.log_path = log
        self.port = port or free_port()
        self.args = (
            args if args is not None else ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)]
        )
        self.env = env or {}
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [*self.api_server(str(self.model), ["--dtype", "bfloat16", "--enable-log-requests"]), *self.args]

    def api_server(self, model: str, flags: list[str]) -> list[str]:
        """vLLM's API server module on `model` with `flags`, dummy weights, on this server's port (the `vllm`
        program needs the package's metadata, which this CPU build does not install)."""
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            *flags,
            "--load-format",
            "dummy",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def start(self) -> VllmServer:
        env = checkout_env(
            HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_SERVER_DEV_MODE="1", **self.env
        )
        self.log_file = open(self.log_path, "w")
        self.process = subprocess.Popen(
            self.command(), stdout=self.log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        return self

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> VllmServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode} during startup; log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM not ready after {timeout:.0f} s; log: {self.log_path}\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def wait_logged(self, text: str, since: int = 0, timeout: float = STARTUP_TIMEOUT) -> None:
        """Until the engine's log holds `text` after its first `since` bytes (it writes a line as it happens)."""
        deadline = time.monotonic() + timeout
        while text not in self.log_after(since):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"vLLM did not log {text!r} within {timeout:.0f} s; log: {self.log_path}")
            time.sleep(0.02)

    def log_after(self, offset: int) -> str:
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def cache_config(self) -> dict[str, str] | None:
        """The labels of vllm:cache_config_info, as kvops reads them."""
        from kvops.engines.metrics import Samples
        from kvops.engines.vllm.metrics import CACHE_CONFIG, cache_config

        config = cache_config(Samples.from_exposition(self.metrics(), only=[CACHE_CONFIG]))
        return dict(config.labels) if config else None

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as response:
            return response.read().decode()

    def stop(self) -> None:
        if self.process:
            stop_group(self.process)
        if getattr(self, "log_file", None):
            self.log_file.close()

    def __enter__(self) -> VllmServer:
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()
