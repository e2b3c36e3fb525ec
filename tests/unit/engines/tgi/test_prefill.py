"""TGI's own --max-batch-prefill-tokens, release by release (launcher/src/main.rs at each tag of
huggingface/text-generation-inference): the value the launcher would log as "Default `max_batch_prefill_tokens` to
N" for a model, a card and a shard count, and what the plan takes and emits."""

from __future__ import annotations

import json

import pytest

from kvops.engines.release import Version
from kvops.engines.tgi.prefill import card, default
from kvops.gpus import find_gpu
from kvops.model import load_model

# Llama-3.1-8B per layer: attention 2 x 128 x 4096 x (3 x 32 + 2 x 8) = 117,440,512, MLP 6 x 4096 x 14336 =
# 352,321,536; x 32 layers = 15,032,385,536 FLOPs a token (`Config::flop`)
LLAMA_8B_FLOPS = 15_032_385_536
# Llama-3.1-70B: 2 x 128 x 8192 x (3 x 64 + 2 x 8) + 6 x 8192 x 28672 = 1,845,493,760 a layer, x 80
LLAMA_70B_FLOPS = 147_639_500_800


def tokens(model: str, gpu: str, version: str, shards: int = 1, **kwargs) -> int:
    spec = load_model(model)
    return default(spec.config_json, find_gpu(gpu), shards, 1.0, Version.parse(version), **kwargs).tokens


