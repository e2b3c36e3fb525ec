"""Engine releases: each family's rules, read from --engine-version or a run's own log, checked on public logs of
that family (tests/fixtures/corpus): what the engine logged is what the release's own formula gives."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvops.engines.tgi import releases as tgi
from kvops.engines.vllm import releases as vllm
from kvops.errors import ModelNotFound, UsageError
from kvops.units import GiB
from tests.support.corpus import entry
from tests.support.corpus import plan_entry as plan_of


def plan_entry(log_entry, **options):
    """The entry's plan; skipped while its model is not in the catalog (the models branch, issue 12, adds it)."""
    try:
        return plan_of(log_entry, **options)
    except ModelNotFound as exc:
        pytest.skip(f"{log_entry.id}: {exc}")


# --- naming a release ------------------------------------------------------------------------------------


def test_the_default_is_the_newest_release_and_says_so():
    newest = vllm.release(None)
    assert str(newest.version) == vllm.NEWEST == "0.34.0" and "newest" in newest.how
    assert newest.family == "V1 0.20-0.33" and replace(newest, extensible=True).family == vllm.EXTENSIBLE
    assert str(tgi.release(None).version) == tgi.NEWEST and tgi.release(None).family == "TGI 3.x"


def test_families_by_version_and_the_v0_engine():
    assert vllm.release("0.6.4").family == "V0"  # V1 became the default engine in 0.8.0
    assert vllm.release("0.8.5.post1").family == vllm.release("0.11.0").family == "V1 < 0.11.1"
    assert vllm.release("0.8.5-v0").family == "V0" and vllm.release("0.8.5-v0").label == "vLLM 0.8.5 (V0 engine)"
    # FlashInfer became a default dependency in 0.11.1: the profile's sampler stops sorting the vocabulary
    assert vllm.release("0.11.1").family == vllm.release("0.19.1").family == "V1 0.11.1-0.19"
    assert not vllm.release("0.11.0").sampler_sort_free and vllm.release("0.11.1").sampler_sort_free
    assert vllm.release("0.20.1rc1.dev16+g7a1eb8ac2").family == vllm.release("0.33.0").family == "V1 0.20-0.33"
    # 0.7.x ran V1 with VLLM_USE_V1=1 (vllm/envs.py in the 0.7.0 wheel): planned as V1 with --engine-version X-v1
    assert vllm.release("0.7.3-v1").family == "V1 < 0.11.1" and "VLLM_USE_V1=1" in vllm.release("0.7.3-v1").label
    assert tgi.release("2.4.1").family == "TGI 1.x/2.x" and tgi.release("v3.0.1").family == "TGI 3.x"


def test_releases_kvops_does_not_know_are_one_line_errors():
    with pytest.raises(UsageError, match="knows vLLM up to"):
        vllm.release("0.40.0")
    with pytest.raises(UsageError, match="no V0 engine"):
        vllm.release("0.12.0-v0")
    with pytest.raises(UsageError, match="no V1 engine"):
        vllm.release("0.6.4-v1")
    with pytest.raises(UsageError, match="is not a version"):
        vllm.release("latest")
    with pytest.raises(UsageError, match="the last TGI release is"):
        tgi.release("4.0.0")


def test_every_rule_names_its_source():
    for text in ("0.6.4", "0.7.3-v1", "0.8.5-v0", "0.9.0", "0.19.0", "0.21.0", "0.28.0", "0.32.0", "0.33.0", "0.34.0"):
        rules = vllm.release(text).rules()
        assert rules and all(rule.source for rule in rules), text
    assert all(rule.source for rule in tgi.release("2.0.4").rules())


# --- the rules that moved ----------------------------------------------------------------------------------


