"""TGI plans obey TGI's launcher and router rules release by release (the TGI repository at each tag): what TGI
would refuse is never emitted, and limits TGI refuses whatever the memory are usage errors, not 'does not fit'."""

from __future__ import annotations

import json

from kvops.engines.tgi.logs import parse_tgi_log
from tests.support.corpus import entry, plan_entry


def plan(run_kvops, *args: str, expect: int = 0) -> dict:
    return json.loads(run_kvops("plan", "--engine", "tgi", "--json", *args, expect=expect).stdout)


def test_gemma3_without_prefill_chunking_gets_a_prefill_batch_that_holds_its_longest_prompt(run_kvops):
    """TGI 3.3.7 serves Gemma3ForConditionalGeneration without chunking: the router refuses
    `max_batch_prefill_tokens` below `max_input_tokens`; the plan emitted 8000 below 8191 before (issue 13)."""
    doc = plan(run_kvops, "-m", "gemma-3-12b-it", "--gpu", "h100")
    flags = doc["flags"]
    assert (
        flags["max-batch-prefill-tokens"] >= flags["max-input-tokens"] and doc["capacity"]["prefill_chunking"] is False
    )
    assert any("without prefill chunking" in note for note in doc["notes"])
    longer = plan(run_kvops, "-m", "gemma-3-12b-it", "--gpu", "h100", "--max-input-tokens", "8191")["flags"]
    assert longer["max-batch-prefill-tokens"] >= longer["max-input-tokens"] == 8191


def test_without_chunking_the_prefill_bounds_the_prompt_not_the_context(run_kvops):
    """ROCm's paged attention has no prefill chunking. The plan held --max-total-tokens to the prefill + 1 (4097) for
    Llama-3.1-8B on an MI300X, so the router refused every request of 4,000 + 500 tokens ('`inputs` tokens +
    `max_new_tokens` must be <= 4097', router/src/validation.rs) while the plan said they fit, and every request's
    prompt plus output was held to 4,097 of a 131,072 context. Only the prompt must fit one prefill
    (backends/v3/src/main.rs: max_batch_prefill_tokens >= max_input_tokens)."""
    doc = plan(run_kvops, "-m", "llama-3.1-8b", "--gpu", "mi300x", "--prompt-tokens", "4000", "--gen-tokens", "500")
    flags = doc["flags"]
    assert doc["capacity"]["prefill_chunking"] is False and doc["fits"] is True
    assert (flags["max-input-tokens"], flags["max-batch-prefill-tokens"], flags["max-total-tokens"]) == (
        4096, 4096, 131072,
    )  # fmt: skip
    assert any(note.startswith("prefill chunking is off: max-input-tokens held to") for note in doc["notes"])
    longer = plan(run_kvops, "-m", "llama-3.1-8b", "--gpu", "mi300x", "--prompt-tokens", "6000", "--gen-tokens", "100")
    assert longer["flags"]["max-batch-prefill-tokens"] == longer["flags"]["max-input-tokens"] == 6000


def test_stated_requests_the_router_refuses_do_not_fit(run_kvops):
    """A stated workload beyond the limits was planned as fitting. TGI validates input + max_new_tokens, the latter
    cut to 1024 from 3.1.1 (PR #3016), whole before."""
    wrong = run_kvops(
        "plan", "-e", "tgi", "-m", "llama-3.1-8b", "--gpu", "h100", "--prompt-tokens", "3000", "--gen-tokens", "3000",
        "--max-model-len", "5000", "--engine-version", "3.1.0", expect=3,
    ).stderr  # fmt: skip
    assert "'`inputs` tokens + `max_new_tokens` must be <= 5000. Given: 3000 `inputs` tokens and 3000" in wrong
    newest = plan(
        run_kvops, "-m", "llama-3.1-8b", "--gpu", "h100", "--prompt-tokens", "3000", "--gen-tokens", "3000",
        "--max-model-len", "5000",
    )  # fmt: skip
    assert newest["fits"] is True and newest["capacity"]["reservation_tokens_per_request"] == 3000 + 1024 - 1


