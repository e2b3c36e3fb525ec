"""TGI log lines that state a figure kvops plans, read from the corpus' real logs and compared by calibrate: the
router's `warmup{...}` span, the launcher's `max_batch_total_tokens` of 0.9.0-0.9.3, and that release's failed pool."""

from __future__ import annotations

import json

from kvops.engines.tgi.logs import parse_tgi_log
from tests.support.corpus import CORPUS

TGI = CORPUS / "tgi"


def rows(run_kvops, log: str, *options: str) -> tuple[dict, list[str]]:
    report = json.loads(run_kvops("calibrate", "--tgi-log", str(TGI / log), "-e", "tgi", *options, "--json").stdout)
    return {row["term"]: row for row in report["comparisons"]}, report["notes"]


def test_the_warmup_span_of_2_2_and_3_2_states_the_launch():
    old = parse_tgi_log((TGI / "tgi-2.2.0-h100x8-llama-3.1-405b-fp8-fail.log").read_text())
    assert [old.get(f"warmup_max_{name}") for name in ("input_tokens", "prefill_tokens", "total_tokens")] == [
        500,
        550,
        13107,
    ]
    new = parse_tgi_log((TGI / "tgi-3.2.1-a100-80gb-x4-gemma-3-27b-it-fail.log").read_text())
    assert [new.get(f"warmup_max_{name}") for name in ("input_tokens", "prefill_tokens", "total_tokens")] == [
        30000,
        31000,
        32000,
    ]
    # 3.x writes a figure left to the shard as None: nothing is read for it
    unset = parse_tgi_log("ERROR warmup{max_input_length=None max_prefill_tokens=8000 max_total_tokens=None}:warmup")
    assert (unset.get("warmup_max_input_tokens"), unset.get("warmup_max_prefill_tokens")) == (None, 8000)
    assert unset.get("warmup_max_total_tokens") is None


def test_calibrate_compares_a_failed_warmups_launch(run_kvops):
    found, _ = rows(
        run_kvops,
        "tgi-2.2.0-h100x8-llama-3.1-405b-fp8-fail.log",
        "-m",
        "meta-llama/Llama-3.1-405B",
        "--gpu",
        "H100-80GB",
        "--tp",
        "8",
        "--quantization",
        "fp8",
        "--max-batch-prefill-tokens",
        "600",
    )
    assert (found["max_batch_prefill_tokens"]["predicted"], found["max_batch_prefill_tokens"]["actual"]) == (600, 550)
    assert found["max_total_tokens"]["actual"] == 13107 and "warmup{" in found["max_total_tokens"]["source"]
    found, _ = rows(
        run_kvops, "tgi-3.2.1-a100-80gb-x4-gemma-3-27b-it-fail.log", "-m", "google/gemma-3-27b-it", "--gpu", "A100-80GB"
    )
    assert found["max_batch_prefill_tokens"]["actual"] == 31000 and found["max_total_tokens"]["actual"] == 32000


def test_the_pool_0_9_could_not_hold_is_compared_with_the_plans(run_kvops):
    log = parse_tgi_log((TGI / "tgi-0.9-a10g-x8-llama-2-70b-fail.log").read_text())
    assert log.args["max_batch_total_tokens"] == 16000 and log.get("pool_out_of_memory") == (16000, 2)
    # from 0.9.4 the figure is an Option that only caps the pool the warmup sizes: not read as the pool
    assert "max_batch_total_tokens" not in parse_tgi_log("Args { max_batch_total_tokens: Some(20000) }").args
    found, notes = rows(
        run_kvops,
        "tgi-0.9-a10g-x8-llama-2-70b-fail.log",
        "-m",
        "meta-llama/Llama-2-70b-hf",
        "--gpu",
        "A10G",
        "--engine-version",
        "0.9.4",
    )
    pool = found["max_batch_total_tokens"]
    assert pool["actual"] == 16000 and pool["predicted"] > 0 and "16000 total tokens" in pool["source"]
    assert found["max_batch_prefill_tokens"]["actual"] == 4096 and found["max_total_tokens"]["actual"] == 4096
    assert any("ran out of memory holding a 16000-token pool with 2 prefill tokens" in note for note in notes)
    assert "kv_cache" not in found  # a pool that never held is no measure of the KV bytes


def test_explain_given_a_tgi_log_says_so_and_what_to_run(run_kvops):
    from kvops.explain.read import is_tgi_log

    for log in [*TGI.glob("*.log"), *(CORPUS.parent / "logs").glob("tgi-*.log")]:
        error = run_kvops("explain", "--vllm-log", str(log), expect=1).stderr
        assert f"this is a TGI log, which explain does not read: run kvops calibrate --tgi-log {log}" in error
        assert "vLLM on GPU" not in error and len(error.strip().splitlines()) == 1
    vllm_logs = [*(CORPUS / "vllm").glob("*.log"), *(CORPUS.parent / "logs").glob("vllm-*.log")]
    assert vllm_logs and not any(is_tgi_log(log.read_text()) for log in vllm_logs)