def test_defaults_that_moved_between_releases():
    # issue 22, defect 2: 0.20.0 already defaults to 0.92 (config/cache.py l.66) and applies the CUDA-graph estimate
    # (envs.py l.1724: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS "1"); 0.19.1 neither (l.41, l.1654)
    assert vllm.release("0.19.1").default_gpu_memory_utilization == 0.9
    assert vllm.release("0.20.0").default_gpu_memory_utilization == 0.92
    assert not vllm.release("0.19.1").cudagraphs_before_kv and vllm.release("0.20.0").cudagraphs_before_kv
    assert replace(vllm.release("0.34.0"), extensible=True).default_gpu_memory_utilization == 1.0
    assert not vllm.release("0.6.4").null_block and vllm.release("0.8.0").null_block
    # 'GPU KV cache size' is blocks per group x block size through 0.20.0 (kv_cache_utils.py l.1694), concurrency x
    # max_model_len from 0.20.1 (l.1706): the 0.20.0 hybrid launches of the corpus print the former
    assert not vllm.release("0.20.0").kv_tokens_by_concurrency and vllm.release("0.20.1").kv_tokens_by_concurrency
    # hybrid models run with prefix caching (mamba cache mode 'align') by default from 0.28.0 (arg_utils.py l.2650;
    # 0.27.0 l.2604 keeps it opt-in)
    assert not vllm.release("0.27.0").hybrid_prefix_caching and vllm.release("0.28.0").hybrid_prefix_caching
    # the hybrid KV cache manager (sliding layers keep their window) is on by default from 0.9.1 (config.py l.2120);
    # 0.9.0 turns sliding layers into full ones (kv_cache_utils.py unify_hybrid_kv_cache_specs)
    assert not vllm.release("0.9.0").hybrid_manager and vllm.release("0.9.1").hybrid_manager
    # mamba cache mode 'all' is taken through 0.31; a Mamba-2 mixer's prefill checkpoint page arrives in 0.32.0
    assert vllm.release("0.31.0").mamba_states_per_block and not vllm.release("0.32.0").mamba_states_per_block
    assert not vllm.release("0.31.0").mamba2_prefill_checkpoint and vllm.release("0.32.0").mamba2_prefill_checkpoint
    # sliding windows hold the tokens in flight from 0.26.0 (config/vllm.py l.525), not 0.25 (0.25.1 counts batched)
    assert not vllm.release("0.25.1").sliding_counts_in_flight and vllm.release("0.26.0").sliding_counts_in_flight


@pytest.mark.parametrize(
    ("version", "memory_gib", "name", "expected"),
    [
        ("0.8.0", 79.19, "NVIDIA H100 80GB HBM3", (8192, 256)),  # V1 by name, PR #12369
        ("0.8.0", 79.15, "NVIDIA A100-SXM4-80GB", (2048, 256)),
        ("0.8.5", 79.15, "NVIDIA A100-SXM4-80GB", (8192, 1024)),  # >= 70 GiB, PR #17073
        ("0.9.0", 79.15, "NVIDIA A100-SXM4-80GB", (2048, 256)),  # the A100 excluded, PR #17885
        ("0.27.0", 178.35, "NVIDIA B200", (8192, 1024)),
        ("0.28.0", 178.35, "NVIDIA B200", (16384, 1024)),  # the >= 160 GiB tier
    ],
)
def test_batch_defaults_by_era(version, memory_gib, name, expected):
    defaults = vllm.release(version).batch_defaults("gpu", round(memory_gib * GiB), name, 1, 8192)
    assert (defaults.max_num_batched_tokens, defaults.max_num_seqs) == expected


def test_v0_batches_the_whole_context_without_chunked_prefill():
    v0 = vllm.release("0.6.4")
    assert v0.batch_defaults("gpu", 24 * GiB, "RTX 3090", 1, 20000).max_num_batched_tokens == 20000
    assert v0.batch_defaults("gpu", 24 * GiB, "RTX 3090", 1, 1024).max_num_batched_tokens == 2048
    assert v0.batch_defaults("gpu", 24 * GiB, "RTX 3090", 1, 65536).max_num_batched_tokens == 512  # chunked
    assert vllm.release("0.6.5").batch_defaults("gpu", 24 * GiB, "x", 1, 65536).max_num_batched_tokens == 2048


def test_tgi_wiggle_room_per_tag():
    assert [tgi.release(v).wiggle_room for v in ("1.0.0", "1.4.1", "2.3.0", "2.4.0", "3.0.1", "3.2.1", "3.3.7")] == [
        1.0,
        0.95,
        0.95,
        0.90,
        0.95,
        0.93,
        0.90,
    ]
    total, free = 80 * GiB, 50 * GiB
    assert tgi.release("2.0.0").kv_budget(total, free, 1.0) == int(0.95 * free)  # of the memory free after warmup
    assert tgi.release("3.3.7").kv_budget(total, free, 1.0) == int(free - 0.1 * total)  # of the device


