"""The init step of the kvops image gives a bare Python the KV guard, importable beside the installed vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvops import __version__
from tests.support.paths import REPO


@pytest.mark.vllm
def test_the_init_step_gives_a_bare_python_the_kv_guard(tmp_path):
    """The image's install (a non-editable pip install of the repository), the init step's script verbatim (its
    target moved), then a Python that has only the copied packages imports the scheduler vLLM is told to load."""
    from kvops.deploy.stack import PLUGIN_COPY, PLUGIN_DIR

    site, shared = tmp_path / "site-packages", tmp_path / "kvops-python"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stderr
    script = PLUGIN_COPY.replace(PLUGIN_DIR, str(shared))
    copied = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout == f"kvops: copied kvops and kvops_vllm {__version__} to {shared}\n"
    assert sorted(p.name for p in shared.iterdir()) == ["kvops", "kvops_vllm"]
    probe = (
        "import json, kvops, kvops_vllm.scheduler as s, kvops.policy as p; "
        "print(json.dumps([kvops.__file__, s.__file__, s.KVGuardScheduler.__mro__[1].__name__, p.load_policy().thresholds[p.Level.WARN]]))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(shared)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    files = json.loads(imported.stdout.splitlines()[-1])
    assert files == [
        str(shared / "kvops" / "__init__.py"),
        str(shared / "kvops_vllm" / "scheduler.py"),
        "AsyncScheduler",
        0.7,
    ]
