"""The KV layout of the attention backend vLLM picks per GPU (platforms/cuda.py `_get_backend_priorities`), where it
differs from one GPU to another."""

from __future__ import annotations

import json

import pytest

LATENT, INDEXER, LAYERS = 576, 132, 61  # DeepSeek-V3.2: 512 + 64 latent values, the indexer's 128 fp8 keys + scale


def _capacity(run_kvops, gpu: str, release: str) -> dict:
    ran = run_kvops(
        "plan", "-m", "deepseek-ai/DeepSeek-V3.2", "--engine-version", release, "--gpu", gpu, "--gpu-memory", "8TiB",
        "--kv-dtype", "fp8", "--kv-cache-memory-bytes", str(40 * 2**30), "--max-model-len", "8192", "--format", "json",
    )  # fmt: skip
    return json.loads(ran.stdout)["capacity"]


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0", "0.34.0"])
@pytest.mark.parametrize(("gpu", "latent"), [("H100-80GB", 656), ("B200", LATENT), ("GB300", LATENT)])
def test_sparse_mla_keeps_plain_fp8_where_flashinfer_serves_it(run_kvops, gpu, latent, release):
    """An fp8 cache of sparse MLA is FLASHMLA_SPARSE's fp8_ds_mla (656 B a token) on Hopper, but on SM100 vLLM runs
    FLASHINFER_MLA_SPARSE first and keeps plain fp8, 576 B: kvops planned 656 there until 2026-12-08 (3,076,352 B a
    64-token block for 61 layers, 2,764,032 in vLLM), 10% fewer blocks than vLLM holds."""
    capacity = _capacity(run_kvops, gpu, release)
    block = capacity["block_size"]
    assert capacity["bytes_per_block"] == block * (latent + INDEXER) * LAYERS


DENSE_MLA_BLOCKS = {  # (GPU, KV dtype) -> the block through 0.33 (the default 16 as the MLA backend prefers it)
    ("H100-80GB", "bf16"): 16,  # FLASH_ATTN_MLA: multiples of 16
    ("H200", "fp8"): 64,  # FLASHMLA (FLASH_ATTN_MLA stores no fp8): 64 only
    ("B200", "bf16"): 32,  # FLASHINFER_MLA: 32 or 64
    ("GB300", "fp8"): 32,
    ("A100-80GB", "bf16"): 16,  # TRITON_MLA: multiples of 16
    ("L40S", "fp8"): 16,
    ("MI300X", "bf16"): 64,  # ROCm's choice not read: FlashMLA's 64, as before
}


