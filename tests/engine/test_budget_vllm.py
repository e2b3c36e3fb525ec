"""vLLM's own KV-cache sizing (the installed engine's kv_cache_utils) against the planner, for every catalog model.

The specs are vLLM's own: each layer's `get_kv_cache_spec` from the model vLLM builds on the meta device
(tests/support/vllm_specs.py), as the CPU build holds them and as a GPU engine would (block size 16, the SSM dtype
vLLM's model rules choose, the hybrid block alignment of vLLM's platform code with FlashAttention's kernel sizes).
Models the CPU build cannot instantiate get their specs from vLLM's spec classes and its own state-shape
calculator, fed the layer facts kvops read (their reading is checked against ModelConfig in test_vllm_view.py).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest

from kvops.cpu_features import has_amx_tiles, has_avx512_bf16
from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.layout import LayoutOptions, default_block_size, kv_layout, pool
from kvops.model.catalog import catalog
from kvops.model.locate import catalog_spec
from tests.engine.test_vllm_view import UNBUILDABLE
from tests.support.vllm_specs import BuiltModel, engine_config, specs_from_classes

ENTRIES = list(catalog())
POINTS = ((4096, 40 * 2**30 + 777), (8192, 7 * 2**30 + 12345), (1024, 2**27 + 5))
UNBUILDABLE_ON_CPU = UNBUILDABLE


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")


def compare(config, spec, specs, layout, label) -> int:
    """num_blocks and kv tokens of vLLM's get_kv_cache_configs against kvops' pool at a few lengths and sizes."""
    from vllm.v1.core import kv_cache_utils

    checked = 0
    for length, memory in POINTS:
        config.model_config.max_model_len = length
        ours = pool(layout, memory, length, config.max_in_flight_tokens)
        if not ours.fits_one_request:
            refusal = "No available memory" if ours.num_blocks == 0 else "To serve at least one request"
            with pytest.raises(ValueError, match=refusal):
                kv_cache_utils.get_kv_cache_configs(config, [dict(specs)], [memory])
            continue
        configs = kv_cache_utils.get_kv_cache_configs(config, [dict(specs)], [memory])
        scheduler = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
        tokens, _ = kv_cache_utils.get_kv_cache_capacity(config, scheduler)
        assert (ours.num_blocks, ours.kv_cache_size_tokens) == (configs[0].num_blocks, tokens), (label, length)
        assert len(layout.groups) == len(configs[0].kv_cache_groups), label
        assert layout.block_size == min(group.kv_cache_spec.block_size for group in scheduler.kv_cache_groups)
        checked += 1
    return checked


@pytest.mark.vllm
@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.id not in UNBUILDABLE_ON_CPU], ids=lambda e: e.id)
def test_cpu_engine_pool_matches_vllm(entry, tiny_model, tmp_path):
    """As the CPU build sizes it: its own specs, block sizes and state dtypes."""
    spec = catalog_spec(entry)
    built = BuiltModel(entry.config, tmp_path / "model", tiny_model, max_model_len=1024)
    built.vllm_config.cache_config.kv_cache_layout = "LBHNC"
    mode = built.vllm_config.cache_config.mamba_cache_mode
    options = LayoutOptions(device="cpu", mamba_cache_mode=mode, cpu_avx512_bf16=has_avx512_bf16())
    layout = kv_layout(spec, KV_DTYPES["bf16"], 1, default_block_size(spec, "cpu", has_amx_tiles()), options=options)
    assert compare(built.vllm_config, spec, built.specs(), layout, "cpu")


@pytest.mark.vllm
@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.id not in UNBUILDABLE_ON_CPU], ids=lambda e: e.id)
def test_gpu_engine_pool_matches_vllm(entry, tiny_model, tmp_path):
    """As a GPU engine sizes it: block size 16 (64 for MLA), bf16 and fp8 caches, tp 1 and 2."""
    import torch
    from vllm.config import ParallelConfig
    from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec

    spec = catalog_spec(entry)
    block = default_block_size(spec, "gpu")
    built = BuiltModel(entry.config, tmp_path / "model", tiny_model, max_model_len=1024)
    built.as_gpu(block)
    config = built.vllm_config
    config.cache_config.kv_cache_layout = "LBHNC"
    options = LayoutOptions(mamba_cache_mode=config.cache_config.mamba_cache_mode)
    checked = 0
    for tp, dtype_name in ((1, "bf16"), (1, "fp8"), (2, "bf16")):
        if spec.num_attention_heads % tp or (tp > 1 and (spec.has_state or _heterogeneous(spec))):
            continue
        kv_heads = config.model_config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp))
        torch_dtype = {"bf16": torch.bfloat16, "fp8": torch.uint8}[dtype_name]
        specs = {}
        for name, layer_spec in built.specs().items():
            if isinstance(layer_spec, AttentionSpec) and not str(getattr(layer_spec, "cache_role", "")).endswith(
                "INDEXER"
            ):
                heads = layer_spec.num_kv_heads if isinstance(layer_spec, MLAAttentionSpec) else kv_heads
                layer_spec = replace(
                    layer_spec, dtype=torch_dtype, num_kv_heads=heads if tp > 1 else layer_spec.num_kv_heads
                )
            specs[name] = layer_spec
        if dtype_name == "fp8" and spec.has_state:
            continue  # the alignment above was for a bf16 cache
        layout = kv_layout(spec, KV_DTYPES[dtype_name], tp, block, options=options)
        checked += compare(config, spec, specs, layout, f"gpu tp {tp} {dtype_name}")
    assert checked


def _heterogeneous(spec) -> bool:
    return len({(layer.num_kv_heads, layer.head_dim) for layer in spec.attention_layers()}) > 1


@pytest.mark.vllm
@pytest.mark.parametrize("model", sorted(UNBUILDABLE_ON_CPU))
def test_pool_of_models_the_cpu_build_cannot_instantiate(model, tiny_model, tmp_path):
    """Their specs from vLLM's spec classes (and, for state layers, vLLM's MambaStateShapeCalculator); a GPU engine's
    block size, state dtypes and hybrid alignment."""
    entry = next(entry for entry in ENTRIES if entry.id == model)
    spec = catalog_spec(entry)
    config = engine_config({"architectures": ["LlamaForCausalLM"], **_tiny_text()}, tmp_path / "m", tiny_model)
    config.cache_config.kv_cache_layout = "LBHNC"
    config.cache_config.mamba_cache_mode = "align" if spec.has_state else "none"
    options = LayoutOptions()
    block = default_block_size(spec, "gpu")
    layout = kv_layout(spec, KV_DTYPES["bf16"], 1, block, options=options)
    specs = specs_from_classes(spec, layout.attention_block_size)
    assert compare(config, spec, specs, layout, "gpu")


def _tiny_text() -> dict:
    from tests.support.tiny_model import TINY_LLAMA

    return dict(TINY_LLAMA)
