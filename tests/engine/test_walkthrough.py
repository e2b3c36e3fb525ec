"""The walkthrough (docs/walkthrough.md), run as written: plan -> launch -> watch -> explain -> re-plan -> alerts on
the CPU engine.

The block is taken from the page verbatim; only its scratch folder (DEMO) moves to a temporary one, and its two
ports (18000 for the engine, 19400 for the watcher and its proxy) to free ones. The test holds 18000 and 19400 busy
while it runs, as another program on a shared machine might: the walkthrough must not need them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess

import pytest

from tests.support.paths import REPO
from tests.support.processes import checkout_env
from tests.support.walkthrough import ENGINE_PORT, PORTS, holding, on_free_ports, walkthrough_block

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("curl", "jq", "promtool")),
        reason="the walkthrough needs curl, jq and promtool (.ci/run installs them)",
    ),
]


def test_the_walkthrough_runs_as_written_with_its_ports_busy(tmp_path):
    block = walkthrough_block()
    assert "DEMO=/tmp/kvops-demo" in block
    with holding(PORTS):
        block, moved = on_free_ports(block)
        script = tmp_path / "walkthrough.sh"
        script.write_text("set -euo pipefail\n" + block.replace("DEMO=/tmp/kvops-demo", f"DEMO={tmp_path / 'demo'}"))
        process = subprocess.Popen(
            ["bash", str(script)],
            cwd=REPO,
            env=checkout_env(HF_HUB_OFFLINE="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # whatever the script started and did not stop
    assert process.returncode == 0, f"ports {moved}\n" + output[-3000:]
    assert "blocks           32 of 128 tokens (31 usable; block 0 is the null block)" in output  # 1. plan
    assert f"http://127.0.0.1:{moved[ENGINE_PORT]}" in output  # 5. explain read the engine on the port it was moved to
    assert "KV cache now" in output and re.search(
        r"^level +(ok|warn|degrade|critical)", output, flags=re.M
    )  # 5. explain
    assert "X-KVops-Clamped: max_tokens 900->512" in output  # the proxy at warn
    assert '"to":"warn"' in output  # the watcher's level change
    assert re.search(r"^requests +2 at once under the warn level", output, flags=re.M)  # 6. re-plan: 2 x 8 blocks
    assert "SUCCESS: 11 rules found" in output  # 7. promtool
