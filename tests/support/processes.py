"""Stopping what a test started in its own session (start_new_session=True): the whole process group."""

from __future__ import annotations

import os
import signal
import subprocess


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
