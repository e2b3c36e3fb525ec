"""The layer kinds beyond attention, on the real engine (vLLM 0.32.0 CPU build): a hybrid Mamba-2 + attention model
and a chunked-local-attention model, each started from the plan's own command; the predicted `num_gpu_blocks` and
`kv_cache_size_tokens` are what `vllm:cache_config_info` reports.

Both kinds run on this CPU build: its platform picks a CPU state backend for Mamba layers
(vllm/platforms/cpu.py `_cpu_mamba_backend`) and aligns the attention block size to the state page
(`_align_hybrid_block_size`); Llama-4's chunked layers get `ChunkedLocalAttentionSpec` on the CPU attention.
"""

from __future__ import annotations

import pytest

from tests.support.planned_server import PlannedServer, plan_json, reported
from tests.support.tiny_model import TINY_LLAMA, build_model

pytestmark = pytest.mark.vllm

# Granite-4.0-H's layer pattern, dense: 3 Mamba-2 layers (8 heads x 64, state 16, conv 4) and one NoPE attention layer
GRANITE_HYBRID = dict(
    TINY_LLAMA,
    architectures=["GraniteMoeHybridForCausalLM"],
    model_type="granitemoehybrid",
    num_hidden_layers=4,
    layer_types=["mamba", "attention", "mamba", "mamba"],
    mamba_n_heads=8,
    mamba_d_head=64,
    mamba_d_state=16,
    mamba_n_groups=1,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=256,
    mamba_conv_bias=True,
    mamba_proj_bias=False,
    num_local_experts=0,
    num_experts_per_tok=0,
    shared_intermediate_size=512,
    position_embedding_type="nope",
)
# Llama-4's text model: three chunked-local layers (attention_chunk_size 256) and one full (NoPE) layer
LLAMA4_CHUNKED = dict(
    TINY_LLAMA,
    architectures=["Llama4ForCausalLM"],
    model_type="llama4_text",
    num_hidden_layers=4,
    attention_chunk_size=256,
    no_rope_layers=[1, 1, 1, 0],
    interleave_moe_layer_step=5,  # no MoE layer: range(4, 4, 5)
    num_local_experts=0,
    intermediate_size_mlp=512,
    use_qk_norm=True,
    max_position_embeddings=4096,
)


def planned_and_reported(config: dict, name: str, run_kvops, tmp_path) -> tuple[dict, dict[str, str]]:
    model = build_model(tmp_path / name, config)
    plan = plan_json(
        run_kvops,
        "--model",
        str(model),
        "--kv-cache-memory-bytes",
        str(9 * 2**20 + 999),
        "--max-model-len",
        "2048",
        "--max-num-batched-tokens",
        "256",
    )
    with PlannedServer(plan["command"]["argv"], tmp_path / f"{name}.log") as server:
        return plan, reported(server)


def layout(plan: dict) -> str:
    return next(note for note in plan["notes"] if note.startswith("KV cache layout"))


def assert_blocks(plan: dict, labels: dict[str, str]) -> None:
    assert int(labels["num_gpu_blocks"]) == plan["capacity"]["num_blocks"]
    assert int(labels["kv_cache_size_tokens"]) == plan["capacity"]["kv_cache_size_tokens"]
    assert int(labels["block_size"]) == plan["capacity"]["block_size"]


def test_hybrid_mamba_model_blocks_equal_the_engines(run_kvops, tmp_path):
    plan, labels = planned_and_reported(GRANITE_HYBRID, "granite-hybrid", run_kvops, tmp_path)
    assert "(mamba x1, mamba x1, mamba x1, full x1)" in layout(plan)
    assert (plan["capacity"]["num_blocks"], plan["capacity"]["kv_cache_size_tokens"]) == (144, 11796)
    assert_blocks(plan, labels)


def test_chunked_attention_model_blocks_equal_the_engines(run_kvops, tmp_path):
    plan, labels = planned_and_reported(LLAMA4_CHUNKED, "llama4-chunked", run_kvops, tmp_path)
    assert "(chunked 256 x1, chunked 256 x1, chunked 256 x1, full x1)" in layout(plan)
    assert (plan["capacity"]["num_blocks"], plan["capacity"]["kv_cache_size_tokens"]) == (144, 10532)
    assert_blocks(plan, labels)
