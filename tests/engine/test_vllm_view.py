"""kvops' reading of each catalog config against vLLM's own (vllm.config.ModelConfig from a local folder).

Needs the vLLM CPU build; nothing is downloaded (the config is written to a temporary folder, the tokenizer is
the locally built test one and is not initialised).
"""

from __future__ import annotations

import json
import warnings

import pytest

from kvops.model import load_model
from kvops.model.catalog import catalog

pytestmark = pytest.mark.vllm

IDS = [entry.id for entry in catalog()]


@pytest.fixture(scope="module")
def vllm_config_classes():
    warnings.simplefilter("ignore")
    from vllm.config import ModelConfig, ParallelConfig

    return ModelConfig, ParallelConfig


@pytest.mark.parametrize("model", IDS)
def test_vllm_reads_the_same_layers_heads_and_windows(model, vllm_config_classes, tiny_model, tmp_path, monkeypatch):
    ModelConfig, ParallelConfig = vllm_config_classes
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from kvops.model.catalog import find

    config = find(model).config
    if "text_config" in config:
        # The multimodal wrapper needs torchvision, which does not import beside this torch build:
        # compare the language model, which is what holds the KV cache.
        config = {
            **config["text_config"],
            "architectures": ["Gemma3ForCausalLM"],
            "torch_dtype": config.get("torch_dtype"),
        }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(model)
    config = ModelConfig(
        model=str(tmp_path),
        tokenizer=str(tiny_model),
        skip_tokenizer_init=True,
        dtype="bfloat16",
        trust_remote_code=False,
    )

    assert config.get_num_layers(ParallelConfig()) == spec.num_layers
    assert config.get_head_size() == spec.head_dim
    for tp in (1, 2, 8):
        if spec.num_attention_heads % tp:
            continue
        expected = 1 if spec.is_mla else max(1, spec.num_kv_heads // tp)
        assert config.get_num_kv_heads(ParallelConfig(tensor_parallel_size=tp)) == expected
    assert config.use_mla == spec.is_mla
    assert (config.get_sliding_window() or None) == spec.sliding_window

    layer_types = getattr(config.hf_text_config, "layer_types", None)
    if layer_types:
        kinds = ["sliding" if kind == "sliding_attention" else "full" for kind in layer_types]
        if not spec.is_mla:
            assert [layer.kind for layer in spec.layers] == kinds
