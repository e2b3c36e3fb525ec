"""Architectures users load from a folder or the Hub that kvops planned wrong, against what vLLM builds.

Each config is under tests/fixtures/models/<name>/config.json (its `_source` says where it was read). vLLM's figures
come from the 0.32.0 CPU build, the model built on the meta device as a GPU engine holds it
(tests/support/vllm_specs.py), at --kv-cache-memory-bytes 3 GiB + 12,345 B, --max-model-len 4096 and
--max-num-batched-tokens 2048.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from unittest import mock

import pytest

from tests.support.paths import REPO

MODELS = REPO / "tests" / "fixtures" / "models"
KIMI_LINEAR = MODELS / "kimi-linear-48b-a3b-instruct"
GEMMA3N = MODELS / "gemma-3n-E4B-it-text"
MEMORY = 3 * 2**30 + 12345
POINT = ("--kv-cache-memory-bytes", str(MEMORY), "--max-model-len", "4096", "--max-num-batched-tokens", "2048")


def _config(folder: Path) -> dict:
    return {key: value for key, value in json.loads((folder / "config.json").read_text()).items() if key != "_source"}


def test_kimi_linear_kda_layers_keep_a_state_not_a_latent(run_kvops):
    # kvops read 27 MLA layers (31,104 B a token). vLLM (vllm/models/kimi_k3/nvidia/model.py KimiDecoderLayer) builds
    # MLA on the 7 layers outside linear_attn_config.kda_layers (1-based) and a KDA state on the 20 listed:
    # kda_state_shape conv (3, 3 x 32 x 128) in bf16, recurrent (32, 128, 128) in float32 (kda_state_dtype)
    kv = json.loads(run_kvops("kv", "--model", str(KIMI_LINEAR), "--tokens", "8192", "--json").stdout)
    groups = {group["kind"]: group for group in kv["layer_groups"]}
    assert (groups["mla"]["layers"], kv["bytes_per_token"]) == (7, 7 * 576 * 2)
    state = 3 * 12288 * 2 + 32 * 128**2 * 4
    assert (groups["mamba"]["layers"], groups["mamba"]["bytes_per_sequence"]) == (20, 20 * state)


def test_kimi_linear_pool(run_kvops):
    # vLLM 0.32: MLA pages and KDA states unified at block 1920 (a multiple of 128 whose MLA page holds the
    # 2,170,880 B state), 208 blocks, 94,663 tokens, 23.11 requests of 4096. kvops: block 64, 1618 blocks, 103,552
    # tokens, 25.28 requests
    args = ("plan", "--model", str(KIMI_LINEAR), "--json", *POINT, "--engine-version", "0.32.0")
    capacity = json.loads(run_kvops(*args).stdout)["capacity"]
    assert (capacity["block_size"], capacity["num_blocks"], capacity["kv_cache_size_tokens"]) == (1920, 208, 94663)
    assert capacity["max_concurrency"] == 23.1111


def test_kimi_linear_parameters():
    # 49,122,681,728 as vLLM builds it (the 48B of its model card); kvops counted MLA in the KDA layers and no shared
    # expert (num_shared_experts, not n_shared_experts): 48,730,662,144; and 0 experts a token (num_experts_per_token)
    from kvops.model.locate import load_model

    spec = load_model(str(KIMI_LINEAR))
    assert (spec.parameters, spec.experts_per_token) == (49_122_681_728, 8)


def test_kimi_linear_bounded_gate_is_one_line(run_kvops, tmp_path):
    # a bounded gate (Kimi K3's text model) runs FlashKDA's prefill on Hopper and Blackwell, which keeps a checkpoint
    # page per KDA layer (kda_checkpoint.py kda_prefill_checkpoint_alignment): not modelled, so refused
    config = _config(KIMI_LINEAR)
    config["linear_attn_config"] = {**config["linear_attn_config"], "gate_lower_bound": -5.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "linear_attn_config.gate_lower_bound" in ran.stderr


@pytest.mark.vllm
def test_kimi_linear_matches_what_vllm_builds(tiny_model, tmp_path, monkeypatch):
    """vLLM's own pool for the model it builds, and its parameters. The CPU build needs three stand-ins to build it:
    the AMX MLA path (else it turns prefix caching off for MLA, which a GPU engine keeps), a CUDA stream object and
    the Kimi-K3 GEMM all-reduce flag off (its kernel needs cutlass); none changes a layer's shape."""
    import torch

    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm.layout import kv_layout, pool
    from kvops.model.locate import load_model
    from tests.support.vllm_specs import BuiltModel, engine_config, vllm_pool
    from tests.unit.test_defects_architectures import _loaded_parameters

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_KIMI_K3_GEMM_AR", "0")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "Stream", mock.MagicMock())
    warnings.simplefilter("ignore")
    config = _config(KIMI_LINEAR)
    built = BuiltModel(config, tmp_path / "vllm", tiny_model, max_num_batched_tokens=2048, max_model_len=4096)
    built.as_gpu(16)
    blocks, tokens, _ = vllm_pool(built.vllm_config, built.specs(), MEMORY)
    layout = kv_layout(load_model(str(KIMI_LINEAR)), KV_DTYPES["bf16"], 1, 16)
    ours = pool(layout, MEMORY, 4096, built.vllm_config.max_in_flight_tokens)
    assert (ours.num_blocks, ours.kv_cache_size_tokens) == (blocks, tokens) == (208, 94663)
    fresh = engine_config(config, tmp_path / "count", tiny_model, max_num_batched_tokens=2048)
    assert _loaded_parameters(fresh) == load_model(str(KIMI_LINEAR)).parameters


