"""KV figures where kvops differed from vLLM's own, replayed against the figure vLLM computes.

vLLM's figures come from its spec classes and `kv_cache_utils.get_kv_cache_configs` / `get_kv_cache_capacity` (the
0.32.0 CPU build, the model built on the meta device as a GPU engine holds it: tests/support/vllm_specs.py), for a
fixed --kv-cache-memory-bytes, --max-model-len 4096 and --max-num-batched-tokens 2048 (async scheduling: two
batches in flight).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from tests.support.paths import REPO

MODELS = REPO / "tests" / "fixtures" / "models"
FALCON_H1 = MODELS / "falcon-h1-7b-instruct"  # tiiuae/Falcon-H1-7B-Instruct's config.json, the fields sizing reads
MEMORY = 3 * 2**30 + 12345
POINT = ("--kv-cache-memory-bytes", str(MEMORY), "--max-model-len", "4096", "--max-num-batched-tokens", "2048")


def plan(run_kvops, model: Path | str, *args: str) -> dict:
    return json.loads(run_kvops("plan", "--model", str(model), "--json", *POINT, *args).stdout)["capacity"]


def test_falcon_h1_keeps_a_mamba2_state_beside_the_kv_of_every_layer(run_kvops):
    # vLLM's FalconH1DecoderLayer holds an attention layer and a MambaMixer2 (vllm/model_executor/models/falcon_h1.py,
    # 0.32.0): 44 FullAttentionSpec + 44 MambaSpec, pages unified at block 1568 (1,605,632 B), 45 blocks, 7.5
    # requests of 4096 tokens. kvops read attention only: block 16, 4468 blocks, 71,488 tokens, 17.45 requests.
    capacity = plan(run_kvops, FALCON_H1, "--engine-version", "0.32.0")  # the figures are 0.32.0's (16-token default)
    assert (capacity["num_blocks"], capacity["block_size"], capacity["kv_cache_groups"]) == (45, 1568, 2)
    assert (capacity["kv_cache_size_tokens"], capacity["max_concurrency"]) == (30720, 7.5)


def test_falcon_h1_state_per_sequence(run_kvops):
    # MambaStateShapeCalculator.mamba2_state_shape: conv (3, 3072 + 2 x 1 x 256), ssm (24, 128, 256), bf16
    kv = json.loads(run_kvops("kv", "--model", str(FALCON_H1), "--tokens", "8192", "--json").stdout)
    state = next(group for group in kv["layer_groups"] if group["kind"] == "mamba")
    assert state["layers"] == 44
    assert state["bytes_per_sequence"] == 44 * (3 * 3584 + 24 * 128 * 256) * 2


@pytest.mark.parametrize(
    ("name", "config", "why"),
    [
        # 70 lightning (linear) attention layers and 10 softmax ones; kvops had read 80 full layers (320 KiB a token)
        (
            "minimax-text-01",
            {
                "architectures": ["MiniMaxText01ForCausalLM"],
                "model_type": "minimax",
                "hidden_size": 6144,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "num_hidden_layers": 80,
                "attn_type_list": [int((i + 1) % 8 == 0) for i in range(80)],
                "vocab_size": 200064,
                "torch_dtype": "bfloat16",
            },
            "recurrent layers of 'minimax'",
        ),
    ],
)
def test_layers_kvops_does_not_model_are_one_line_not_figures(name, config, why, run_kvops, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    for command in (("kv", "--tokens", "4096"), ("plan", *POINT)):
        ran = run_kvops(command[0], "--model", str(tmp_path), *command[1:], expect=None)
        assert ran.exit_code != 0 and why in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


MPT = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32}


def test_an_architecture_vllm_removed_is_refused_in_one_line(run_kvops, tmp_path):
    # vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS (0.32.0-0.34.0): "MPTForCausalLM": "0.28.0";
    # the engine refuses it at startup ("was supported in vLLM until v0.28.0, and is not supported anymore")
    (tmp_path / "config.json").write_text(json.dumps({**MPT, "vocab_size": 50432, "torch_dtype": "bfloat16"}))
    ran = run_kvops("plan", "--model", str(tmp_path), *POINT, expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "refuses MPTForCausalLM" in ran.stderr and "--engine-version 0.28.0" in ran.stderr
    assert run_kvops("plan", "--model", str(tmp_path), *POINT, "--engine-version", "0.28.0", expect=None).stdout


@pytest.mark.vllm
def test_falcon_h1_pool_matches_vllm(tiny_model, tmp_path, monkeypatch):
    """The figures above from vLLM itself: its model built on the meta device, its pool arithmetic."""
    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm.layout import kv_layout, pool
    from kvops.model.locate import load_model
    from tests.support.vllm_specs import BuiltModel, vllm_pool

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    config = json.loads((FALCON_H1 / "config.json").read_text())
    built = BuiltModel(config, tmp_path / "model", tiny_model, max_model_len=4096, max_num_batched_tokens=2048)
    built.as_gpu(16)
    assert vllm_pool(built.vllm_config, built.specs(), MEMORY) == (45, 30720, 7.5)

    spec = load_model(str(FALCON_H1))
    ours = pool(kv_layout(spec, KV_DTYPES["bf16"], 1, 16), MEMORY, 4096, built.vllm_config.max_in_flight_tokens)
    assert (ours.num_blocks, ours.kv_cache_size_tokens) == (45, 30720)


QWEN2_PARTIAL_WINDOW = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 8,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 16384,
    "sliding_window": 4096,
    "use_sliding_window": True,
    "max_window_layers": 4,
    "torch_dtype": "bfloat16",
}


def test_a_qwen2_window_on_some_layers_is_refused_as_vllm_refuses_it(run_kvops, tmp_path):
    # vllm/model_executor/models/qwen2.py l.351-353 (0.32.0; 0.34.0 the same) asserts "Sliding window for some but
    # all layers is not supported" when layer_types mix; kvops had planned 12,288 blocks, 98,112 tokens
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_PARTIAL_WINDOW))
    ran = run_kvops("plan", "--model", str(tmp_path), *POINT, expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "sliding window on 4 of 8 layers" in ran.stderr
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2_PARTIAL_WINDOW, "max_window_layers": 8}))
    assert plan(run_kvops, tmp_path)["kv_cache_groups"] == 1  # no layer slides: served, one group


# tiiuae/falcon-7b's config.json (transformers' own FalconConfig form): multi-query attention, 71 query heads
FALCON_7B = {
    "architectures": ["FalconForCausalLM"],
    "model_type": "falcon",
    "alibi": False,
    "bias": False,
    "hidden_size": 4544,
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "vocab_size": 65024,
    "torch_dtype": "bfloat16",
}
# databricks/dbrx-instruct's config.json: the KV heads and experts nested in attn_config and ffn_config
DBRX = {
    "architectures": ["DbrxForCausalLM"],
    "model_type": "dbrx",
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
    "d_model": 6144,
    "ffn_config": {"ffn_hidden_size": 10752, "moe_jitter_eps": 0.01, "moe_num_experts": 16, "moe_top_k": 4},
    "max_seq_len": 32768,
    "n_heads": 48,
    "n_layers": 40,
    "tie_word_embeddings": False,
    "vocab_size": 100352,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "bytes_per_token"),
    [
        # kvops read 71 KV heads (568 KiB a token, 71 x vLLM's): FalconModelArchConfigConvertor gives 1
        (FALCON_7B, 2 * 32 * 1 * 64 * 2),
        # kvops read 48 KV heads (960 KiB a token, 6 x vLLM's): DbrxModelArchConfigConvertor reads kv_n_heads
        (DBRX, 2 * 40 * 8 * 128 * 2),
    ],
    ids=["falcon-7b", "dbrx"],
)
def test_kv_heads_named_outside_num_key_value_heads(config, bytes_per_token, run_kvops, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    kv = json.loads(run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", "--json").stdout)
    assert kv["bytes_per_token"] == bytes_per_token


def test_dbrx_weights_count_its_experts(run_kvops, tmp_path):
    # 16 experts of 3 x 6144 x 10752 in each of 40 layers: kvops counted a dense 4 x hidden MLP, 22.9B parameters
    # where DBRX has 132B (its model card); now 131.6B
    (tmp_path / "config.json").write_text(json.dumps(DBRX))
    text = run_kvops("plan", "--model", str(tmp_path), "--gpu", "H100-80GB", "--tp", "8", "--json").stdout
    assert "131,596,523,520 parameters" in text


def test_context_as_vllm_derives_it(run_kvops, tmp_path):
    # Command-R's model_max_length (131,072) wins over its max_position_embeddings (8,192), DBRX's max_seq_len is its
    # context, and a config naming none runs at 2,048 (vllm/transformers_utils/model_arch_config_convertor.py
    # derive_max_model_len_and_key; vllm/config/model.py _get_and_verify_max_len): kvops planned Command-R at 8,192,
    # and refused DBRX and Falcon-7B ("give --max-model-len N")
    (tmp_path / "dbrx").mkdir()
    (tmp_path / "dbrx" / "config.json").write_text(json.dumps(DBRX))
    (tmp_path / "falcon").mkdir()
    (tmp_path / "falcon" / "config.json").write_text(json.dumps(FALCON_7B))
    for model, gpus, context in (
        ("command-r", "4", 131072),
        (tmp_path / "dbrx", "8", 32768),
        (tmp_path / "falcon", "1", 2048),
    ):
        out = run_kvops("plan", "--model", str(model), "--gpu", "H100-80GB", "--tp", gpus, "--json").stdout
        assert json.loads(out)["capacity"]["max_model_len"] == context


@pytest.mark.vllm
@pytest.mark.parametrize("config", [FALCON_7B, DBRX], ids=["falcon-7b", "dbrx"])
def test_kv_heads_and_context_match_vllm(config, tiny_model, tmp_path, monkeypatch):
    """The figures above from vLLM itself: its model built on the meta device, each layer's page at block 16."""
    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm import context
    from kvops.model.locate import load_model
    from tests.support.vllm_specs import BuiltModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    built = BuiltModel(config, tmp_path / "model", tiny_model, max_num_batched_tokens=2048)
    built.as_gpu(16)
    pages = {spec.page_size_bytes for spec in built.specs().values()}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_model(str(tmp_path))
    per_layer = spec.attention_layers()[0].bytes_per_token(KV_DTYPES["bf16"], 1)
    assert pages == {16 * per_layer}
    assert built.vllm_config.model_config.max_model_len == context.model_default(spec)


def test_context_keys_a_config_leaves_to_its_class_defaults():
    # Gemma 3's text_config states no max_position_embeddings: transformers' Gemma3TextConfig gives 131,072, which
    # vLLM reads from the config object; read from config.json's keys alone, the plan fell to 2,048
    from kvops.engines.vllm import context
    from kvops.model.locate import load_model

    assert context.model_default(load_model("gemma-3-27b")) == 131072
