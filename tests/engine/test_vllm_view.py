"""kvops' reading of each catalog config against vLLM's own: its ModelConfig, and the KV-cache spec of every
layer of the model vLLM builds for it (on the meta device: no weights, no memory; tests/support/vllm_specs.py).

Needs the vLLM CPU build; nothing is downloaded (the config is written to a temporary folder, the tokenizer is
the locally built test one and is not initialised). Multimodal wrappers are compared through their language
model's own CausalLM class (the wrappers need torchvision, which does not import beside this torch build).
"""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from dataclasses import replace

import pytest

from kvops.cpu_features import has_avx512_bf16
from kvops.dtypes import KV_DTYPES
from kvops.engines.vllm.layout import LayoutOptions, aligned_block_size, state_dtypes
from kvops.model.catalog import catalog
from kvops.model.locate import catalog_spec
from tests.support.vllm_specs import engine_config, kv_cache_specs, text_model_config

pytestmark = pytest.mark.vllm

ENTRIES = {entry.id: entry for entry in catalog()}
# Models the vLLM CPU build cannot instantiate, and why; their specs are built from vLLM's spec classes and
# shape calculators in test_budget_vllm.py, their layers checked against ModelConfig here.
UNBUILDABLE = {
    "deepseek-ai/DeepSeek-V3.2": "sparse attention is not supported on CPU",
    "zai-org/GLM-5": "sparse attention is not supported on CPU",
    "nvidia/Llama-3_3-Nemotron-Super-49B-v1": "its config class is the repository's own code (trust_remote_code)",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "its non-gated MoE experts run only on CUDA, XPU and ROCm",
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8": "its non-gated MoE experts run only on CUDA, XPU and ROCm",
    **{
        name: "vLLM's Qwen3.5 module imports torchvision, which does not import beside this torch"
        for name, entry in ENTRIES.items()
        if str((entry.config.get("text_config") or {}).get("model_type", "")).startswith("qwen3_5")
    },
}
# transformers has no config class for Nemotron NAS; vLLM cannot inspect its Qwen3.5 classes (torchvision)
CONFIG_UNREADABLE = {"nvidia/Llama-3_3-Nemotron-Super-49B-v1"} | {
    name for name, reason in UNBUILDABLE.items() if "torchvision" in reason
}
LAYER = re.compile(r"layers\.(\d+)\.")


@pytest.fixture(scope="module", autouse=True)
def quiet():
    warnings.simplefilter("ignore")


@pytest.mark.parametrize("model", [model for model in ENTRIES if model not in CONFIG_UNREADABLE])
def test_vllm_reads_the_same_layers_heads_and_windows(model, tiny_model, tmp_path):
    from vllm.config import ParallelConfig

    spec = catalog_spec(ENTRIES[model])
    config = engine_config(text_model_config(ENTRIES[model].config), tmp_path, tiny_model).model_config

    assert config.get_num_layers(ParallelConfig()) == spec.num_layers
    if not spec.has_state and len({layer.head_dim for layer in spec.attention_layers()}) == 1:
        assert config.get_head_size() == spec.head_dim
    for tp in (1, 2, 8):
        if spec.num_attention_heads % tp:
            continue
        expected = 1 if spec.is_mla else max(1, spec.attention_layers()[0].num_kv_heads // tp)
        assert config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp)) == expected
    assert config.use_mla == spec.is_mla
    assert (config.get_sliding_window() or None) == spec.sliding_window
    assert config.is_hybrid == spec.has_state
    assert (config.attention_chunk_size or None) == spec.attention_chunk


@pytest.mark.parametrize("model", [model for model in ENTRIES if model not in UNBUILDABLE])
def test_each_layer_caches_what_vllm_builds_for_it(model, tiny_model, tmp_path):
    """Per layer: the spec class, KV heads, head sizes, window or chunk, and the page bytes at block size 16; for
    state layers the conv and SSM shapes and dtypes; for hybrid models the aligned attention block size."""
    spec = catalog_spec(ENTRIES[model])
    vllm_config, vllm_specs = kv_cache_specs(ENTRIES[model].config, tmp_path, tiny_model, max_model_len=1024)
    theirs = defaultdict(list)
    for name, layer_spec in vllm_specs.items():
        theirs[int(LAYER.search(name).group(1))].append(layer_spec)
    ours = defaultdict(list)
    for index, layer in spec.caches():
        ours[index].append(layer)
    assert sorted(theirs) == sorted(ours)
    options = LayoutOptions(device="cpu", block_size_given=False, cpu_avx512_bf16=has_avx512_bf16())
    block = aligned_block_size(spec, KV_DTYPES["bf16"], 1, 128, options)
    for index, layers in ours.items():
        assert len(theirs[index]) == len(layers), index
        for layer, their_spec in zip(sorted(layers, key=_order), sorted(theirs[index], key=_their_order), strict=True):
            check_layer(spec, layer, their_spec, block, options)
    if spec.has_state:
        assert vllm_config.cache_config.block_size == block


def _order(layer) -> int:
    return layer.kind == "indexer"


def _their_order(spec) -> int:
    return str(getattr(spec, "cache_role", "")).endswith("INDEXER")


def check_layer(spec, layer, theirs, block, options) -> None:
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    if layer.kind == "mamba":
        assert isinstance(theirs, MambaSpec)
        assert [tuple(shape) for shape in theirs.shapes] == [layer.conv_shape(1), layer.ssm_shape(1)]
        conv, ssm = state_dtypes(spec, layer, options)
        assert [dtype.itemsize for dtype in theirs.dtypes] == [conv, ssm]
        assert theirs.page_size_bytes == block * spec.attention_layers()[0].bytes_per_token(KV_DTYPES["bf16"], 1)
        return
    expected = {
        "full": FullAttentionSpec,
        "sliding": SlidingWindowSpec,
        "chunked": ChunkedLocalAttentionSpec,
        "mla": MLAAttentionSpec,
        "indexer": MLAAttentionSpec,
    }[layer.kind]
    assert type(theirs) is expected, theirs
    assert (theirs.num_kv_heads, theirs.head_size) == (layer.heads_per_gpu(1), layer.head_dim)
    if layer.kind in ("full", "sliding", "chunked"):
        assert theirs.head_size_v == layer.value_dim
    assert getattr(theirs, "sliding_window", None) == getattr(layer, "window", None)
    assert getattr(theirs, "attention_chunk_size", None) == getattr(layer, "chunk", None)
    assert replace(theirs, block_size=16).page_size_bytes == 16 * layer.bytes_per_token(KV_DTYPES["bf16"], 1)
