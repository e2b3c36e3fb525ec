"""TGI's KV sizing and launch rules, as its source states them (TGI cannot run here)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.engines.common import forward_activation_peak
from kvops.engines.tgi.budget import (
    activation_model,
    check_fp8,
    dense_image_attention,
    kv_bytes_per_token,
    pool,
    reservation_tokens,
    resolve_attention,
    tgi_kv_dtype,
    unfused_mlp,
    warmup_logits,
)
from kvops.engines.tgi.flags import validation_errors
from kvops.engines.tgi.releases import NON_TORCH_PRIOR, release
from kvops.errors import UsageError
from kvops.gpus import find_gpu
from kvops.model import load_model
from kvops.model.config import spec_from_config
from kvops.overheads import POOLED, shipped_fit
from kvops.plan import PlanInputs


def test_attention_backend_and_block_size_follow_resolve_attention():
    assert resolve_attention(load_model("llama-3-8b"), "nvidia").block_size == 1  # flashinfer
    deepseek = resolve_attention(load_model("deepseek-ai/DeepSeek-V2-Lite"), "nvidia")
    assert (deepseek.backend, deepseek.block_size) == ("flashdecoding", 256)
    rocm = resolve_attention(load_model("llama-3-8b"), "amd")
    assert (rocm.backend, rocm.block_size, rocm.supports_chunking) == ("paged", 16, False)


def test_kv_bytes_per_token_caches_the_whole_context_and_splits_kv_heads():
    mistral = load_model("mistral-7b-v0.1")  # sliding window 4096 on every layer: TGI still reserves everything
    assert kv_bytes_per_token(mistral, KV_DTYPES["bf16"], 1) == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(mistral, KV_DTYPES["bf16"], 2) == 2 * 32 * 4 * 128 * 2
    assert kv_bytes_per_token(mistral, KV_DTYPES["fp8"], 1) == 2 * 32 * 8 * 128


def test_kv_heads_must_divide_by_shards_in_tgi_words():
    with pytest.raises(
        UsageError,
        match=r"`num_key_value_heads` must be divisible by `num_shards` \(got `num_key_value_heads`: 8 and `num_shards`: 16",
    ):
        kv_bytes_per_token(load_model("llama-3.1-70b"), KV_DTYPES["bf16"], 16)


# google/gemma-2b's config.json: a Llama-style model with one KV head
GEMMA_2B = {
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "head_dim": 256, "hidden_size": 2048,
    "intermediate_size": 16384, "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "torch_dtype": "bfloat16", "vocab_size": 256000,
}  # fmt: skip


def test_one_kv_head_is_not_replicated_over_shards_for_a_llama_style_model(run_kvops, tmp_path):
    """TGI splits KV heads (1 // 2 = 0 heads: flash_llama_modeling's ValueError from v2.1.0, _load_gqa's shape
    assertion before, at every tag); kvops had kept the head whole on each shard and planned --num-shard 2 as
    fitting (915,109 KV tokens on 2 x A10G)."""
    gemma = spec_from_config(GEMMA_2B, name="gemma-2b", source="path", where="gemma-2b/config.json")
    assert kv_bytes_per_token(gemma, KV_DTYPES["bf16"], 1) == 2 * 18 * 1 * 256 * 2
    with pytest.raises(UsageError, match=r"`num_key_value_heads`: 1 and `num_shards`: 2 .*; give --num-shard 1$"):
        kv_bytes_per_token(gemma, KV_DTYPES["bf16"], 2)
    (tmp_path / "config.json").write_text(json.dumps(GEMMA_2B))
    refused = run_kvops("plan", "--engine", "tgi", "-m", str(tmp_path), "--gpu", "a10g", "--tp", "2", expect=2)
    assert "TGI refuses --num-shard 2" in refused.stderr and "Traceback" not in refused.stderr
    # the multi-query models TGI does replicate it for (flash_santacoder_modeling.py, flash_rw_modeling.py)
    bigcode = replace(gemma, model_type="gpt_bigcode")
    assert kv_bytes_per_token(bigcode, KV_DTYPES["bf16"], 2) == kv_bytes_per_token(bigcode, KV_DTYPES["bf16"], 1)


def test_kv_cache_dtype_takes_only_fp8_values():
    assert tgi_kv_dtype(KV_DTYPES["fp8"], "bf16") == "fp8_e4m3fn"
    assert tgi_kv_dtype(KV_DTYPES["fp8_e5m2"], "bf16") == "fp8_e5m2"
    assert tgi_kv_dtype(KV_DTYPES["bf16"], "bf16") is None
    with pytest.raises(UsageError, match=r"\[possible values: fp8_e4m3fn, fp8_e5m2\]"):
        tgi_kv_dtype(KV_DTYPES["int8"], "bf16")


def test_fp8_rules_of_the_kv_cache_constructor():
    flashdecoding = resolve_attention(load_model("deepseek-ai/DeepSeek-V2-Lite"), "nvidia")
    with pytest.raises(UsageError, match="FP8 KV cache is currently only supported for flashinfer on CUDA"):
        check_fp8(flashdecoding, "fp8_e4m3fn", "nvidia")
    with pytest.raises(UsageError, match="float8_e5m2 FP8 KV cache is not supported on AMD ROCm"):
        check_fp8(resolve_attention(load_model("llama-3-8b"), "amd"), "fp8_e5m2", "amd")


def test_a_request_reserves_input_plus_at_most_1024_new_tokens_from_3_1_1():
    """router/src/validation.rs cuts a given max_new_tokens to 1024 a round from 3.1.1 (PR #3016); 3.0.x and 2.x
    queue it whole (kvops had cut it at every release)."""
    newest = release(None)
    assert reservation_tokens(1000, 500, newest) == 1499
    assert reservation_tokens(1000, 4000, newest) == 1000 + 1024 - 1
    for older in ("3.1.0", "2.4.1"):
        assert reservation_tokens(1000, 4000, release(older)) == 1000 + 4000 - 1


def test_capacity_is_whole_blocks_with_block_zero_for_health_checks():
    cap = pool(10 * 131072 * 16 + 5, 131072, 16)
    assert (cap.num_blocks, cap.max_batch_total_tokens, cap.usable_blocks) == (10, 160, 9)
    assert cap.requests_fitting(40) == 3  # 3 blocks each


def test_validation_messages_are_tgis_own():
    assert validation_errors(100, 100, 4096, 10000, True) == [
        "Invalid argument: `max_input_tokens`(100) must be < `max_total_tokens`(100)"
    ]
    assert (
        validation_errors(8191, 8192, 4096, 5000, True)[0]
        == "Backend failed: Not enough memory to handle `max_total_tokens=8192`"
    )
    assert validation_errors(8191, 8192, 4096, 20000, False) == [
        "Argument validation error: `max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: 4096 and 8191"
    ]
    assert validation_errors(1000, 2000, 4096, 3000, True) == [
        "Argument validation error: `max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. Given: 4096 and 3000"
    ]
    assert validation_errors(1000, 2000, 4096, 30000, True) == []


def test_deepseek_in_tgi_caches_full_heads_of_nope_plus_rope():
    from kvops.engines.tgi.budget import head_size

    assert (
        head_size(load_model("deepseek-v3")) == 128 + 64
    )  # max(qk_nope + qk_rope, v_head_dim 128), not the 576 latent


@pytest.mark.parametrize(
    ("version", "tp", "per_logit"),
    [
        ("2.3.1", 1, 4),  # 16-bit logits and their log-softmax copy
        ("2.3.1", 2, 7),  # the gather (2 + 1 B), the contiguous copy of its transposed view and the log-softmax
        ("2.4.1", 1, 2),  # log_softmax in place (#2661)
        ("2.4.1", 2, 5),  # the gathered logits beside the shard's own half, and the contiguous copy
        ("1.0.0", 4, 6.5),  # TensorParallelHead returns world_out.T since 1.0
    ],
)
def test_warmup_logits_before_3_0_cover_every_prefill_token(version, tp, per_logit):
    inputs = PlanInputs("tgi", load_model("llama-3-8b"), find_gpu("H100-80GB"), tp=tp)
    logits, _ = warmup_logits(inputs, release(version), 4096)
    assert logits == 4096 * 128256 * per_logit


def test_gathered_logits_copy_explains_the_tgi_2_4_tp2_warmup():
    """tgi-2.x-a100-80gb-x2-llama-3.1-70b (2.4, tp 2, 10,049 prefill tokens): its pool leaves 8.82 GB besides the
    weights; the forward (1.36 GB, 0.29 more for TGI's unfused MLP) and 5 B per logit (6.44 GB) leave 0.73 GB, below
    the 1 GiB non-torch of tp 2."""
    inputs = PlanInputs("tgi", load_model("meta-llama/Llama-3.1-70B"), find_gpu("A100-80GB"), tp=2)
    model, _ = activation_model(inputs, release("2.4.0"), 10049)
    assert model == 1358303232 + 10049 * 28672 // 2 * 2 + 10049 * 128256 * 5
    assert 8823077274 - model == 732426394


def test_tgi_mlp_holds_the_activated_gate_beside_gate_up_and_their_product():
    """`self.act(gate_up_states[:, 0]) * gate_up_states[:, 1]` (flash_llama_modeling.py v1.0.0-v3.3.7): one more
    intermediate width per token than kvops' forward model (vLLM's fused SiluAndMul); not for MoE models."""
    spec = load_model("llama-3-8b")
    assert unfused_mlp(spec, 4096, 1) == 4096 * 14336 * 2
    assert unfused_mlp(spec, 4096, 2) == 4096 * 7168 * 2
    inputs = PlanInputs("tgi", spec, find_gpu("H100-80GB"))
    model, what = activation_model(inputs, release("3.3.7"), 4096)
    assert model == forward_activation_peak(spec, 4096) + 4096 * 14336 * 2 + 128256 * 2
    assert f"forward {forward_activation_peak(spec, 4096) + 4096 * 14336 * 2} B" in what
    assert unfused_mlp(load_model("Qwen/Qwen3-30B-A3B"), 4096, 1) == 0  # experts: TGI's fused MoE kernels


def test_tgi_non_torch_prior_at_tp_1_is_what_the_a10g_page_shows_after_warmup():
    """TGI reads device-wide free memory: its tp 1 non-torch prior is the A10G page's nvidia-smi (19882 MiB used
    after a TGI 2.2.0 warmup) less Llama-3.1-8B's 16-bit weights and the logged 19,056-token pool; the shipped fit,
    with no tp 1 log of its own, plans with it."""
    weights = 8_030_261_248 * 2
    pool_bytes = 19056 * kv_bytes_per_token(load_model("meta-llama/Llama-3.1-8B-Instruct"), KV_DTYPES["bf16"], 1)
    assert (19882 * 2**20 - weights - pool_bytes, 2**30) == NON_TORCH_PRIOR
    assert shipped_fit("tgi").families[POOLED].non_torch_bytes(1) == NON_TORCH_PRIOR[0]


def test_gemma3_image_warmup_attends_over_dense_masks_in_3_2():
    """TGI 3.2.x: the warmup's image request sends Gemma 3 through SDPA over [batch, 1, S, S] masks (global and
    sliding) and the math kernel's scores; 3.3.0 hands the mask to flashinfer (#3167); text models never."""
    spec, gpu = load_model("google/gemma-3-27b-it"), find_gpu("A100-80GB")
    inputs = PlanInputs("tgi", spec, gpu, tp=4, max_input_tokens=30000)
    dense, how = dense_image_attention(inputs, release("3.2.1"), 31000)
    square = 2 * 30000 * 30000 * 2  # two warmup requests (30,000 and 1,000 tokens) padded to 30,000, 16-bit
    assert dense == 2 * square + 2 * (32 // 4) * square
    assert "Gemma 3" in how
    assert dense_image_attention(inputs, release("3.3.0"), 31000) == (0, "")
    assert dense_image_attention(inputs, release("3.1.1"), 31000) == (0, "")
    text = PlanInputs("tgi", load_model("llama-3-8b"), gpu, max_input_tokens=30000)
    assert dense_image_attention(text, release("3.2.1"), 31000) == (0, "")


def test_warmup_logits_from_3_0_are_each_warmup_requests_last_token():
    """3.0 drops prefill logprobs unless REQUEST_LOGPROBS=1: the router's warmup requests each sample one token."""
    spec, gpu = load_model("llama-3-8b"), find_gpu("H100-80GB")
    one, _ = warmup_logits(PlanInputs("tgi", spec, gpu), release("3.0.1"), 4096)  # max input unset: one request
    assert one == 128256 * 2
    split, _ = warmup_logits(PlanInputs("tgi", spec, gpu, tp=2, max_input_tokens=1000), release("3.3.7"), 4096)
    assert split == 5 * 128256 * 3  # 4096 prefill tokens in requests of at most 1000
