"""vLLM's own KV-cache sizing (the installed engine's kv_cache_utils) against the planner, for every catalog model."""

from __future__ import annotations

import warnings

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.layout import kv_layout, pool
from kvops.model import load_model
from kvops.model.catalog import catalog


@pytest.mark.vllm
def test_num_blocks_and_kv_tokens_match_vllm_for_every_catalog_model(tiny_model, tmp_path, monkeypatch):
    """kv_layout + capacity against vLLM's get_kv_cache_configs / get_kv_cache_capacity, hybrid models included."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    config = EngineArgs(
        model=str(tiny_model), load_format="dummy", dtype="bfloat16", max_model_len=1024, block_size=16
    ).create_engine_config()
    config.cache_config.kv_cache_layout = "LBHNC"
    torch_dtypes = {"bf16": torch.bfloat16, "fp8": torch.uint8}
    checked = 0
    for entry in catalog():
        spec = load_model(entry.id)
        for tp in (1, 2):
            if spec.num_attention_heads % tp:
                continue
            for dtype_name, torch_dtype in torch_dtypes.items():
                layout = kv_layout(spec, KV_DTYPES[dtype_name], tp, 16)
                specs = {}
                for index, layer in enumerate(spec.layers):
                    common = dict(
                        block_size=16, num_kv_heads=layer.heads_per_gpu(tp), head_size=layer.head_dim, dtype=torch_dtype
                    )
                    kind = {"sliding": SlidingWindowSpec, "mla": MLAAttentionSpec, "full": FullAttentionSpec}[
                        layer.kind
                    ]
                    extra = {"sliding_window": layer.window} if layer.kind == "sliding" else {}
                    specs[f"model.layers.{index}.attn"] = kind(**common, **extra)
                for length, memory in ((4096, 40 * 2**30 + 777), (8192, 7 * 2**30 + 12345)):
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
                        entry.id,
                        tp,
                        dtype_name,
                        length,
                    )
                    assert len(layout.groups) == len(configs[0].kv_cache_groups)
                    checked += 1
    assert checked > 100
