"""Parameter counts from the config's architecture against the published counts in the catalog."""

import pytest

from kvops.model.catalog import catalog
from kvops.model.locate import catalog_spec

# Published totals that hold what the count does not: FP8 block scales (DeepSeek-V3: its F32 tensors are 41,540,496
# scale values and 15,104 routing biases; the R1 figure of the same architecture is the count exactly); an
# unexplained 13,880,064 above MiniMax-M2/M2.1/M2.7 of the same shape (MiniMax-M2.5); the vision encoder, absent
# from the trimmed copy (Llama-4-Scout, 871,932,416); a figure rounded to 26B, with vision and audio towers not
# counted (Gemma-4-26B-A4B); 35,651,584 above the count, the source flags the figure as possibly copied from the
# BF16 repository (Nemotron-3-Super).
BEYOND_THE_COUNT = {
    "deepseek-ai/DeepSeek-V3": 1e-4,
    "MiniMaxAI/MiniMax-M2.5": 1e-4,
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": 0.01,
    "google/gemma-4-26B-A4B": 0.06,
}
ABOVE_THE_FIGURE = {"nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8": 5e-4}
PUBLISHED = [entry for entry in catalog() if entry.parameters]


@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda entry: entry.id)
def test_counted_parameters_match_published(entry):
    counted = counts(entry)
    tolerance = BEYOND_THE_COUNT.get(entry.id) or ABOVE_THE_FIGURE.get(entry.id, 1e-6)
    assert abs(counted - entry.parameters) / entry.parameters <= tolerance
    assert counted <= entry.parameters or entry.id in ABOVE_THE_FIGURE


def counts(entry) -> int:
    """What the count from the entry's config says its published figure should be."""
    return entry.published.expected(catalog_spec(entry).count)


def test_most_catalog_entries_have_a_published_count():
    assert len(PUBLISHED) >= 0.8 * len(catalog())


@pytest.mark.parametrize("entry", catalog(), ids=lambda entry: entry.id)
def test_every_entry_names_its_sources(entry):
    assert entry.config_source and entry.parameters_source


def test_what_the_engine_does_not_load_is_left_out():
    """MTP layers and a stored copy of tied embeddings are in the published total, not in the loaded weights."""
    by_id = {entry.id: entry for entry in catalog()}
    r1 = by_id["deepseek-ai/DeepSeek-R1"]
    spec = catalog_spec(r1)
    assert spec.mtp_parameters > 10**10
    assert spec.parameters == r1.parameters - spec.mtp_parameters
    small = by_id["Qwen/Qwen3-0.6B"]
    spec = catalog_spec(small)
    assert spec.parameters == small.parameters - spec.vocab_size * spec.hidden_size


def _count(config: dict) -> int:
    from kvops.model.config import spec_from_config

    return spec_from_config(config, name="tiny", source="catalog", where="tiny").count.checkpoint


def test_phi_counts_its_biases_plain_mlp_and_one_layernorm_per_block():
    """Phi (PhiForCausalLM): q/k/v and dense with biases, fc1/fc2 with biases (no gate), one LayerNorm with bias
    per block (attention and MLP in parallel), a final LayerNorm and an untied head with a bias."""
    hidden, inter, vocab, layers = 8, 32, 50, 2
    config = {
        "architectures": ["PhiForCausalLM"],
        "model_type": "phi",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": layers,
        "partial_rotary_factor": 0.4,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
    }
    attention = 4 * (hidden * hidden + hidden)
    mlp = hidden * inter + inter + inter * hidden + hidden
    block = attention + mlp + 2 * hidden
    assert _count(config) == vocab * hidden + layers * block + 2 * hidden + (vocab * hidden + vocab)


def test_qwen2_moe_counts_its_qkv_biases():
    """Qwen2-MoE's q/k/v projections carry biases, as Qwen2's do, though its config has no attention_bias."""
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": 8,
        "intermediate_size": 16,
        "moe_intermediate_size": 4,
        "shared_expert_intermediate_size": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "tie_word_embeddings": False,
        "vocab_size": 50,
    }
    hidden, heads, kv_heads, head_dim, layers, vocab = 8, 2, 1, 4, 2, 50
    attention = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim
    qkv_bias = heads * head_dim + 2 * kv_heads * head_dim
    moe = 4 * 3 * hidden * 4 + hidden * 4 + (3 * hidden * 16 + hidden)  # experts, router, shared expert and its gate
    block = attention + qkv_bias + moe + 2 * hidden
    assert _count(config) == 2 * vocab * hidden + layers * block + hidden


def _vision(config: dict) -> int:
    from kvops.model.config import spec_from_config

    return spec_from_config(config, name="tiny", source="catalog", where="tiny").count.vision


def test_moonvit_counts_its_tower_and_kimi_vl_projector():
    """MoonViT (Kimi-VL): biased patch convolution, init_pos_emb_height x width learned positions, blocks of biased
    wqkv / wo / fc0 / fc1 and two LayerNorms, a final LayerNorm; the projector a LayerNorm and two biased layers
    from merge_kernel_size patches to the text width. Its patches per token are the merge kernel's."""
    from kvops.model.config import spec_from_config

    text = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    text |= {"num_hidden_layers": 1, "vocab_size": 10}
    vision = {"model_type": "moonvit", "hidden_size": 8, "intermediate_size": 12, "patch_size": 2}
    vision |= {"init_pos_emb_height": 3, "init_pos_emb_width": 4, "num_hidden_layers": 2, "merge_kernel_size": [2, 2]}
    config = {"model_type": "kimi_vl", "text_config": text, "vision_config": vision}
    w, i, t = 8, 12, 16
    block = 2 * 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + (w * i + i) + (i * w + w)
    tower = 3 * 2 * 2 * w + w + 3 * 4 * w + 2 * block + 2 * w
    projector = 2 * w + (4 * w * 4 * w + 4 * w) + (4 * w * t + t)
    assert _vision(config) == tower + projector
    spec = spec_from_config(config, name="tiny", source="catalog", where="tiny")
    assert spec.encoder is not None and spec.encoder.patches_per_token == 4


def test_siglip_counts_the_pooling_head_and_llava_next_projector():
    """A SigLIP tower without vision_use_head builds its attention-pooling head (Gemma 3 sets it false); LLaVA-NeXT
    projects the concatenated vision_feature_layer outputs through two biased layers and adds image_newline."""
    text = {"model_type": "granite", "hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2}
    text |= {"num_hidden_layers": 1, "vocab_size": 10}
    vision = {"model_type": "siglip_vision_model", "hidden_size": 8, "intermediate_size": 12, "patch_size": 2}
    vision |= {"image_size": 4, "num_hidden_layers": 1}
    w, i, t = 8, 12, 16
    layer = 2 * 2 * w + 4 * (w * w + w) + (w * i + i) + (i * w + w)
    tower = 3 * 2 * 2 * w + w + 4 * w + layer + 2 * w
    head = w + (3 * w * w + 3 * w) + (w * w + w) + 2 * w + (w * i + i) + (i * w + w)
    gemma = {"model_type": "gemma3", "text_config": text, "vision_config": {**vision, "vision_use_head": False}}
    assert _vision(gemma) == tower + w * t + w
    llava = {"model_type": "llava_next", "vision_feature_layer": [-2, -1], "text_config": text, "vision_config": vision}
    assert _vision(llava) == tower + head + (2 * w * t + t) + (t * t + t) + t
