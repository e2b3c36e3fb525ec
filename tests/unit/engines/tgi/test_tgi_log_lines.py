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


def test_a_0_9_3_pool_is_the_stated_one_and_the_failure_bounds_kvops_room(run_kvops):
    """TGI 0.9.0-0.9.3 size no pool: the warmup allocates the stated --max-batch-total-tokens (ceil(16000 / 16) + 10
    = 1,010 blocks, flash_causal_lm.py at v0.9.3). calibrate had compared kvops' own room with it as a sized pool:
    97,424 against 16,000 (-83.6%) with --engine-version 0.9.x, 59,782 planned as 3.3.7 without it. The log's
    wording is 0.9.0-0.9.3's and Llama 2's grouped KV heads came in 0.9.3: planned as 0.9.3, the pool is the stated
    16,000, and the room kvops leaves (16 blocks x 16 below 97,424: the 10 extra blocks) is what the failure refutes."""
    report = json.loads(
        run_kvops(
            "calibrate", "--tgi-log", str(TGI / "tgi-0.9-a10g-x8-llama-2-70b-fail.log"), "-e", "tgi",
            "-m", "meta-llama/Llama-2-70b-hf", "--gpu", "A10G", "--json",
        ).stdout
    )  # fmt: skip
    found = {row["term"]: row for row in report["comparisons"]}
    assert report["profile"]["engine_version"] == "0.9.3"
    assert found["max_batch_total_tokens"]["predicted"] == found["max_batch_total_tokens"]["actual"] == 16000
    assert found["kv_room_tokens"]["predicted"] == 97_264 and found["kv_room_tokens"]["actual"] is None
    [warning] = report["warnings"]
    assert "TGI 0.9.3 allocates the stated 16000-token pool (1,010 blocks of 16, 631.25 MiB a shard)" in warning
    assert "its terms miss at least ~3.1 GiB a shard" in warning


def test_a_0_9_3_plan_emits_the_pool_it_sizes_as_max_batch_total_tokens(run_kvops):
    """0.9.0-0.9.3 take the flag as the pool (default 16000): the plan had left it out ("TGI ignores it on flash
    models"), so TGI allocated 16,000 tokens where the plan said 97,424."""
    doc = json.loads(
        run_kvops(
            "plan", "-e", "tgi", "-m", "meta-llama/Llama-2-70b-hf", "--gpu", "A10G", "--tp", "8",
            "--engine-version", "0.9.3", "--max-model-len", "4096", "--json",
        ).stdout
    )  # fmt: skip
    capacity = doc["capacity"]
    assert doc["flags"]["max-batch-total-tokens"] == capacity["max_batch_total_tokens"] == 97_264
    # ceil(97,264 / 16) + 10 blocks of 40,960 B a token: what the KV budget holds, whole
    assert (97_264 // 16 + 10) * 16 * capacity["kv_bytes_per_token"] <= doc["memory"]["kv_cache_bytes"]
    assert any(note.startswith("--max-batch-total-tokens is the KV pool the plan sizes") for note in doc["notes"])
    newer = json.loads(
        run_kvops("plan", "-e", "tgi", "-m", "meta-llama/Llama-2-70b-hf", "--gpu", "A10G", "--tp", "8",
                  "--engine-version", "0.9.4", "--max-model-len", "4096", "--json").stdout
    )  # fmt: skip
    assert "max-batch-total-tokens" not in newer["flags"]
    pasted = json.loads(
        run_kvops(
            "plan", "--gpu", "A10G", "--json", "--from-command",
            "docker run ghcr.io/huggingface/text-generation-inference:0.9.3 --model-id meta-llama/Llama-2-70b-hf "
            "--num-shard 8 --max-batch-total-tokens 16000 --max-total-tokens 4096 --max-input-length 3072",
        ).stdout
    )  # fmt: skip
    assert pasted["command"]["argv"].count("--max-batch-total-tokens") == 1
    assert pasted["flags"]["max-batch-total-tokens"] == 97_264
    [line] = [text for text in pasted["from_command"] if text.startswith("--max-batch-total-tokens 16000")]
    assert "0.9.0-0.9.3 allocate this figure as the pool" in line


def test_explain_given_a_tgi_log_says_so_and_what_to_run(run_kvops):
    from kvops.explain.read import is_tgi_log

    for log in [*TGI.glob("*.log"), *(CORPUS.parent / "logs").glob("tgi-*.log")]:
        error = run_kvops("explain", "--vllm-log", str(log), expect=1).stderr
        assert f"this is a TGI log, which explain does not read: run kvops calibrate --tgi-log {log}" in error
        assert "vLLM on GPU" not in error and len(error.strip().splitlines()) == 1
    vllm_logs = [*(CORPUS / "vllm").glob("*.log"), *(CORPUS.parent / "logs").glob("vllm-*.log")]
    assert vllm_logs and not any(is_tgi_log(log.read_text()) for log in vllm_logs)