# --- detection from a run's own log -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry_id", "label", "family"),
    [
        ("vllm-0.11.2-h100-kaggle-gpt-oss-120b-tp1", "vLLM 0.11.2", "V1 0.11.1-0.19"),  # "vLLM API server version"
        ("vllm-0.19.0-a100-gpt-oss-20b-tp1", "vLLM 0.19.0", "V1 0.11.1-0.19"),  # the startup banner
        ("vllm-0.10.2-l4-qwen3-8b-fp8-unsloth-tp1", "vLLM 0.10.2", "V1 < 0.11.1"),  # "V1 LLM engine (v0.10.2)"
        ("vllm-0.8.5.post1-t4-qwen3-4b-base-unsloth-tp1", "vLLM 0.8.5.post1 (V0 engine)", "V0"),  # "V0 LLM engine"
        ("vllm-0.6-rtx3090-llama-3.1-8b-20k-tp1", "vLLM 0.7.3", "V0"),  # no version line, V0's wording
        ("vllm-0.6dev-80gb-x2-bamba-9.8b-fp32-tp2", "vLLM 0.7.3", "V0"),  # an untagged source build: 0.1.dev3512
    ],
)
def test_the_release_a_log_names(entry_id, label, family):
    found = entry(entry_id).log.release()
    assert (found.label, found.family) == (label, family)


def test_tgi_release_from_the_image_a_quoted_command_runs():
    assert entry("tgi-3.2.1-a100-80gb-x4-gemma-3-27b-it-fail").log.get("version") == "3.2.1"


# --- each family's capacity formula on a log of that family (the logged KV pinned) -----------------------


def test_v0_capacity_has_no_null_block_and_counts_blocks_times_block_size():
    # 0.6.x: "GPU blocks: 1952 ... Maximum concurrency for 20000 tokens per request: 1.56x"
    plan = plan_entry(entry("vllm-0.6-rtx3090-llama-3.1-8b-20k-tp1"), pinned_kv=1952 * 2 * (1 << 20))
    cap = plan.capacity.to_dict()
    assert (cap["num_blocks"], cap["usable_blocks"], cap["kv_tokens"]) == (1952, 1952, 1952 * 16)
    assert round(cap["max_concurrency"], 2) == 1.56


def test_v0_capacity_on_an_a100_40gb():
    # 0.6.x: "# GPU blocks: 5691 ... Maximum concurrency for 8192 tokens per request: 11.12x" (Meta-Llama-3-8B)
    plan = plan_entry(entry("vllm-0.6-a100-40gb-llama-3-8b-tp1"), pinned_kv=5691 * 2 * (1 << 20))
    assert (plan.capacity.num_blocks, plan.capacity.kv_tokens) == (5691, 5691 * 16)
    assert round(plan.capacity.max_concurrency, 2) == 11.12 and plan.release.family == "V0"


def test_v0_refuses_a_context_above_what_its_blocks_hold_in_its_own_words():
    # 0.6.x at 29000: 1478 blocks = 23648 tokens < 29000, "larger than the maximum number of tokens ..."
    plan = plan_entry(entry("vllm-0.6-rtx3090-llama-3.1-8b-29k-tp1-fail"), pinned_kv=1478 * 2 * (1 << 20))
    assert not plan.fits and plan.capacity.kv_tokens == 23648
    assert "maximum number of tokens that can be stored in KV cache (23648)" in plan.problem


def test_v1_before_0_20_counts_tokens_per_group_and_slides_by_batched_tokens():
    """gpt-oss-120b on 0.11.2: 130,960 tokens at 2.46x for 98,304: two groups (sliding, full) of 16,370 blocks; the
    sliding group holds window + max_num_batched_tokens (8192), not the 0.25+ tokens in flight."""
    log_entry = entry("vllm-0.11.2-h100-kaggle-gpt-oss-120b-tp1")
    first = plan_entry(log_entry)
    kv = 16370 * first.capacity.bytes_per_block
    cap = plan_entry(log_entry, pinned_kv=kv).capacity
    assert (cap.kv_cache_groups, cap.num_blocks, cap.kv_tokens) == (2, 16370, 130960)
    assert round(cap.max_concurrency, 2) == 2.46
    newest = plan_entry(log_entry, pinned_kv=kv).inputs
    from dataclasses import replace

    from kvops.planner import predict

    now = predict(replace(newest, engine_version=None)).capacity
    assert round(now.max_concurrency, 2) != 2.46 and now.kv_tokens != 130960  # the newest rules do not match it