def test_a_text_model_chunks_its_prefill_and_keeps_the_launcher_default(run_kvops):
    """TGI 3.3.7 on an H100: 900 TFLOP/s over Llama-3-8B's 15.0 GFLOPs a token is 59,870, held to its
    max_position_embeddings 8192; the plan warms up with it and leaves the flag to TGI (prefill.py)."""
    doc = plan(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--max-model-len", "8192")
    assert doc["capacity"]["prefill_chunking"] is True and doc["capacity"]["max_batch_prefill_tokens"] == 8192
    assert "max-batch-prefill-tokens" not in doc["flags"]


def test_limits_tgi_refuses_whatever_the_memory_are_usage_errors(run_kvops):
    wrong = run_kvops(
        "plan", "--engine", "tgi", "-m", "llama-3-8b", "--gpu", "h100", "--max-input-tokens", "9000",
        "--max-model-len", "8192", expect=2,
    )  # fmt: skip
    assert (
        "--max-input-tokens 9000 must be below --max-model-len" in wrong.stderr and "does not fit" not in wrong.stderr
    )
    short = run_kvops(
        "plan", "--engine", "tgi", "-m", "gemma-3-12b-it", "--gpu", "h100", "--max-batch-prefill-tokens", "8000",
        "--max-input-tokens", "8191", expect=2,
    )  # fmt: skip
    assert "`max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: 8000 and 8191" in short.stderr


def test_tgi_2_keeps_95_percent_of_the_free_memory_and_its_launcher_defaults(run_kvops):
    doc = plan(run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--engine-version", "2.0.4")
    terms = {term["name"]: term for term in doc["memory"]["terms"]}
    assert terms["kv_cache"]["formula"].startswith("0.95 x (budget")
    assert terms["budget"]["bytes"] == terms["total"]["bytes"]  # cuda_memory_fraction 1, no wiggle on the device
    flags = doc["flags"]
    # 2.x launcher: max_total = min(max_position_embeddings, 4096), input one less, prefill input + 50
    assert (flags["max-total-tokens"], flags["max-input-tokens"], flags["max-batch-prefill-tokens"]) == (
        4096,
        4095,
        4145,
    )
    assert doc["engine_version"]["family"] == "TGI 1.x/2.x" and doc["capacity"]["prefill_chunking"] is False
    newest = plan(run_kvops, "-m", "llama-3-8b", "--gpu", "h100")
    assert {t["name"]: t for t in newest["memory"]["terms"]}["budget"]["bytes"] == int(terms["total"]["bytes"] * 0.9)


def test_the_16000_token_fallback_of_models_without_flash_attention():
    log = parse_tgi_log(entry("tgi-1.3-nvidia-gpt2-no-auto-budget").text)
    assert log.get("no_automatic_total") and log.get("max_batch_total_tokens") == 16000
    assert log.args["max_total_tokens"] == 2048 and log.args["max_input_tokens"] == 1024  # the 1.x clap defaults


def test_args_dumps_in_every_shape_tgi_logs_print():
    assert parse_tgi_log(entry("tgi-2.0-a40x2-llama-3-70b-load-oom").text).args["model_id"] == (
        "meta-llama/Meta-Llama-3-70B-Instruct"
    )  # 2.x prints it over many lines
    bare = parse_tgi_log(entry("tgi-0.9-a10g-x8-llama-2-70b-fail").text).args  # posted without its prefix
    assert (bare["num_shard"], bare["max_input_tokens"], bare["max_total_tokens"]) == (8, 3072, 4096)


def test_a_tgi_pool_resting_on_too_few_logs_says_it_has_no_band(run_kvops):
    """TGI logs print only the pool they kept: 3 in the corpus fit the warmup estimate, too few to bound it, so the
    plan says it states no band and plans no margin rather than print a band it cannot back (issue 13)."""
    doc = plan(run_kvops, "-m", "llama-3-8b", "--gpu", "h100")
    kv = {term["name"]: term for term in doc["memory"]["terms"]}["kv_cache"]
    assert "no band and no margin" in kv["formula"] and "fewer than the 5 that bound them" in kv["formula"]
    assert kv.get("band") is None and "margin" not in {term["name"] for term in doc["memory"]["terms"]}


def test_without_a_workload_the_router_keeps_tgi_s_in_flight_limit(run_kvops):
    """Sized for requests that fill the context, --max-concurrent-requests 52 would answer 429 to the 53rd short
    request the pool could run, where stock TGI (128) queues it: no workload stated, the plan leaves TGI's default
    and says what a stated one would size."""
    unstated = plan(run_kvops, "-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192")
    assert "max-concurrent-requests" not in unstated["flags"]
    assert unstated["capacity"]["requests_at_full"] < 128
    assert any(
        note.startswith("max-concurrent-requests: TGI's default (128): no workload stated")
        for note in unstated["notes"]
    )
    stated = plan(run_kvops, "-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192",
                  "--prompt-tokens", "1000", "--gen-tokens", "500")  # fmt: skip
    assert stated["flags"]["max-concurrent-requests"] == stated["capacity"]["requests_at_full"]
    pinned = plan(run_kvops, "-m", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192", "--max-num-seqs", "40")
    assert pinned["flags"]["max-concurrent-requests"] == 40


def test_gemma3_image_warmup_of_tgi_3_2_does_not_fit_a_31000_token_prefill():
    """tgi-3.2.1-a100-80gb-x4-gemma-3-27b-it-fail: TGI 3.2.1 ran out of memory warming up 31,000 prefill tokens. Its
    image request attends over dense [2, 1, 30000, 30000] masks and SDPA's scores for 8 heads a shard (about
    60 GiB), which leave no KV cache; 3.3.0's flashinfer mask path plans a pool."""
    from dataclasses import replace

    from kvops.planner import predict

    inputs = entry("tgi-3.2.1-a100-80gb-x4-gemma-3-27b-it-fail").options().plan_inputs()
    failed = predict(inputs)
    assert failed.fits is False and failed.kv_cache_bytes < 0
    assert failed.term("activation").bytes > 60 * (1 << 30)
    later = predict(replace(inputs, engine_version="3.3.0"))
    assert later.kv_cache_bytes > 40 * (1 << 30)


def test_the_a10g_tgi_2_2_launch_is_not_over_promised():
    """tgi-2.2.0-a10g-llama-3.1-8b-instruct (scored apart, every default): its 19,056-token pool, planned with the
    shipped fit, is not promised more than 2% too much (it was +64% with vLLM's 0.5 GiB non-torch prior at tp 1)."""
    item = entry("tgi-2.2.0-a10g-llama-3.1-8b-instruct")
    plan = plan_entry(item)
    logged = item.log.facts["max_batch_total_tokens"] * plan.capacity.kv_bytes_per_token
    kv = next(term.bytes for term in plan.memory if term.name == "kv_cache")
    assert 0.85 * logged < kv < 1.02 * logged
