"""Weights from the checkpoint's own bytes: safetensors headers written by the test (the real format), read back per
dtype exactly, and what one GPU loads of them (serving dtype, left-out parts, tp, expert ranks, pipeline stages)."""

from __future__ import annotations

import json

import pytest

from kvops.errors import ConfigError
from kvops.model import load_model
from kvops.model.checkpoint import (
    Checkpoint,
    Loading,
    Parallel,
    loaded_weights,
    parse_header,
    pipeline_partition,
    read_local,
    stage_of_layer,
)
from tests.support.safetensors_files import safetensors_bytes, tensor_bytes, write_sharded

# gpt-oss's MXFP4 layout: U8 blocks and scales for the experts, BF16 for attention, router and embeddings
MXFP4 = [
    {
        "model.embed_tokens.weight": ("BF16", (1000, 64)),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", (64, 64)),
        "model.layers.0.mlp.router.weight": ("BF16", (4, 64)),
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", (4, 256, 2, 16)),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", (4, 256, 2)),
        "model.layers.0.input_layernorm.weight": ("BF16", (64,)),
    },
    {
        "model.layers.1.mlp.experts.down_proj_blocks": ("U8", (4, 64, 4, 16)),
        "model.layers.1.mlp.experts.down_proj_scales": ("U8", (4, 64, 4)),
        "model.norm.weight": ("BF16", (64,)),
        "lm_head.weight": ("BF16", (1000, 64)),
    },
]
# DeepSeek-V3's FP8 layout: F8_E4M3 weights with F32 block scales (weight_scale_inv), BF16 norms and embeddings
FP8 = [
    {
        "model.embed_tokens.weight": ("BF16", (1000, 64)),
        "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", (128, 64)),
        "model.layers.0.self_attn.q_proj.weight_scale_inv": ("F32", (1, 1)),
        "model.layers.0.mlp.down_proj.weight": ("F8_E4M3", (64, 256)),
        "model.layers.0.mlp.down_proj.weight_scale_inv": ("F32", (1, 2)),
        "model.layers.0.post_attention_layernorm.weight": ("BF16", (64,)),
        "model.norm.weight": ("BF16", (64,)),
        "lm_head.weight": ("BF16", (1000, 64)),
    }
]


def expected_by_dtype(shards) -> dict[str, int]:
    totals: dict[str, int] = {}
    for shard in shards:
        for dtype, shape in shard.values():
            totals[dtype] = totals.get(dtype, 0) + tensor_bytes(dtype, shape)
    return dict(sorted(totals.items()))


@pytest.mark.parametrize("shards", [MXFP4, FP8], ids=["mxfp4", "fp8"])
def test_headers_give_the_stored_bytes_per_dtype_exactly(tmp_path, shards):
    files = write_sharded(tmp_path, shards)
    checkpoint = read_local(tmp_path)
    assert checkpoint is not None and checkpoint.files == len(shards)
    assert checkpoint.bytes_by_dtype() == expected_by_dtype(shards)
    index = json.loads(files["model.safetensors.index.json"])
    assert checkpoint.stored_bytes == index["metadata"]["total_size"] == checkpoint.total_size


def test_a_single_file_checkpoint_and_a_folder_without_one(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(FP8[0]))
    assert read_local(tmp_path).bytes_by_dtype() == expected_by_dtype(FP8)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_local(empty) is None


def test_a_broken_header_is_one_line():
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_header(b"{nope", "shard.safetensors")
    with pytest.raises(ConfigError, match="'w' has no dtype"):
        parse_header(json.dumps({"w": {"shape": [1]}}).encode(), "shard.safetensors")


def test_float_weights_take_the_serving_dtype_and_quantized_ones_keep_their_bytes():
    checkpoint = Checkpoint.from_dict(
        {
            "source": "test",
            "tensors": [
                ["model.layers.0.mlp.up_proj.weight", "F32", [8, 8], 256],
                ["model.layers.0.mlp.down_proj.weight", "F8_E4M3", [8, 8], 64],
                ["model.layers.0.mlp.down_proj.weight_scale_inv", "F32", [1, 1], 4],
            ],
        }
    )
    loaded = loaded_weights(checkpoint, Loading(serving_dtype="bf16", num_layers=1), Parallel())
    assert loaded.by_dtype == {"BF16": 128, "F32": 4, "F8_E4M3": 64}
    assert loaded.converted == {"F32": 256}