def test_gemma3n_per_layer_widths_are_read(run_kvops):
    # kvops refused the published config: "'intermediate_size' is a list of 35; valid: a whole number"; vLLM reads
    # intermediate_size[layer_idx] (vllm/model_executor/models/gemma3n.py). Its KV, as vLLM 0.32 builds it: the last
    # 15 of 35 layers read an earlier layer's cache; of the 20 that keep one, 16 slide over 512 tokens and 4 are full
    kv = json.loads(run_kvops("kv", "--model", str(GEMMA3N), "--tokens", "8192", "--json").stdout)
    groups = {group["kind"]: (group["layers"], group["window"]) for group in kv["layer_groups"]}
    assert groups == {"sliding": (16, 512), "full": (4, None)}
    assert kv["bytes_per_token"] == 20 * 2 * 2 * 256 * 2


def test_gemma3n_widths_that_differ_are_one_line(run_kvops, tmp_path):
    config = _config(GEMMA3N)
    config["intermediate_size"] = [16384] * 34 + [8192]
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "'intermediate_size' is a list of widths that are not all the same" in ran.stderr


def test_gemma3n_parameters():
    # 6,835,235,568 as vLLM 0.32 builds Gemma3nForCausalLM. With its width given as one number kvops counted
    # 6,674,403,584: no attention in the 15 KV-sharing layers (they keep q_proj, o_proj and q_norm), no AltUp or
    # LAuReL in any layer, no AltUp projections, two norms a layer of four and no q/k norms
    from kvops.model.locate import load_model

    assert load_model(str(GEMMA3N)).parameters == 6_835_235_568


@pytest.mark.vllm
def test_gemma3n_matches_what_vllm_builds(tiny_model, tmp_path, monkeypatch):
    """Each cache page at block 16 and its window, the context, the parameters. Built with no activation sparsity:
    the meta device cannot compute its threshold (a tensor's .item()), and it changes no weight's shape."""
    from kvops.dtypes import KV_DTYPES
    from kvops.engines.vllm import context
    from kvops.model.locate import load_model
    from tests.support.vllm_specs import BuiltModel, engine_config
    from tests.unit.test_defects_architectures import _loaded_parameters

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    config = {**_config(GEMMA3N), "activation_sparsity_pattern": [0.0] * 35}
    built = BuiltModel(config, tmp_path / "vllm", tiny_model, max_num_batched_tokens=2048)
    built.as_gpu(16)
    theirs = sorted(
        (spec.page_size_bytes, getattr(spec, "sliding_window", None) or 0) for spec in built.specs().values()
    )
    spec = load_model(str(GEMMA3N))
    ours = sorted(
        (16 * layer.bytes_per_token(KV_DTYPES["bf16"], 1), getattr(layer, "window", 0))
        for layer in spec.layers
        if layer.kind != "none"
    )
    assert ours == theirs
    assert built.vllm_config.model_config.max_model_len == context.model_default(spec) == 32768
    fresh = engine_config(config, tmp_path / "count", tiny_model, max_num_batched_tokens=2048)
    assert _loaded_parameters(fresh) == spec.parameters


def test_gemma4_e4b_text_and_towers():
    # vLLM 0.32 builds gemma-4-E4B's text model of 7,463,013,376 parameters (on the meta device, as
    # test_gemma3n_matches_what_vllm_builds does); kvops counted 7,242,577,664: no attention in the 18 KV-sharing
    # layers (q_proj, o_proj, q_norm: gemma4.py), two norms a layer of four, no q/k norms. Its audio tower, as
    # transformers' Gemma4AudioConfig builds it for vLLM (AutoModel.from_config), is 1024 wide, 304,824,608
    # parameters; kvops took 1536 (its output_proj_dims): 679M
    from kvops.model.locate import load_model

    count = load_model(str(MODELS / "gemma-4-E4B-it")).count
    assert count.total == 7_463_013_376
    assert 0.45e9 < count.vision < 0.48e9  # transformers' towers: 472,189,216 (the projections beside them)


