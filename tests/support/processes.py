"""The processes tests and benchmarks start: this checkout's code on their path, and stopping their whole group."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def checkout_env(**extra: str) -> dict[str, str]:
    """The environment with this checkout's `kvops` and `kvops_vllm` first on PYTHONPATH, so a subprocess (an
    engine loading the guard, `kvops watch`, a README command) runs the code under test, whatever is installed."""
    path = [str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path)), **extra}


def stop_group(process: subprocess.Popen, grace: float = 30) -> int | None:
    """SIGTERM the process group, SIGKILL it after `grace` seconds; the process's exit status."""
    if process.poll() is not None:
        return process.returncode
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass
    return process.returncode
