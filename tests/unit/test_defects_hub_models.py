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