@pytest.mark.parametrize(
    ("model", "gpu", "shards", "version", "expected"),
    [
        ("llama-3.1-8b-instruct", "h100", 1, "3.0.0", 900 * 10**12 // LLAMA_8B_FLOPS),  # 59,870: the first release
        ("llama-3.1-8b-instruct", "h100", 1, "3.3.7", 59_870),
        ("llama-3-8b", "h100", 1, "3.3.7", 8192),  # held to max_position_embeddings
        ("llama-3.1-8b-instruct", "l4", 1, "3.3.7", 121 * 10**12 // LLAMA_8B_FLOPS),  # 8,049
        ("llama-3.1-70b-instruct", "a100-80gb", 4, "3.3.7", 4 * 312 * 10**12 // LLAMA_70B_FLOPS),  # 8,453
        ("llama-3.1-8b-instruct", "a100-40gb", 1, "3.0.1", 4096),  # "nvidia-a100-sxm4-40gb" is added in 3.0.2
        ("llama-3.1-8b-instruct", "a100-40gb", 1, "3.0.2", 312 * 10**12 // LLAMA_8B_FLOPS),
        ("llama-3.1-8b-instruct", "h200", 1, "3.0.2", 4096),  # H200 is added in 3.1.0
        ("llama-3.1-8b-instruct", "h200", 1, "3.1.0", 989 * 10**12 // LLAMA_8B_FLOPS),
        # nvidia-smi says 'NVIDIA GeForce RTX 4090' and 'Tesla T4': never the table's nvidia-4090 / nvidia-t4
        ("llama-3.1-8b-instruct", "rtx4090", 1, "3.3.7", 4096),
        ("llama-3.1-8b-instruct", "mi300x", 1, "3.3.7", 4096),  # no nvidia-smi in the ROCm image: no card, no cap
        ("gemma-3-27b-it", "a100-80gb", 4, "3.1.1", 4096),  # a VLM: no FLOPs; the gemma3 fallback comes in 3.2.0
        ("gemma-3-27b-it", "a100-80gb", 4, "3.2.0", 8000),
        ("gpt-oss-20b", "h100", 1, "3.3.7", 4096),  # quant_method mxfp4: the launcher cannot read the config
    ],
)
def test_the_launcher_default_per_release_model_and_card(model, gpu, shards, version, expected):
    assert tokens(model, gpu, version, shards) == expected


def test_the_vram_cap_the_launcher_computes():
    """T4 with Llama-3.1-8B: 15094 MiB x 0.95 (the launcher's TGI_WIGGLE_ROOM default, f32) = 15,035,987,558 B,
    less 14,449,770,496 B (`model_vram`: 7,224,885,248 16-bit parameters as the launcher counts them), over
    260,096 B a token (K and V 131,072 + 3 x 2 x (14336 + 7168) for the MLP) = 2,253; the fallback 4096 (unknown
    card 'tesla-t4') is reduced to it. A quantized checkpoint has no cap."""
    assert tokens("llama-3.1-8b-instruct", "t4", "3.3.7") == 2253
    assert tokens("llama-3.1-8b-instruct", "t4", "3.3.7", quantization="awq") == 4096
    smaller = find_gpu("h100").with_memory(20 << 30)  # the card keeps its name, nvidia-smi's total is 20480 MiB
    found = default(load_model("llama-3.1-8b-instruct").config_json, smaller, 1, 1.0, Version(3, 3, 7))
    assert found.tokens == (int(20480 * 2**20 * 0.95) - 14_449_770_496) // 260_096 == 22_881
    assert "compute-optimal 59,870" in found.why and "VRAM cap 22,881" in found.why


def test_per_model_fallbacks_read_the_configs_own_model_type():
    qwen2_vl = {
        "model_type": "qwen2_vl",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "num_hidden_layers": 28,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "vision_config": {"depth": 32},
    }
    h100 = find_gpu("h100")
    assert default(qwen2_vl, h100, 1, 1.0, Version(3, 1, 0)).tokens == 4096
    assert default(qwen2_vl, h100, 1, 1.0, Version(3, 1, 1)).tokens == 10_000
    text_only = {key: value for key, value in qwen2_vl.items() if key != "vision_config"}
    assert default(text_only, h100, 1, 1.0, Version(3, 1, 1)).tokens > 10_000  # FLOPs apply without a vision tower
    assert card(find_gpu("a100-80gb")) == "nvidia-a100-sxm4-80gb" and card(find_gpu("mi300x")) is None


def plan(run_kvops, *args: str) -> dict:
    return json.loads(run_kvops("plan", "--engine", "tgi", "--json", *args).stdout)


def test_the_plan_warms_up_with_the_launchers_default_and_leaves_the_flag_to_tgi(run_kvops):
    doc = plan(run_kvops, "-m", "llama-3.1-8b-instruct", "--gpu", "h100", "--engine-version", "3.3.7")
    assert doc["capacity"]["max_batch_prefill_tokens"] == 59_870
    assert "max-batch-prefill-tokens" not in doc["flags"]
    activation = {term["name"]: term for term in doc["memory"]["terms"]}["activation"]
    assert "warmup prefill of 59870 tokens" in activation["formula"]
    assert any("not emitted: TGI 3.3.7's launcher default 59,870: compute-optimal" in note for note in doc["notes"])
    given = plan(run_kvops, "-m", "llama-3.1-8b-instruct", "--gpu", "h100", "--max-batch-prefill-tokens", "4096")
    assert given["flags"]["max-batch-prefill-tokens"] == 4096 == given["capacity"]["max_batch_prefill_tokens"]
    assert given["capacity"]["kv_tokens"] > doc["capacity"]["kv_tokens"]  # a smaller warmup leaves more KV
    old = plan(run_kvops, "-m", "llama-3.1-8b-instruct", "--gpu", "h100", "--engine-version", "2.4.1")
    # 2.4.1's launcher: 4096.min(max_position_embeddings) (it had kept 2.0-2.4.0's max_input_tokens + 50: 4145)
    assert old["flags"]["max-batch-prefill-tokens"] == 4096 >= old["flags"]["max-input-tokens"] == 4095
    before = plan(run_kvops, "-m", "llama-3.1-8b-instruct", "--gpu", "h100", "--engine-version", "2.4.0")
    assert before["flags"]["max-batch-prefill-tokens"] == 4145  # 2.0-2.4.0: max_input_tokens + 50, on any card