def test_what_the_engine_does_not_load_is_left_out_and_named():
    checkpoint = Checkpoint.from_dict(
        {
            "source": "test",
            "tensors": [
                ["model.embed_tokens.weight", "BF16", [100, 8], 1600],
                ["lm_head.weight", "BF16", [100, 8], 1600],
                ["model.layers.0.mlp.up_proj.weight", "BF16", [8, 8], 128],
                ["model.layers.1.mlp.up_proj.weight", "BF16", [8, 8], 128],  # beyond num_layers 1: an MTP layer
                ["mtp.layers.0.mlp.up_proj.weight", "BF16", [8, 8], 128],  # Qwen3.5's MTP naming
                ["model.vision_tower.blocks.0.weight", "BF16", [8, 8], 128],
            ],
        }
    )
    loading = Loading(serving_dtype="bf16", text_only=True, tie_word_embeddings=True, num_layers=1)
    loaded = loaded_weights(checkpoint, loading, Parallel())
    assert loaded.bytes == 1600 + 128
    assert sorted(loaded.left_out.values()) == [128, 256, 1600]
    with_mtp = loaded_weights(checkpoint, Loading(serving_dtype="bf16", load_mtp=True, num_layers=1), Parallel())
    assert with_mtp.bytes == 1600 * 2 + 128 * 4 and not with_mtp.left_out


def test_tensor_parallel_splits_all_but_norms_and_router_experts_split_over_their_ranks():
    checkpoint = Checkpoint.from_dict(
        {
            "source": "test",
            "tensors": [
                ["model.layers.0.input_layernorm.weight", "BF16", [64], 128],
                ["model.layers.0.mlp.gate.weight", "BF16", [8, 64], 1024],
                ["model.layers.0.self_attn.q_proj.weight", "BF16", [64, 64], 8192],
                ["model.layers.0.mlp.experts.0.up_proj.weight", "BF16", [64, 64], 8192],
                ["model.layers.0.mlp.shared_experts.up_proj.weight", "BF16", [64, 64], 8192],
            ],
        }
    )
    loading = Loading(serving_dtype="bf16", num_layers=1, num_experts=8)
    tp2 = loaded_weights(checkpoint, loading, Parallel(tp=2, expert_ranks=2))
    assert tp2.bytes == 128 + 1024 + 8192 // 2 + 8192 // 2 + 8192 // 2
    dp4 = loaded_weights(checkpoint, loading, Parallel(tp=2, expert_ranks=8))  # tp 2 x dp 4
    assert dp4.bytes == 128 + 1024 + 8192 // 2 + 8192 // 8 + 8192 // 2
    whole = loaded_weights(
        checkpoint, Loading(serving_dtype="bf16", num_layers=1, num_experts=6), Parallel(1, 1, 4, True)
    )
    assert whole.bytes == 128 + 1024 + 8192 + -(-8192 * 2 // 6) + 8192  # ceil(6 / 4) = 2 of 6 experts per rank


def test_kv_projections_are_replicated_beyond_the_kv_heads():
    checkpoint = Checkpoint.from_dict(
        {"source": "test", "tensors": [["model.layers.0.self_attn.k_proj.weight", "BF16", [128, 64], 16384]]}
    )
    loading = Loading(serving_dtype="bf16", num_layers=1, num_kv_heads=2)
    assert loaded_weights(checkpoint, loading, Parallel(tp=2)).bytes == 8192
    assert loaded_weights(checkpoint, loading, Parallel(tp=8)).bytes == 8192  # one KV head per rank


def test_pipeline_stages_follow_vllms_partition():
    assert pipeline_partition(61, 4) == [15, 15, 16, 15]  # the remainder before the last stage, counting back
    assert pipeline_partition(62, 4) == [15, 16, 16, 15]
    assert pipeline_partition(80, 8) == [10] * 8
    assert [stage_of_layer(layer, 61, 4) for layer in (0, 14, 15, 30, 46, 60, 61)] == [0, 0, 1, 2, 3, 3, 3]
    checkpoint = Checkpoint.from_dict(
        {
            "source": "test",
            "tensors": [
                ["model.embed_tokens.weight", "BF16", [100, 8], 1600],
                ["model.layers.0.mlp.up_proj.weight", "BF16", [8, 8], 128],
                ["model.layers.1.mlp.up_proj.weight", "BF16", [8, 8], 128],
                ["model.norm.weight", "BF16", [8], 16],
            ],
        }
    )
    tied = loaded_weights(
        checkpoint, Loading(serving_dtype="bf16", tie_word_embeddings=True, num_layers=2), Parallel(pp=2)
    )
    assert tied.stage_bytes == (1600 + 128, 128 + 16 + 1600)  # a tied LM head is a second copy on the last stage


def test_a_local_folder_plans_with_its_checkpoint_bytes(tmp_path, run_kvops):
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 64,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"],
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4"},
    }
    write_sharded(tmp_path, MXFP4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(str(tmp_path))
    assert spec.parameters_source == "checkpoint"
    plan = json.loads(run_kvops("plan", "-m", str(tmp_path), "--gpu", "h100", "--json").stdout)
    weights = next(term for term in plan["memory"]["terms"] if term["name"] == "weights")
    rotary = 4096 * 16 * 2  # vLLM's rotary cos/sin cache, counted with the weights: positions x head dim x 2 B
    assert weights["bytes"] == sum(expected_by_dtype(MXFP4).values()) + rotary
    assert "checkpoint's own bytes" in weights["formula"] and "U8" in weights["formula"]
