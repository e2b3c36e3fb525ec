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
