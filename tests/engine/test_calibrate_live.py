"""`kvops calibrate` on the live CPU engine: its /metrics and log against the plan."""

from __future__ import annotations

import json

import pytest
import yaml


@pytest.mark.vllm
def test_live_engine_metrics_and_log_match_the_plan(vllm_engine, tiny_model, run_kvops, tmp_path):
    labels = vllm_engine.cache_config()
    assert labels["num_gpu_blocks"] == "32" and labels["kv_cache_size_tokens"] == "4096"
    saved = tmp_path / "live.yaml"
    report = json.loads(
        run_kvops(
            "calibrate",
            "--metrics",
            vllm_engine.url,
            "--vllm-log",
            str(vllm_engine.log_path),
            "--model",
            str(tiny_model),
            "--save",
            str(saved),
            "--json",
        ).stdout
    )
    rows = {row["term"]: row for row in report["comparisons"]}
    for name in ("num_gpu_blocks", "kv_cache_size_tokens", "max_concurrency", "kv_cache"):
        assert rows[name]["difference"] == 0, rows[name]
    profile = yaml.safe_load(saved.read_text())
    assert (profile["num_gpu_blocks"], profile["kv_cache_bytes"], profile["block_size"]) == (32, 4194304, 128)
