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
