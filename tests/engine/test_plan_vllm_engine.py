"""`kvops plan --engine vllm` against the real engine (vLLM 0.32.0 CPU build): the predicted `num_gpu_blocks` and
`kv_cache_size_tokens` are exactly what `vllm:cache_config_info` reports, and the emitted command starts the engine.

Three shapes: the stock test model (the session engine), an all-sliding-window Mistral shape with an fp8 cache, and a
hybrid llama shape (sliding and full layers in separate KV cache groups, one padding layer, MQA, head_dim 256). The
`vllm` console script does not work here, so the emitted argv runs with `python -m vllm.entrypoints.openai.api_server`
in place of `vllm serve`; every flag is the plan's, plus dummy weights, host and port.
"""

from __future__ import annotations

import pytest

from kvops.cpu_features import has_amx_tiles, has_avx512
from tests.support.planned_server import PlannedServer, plan_json, reported
from tests.support.tiny_model import TINY_LLAMA, build_model

pytestmark = pytest.mark.vllm

MISTRAL_SLIDING = dict(
    TINY_LLAMA,
    architectures=["MistralForCausalLM"],
    model_type="mistral",
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=128,
    sliding_window=256,
    max_position_embeddings=4096,
)
LLAMA_HYBRID = dict(
    TINY_LLAMA,
    hidden_size=512,
    num_hidden_layers=5,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=256,
    sliding_window=256,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention"],
    max_position_embeddings=4096,
)


def assert_exact(plan: dict, labels: dict[str, str]) -> None:
    assert int(labels["num_gpu_blocks"]) == plan["capacity"]["num_blocks"]
    assert int(labels["kv_cache_size_tokens"]) == plan["capacity"]["kv_cache_size_tokens"]
    assert float(labels["kv_cache_max_concurrency"]) == pytest.approx(plan["capacity"]["max_concurrency"], abs=1e-4)
    assert int(labels["block_size"]) == plan["capacity"]["block_size"] == 128


def test_stock_model_matches_the_session_engine(vllm_engine, tiny_model, run_kvops):
    plan = plan_json(
        run_kvops, "--model", str(tiny_model), "--kv-cache-memory-bytes", "4194304", "--max-model-len", "1024"
    )
    assert plan["capacity"]["num_blocks"] == 32 and plan["capacity"]["kv_cache_size_tokens"] == 4096
    assert_exact(plan, reported(vllm_engine))


@pytest.fixture(scope="module")
def sliding_shape(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("models") / "mistral-sliding", MISTRAL_SLIDING)


@pytest.fixture(scope="module")
def hybrid_shape(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("models") / "llama-hybrid", LLAMA_HYBRID)


def test_all_sliding_fp8_shape_starts_from_the_emitted_command_and_matches(sliding_shape, run_kvops, tmp_path):
    # 3 layers x 4 KV heads x head_dim 128, fp8: 393,216 B per block; 7 MiB + 12,345 B -> 18 blocks.
    # Every layer slides (window 256): a request holds cdiv(min(255 + 256 in flight, 2048), 128) + 1 = 5 blocks.
    plan = plan_json(
        run_kvops,
        "--model",
        str(sliding_shape),
        "--kv-cache-memory-bytes",
        str(7 * 2**20 + 12345),
        "--max-model-len",
        "2048",
        "--max-num-batched-tokens",
        "256",
        "--kv-dtype",
        "fp8",
    )
    assert plan["flags"]["kv-cache-dtype"] == "fp8"
    assert (
        plan["capacity"]["num_blocks"],
        plan["capacity"]["blocks_per_request_at_max_model_len"],
        plan["capacity"]["kv_cache_size_tokens"],
    ) == (18, 5, 7372)
    refused = any("neither AVX-512 nor AMX tiles" in warning for warning in plan["warnings"])
    if not (has_avx512() or has_amx_tiles()):
        # vLLM's CPU attention refuses an fp8 cache here (cpu_attn.py _get_attn_isa): the plan says so
        assert refused
        pytest.skip("this host has neither AVX-512 nor AMX tiles: vLLM's CPU build refuses an fp8 KV cache")
    assert not refused
    with PlannedServer(plan["command"]["argv"], tmp_path / "sliding.log") as server:
        assert_exact(plan, reported(server))


def test_hybrid_shape_groups_layers_like_vllm_and_matches(hybrid_shape, run_kvops, tmp_path):
    # 3 sliding + 2 full layers, MQA, head_dim 256: groups of 2 (one padding slot), 262,144 B per block;
    # a request at 2048 tokens holds 16 (full) + 2 x 5 (two sliding groups) = 26 blocks; 9 MiB + 999 B -> 36 blocks.
    plan = plan_json(
        run_kvops,
        "--model",
        str(hybrid_shape),
        "--kv-cache-memory-bytes",
        str(9 * 2**20 + 999),
        "--max-model-len",
        "2048",
        "--max-num-batched-tokens",
        "256",
    )
    cap = plan["capacity"]
    assert (
        cap["kv_cache_groups"],
        cap["bytes_per_block"],
        cap["blocks_per_request_at_max_model_len"],
        cap["num_blocks"],
    ) == (3, 262144, 26, 36)
    assert cap["kv_cache_size_tokens"] == int(36 / 26 * 2048) == 2835
    with PlannedServer(plan["command"]["argv"], tmp_path / "hybrid.log") as server:
        assert_exact(plan, reported(server))
        log = server.log_text()
    assert "Add 1 padding layers" in log  # vLLM's own word for the padding kvops predicted
