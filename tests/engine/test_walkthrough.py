"""The README's walkthrough, run as written: plan -> launch -> watch -> explain -> re-plan -> alerts on the CPU engine.

The block is taken from README.md verbatim; only its scratch folder (DEMO) moves to a temporary one.
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

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("curl", "jq", "promtool")),
        reason="the walkthrough needs curl, jq and promtool (.ci/run installs them)",
    ),
]

README = REPO / "README.md"


def walkthrough_block() -> str:
    section = README.read_text().split("\n## Walkthrough", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)


def test_the_readme_walkthrough_runs_as_written(tmp_path):
    block = walkthrough_block()
    assert "DEMO=/tmp/kvops-demo" in block
    script = tmp_path / "walkthrough.sh"
    script.write_text("set -euo pipefail\n" + block.replace("DEMO=/tmp/kvops-demo", f"DEMO={tmp_path / 'demo'}"))
    process = subprocess.Popen(
        ["bash", str(script)],
        cwd=README.parent,
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
    assert process.returncode == 0, output[-3000:]
    assert "blocks           32 of 128 tokens (31 usable; block 0 is the null block)" in output  # 1. plan
    assert "KV cache now" in output and re.search(
        r"^level +(ok|warn|degrade|critical)", output, flags=re.M
    )  # 5. explain
    assert "X-KVops-Clamped: max_tokens 900->512" in output  # the proxy at warn
    assert '"to":"warn"' in output  # the watcher's level change
    assert re.search(r"--max-num-seqs 2 ", output)  # 6. the re-plan from measured prompts keeps 2 x 8 blocks under 70%
    assert "SUCCESS: 8 rules found" in output  # 7. promtool
