"""`pip install kvops` without extras: the core commands run, the others say which extra they need in one line.

The extras' packages are hidden from a fresh interpreter (an import hook refuses them), as on a core-only install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import LOGS
from tests.support.processes import checkout_env

EXTRAS = ("pandas", "matplotlib", "numpy", "huggingface_hub", "tokenizers", "jinja2", "prometheus_api_client")
RUN_WITHOUT_EXTRAS = f"""
import importlib.abc, importlib.util, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Hide())
importlib.util.find_spec = lambda name, *a: None if name.split('.')[0] in {EXTRAS!r} else _find(name, *a)
"""


def kvops_without_extras(*args: str) -> subprocess.CompletedProcess:
    script = (
        "import importlib.util\n_find = importlib.util.find_spec\n"
        + RUN_WITHOUT_EXTRAS
        + f"sys.argv = ['kvops', *{list(args)!r}]\nfrom kvops.cli import main\nmain()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=checkout_env(), timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ("kv", "-m", "mistral-7b-v0.1", "--tokens", "8192"),
        ("plan", "-m", "qwen3-8b", "--gpu", "L40S", "--max-model-len", "8192", "--format", "json"),
        ("alerts", "--engine", "vllm"),
        ("explain", "--vllm-log", str(LOGS / "vllm-v1-2026-startup-summary.log")),
        ("manifests", "-m", "qwen3-8b", "--gpu", "L40S", "--max-model-len", "8192"),
        ("models",),
    ],
)
def test_core_commands_run_without_extras(args):
    ran = kvops_without_extras(*args)
    assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize(
    "args, extra",
    [
        (("table", "-m", "qwen3-8b"), "plot"),
        (("plot", "-m", "qwen3-8b", "-o", "out.png"), "plot"),
        (("sweep", "-o", "out.csv"), "plot"),
    ],
)
def test_commands_that_need_an_extra_say_which_in_one_line(args, extra):
    ran = kvops_without_extras(*args)
    assert ran.returncode == 1
    assert ran.stderr.strip().splitlines() == [ran.stderr.strip()]
    assert f"pip install 'kvops[{extra}]'" in ran.stderr
