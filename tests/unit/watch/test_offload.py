"""vLLM's host KV tier, planned and watched. vLLM 0.32.0's CPU build cannot run the tier (its native worker refuses
non-CUDA devices: vllm/v1/kv_offload/cpu/spec.py), so the plan refuses it there, and the watcher reads a STAND-IN:
a real HTTP server serving the recorded CPU exposition plus the tier's families rendered by vLLM's own
OffloadPromMetrics (tests/support/offload_exposition.py), their values set per stage."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.metrics_server import MetricsServer, offload_exposition
from tests.support.watch_process import WatchProcess

GPU_PLAN = ["--model", "llama-3-8b", "--gpu", "H100-80GB", "--max-model-len", "8192", "--kv-dtype", "int8"]


def test_the_cpu_build_has_no_tier(run_kvops, tmp_path):
    result = run_kvops(
        "plan",
        "--model",
        "llama-3-8b",
        "--device",
        "cpu",
        "--kv-cache-memory-bytes",
        "1GiB",
        "--kv-offloading-size",
        "4",
        expect=2,
    )
    assert (
        result.stderr.strip().endswith("'CPU Offloading is currently only supported on CUDA-alike and XPU GPUs')")
        and len(result.stderr.splitlines()) == 1
    )


def test_the_plan_counts_the_tiers_chunks_tokens_and_reload(run_kvops):
    plan = json.loads(run_kvops("plan", *GPU_PLAN, "--kv-offloading-size", "64", "--json").stdout)
    assert (plan["flags"]["kv-offloading-size"], plan["flags"]["kv-offloading-backend"]) == (64.0, "native")
    per_block = plan["capacity"]["bytes_per_block"]
    # 32 layers x 2 x 8 KV heads x 128 x 64 tokens (vLLM 0.34's default block) x int8 + per-token-head scales
    assert per_block == 4 * 1081344
    (note,) = [n for n in plan["notes"] if n.startswith("host KV tier")]
    chunks = 64 * 2**30 // per_block  # one GPU block per chunk, already a multiple of the 4096 B page
    assert f"{chunks:,} chunks" in note and f"{chunks * 64:,} KV tokens" in note
    # a planned request (8,192 tokens = 128 blocks, 528 MiB) over PCIe Gen5 x16 at 80% of 63 GB/s: ~11 ms
    reload_ms = 128 * per_block / (32e9 * 16 * 128 / 130 / 8 * 0.8) * 1000
    assert f"~{reload_ms:.2g} ms over PCIe Gen5 x16" in note and "over the 5 ms load target" in note


def until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.1)


def test_the_watcher_reads_the_tier_and_its_load_latency(tmp_path):
    with (
        MetricsServer(offload_exposition(0.40, loads=3, load_seconds=0.006, load_bytes=6_000_000)) as engine,
        WatchProcess("--engine", "vllm", "--metrics-url", engine.url, "--interval", "0.3") as watch,
    ):

        def firing(signal: str) -> float | None:
            return watch.metric("kvops_signal_firing", signal=signal)

        until(lambda: firing("offload_usage") == 0)
        # 10 more loads taking 8 ms each: over the 5 ms target; transfers pin 97% of the tier: over 95%
        engine.set(offload_exposition(0.97, loads=13, load_seconds=0.086, load_bytes=26_000_000))
        until(lambda: firing("offload_load_latency") == 1)
        assert firing("offload_usage") == 1
        status = json.loads(watch.get("/kvops/status")[1])
        (replica,) = status["replicas"]
        signals = {s["name"]: s for s in replica["signals"]}
        assert signals["offload_load_latency"]["value"] == pytest.approx(8.0)  # ms per load
        assert signals["offload_usage"]["value"] == 0.97
