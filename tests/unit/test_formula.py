"""The formula against the seed's worked examples and figures computed by hand for every catalog model."""

from __future__ import annotations

import json
from math import ceil

import pytest

from kvops.dtypes import KV_DTYPES
from kvops.formula import beam_search_estimate, kv_cost, tokens_per_sequence_fit
from kvops.model import load_model
from kvops.model.catalog import catalog

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
BF16 = KV_DTYPES["bf16"]


# --- the seed's worked examples, exactly -------------------------------------------------------------


@pytest.mark.parametrize("batch, tax", [(1, 128 * KIB), (4, 512 * KIB), (8, MIB)])
def test_seed_mistral_token_tax(batch, tax):
    cost = kv_cost(load_model("mistralai/Mistral-7B-v0.1"), tokens=1024, dtype=BF16, batch=batch)
    assert cost.token_tax_bytes == tax


@pytest.mark.parametrize(
    "tokens, windowed, unwindowed", [(1024, 128 * MIB, 128 * MIB), (4096, 512 * MIB, 512 * MIB), (8192, 512 * MIB, GIB)]
)
def test_seed_mistral_cache_with_and_without_window(tokens, windowed, unwindowed):
    mistral = load_model("mistral-7b-v0.1")
    assert kv_cost(mistral, tokens=tokens, dtype=BF16).total_bytes == windowed
    assert kv_cost(mistral, tokens=tokens, dtype=BF16, apply_windows=False).total_bytes == unwindowed


def test_seed_mistral_as_mha_at_4096_is_2_gib(tmp_path):
    from kvops.model.catalog import find

    config = dict(find("mistral-7b-v0.1").config, num_key_value_heads=32)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert kv_cost(load_model(str(tmp_path)), tokens=4096, dtype=BF16).total_bytes == 2 * GIB


def test_seed_llama2_7b_fp16_at_2048_is_1_gib():
    llama = load_model("meta-llama/Llama-2-7b-hf")
    assert llama.dtype == "fp16"
    assert kv_cost(llama, tokens=2048, dtype=KV_DTYPES[llama.dtype]).total_bytes == GIB


def test_seed_slip_17_8_gib_holds_145817_tokens_not_142():
    mistral = load_model("mistral-7b-v0.1")
    memory = int(17.8 * GIB)
    assert memory // kv_cost(mistral, tokens=1, dtype=BF16).bytes_per_token == 145817


# --- every catalog model, by hand --------------------------------------------------------------------
# (layers, kv_heads, head_dim, window or None, sliding layers) for attention models; ("mla", layers, latent) for MLA.
# Facts written from the models' published configs, independently of kvops' parser.
HAND = {
    "meta-llama/Llama-2-7b-hf": (32, 32, 128, None, 0),
    "meta-llama/Llama-2-70b-hf": (80, 8, 128, None, 0),
    "meta-llama/Meta-Llama-3-8B": (32, 8, 128, None, 0),
    "meta-llama/Llama-3.1-70B": (80, 8, 128, None, 0),
    "meta-llama/Llama-3.1-405B": (126, 8, 128, None, 0),
    "mistralai/Mistral-7B-v0.1": (32, 8, 128, 4096, 32),
    "mistralai/Mistral-7B-Instruct-v0.3": (32, 8, 128, None, 0),
    "mistralai/Mixtral-8x7B-v0.1": (32, 8, 128, None, 0),
    "Qwen/Qwen2.5-7B-Instruct": (28, 4, 128, None, 0),
    "Qwen/Qwen2.5-72B-Instruct": (80, 8, 128, None, 0),
    "Qwen/Qwen3-8B": (36, 8, 128, None, 0),
    "Qwen/Qwen3-30B-A3B": (48, 4, 128, None, 0),
    "microsoft/Phi-3-mini-4k-instruct": (32, 32, 96, 2047, 32),
    "google/gemma-2-9b": (42, 8, 256, 4096, 21),
    "google/gemma-3-12b-it": (48, 8, 256, 1024, 40),
    "openai/gpt-oss-20b": (24, 8, 64, 128, 12),
    "openai/gpt-oss-120b": (36, 8, 64, 128, 18),
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": (22, 4, 64, None, 0),
    "facebook/opt-125m": (12, 12, 64, None, 0),
    "deepseek-ai/DeepSeek-V2-Lite": ("mla", 27, 512 + 64),
    "deepseek-ai/DeepSeek-V3": ("mla", 61, 512 + 64),
}
# Attention heads, for the tp rule (heads must split evenly across ranks).
HEADS = {"Qwen/Qwen2.5-7B-Instruct": 28, "facebook/opt-125m": 12}