def test_v1_dense_tokens_and_concurrency_from_the_blocks():
    # 0.10.2, Qwen3-8B on an L4: "GPU KV cache size: 65,376 tokens", 31.92x at 2048
    log_entry = entry("vllm-0.10.2-l4-qwen3-8b-fp8-unsloth-tp1")
    block = plan_entry(log_entry).capacity.bytes_per_block
    cap = plan_entry(log_entry, pinned_kv=65376 // 16 * block).capacity
    assert (cap.kv_tokens, round(cap.max_concurrency, 2)) == (65376, 31.92)


def test_what_vllms_own_max_model_len_auto_picks(run_kvops, tiny_model):
    """The installed 0.32.0 CPU build refused 131072 tokens with 64 MiB: 'the estimated maximum model length is
    65408' (tests/fixtures/logs/vllm-0.32.0-cpu-kv-too-small.log)."""
    doc = json.loads(
        run_kvops(
            "plan",
            "-m",
            str(tiny_model),
            "--device",
            "cpu",
            "--kv-cache-memory-bytes",
            str(64 << 20),
            "--max-model-len",
            "131072",
            "--json",
            expect=3,
        ).stdout
    )
    assert "the estimated maximum model length is 65408" in doc["problem"]  # the search up to the asked length
    # vLLM's own --max-model-len auto searches up to the model's context, which fits whole in 64 MiB
    limit = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    assert doc["capacity"]["engine_auto_max_model_len"] == limit
    assert doc["engine_version"]["version"] == vllm.NEWEST and doc["engine_version"]["rules"]


# --- every corpus log of each family: its own capacity formula, the logged KV pinned ----------------------

LOG_ROUNDING = 5 << 20  # vLLM logs GiB with two decimals: a logged KV is within +-5 MiB of what it allocated


def _capacity_logs(family: str):
    """Corpus logs of a vLLM release family that print their KV bytes and at least one capacity figure."""
    from tests.support.corpus import NotPlanned, entries

    found = []
    for item in entries():
        if item.engine != "vllm" or item.log.get("kv_cache_bytes") is None:
            continue
        try:
            inputs = item.options().plan_inputs()
        except (NotPlanned, ModelNotFound, UsageError):
            continue
        if vllm.release(inputs.engine_version).family != family or item.log.get("kv_cache_bytes") <= 0:
            continue
        if inputs.pp > 1:  # its KV line is the first stage's; the pool is the smallest stage's
            continue
        if item.log.kv_cache_size_tokens or item.log.get("num_gpu_blocks") or item.log.max_concurrency:
            found.append(item)
    return found


@pytest.mark.parametrize("family", ["V0", "V1 < 0.11.1", "V1 0.11.1-0.19"])
def test_each_familys_capacity_formula_gives_what_its_logs_printed(family):
    """Blocks (V0's '# GPU blocks'), 'GPU KV cache size' tokens and 'Maximum concurrency', from the logged KV by the
    release's rules (null block, groups, tokens per group or concurrency x max_model_len): each logged figure lies
    between what the formula gives at the logged KV -5 MiB and +5 MiB."""
    logs = _capacity_logs(family)
    assert logs, f"no {family} log in the corpus prints its KV and capacity"
    for item in logs:
        kv = item.log.get("kv_cache_bytes")
        low, high = (plan_entry(item, pinned_kv=kv + delta).capacity for delta in (-LOG_ROUNDING, LOG_ROUNDING))
        if item.log.get("num_gpu_blocks"):
            assert low.num_blocks <= item.log.get("num_gpu_blocks") <= high.num_blocks, item.id
        if item.log.kv_cache_size_tokens:
            assert low.kv_cache_size_tokens <= item.log.kv_cache_size_tokens <= high.kv_cache_size_tokens, item.id
        if item.log.max_concurrency:
            assert round(low.max_concurrency, 2) <= item.log.max_concurrency <= round(high.max_concurrency, 2), item.id


@pytest.mark.parametrize("family", tgi.FAMILIES)
def test_each_tgi_familys_block_size_gives_what_its_logs_printed(family):
    """TGI logs its pool as 'Setting max batch total tokens' (1.x/2.x: whole 16-token paged blocks) or, from 3.0,
    'KV-cache blocks: N, size: S' (flashinfer's 1-token blocks): the release's block size is what each log shows."""
    from tests.support.corpus import NotPlanned, entries

    checked = []
    for item in entries():
        tokens = item.log.get("max_batch_total_tokens")
        if item.engine != "tgi" or not tokens or item.log.get("no_automatic_total"):
            continue
        try:
            plan = plan_of(item)
        except (NotPlanned, ModelNotFound, UsageError):
            continue
        if plan.release.family != family:
            continue
        block_size = plan.capacity.to_dict()["block_size"]
        logged = item.log.get("kv_blocks")
        assert (logged[1] == block_size) if logged else (tokens % block_size == 0), item.id
        checked.append(item.id)
    assert checked, f"no {family} log in the corpus prints its pool"
