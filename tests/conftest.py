"""Shared fixtures: a locally built test model and one real vLLM engine per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.extras import INSTALL
from tests.support.policy_endpoint import PolicyEndpoint
from tests.support.tiny_model import build_model
from tests.support.vllm_server import DEFAULT_KV_BYTES, VllmServer, vllm_available

ENGINE_TESTS = Path(__file__).resolve().parent / "engine"
NO_VLLM = "vLLM is not importable (install the CPU build: pip install -e '.[vllm]', see DEVELOPERS.md)"


def pytest_collection_modifyitems(config, items):
    """Tests under tests/engine/ start real engines and daemons: marked `engine`, so `-m "not engine"` is the fast
    suite. Tests that need vLLM skip, saying how to install it, where it is not importable."""
    skip = None if vllm_available() else pytest.mark.skip(reason=NO_VLLM)
    for item in items:
        if ENGINE_TESTS in item.path.parents:
            item.add_marker(pytest.mark.engine)
        if skip is not None and "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer llama (4 heads, 2 KV heads, head_dim 64) with an offline-trained tokenizer."""
    pytest.importorskip("tokenizers", reason=f"tokenizers not installed ({INSTALL})")
    return build_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def vllm_engine(tiny_model, tmp_path_factory):
    """The stock engine with a 4 MiB KV pool (32 blocks of 128 tokens): small enough to fill and preempt."""
    server = VllmServer(tiny_model, tmp_path_factory.mktemp("logs") / "vllm-stock.log")
    with server:
        yield server


@pytest.fixture(scope="session")
def policy_endpoint():
    """A stand-in for the watcher's /kvops/policy that kv_guard_engine follows; it serves level ok, usage 0,
    until a test changes it (tests that do restore it)."""
    with PolicyEndpoint() as endpoint:
        endpoint.follow("ok", 0.0)
        yield endpoint


@pytest.fixture(scope="session")
def kv_guard_engine(tiny_model, policy_endpoint, tmp_path_factory):
    """vllm_engine's configuration, scheduled by kvops' KV guard (this worktree's code), following policy_endpoint.

    Its policy is the shipped one with no minimum dwell, so a level a test drives up (a burst) does not linger
    into the next test."""
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text("min_dwell_seconds: 0\n")
    env = {
        "KVOPS_POLICY": str(policy),
        "KVOPS_POLICY_URL": policy_endpoint.url,
        "KVOPS_POLICY_POLL_SECONDS": "0.2",
        "KVOPS_POLICY_TIMEOUT_SECONDS": "10",  # a busy 2-core machine's local watcher can be slow
        "KVOPS_LEVELS": "own",  # levels also from the engine's own KV usage (the default follows the watcher only)
        "KVOPS_LOG_SECONDS": "0.5",  # a summary line from a burst's first step on, which the burst test reads
    }
    args = [
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(DEFAULT_KV_BYTES),
        "--scheduler-cls",
        "kvops_vllm.scheduler.KVGuardScheduler",
        "--logits-processors",  # requests that stop where their vllm_xargs say, as bench/guard_goodput.py sends
        "tests.support.stop_at:StopAt",
    ]
    server = VllmServer(tiny_model, tmp_path_factory.mktemp("logs") / "vllm-kv-guard.log", args=args, env=env)
    with server:
        yield server


@pytest.fixture(scope="session")
def middleware_engine(tiny_model, tmp_path_factory):
    """vllm_engine's configuration with kvops' admission middleware in its API server (`--middleware`, as `kvops
    manifests` runs vLLM): the shipped levels with a 15 s dwell (a staged load's dips between requests do not lower
    its level), and X-KVops-Priority read from 127.0.0.1, as from a gateway's network."""
    from tests.support.kv_load import STAGED_POLICY

    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text(STAGED_POLICY)
    args = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)]
    args += ["--middleware", "kvops_vllm.middleware.KVOpsMiddleware"]
    env = {"KVOPS_POLICY": str(policy), "KVOPS_TRUST_PRIORITY_FROM": "127.0.0.1/32"}  # the tests are the gateway
    server = VllmServer(tiny_model, tmp_path_factory.mktemp("logs") / "vllm-middleware.log", args=args, env=env)
    with server:
        yield server


class Ran:
    def __init__(self, exit_code: int, stdout: str, stderr: str):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


@pytest.fixture
def run_kvops():
    """Run the CLI in-process: run_kvops("kv", "--model", ..., expect=0) -> stdout, stderr, exit code."""
    from click.testing import CliRunner

    from kvops.cli import main

    def run(*args: str, expect: int | None = 0, input: str | None = None) -> Ran:
        result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)
        ran = Ran(result.exit_code, result.stdout, result.stderr)
        if expect is not None:
            assert ran.exit_code == expect, (
                f"kvops {' '.join(args)} exited {ran.exit_code}, wanted {expect}\n{ran.stderr}"
            )
        return ran

    return run