def hand_figures(model: str, tokens: int, batch: int, tp: int, value_bytes: float = 2) -> tuple[int, int]:
    """(bytes_per_token, total_bytes) per GPU, from the seed's formula and the HAND facts."""
    facts = HAND[model]
    if facts[0] == "mla":
        _, layers, latent = facts
        per_token = int(layers * latent * value_bytes)
        return per_token, batch * tokens * per_token
    layers, kv_heads, head_dim, window, sliding = facts
    per_layer = int(2 * max(1, kv_heads // tp) * head_dim * value_bytes)
    total = batch * per_layer * ((layers - sliding) * tokens + sliding * min(tokens, window or tokens))
    return layers * per_layer, total


def test_catalog_covers_the_issue_list():
    assert {entry.id for entry in catalog()} >= set(HAND)


@pytest.mark.parametrize("model", sorted(HAND))
@pytest.mark.parametrize("tp", [1, 8])
def test_kv_json_matches_hand_figures(model, tp, run_kvops):
    heads = HEADS.get(model)
    args = ["kv", "--model", model, "--tokens", "8192", "--batch", "3", "--tp", str(tp), "--kv-dtype", "bf16", "--json"]
    if heads and heads % tp:
        result = run_kvops(*args, expect=2)
        assert f"--tp {tp} does not fit" in result.stderr and result.stderr.count("\n") == 1
        return
    document = json.loads(run_kvops(*args).stdout)
    per_token, total = hand_figures(model, 8192, 3, tp)
    assert document["bytes_per_token"] == per_token
    assert document["token_tax_bytes"] == 3 * per_token
    assert document["total_bytes"] == total
    assert document["total_bytes_all_gpus"] == total * tp
    assert sum(group["layers"] for group in document["layer_groups"]) == (
        HAND[model][1] if HAND[model][0] == "mla" else HAND[model][0]
    )


@pytest.mark.parametrize("model", ["deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/DeepSeek-V3"])
def test_mla_is_one_latent_not_split_by_tp(model):
    spec = load_model(model)
    one, eight = (kv_cost(spec, tokens=1, dtype=BF16, tp=tp).bytes_per_token for tp in (1, 8))
    assert one == eight == spec.num_layers * 576 * 2


def test_heads_replicate_when_tp_exceeds_kv_heads():
    tiny = load_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")  # 4 KV heads
    assert [group.kv_heads for group in kv_cost(tiny, tokens=1, dtype=BF16, tp=8).groups] == [1]


@pytest.mark.parametrize(
    "dtype, data_bytes, scale_bytes",
    [("fp32", 4 * 128, 0), ("fp8", 128, 0), ("fp8_e5m2", 128, 0), ("int8", 128, 2 * 8 * 4), ("int4", 64, 2 * 8 * 4)],
)
def test_kv_dtypes_and_their_scales(dtype, data_bytes, scale_bytes):
    llama3 = load_model("llama-3-8b")  # 32 layers x 8 KV heads x 128
    cost = kv_cost(llama3, tokens=1, dtype=KV_DTYPES[dtype])
    assert cost.bytes_per_token == 32 * (8 * 2 * data_bytes + scale_bytes)
    assert cost.scale_bytes_per_token == 32 * scale_bytes


def test_block_rounding_per_layer_group():
    gemma = load_model("google/gemma-2-9b")  # 21 sliding (4096) + 21 full layers
    cost = kv_cost(gemma, tokens=5000, dtype=BF16, block_size=16)
    slots = {group.kind: group.token_slots for group in cost.groups}
    assert slots == {"sliding": 4096, "full": ceil(5000 / 16) * 16}
    per_layer = 2 * 8 * 256 * 2
    assert cost.total_bytes == 21 * per_layer * 4096 + 21 * per_layer * 5008


def test_beams_multiply_the_batch_and_the_estimate_stays_apart():
    llama = load_model("llama-3-8b")
    greedy = kv_cost(llama, tokens=1000, dtype=BF16, batch=8)
    beams = kv_cost(llama, tokens=1000, dtype=BF16, batch=2, beams=4)
    assert beams.total_bytes == greedy.total_bytes and beams.effective_batch == 8
    assert beam_search_estimate(beams.total_bytes, 4) == (
        round(greedy.total_bytes * 1.2),
        round(greedy.total_bytes * 1.3),
    )
    assert beam_search_estimate(greedy.total_bytes, 1) is None


def test_longest_sequence_that_fits():
    llama = load_model("llama-3-8b")  # 128 KiB per token
    assert tokens_per_sequence_fit(llama, GIB, dtype=BF16, batch=2) == 4096
    assert tokens_per_sequence_fit(llama, GIB - 1, dtype=BF16, batch=2) == 4095
    assert tokens_per_sequence_fit(llama, 100, dtype=BF16) == 0
    assert tokens_per_sequence_fit(load_model("mistral-7b-v0.1"), GIB, dtype=BF16) is None  # every layer slides
