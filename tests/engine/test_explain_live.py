"""`kvops explain` on the live CPU engine."""

from __future__ import annotations

import time

import pytest

from tests.unit.explain.test_explain import MiB, basis, explain_doc, figure, gauges


@pytest.mark.vllm
def test_live_engine_kv_in_use_headroom_level_and_next_action(vllm_engine, tiny_model, run_kvops):
    """The stock engine (32 blocks of 128 tokens, 4 MiB) under 4 requests of 650 + 100 tokens (6 blocks each, 77%)."""
    from kvops.policy import load_policy
    from tests.support.kv_load import WARN, KvLoad

    idle = explain_doc(run_kvops, "--metrics", vllm_engine.url, "--device", "cpu")
    assert idle["kv"]["usage"] == gauges(vllm_engine)["vllm:kv_cache_usage_perc"] == 0.0
    assert (idle["kv"]["num_blocks"], idle["kv"]["block_size"], idle["kv"]["request_blocks"]) == (
        32,
        128,
        8,
    )  # 1024 tokens at 4.0x
    assert (idle["kv"]["headroom_tokens"], idle["kv"]["headroom_requests"], idle["level"]) == (31 * 128, 3, "ok")
    assert idle["action"]["source"] == "policy" and idle["action"]["change"] is None

    args = (
        "--metrics",
        vllm_engine.url + "/metrics",
        "--vllm-log",
        str(vllm_engine.log_path),
        "--model",
        str(tiny_model),
        "--prompt-tokens",
        "650",
        "--gen-tokens",
        "100",
    )
    load = KvLoad(vllm_engine.url, str(tiny_model)).start(WARN)
    try:
        deadline, doc = time.monotonic() + 180, None
        while time.monotonic() < deadline:
            doc = explain_doc(run_kvops, *args)
            if doc["level"] == "warn":
                break
            time.sleep(0.5)
    finally:
        load.stop()
    assert load.errors == [] and doc["level"] == "warn", doc["kv"]
    kv = doc["kv"]
    assert (kv["num_blocks"], kv["block_size"], kv["bytes_per_block"], kv["pool_bytes"]) == (
        32,
        128,
        128 * 1024,
        4 * MiB,
    )
    assert kv["used_blocks"] == round(kv["usage"] * 31) and kv["free_blocks"] == 31 - kv["used_blocks"]
    assert kv["in_use_bytes"] == kv["used_blocks"] * 128 * 1024 and kv["headroom_tokens"] == kv["free_blocks"] * 128
    assert (kv["request_tokens"], kv["request_blocks"]) == (750, 6) and kv["headroom_requests"] == kv[
        "free_blocks"
    ] // 6
    assert kv["headroom_blocks_to_warn"] == max(0, int(0.7 * 31) - kv["used_blocks"])
    assert load_policy(None).raw_level(kv["usage"]).label == "warn" and 0.70 <= kv["usage"] < 0.85
    # the engine's own gauges, one scrape: each running request holds ceil(650 / 128) = ceil(750 / 128) = 6 blocks
    assert kv["used_blocks"] == 6 * kv["running"] and kv["waiting"] == 0
    assert (figure(doc, "kv_cache"), basis(doc, "kv_cache")) == (4 * MiB, "reported")
    assert doc["limits"]["max_tokens_cap"] == 512
    # 4 requests x 6 blocks do not stay under 70% of 31 blocks; fp8 KV doubles the blocks the same 4 MiB holds
    assert doc["action"] == doc["action"] | {"change": "--kv-dtype fp8", "source": "planner"}
    assert "(31 usable blocks: 3 under the warn level)" in doc["action"]["problem"]
