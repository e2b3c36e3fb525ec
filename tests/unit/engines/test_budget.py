"""Engine-neutral budget terms: weights by format and tp, the activation model."""

from __future__ import annotations

import json
from math import ceil

import pytest

from kvops.engines.common import forward_activation_peak, sampler_peak
from kvops.engines.weights import weight_bytes, weight_format
from kvops.errors import UsageError
from kvops.model import load_model


def test_16_bit_weights_are_the_parameter_count_times_two_split_by_tp():
    spec = load_model("llama-3-8b")
    assert weight_bytes(spec, weight_format(spec)).bytes == 8_030_261_248 * 2
    assert weight_bytes(spec, weight_format(spec), tp=2).bytes == 8_030_261_248
    assert weight_bytes(spec, weight_format(spec)).basis == "computed"


def test_fp8_block_scales_and_16_bit_embeddings_for_deepseek_v3():
    spec = load_model("deepseek-ai/DeepSeek-V3")
    fmt = weight_format(spec)  # quantization_config: fp8, weight_block_size [128, 128]
    assert fmt.name == "fp8" and fmt.bits == 8 + 32 / (128 * 128)
    embeddings = 2 * spec.vocab_size * spec.hidden_size  # untied embeddings and LM head stay bf16
    quantized = spec.parameters - embeddings
    expected = -(-quantized * fmt.bits // 8) + embeddings * 2
    assert abs(weight_bytes(spec, fmt).bytes - expected) <= 1


def test_mxfp4_quantizes_only_the_experts_of_gpt_oss():
    spec = load_model("openai/gpt-oss-20b")
    fmt = weight_format(spec)
    assert fmt.name == "mxfp4" and fmt.bits == 4.25
    rest = spec.parameters - spec.expert_parameters
    assert weight_bytes(spec, fmt).bytes == -(-spec.expert_parameters * 17 // 32) + rest * 2


def test_mxfp4_on_a_dense_model_quantizes_its_linear_layers():
    """A dense model has no experts to hold MXFP4: its MXFP4 checkpoints are W4A4 (every linear layer), as the
    decodebench Qwen3-32B run of the corpus logged (vllm-0.31.0-b200-qwen3-32b-mxfp4-w4a4-tp1)."""
    spec = load_model("Qwen/Qwen3-32B")
    fmt = weight_format(spec, "mxfp4")
    assert fmt.scope == "linear" and fmt.bits == 4.25
    embeddings = 2 * spec.vocab_size * spec.hidden_size  # untied embeddings and LM head stay bf16
    assert weight_bytes(spec, fmt).bytes == -(-(spec.parameters - embeddings) * 17 // 32) + embeddings * 2


def test_awq_int4_with_group_scales_is_about_a_quarter_of_bf16():
    spec = load_model("llama-3-8b")
    awq = weight_bytes(spec, weight_format(spec, "awq")).bytes
    bf16 = weight_bytes(spec, weight_format(spec, "bf16")).bytes
    assert 0.3 * bf16 < awq < 0.4 * bf16  # 4.16 bits per weight + 16-bit embeddings and LM head


def test_unknown_weight_format_is_one_line():
    with pytest.raises(UsageError, match="valid: auto, bf16"):
        weight_format(load_model("llama-3-8b"), "nf5")


def test_activation_grows_with_batched_tokens_and_shrinks_with_tp():
    spec = load_model("llama-3-8b")
    assert forward_activation_peak(spec, 8192) == 2 * forward_activation_peak(spec, 4096)
    assert forward_activation_peak(spec, 8192, tp=2) < forward_activation_peak(spec, 8192)
    assert sampler_peak(spec, 256, 15.5) == ceil(256 * 128256 * 15.5)  # the fitted bytes per logit of a release


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_per_channel_int4_group_size_minus_one_is_four_bits_a_weight(tmp_path, method):
    """group_size -1 (per channel, common in GPTQ checkpoints) had divided by -1: negative weights, a KV cache
    larger than the GPU."""
    spec = _quantized(tmp_path, {"quant_method": method, "bits": 4, "group_size": -1})
    fmt = weight_format(spec)
    assert fmt.bits == 4 and "per-channel" in fmt.note
    embeddings = 2 * spec.vocab_size * spec.hidden_size
    assert weight_bytes(spec, fmt).bytes == (spec.parameters - embeddings) // 2 + embeddings * 2


def _quantized(tmp_path, quantization_config: dict):
    config = dict(load_model("llama-3-8b").config_json)
    config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    return load_model(str(tmp_path))


def test_another_format_than_the_checkpoints_is_one_line_as_vllm_refuses_it(tmp_path):
    """vLLM raises 'Quantization method specified in the model config (awq) does not match ...' (vllm/config/model.py):
    a plan of fp8 weights for an AWQ checkpoint sized weights the engine never loads."""
    spec = _quantized(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128})
    with pytest.raises(UsageError, match=r"--quantization fp8: .* is quantized as awq .*leave it out or give awq$"):
        weight_format(spec, "fp8")
    assert weight_format(spec, "awq") == weight_format(spec)


def test_an_unknown_quant_method_names_the_config_not_a_flag_never_given(tmp_path):
    spec = _quantized(tmp_path, {"quant_method": "weird_method"})
    with pytest.raises(UsageError, match="quant_method 'weird_method' is not a weight format kvops models; plan it"):
        weight_format(spec)
    assert weight_format(spec, "gptq").name == "gptq"  # named by the user, planned so