@pytest.mark.parametrize(("gpu", "dtype"), DENSE_MLA_BLOCKS)
@pytest.mark.parametrize("release", ["0.32.0", "0.33.0", "0.34.0"])
def test_dense_mla_takes_the_block_of_the_backend_the_gpu_runs(run_kvops, gpu, dtype, release):
    """vLLM sizes the block from its default as the GPU's first MLA backend prefers it (platforms/cuda.py
    `_get_backend_priorities`; `get_preferred_block_size`): kvops planned FlashMLA's 64 on every GPU until
    2026-12-08, a quarter of the blocks 0.33 holds on an H100 (DeepSeek-V2-Lite at 8,192: 21,546 blocks of 64
    planned, 86,186 of 16 in vLLM, about the same 1.38 M tokens). From 0.34 the default 64 is every MLA backend's."""
    ran = run_kvops(
        "plan", "-m", "deepseek-ai/DeepSeek-V2-Lite", "--engine-version", release, "--gpu", gpu, "--kv-dtype", dtype,
        "--max-model-len", "8192", "--format", "json",
    )  # fmt: skip
    plan = json.loads(ran.stdout)
    expected = 64 if release == "0.34.0" else DENSE_MLA_BLOCKS[gpu, dtype]
    assert (plan["flags"]["block-size"], plan["capacity"]["block_size"]) == (expected, expected)


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0", "0.34.0"])
@pytest.mark.parametrize(
    ("model", "gpu", "extra", "through_033"),
    [
        ("google/gemma-3-12b-it", "B200", (), 64),  # head size 256, images on: TRITON_FLASHINFER's [64]
        ("google/gemma-3-4b-it", "GB200", (), 64),
        ("google/gemma-3-12b-it", "B200", ("--language-model-only",), 16),  # text only: no mm-prefix attention
        ("google/gemma-3-27b-it", "B200", (), 16),  # head size 128: not the composite's
        ("google/gemma-3-12b-it", "H100-80GB", (), 16),  # Hopper's composite runs multiples of 16
    ],
)
def test_mm_prefix_attention_on_sm100_takes_triton_flashinfer_block(run_kvops, model, gpu, extra, through_033, release):
    """A Gemma 3 served with its images runs bidirectional attention over image tokens, which on SM100 vLLM gives the
    TRITON_FLASHINFER composite at head size 256 or 512 (platforms/cuda.py `_get_backend_priorities`,
    v1/attention/backends/triton_flashinfer.py: kernel block 64 only), so through 0.33 its default 16 becomes 64:
    kvops planned 16 until 2026-12-08 (gemma-3-12b-it on a B200 at 8,192 and 0.33: 136,419 blocks of 16 planned,
    34,104 of 64 in vLLM)."""
    ran = run_kvops(
        "plan", "-m", model, "--engine-version", release, "--gpu", gpu, "--max-model-len", "8192", *extra,
        "--format", "json",
    )  # fmt: skip
    plan = json.loads(ran.stdout)
    expected = 64 if release == "0.34.0" else through_033
    assert (plan["flags"]["block-size"], plan["capacity"]["block_size"]) == (expected, expected)


@pytest.mark.parametrize(
    ("gpu", "refused"), [("A100-80GB", True), ("L40S", True), ("H100-80GB", False), ("B200", False)]
)
def test_sparse_mla_where_vllm_has_no_backend_is_a_warning(run_kvops, gpu, refused):
    """Every sparse MLA backend needs Hopper or Blackwell (supports_compute_capability, v1/attention/backends/mla/):
    on an A100 or L40S vLLM stops at startup with no attention backend; kvops planned DeepSeek-V3.2 there without a
    word until 2026-12-08."""
    ran = run_kvops(
        "plan", "-m", "deepseek-ai/DeepSeek-V3.2", "--gpu", gpu, "--gpu-memory", "8TiB", "--max-model-len", "8192",
        "--format", "json",
    )  # fmt: skip
    warnings = json.loads(ran.stdout)["warnings"]
    assert any("no sparse MLA attention backend" in warning for warning in warnings) is refused


@pytest.mark.parametrize("dtype", ["auto", "fp8"])
def test_sparse_mla_on_sm120_is_fp8_ds_mla_whatever_the_dtype(run_kvops, dtype):
    """SM120's only sparse backend, FLASHINFER_MLA_SPARSE_SM120, stores an auto cache as fp8_ds_mla too
    (`_canonicalize_sparse_mla_kv_cache_dtype`): kvops planned bf16's 1,152 B a token on an RTX PRO 6000 until
    2026-12-08 (5,012,736 B a block, 8,568 blocks in 40 GiB; vLLM 3,076,352 B and 13,961)."""
    ran = run_kvops(
        "plan", "-m", "deepseek-ai/DeepSeek-V3.2", "--gpu", "RTX-PRO-6000", "--gpu-memory", "8TiB", "--kv-dtype",
        dtype, "--kv-cache-memory-bytes", str(40 * 2**30), "--max-model-len", "8192", "--format", "json",
    )  # fmt: skip
    capacity = json.loads(ran.stdout)["capacity"]
    assert capacity["bytes_per_block"] == capacity["block_size"] * (656 + INDEXER) * LAYERS
