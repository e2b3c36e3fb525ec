"""config.json -> ModelSpec on the shapes calculators commonly get wrong, with synthetic configs."""

import pytest

from kvops.errors import ConfigError
from kvops.model.config import spec_from_config
from kvops.model.spec import FullAttention, MultiLatentAttention, SlidingWindow

BASE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "hidden_size": 512,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}


def spec(**fields):
    return spec_from_config({**BASE, **fields}, name="test", source="path", where="test/config.json")


def test_missing_kv_heads_is_multi_head():
    model = spec()
    assert model.num_kv_heads == 8 and model.head_dim == 64
    assert any("multi-head" in note for note in model.notes)


def test_explicit_head_dim_wins_over_hidden_over_heads():
    assert spec(head_dim=128, num_key_value_heads=2).layers[0] == FullAttention(2, 128)


def test_text_config_is_read():
    wrapper = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "text_config": {**BASE, "num_key_value_heads": 4},
    }
    model = spec_from_config(wrapper, name="t", source="path", where="w")
    assert model.num_layers == 4 and model.num_kv_heads == 4


@pytest.mark.parametrize("fields", [{"sliding_window": 4096, "use_sliding_window": False}, {"sliding_window": None}])
def test_window_that_does_not_apply(fields):
    assert all(layer.kind == "full" for layer in spec(**fields).layers)


def test_window_on_every_layer():
    assert spec(sliding_window=4096).layers == (SlidingWindow(8, 64, window=4096),) * 4


def test_layer_types_interleave():
    model = spec(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2)
    assert [layer.kind for layer in model.layers] == ["sliding", "full", "sliding", "full"]


def test_gemma3_pattern_every_sixth_layer_is_full():
    model = spec(num_hidden_layers=12, sliding_window=1024, sliding_window_pattern=6)
    assert [i for i, layer in enumerate(model.layers) if layer.kind == "full"] == [5, 11]


def test_gemma2_without_layer_types_alternates_from_a_sliding_layer():
    model = spec(model_type="gemma2", sliding_window=4096)
    assert [layer.kind for layer in model.layers] == ["sliding", "full", "sliding", "full"]


def test_qwen2_max_window_layers():
    model = spec(sliding_window=32, use_sliding_window=True, max_window_layers=2)
    assert [layer.kind for layer in model.layers] == ["full", "full", "sliding", "sliding"]


def test_mla_latent():
    model = spec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    assert model.layers == (MultiLatentAttention(512, 64, 128, 128),) * 4 and model.head_dim == 576


def test_float32_checkpoint_is_served_in_bf16():
    assert spec(torch_dtype="float32").dtype == "bf16"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_hidden_layers": None}, "missing 'num_hidden_layers'"),
        ({"num_attention_heads": 0}, "'num_attention_heads' is 0"),
        ({"num_key_value_heads": "eight"}, "'num_key_value_heads' is 'eight'"),
        ({"sliding_window": None, "layer_types": ["sliding_attention"] * 4}, "missing 'sliding_window'"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types lists 3 layers"),
        ({"hidden_size": 500}, "not divisible"),
    ],
)
def test_bad_configs_name_the_field_and_the_file(fields, message):
    with pytest.raises(ConfigError) as caught:
        spec(**fields)
    assert message in str(caught.value) and "test/config.json" in str(caught.value)
