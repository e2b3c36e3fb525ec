"""vLLM V1's block arithmetic, checked against the installed engine's own kv_cache_utils."""

from __future__ import annotations

from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.budget import (
    BatchDefaults,
    batch_defaults,
    capture_sizes,
    concurrent_batches,
    max_in_flight_tokens,
    resolve_batch,
)
from kvops.engines.vllm.layout import kv_layout, longest_context, pool
from kvops.engines.vllm.releases import release
from kvops.gpus import find_gpu
from kvops.model import load_model

BF16 = KV_DTYPES["bf16"]


def test_tiny_model_4_mib_pool_is_32_blocks_of_128_tokens(tiny_model):
    spec = load_model(str(tiny_model))
    layout = kv_layout(spec, BF16, tp=1, block_size=128)
    assert layout.bytes_per_block == 2 * 128 * (2 * 2 * 64 * 2)  # 2 layers x 128 tokens x 512 B
    cap = pool(layout, 4 * 1024 * 1024, max_model_len=1024, in_flight=2048)
    assert (cap.num_blocks, cap.kv_cache_size_tokens, cap.max_concurrency, cap.usable_blocks) == (32, 4096, 4.0, 31)


def test_gemma2_alternating_layers_form_two_groups_sharing_one_pool():
    layout = kv_layout(load_model("gemma-2-9b"), BF16, tp=1, block_size=16)
    assert [group.kind for group in layout.groups] == ["sliding", "full"]
    assert [len(group.layers) for group in layout.groups] == [21, 21]
    assert layout.bytes_per_block == 21 * 16 * (2 * 8 * 256 * 2)
    assert layout.padding_layers == 0


def test_gemma3_five_to_one_groups_sliding_layers_by_the_full_count():
    layout = kv_layout(load_model("google/gemma-3-12b-it"), BF16, tp=1, block_size=16)
    kinds = [group.kind for group in layout.groups]
    assert kinds.count("sliding") == 5 and kinds.count("full") == 1
    assert {len(group.layers) for group in layout.groups} == {8}  # 40 sliding + 8 full, groups of 8


def test_sliding_group_holds_window_plus_in_flight_not_the_context():
    layout = kv_layout(load_model("gemma-2-9b"), BF16, tp=1, block_size=16)
    sliding, full = layout.groups
    assert full.admission_blocks(32768, in_flight=16384) == 2048
    assert sliding.admission_blocks(32768, in_flight=16384) == -(-(4096 - 1 + 16384) // 16) + 1
    assert sliding.held_blocks(32768) == 4096 // 16 + 1


def test_batch_defaults_follow_get_batch_defaults():
    assert batch_defaults("gpu", find_gpu("H100").memory_bytes, "NVIDIA H100 80GB HBM3") == BatchDefaults(
        8192, 1024, batch_defaults("gpu", find_gpu("H100").memory_bytes, "H100").rule
    )
    assert (
        batch_defaults("gpu", find_gpu("A100-80GB").memory_bytes, "NVIDIA A100-SXM4-80GB").max_num_batched_tokens
        == 2048
    )
    assert batch_defaults("gpu", find_gpu("B200").memory_bytes, "NVIDIA B200").max_num_batched_tokens == 16384
    assert batch_defaults("cpu", None, "").max_num_seqs == 128
    assert resolve_batch(batch_defaults("cpu", None, ""), 1024, None, None) == (2048, 128)
    assert resolve_batch(batch_defaults("cpu", None, ""), 8, None, None) == (1024, 128)  # min(128 x 8, 2048)
    # chunked prefill off: each prompt runs whole, so a default budget rises to the context (a stated one stays)
    h100 = batch_defaults("gpu", find_gpu("H100").memory_bytes, "H100")
    assert resolve_batch(h100, 32768, None, None, chunked_prefill=False) == (32768, 1024)
    assert resolve_batch(h100, 4096, None, None, chunked_prefill=False) == (8192, 1024)
    assert resolve_batch(h100, 32768, 16384, None, chunked_prefill=False) == (16384, 1024)


def test_a_pipeline_keeps_a_batch_in_flight_per_stage_and_async_scheduling_one_more():
    """VllmConfig.max_concurrent_batches: 0.34 runs pp + 1 batches with async scheduling, pp without; 0.32-0.33 add
    the async one to a pipeline only with Model Runner V2; one stage keeps two (async) or one."""
    newest, v032 = release("0.34.0"), release("0.32.0")
    assert [concurrent_batches(newest, True, pp, False) for pp in (1, 2, 4)] == [2, 3, 5]
    assert [concurrent_batches(newest, False, pp, False) for pp in (1, 2, 4)] == [1, 2, 4]
    assert concurrent_batches(v032, True, 2, v2_runner=False) == 2 and concurrent_batches(v032, True, 2, True) == 3
    assert max_in_flight_tokens(8192, "gpu", newest, True, pp=2) == 3 * 8192
    assert max_in_flight_tokens(8192, "cpu", newest, True, pp=1) == 8192  # the CPU platform turns async off


def test_interactivity_captures_every_batch_up_to_32():
    assert len(capture_sizes(512)) == 51 and len(capture_sizes(512, interactive=True)) == 76
    assert capture_sizes(20, interactive=True) == list(range(1, 21))
    assert capture_sizes(20) == [1, 2, 4, 8, 16]
    assert max_in_flight_tokens(2048, "gpu") == 4096 and max_in_flight_tokens(2048, "cpu") == 2048


def test_longest_context_is_the_largest_that_fits():
    layout = kv_layout(load_model("llama-3-8b"), BF16, tp=1, block_size=16)
    length = longest_context(layout, usable_blocks=1000, sequences=2, in_flight=0, upper=8192)
    assert 2 * layout.blocks_per_request(length, 0) <= 1000 < 2 * layout.blocks_per_request(length + 16, 0)


def test_a_float32_launch_of_a_16_bit_model_loads_4_bytes_a_weight_and_its_rotary_cache():
    """`--dtype float32` casts every float weight and the rotary cos/sin cache to fp32 as vLLM loads them: the plan's
    weights are what llm-d-planner's H100 log printed ('Model loading took 29.98 GiB'), twice the bf16 launch's."""
    from tests.support.corpus import entry, plan_entry

    fp32 = entry("vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-fp32-llmd")
    bf16 = entry("vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-llmd")
    weights = {item.id: plan_entry(item).term("weights").bytes for item in (fp32, bf16)}
    assert abs(weights[fp32.id] - fp32.log.get("weights_bytes")) <= 5 << 20  # the log's two decimals
    assert weights[fp32.id] == 2 * weights[bf16.id]
    assert "x 4 B" in plan_entry(fp32).term("weights").formula