@pytest.mark.parametrize("model_type", ["bailing_hybrid", "bailing_moe_linear"])
def test_ling_hybrid_is_one_line(model_type, run_kvops, tmp_path):
    # Ling 2.5/2.6 (BailingMoeV2_5ForCausalLM, model_type bailing_hybrid) and Ring-linear: vLLM 0.32's
    # bailing_moe_linear.py keeps MLA on every layer_group_size-th layer and a lightning linear-attention state
    # (linear_attention_state_shape: heads x head_dim x head_dim) on the others; bailing_moe_v3.py a KDA state.
    # kvops read MLA on all 32 layers of this shape: 36 KiB a token where vLLM caches 4.5 KiB and 28 states
    config = {"architectures": ["BailingMoeV2_5ForCausalLM"], "model_type": model_type, "hidden_size": 4096}
    config |= {"num_hidden_layers": 32, "num_attention_heads": 32, "layer_group_size": 8, "kv_lora_rank": 512}
    config |= {"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 157184}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "Ling 2.5+/Ring-linear's hybrid layers" in ran.stderr


DORY = {"model_type": "dory", "hidden_size": 2048, "num_hidden_layers": 72, "num_attention_heads": 16}
DORY |= {"num_key_value_heads": 4, "head_dim": 256, "sliding_window": 1024, "vocab_size": 151936}
DORY |= {"layer_types": (["sliding_attention", "mlp"] * 3 + ["full_attention", "mlp"]) * 9}
ZAYA = {"model_type": "zaya", "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 8}
ZAYA |= {"num_key_value_heads": 2, "head_dim": 128, "vocab_size": 262272, "layer_types": ["hybrid"] * 40}


@pytest.mark.parametrize(
    ("config", "refusal"),
    [
        # vLLM 0.34 dory.py: the 36 'mlp' layers have no attention (is_attention), and the recurrent block's layers
        # keep a cache per loop (recurrent_kv_cache_mode "per_loop"); kvops read 45 full and 27 sliding layers,
        # 288 KiB a token for DoryConfig's defaults (vllm/transformers_utils/configs/dory.py)
        ({**DORY, "architectures": ["DoryForCausalLM"]}, "Dory's layers"),
        # vLLM 0.34 zaya.py: each layer's ZayaCCA keeps a per-request convolution state (a MambaBase: pages beside
        # the KV) besides its attention; kvops read attention alone (transformers' ZayaConfig defaults)
        ({**ZAYA, "architectures": ["ZayaForCausalLM"]}, "ZAYA1's layers"),
    ],
    ids=["dory", "zaya"],
)
def test_newer_release_layers_kvops_cannot_plan_are_one_line(config, refusal, run_kvops, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert refusal in ran.stderr


def test_ling_2_parameters(run_kvops):
    # Ling-mini-2.0 (BailingMoeV2ForCausalLM) as vLLM 0.32 builds it on the meta device (bailing_moe.py):
    # 16,255,648,512;
    # kvops counted 16,255,633,408: no per-head q/k norms (a LayerNorm each, weight and bias, without use_rmsnorm)
    # and no router expert_bias (moe_router_enable_expert_bias). Its KV was vLLM's: 20 layers of 4 KV heads x 128,
    # 40,960 B a token; context 32,768
    from kvops.model.locate import load_model

    assert load_model(str(MODELS / "ling-mini-2.0")).parameters == 16_255_648_512
    kv = json.loads(run_kvops("kv", "--model", str(MODELS / "ling-mini-2.0"), "--tokens", "1", "--json").stdout)
    assert kv["bytes_per_token"] == 20 * 2 * 4 * 128 * 2


@pytest.mark.vllm
def test_ling_2_matches_what_vllm_builds(tiny_model, tmp_path, monkeypatch):
    """Built as a LlamaConfig carrying Ling's fields: its own config class is remote code (auto_map), which is not
    here; bailing_moe.py reads the fields by name, and embedding_dropout (unused at inference) must exist."""
    from kvops.model.locate import load_model
    from tests.support.vllm_specs import BuiltModel, engine_config
    from tests.unit.test_defects_architectures import _loaded_parameters

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    config = {**_config(MODELS / "ling-mini-2.0"), "model_type": "llama", "embedding_dropout": 0.0}
    built = BuiltModel(config, tmp_path / "vllm", tiny_model, max_num_batched_tokens=2048)
    built.as_gpu(16)
    assert sorted(spec.page_size_bytes for spec in built.specs().values()) == [16 * 2 * 4 * 128 * 2] * 20
    assert built.vllm_config.model_config.max_model_len == 32768
    fresh = engine_config(config, tmp_path / "count", tiny_model, max_num_batched_tokens=2048)
    assert _loaded_parameters(fresh) == load_model(str(MODELS / "ling-mini-2.0")).parameters


def test_per_layer_attention_shapes_are_one_line(run_kvops, tmp_path):
    # vLLM 0.34 domyn_edge.py builds layer i with per_layer_config[i].head_dim and a window of window_sizes[i][0] + 1
    # (0: full attention); kvops read neither: 8 full layers of hidden / heads = 128 dims, 16 KiB a token, where this
    # config caches 2 full layers of 256 (8 KiB) and 6 of 64 over 513 tokens
    config = {"architectures": ["DomynEdgeForCausalLM"], "model_type": "domyn_edge", "hidden_size": 2048}
    config |= {"num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000}
    config |= {"per_layer_config": [{"head_dim": 64 if i % 4 else 256} for i in range(8)]}
    config |= {"window_sizes": [[512 if i % 4 else 0, 0] for i in range(8)]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ran = run_kvops("kv", "--model", str(tmp_path), "--tokens", "1", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1
    assert "per-layer attention shapes" in ran.stderr
