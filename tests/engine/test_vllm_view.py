"""kvops' reading of each catalog config against vLLM's own: its ModelConfig, and the KV-cache spec of every
layer of the model vLLM builds for it (on the meta device: no weights, no memory; tests/support/vllm_specs.py).

Needs the vLLM CPU build; nothing is downloaded (the config is written to a temporary folder, the tokenizer is
the locally built test one and is not initialised). Multimodal wrappers are compared through their language
model's own CausalLM class (the wrappers need torchvision, which does not import beside this torch build).
"""

from __future__ import annotations

import re
import warnings

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.model.catalog import catalog
from kvops.model.locate import catalog_spec
from tests.support.vllm_specs import engine_config, kv_cache_specs, text_model_config

pytestmark = pytest.mark.vllm

ENTRIES = {entry.id: entry for entry in catalog()}
# Models the vLLM CPU build cannot instantiate, and why; their layers are checked against ModelConfig only.
UNBUILDABLE: dict[str, str] = {}
LAYER = re.compile(r"layers\.(\d+)\.")


@pytest.fixture(scope="module", autouse=True)
def quiet():
    warnings.simplefilter("ignore")


@pytest.mark.parametrize("model", list(ENTRIES))
def test_vllm_reads_the_same_layers_heads_and_windows(model, tiny_model, tmp_path):
    from vllm.config import ParallelConfig

    spec = catalog_spec(ENTRIES[model])
    config = engine_config(text_model_config(ENTRIES[model].config), tmp_path, tiny_model).model_config

    assert config.get_num_layers(ParallelConfig()) == spec.num_layers
    assert config.get_head_size() == spec.head_dim
    for tp in (1, 2, 8):
        if spec.num_attention_heads % tp:
            continue
        expected = 1 if spec.is_mla else max(1, spec.num_kv_heads // tp)
        assert config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp)) == expected
    assert config.use_mla == spec.is_mla
    assert (config.get_sliding_window() or None) == spec.sliding_window


@pytest.mark.parametrize("model", [model for model in ENTRIES if model not in UNBUILDABLE])
def test_each_layer_caches_what_vllm_builds_for_it(model, tiny_model, tmp_path):
    """Per layer: the spec class, KV heads, head size, window, and the page bytes at block size 16."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    spec = catalog_spec(ENTRIES[model])
    _, vllm_specs = kv_cache_specs(ENTRIES[model].config, tmp_path, tiny_model, max_model_len=1024)
    by_layer = {int(LAYER.search(name).group(1)): layer_spec for name, layer_spec in vllm_specs.items()}
    assert sorted(by_layer) == list(range(spec.num_layers))
    expected_class = {"full": FullAttentionSpec, "sliding": SlidingWindowSpec, "mla": MLAAttentionSpec}
    for index, layer in enumerate(spec.layers):
        theirs = by_layer[index]
        assert type(theirs) is expected_class[layer.kind], (index, theirs)
        assert (theirs.num_kv_heads, theirs.head_size) == (layer.heads_per_gpu(1), layer.head_dim), index
        assert getattr(theirs, "sliding_window", None) == getattr(layer, "window", None), index
        from dataclasses import replace

        assert replace(theirs, block_size=16).page_size_bytes == 16 * layer.bytes_per_token(KV_DTYPES["bf16"], 1)
