"""vLLM's own KV-cache sizing (the installed engine's kv_cache_utils) against the planner, for every catalog model.

The specs are vLLM's own: each layer's `get_kv_cache_spec` from the model vLLM builds on the meta device
(tests/support/vllm_specs.py), with the block size a GPU uses (16) and the fp8 cache as vLLM's specs hold it.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.layout import kv_layout, pool
from kvops.model.catalog import catalog
from kvops.model.locate import catalog_spec
from tests.support.vllm_specs import kv_cache_specs

ENTRIES = list(catalog())


def as_gpu_spec(spec, torch_dtype, kv_heads):
    """The CPU-built spec as a GPU engine holds it: block size 16, the cache dtype asked for, the KV heads of one
    tensor-parallel rank (vLLM's ModelConfig.get_num_kv_heads; MLA keeps its one latent head)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    heads = spec.num_kv_heads if isinstance(spec, MLAAttentionSpec) else kv_heads
    return replace(spec, block_size=16, dtype=torch_dtype, num_kv_heads=heads)


@pytest.mark.vllm
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.id)
def test_num_blocks_and_kv_tokens_match_vllm(entry, tiny_model, tmp_path, monkeypatch):
    """kv_layout + capacity against vLLM's get_kv_cache_configs / get_kv_cache_capacity, hybrid models included."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    import torch
    from vllm.config import ParallelConfig
    from vllm.v1.core import kv_cache_utils

    spec = catalog_spec(entry)
    config, built = kv_cache_specs(entry.config, tmp_path / "model", tiny_model, max_model_len=1024)
    config.cache_config.kv_cache_layout = "LBHNC"
    torch_dtypes = {"bf16": torch.bfloat16, "fp8": torch.uint8}
    checked = 0
    for tp, dtype_name in ((1, "bf16"), (1, "fp8"), (2, "bf16")):
        if spec.num_attention_heads % tp:
            continue
        kv_heads = config.model_config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp))
        layout = kv_layout(spec, KV_DTYPES[dtype_name], tp, 16)
        specs = {name: as_gpu_spec(layer, torch_dtypes[dtype_name], kv_heads) for name, layer in built.items()}
        for length, memory in ((4096, 40 * 2**30 + 777), (8192, 7 * 2**30 + 12345), (1024, 2**26 + 5)):
            config.model_config.max_model_len = length
            ours = pool(layout, memory, length, config.max_in_flight_tokens)
            if not ours.fits_one_request:
                with pytest.raises(ValueError, match="To serve at least one request"):
                    kv_cache_utils.get_kv_cache_configs(config, [dict(specs)], [memory])
                continue
            configs = kv_cache_utils.get_kv_cache_configs(config, [dict(specs)], [memory])
            tokens, _ = kv_cache_utils.get_kv_cache_capacity(
                config, kv_cache_utils.generate_scheduler_kv_cache_config(configs)
            )
            assert (ours.num_blocks, ours.kv_cache_size_tokens) == (configs[0].num_blocks, tokens), (
                tp,
                dtype_name,
                length,
            )
            assert len(layout.groups) == len(configs[0].kv_cache_groups)
            checked += 1
    assert checked
