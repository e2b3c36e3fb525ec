"""The LoRA slots vLLM allocates at load (--enable-lora), counted from the model's shapes; the engine test
(tests/engine/test_lora_engine.py) holds the count to the tensors vLLM's own CPU build allocates."""

from __future__ import annotations

import pytest

from kvops.engines.vllm.lora import lora_bytes
from kvops.errors import UsageError
from kvops.model import load_model
from kvops.plan import LoraSlots

# Llama-3.1-8B, one slot at rank 16, tp 1, per decoder layer (hidden 4,096, intermediate 14,336, 32 query heads and
# 8 KV heads of 128): q/k/v A 3 x 16 x 4,096 + B 16 x (4,096 + 2 x 1,024) = 294,912; o A 16 x 4,096 + B 4,096 x 16
# = 131,072; gate/up A 2 x 16 x 4,096 + B 2 x 14,336 x 16 = 589,824; down A 16 x 14,336 + B 4,096 x 16 = 294,912:
# 1,310,720 a layer, x 32 layers; embed_tokens and lm_head 16 x (128,256 + 4,096) each.
LLAMA_8B_LAYER = 1_310_720
LLAMA_8B_EMBEDDING = 16 * (128_256 + 4_096)


def test_llama_8b_one_slot_counts_every_projection_and_both_embeddings():
    counted = lora_bytes(load_model("llama-3.1-8b"), LoraSlots(), tp=1, pp=1, width=2)
    assert counted is not None
    assert counted.bytes == 2 * (32 * LLAMA_8B_LAYER + 2 * LLAMA_8B_EMBEDDING) == 92_356_608
    assert "1 LoRA slot at rank 16" in counted.formula and "embed_tokens and lm_head" in counted.formula


def test_slots_and_rank_scale_it_linearly():
    spec = load_model("llama-3.1-8b")
    one = lora_bytes(spec, LoraSlots(), 1, 1, 2)
    four = lora_bytes(spec, LoraSlots(max_loras=4, max_rank=64), 1, 1, 2)
    assert one is not None and four is not None and four.bytes == 16 * one.bytes


def test_tensor_parallel_splits_the_outputs_of_column_layers_and_the_inputs_of_row_layers():
    """At tp 2: q/k/v B 16 x (2,048 + 2 x 512), o A 16 x 2,048, gate/up B 2 x 7,168 x 16, down A 16 x 7,168; the A
    matrices of column layers and the B matrices of row layers stay whole, as do the embeddings'."""
    layer = 3 * 16 * 4096 + 16 * (2048 + 2 * 512) + 16 * 2048 + 4096 * 16 + 2 * 16 * 4096 + 2 * 16 * 7168
    layer += 16 * 7168 + 4096 * 16
    counted = lora_bytes(load_model("llama-3.1-8b"), LoraSlots(), tp=2, pp=1, width=2)
    assert counted is not None and counted.bytes == 2 * (32 * layer + 2 * LLAMA_8B_EMBEDDING)


def test_fully_sharded_splits_the_column_rank_and_the_row_outputs_too():
    layer = 3 * 8 * 4096 + 16 * (2048 + 2 * 512) + 16 * 2048 + 2048 * 16 + 2 * 8 * 4096 + 2 * 16 * 7168
    layer += 16 * 7168 + 2048 * 16
    counted = lora_bytes(load_model("llama-3.1-8b"), LoraSlots(fully_sharded=True), tp=2, pp=1, width=2)
    assert counted is not None and counted.bytes == 2 * (32 * layer + 2 * LLAMA_8B_EMBEDDING)


def test_kv_heads_fewer_than_tp_are_replicated_one_per_gpu():
    """QKVParallelLinear keeps one KV head per GPU when tp exceeds the KV heads: Llama-3.1-8B's 8 at tp 16 give
    each GPU 2 query heads and 1 KV head (of 128) and 896 of the intermediate size."""
    layer = 3 * 16 * 4096 + 16 * (256 + 2 * 128) + 16 * 256 + 4096 * 16 + 2 * 16 * 4096 + 2 * 16 * 896
    layer += 16 * 896 + 4096 * 16
    counted = lora_bytes(load_model("llama-3.1-8b"), LoraSlots(), tp=16, pp=1, width=2)
    assert counted is not None and counted.bytes == 2 * (32 * layer + 2 * LLAMA_8B_EMBEDDING)


def test_pipeline_stages_hold_their_layers_and_the_busiest_is_planned():
    spec = load_model("llama-3.1-8b")
    staged = lora_bytes(spec, LoraSlots(), tp=1, pp=2, width=2)
    assert staged is not None
    assert staged.bytes == 2 * (16 * LLAMA_8B_LAYER + LLAMA_8B_EMBEDDING) and staged.formula.startswith("stage ")


def test_qwen2_lists_no_embedding_modules_so_its_embeddings_get_no_slots():
    counted = lora_bytes(load_model("Qwen/Qwen2.5-7B-Instruct"), LoraSlots(), 1, 1, 2)
    assert counted is not None and "embed_tokens" not in counted.formula


def test_mixtral_counts_the_router_and_every_experts_w1_w3_and_w2():
    """Mixtral-8x7B, one slot at rank 16, tp 1, per layer: q/k/v and o as Llama's (294,912 + 131,072); the router
    A 16 x 4,096 + B 8 x 16; each of the 8 experts w1 and w3 A 16 x 4,096 + B 14,336 x 16, w2 A 16 x 14,336 + B
    4,096 x 16; two int32 adapter flags (slots + 1) a layer."""
    layer = 294_912 + 131_072 + (16 * 4096 + 8 * 16) + 2 * 8 * (16 * 4096 + 14336 * 16) + 8 * (16 * 14336 + 4096 * 16)
    counted = lora_bytes(load_model("mixtral-8x7b"), LoraSlots(), tp=1, pp=1, width=2)
    assert counted is not None and "router and routed experts" in counted.formula
    assert counted.bytes == 32 * (2 * layer + 2 * 4) + 2 * 2 * 16 * (32_000 + 4_096)


def test_expert_parallel_is_not_laid_out():
    assert lora_bytes(load_model("mixtral-8x7b"), LoraSlots(), 2, 1, 2, expert_parallel=True) is None


@pytest.mark.parametrize("model", ["deepseek-v2-lite", "deepseek-r1"])
def test_layouts_kvops_does_not_lay_out_are_none_so_the_plan_says_so(model):
    assert lora_bytes(load_model(model), LoraSlots(), 1, 1, 2) is None


@pytest.mark.parametrize(
    ("slots", "tp", "message"),
    [
        (LoraSlots(max_rank=12), 1, "--max-lora-rank 12; valid: 1, 8, 16, 32, 64, 128, 256, 320, 512"),
        (LoraSlots(dtype="float32"), 1, "--lora-dtype 'float32'; valid: auto, float16, bfloat16"),
        (LoraSlots(max_rank=8, fully_sharded=True), 16, "does not divide it"),
    ],
)
def test_what_vllm_refuses_is_one_line(slots, tp, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lora_bytes(load_model("llama-3.1-8b"), slots, tp, 1, 2)
