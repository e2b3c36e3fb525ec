"""Which GPU model runner a vLLM release runs a model with (V1's or Model Runner V2), as config/vllm.py
`use_v2_model_runner` decides in the 0.21.0-0.34.0 wheels, and what the memory profile's sampler run holds with each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvops.deployment import DeploymentOptions
from kvops.engines.release import Version
from kvops.engines.vllm.logs import parse_vllm_log
from kvops.engines.vllm.model_runner import model_runner
from kvops.model import load_model
from kvops.planner import predict
from kvops.units import GiB
from tests.support.corpus import entry, plan_entry

QWEN3 = load_model("Qwen/Qwen3-8B")  # Qwen3ForCausalLM, dense
LLAMA = load_model("meta-llama/Llama-3.1-8B-Instruct")  # LlamaForCausalLM, dense
QWEN3_MOE = load_model("Qwen/Qwen3-30B-A3B")  # Qwen3MoeForCausalLM, not allow-listed
QWEN2_MOE = load_model("Qwen/Qwen1.5-MoE-A2.7B")  # Qwen2MoeForCausalLM, allow-listed from 0.24
HYBRID = load_model("Qwen/Qwen3.5-9B")  # Gated DeltaNet layers beside attention
DEEPSEEK_V32 = load_model("deepseek-ai/DeepSeek-V3.2")  # ROCm keeps it on V1 in 0.29-0.31


def runs_v2(version: str, spec, **given) -> bool:
    return model_runner(Version.parse(version), spec, **given).v2


@pytest.mark.parametrize(
    ("version", "spec", "v2"),
    [
        ("0.21.0", QWEN3, False),  # MRv2 only with VLLM_USE_V2_MODEL_RUNNER=1
        ("0.22.0", QWEN3, True),  # the allow-list: Qwen3ForCausalLM
        ("0.22.0", LLAMA, False),
        ("0.23.0", LLAMA, True),  # + Llama, Mistral
        ("0.24.0", QWEN2_MOE, True),  # + three MoE architectures
        ("0.24.0", QWEN3_MOE, False),
        ("0.25.0", load_model("google/gemma-3-12b-it"), True),  # every dense model
        ("0.25.0", QWEN3_MOE, False),
        ("0.28.0", HYBRID, False),  # state layers: V1 unless allow-listed
        ("0.28.0", QWEN3_MOE, False),
        ("0.29.0", HYBRID, True),  # every model
        ("0.29.0", QWEN3_MOE, True),
        ("0.34.0", QWEN3_MOE, True),  # the only GPU runner
    ],
)
def test_the_release_chooses_the_runner_by_model_kind(version, spec, v2):
    assert runs_v2(version, spec) is v2


def test_quantized_checkpoints_stay_on_v1_until_024():
    """0.22-0.23 also require `not is_quantized` (a config with quantization_config); 0.24 drops the gate."""
    quantized = replace(QWEN3, quantization={"quant_method": "fp8"})
    assert not runs_v2("0.23.0", quantized)
    assert runs_v2("0.24.0", quantized)


def test_rocm_keeps_deepseek_v32_on_v1_through_031():
    assert not runs_v2("0.29.0", DEEPSEEK_V32, rocm=True)
    assert runs_v2("0.29.0", DEEPSEEK_V32, rocm=False)
    assert runs_v2("0.32.0", DEEPSEEK_V32, rocm=True)  # the ROCm list is gone in 0.32.0


@pytest.mark.parametrize(
    ("version", "method", "v2"),
    [
        ("0.28.0", "ngram", False),
        ("0.28.0", "eagle3", True),
        ("0.31.0", "ngram", False),
        ("0.32.0", "ngram", True),
        ("0.32.0", "medusa", False),
        ("0.33.0", "medusa", True),
        ("0.33.0", "suffix", False),
        ("0.34.0", "suffix", True),  # V1's runner is gone from the wheel
    ],
)
def test_a_speculative_method_mrv2_lacks_sends_the_model_to_v1(version, method, v2):
    assert runs_v2(version, QWEN3, speculative_method=method) is v2


def test_mrv2_holds_the_logits_alone_from_026_and_an_fp32_copy_before():
    assert model_runner(Version.parse("0.25.0"), QWEN3).sampler_bytes_per_logit(2) == 6
    assert model_runner(Version.parse("0.26.0"), QWEN3).sampler_bytes_per_logit(2) == 2


def test_from_033_mrv2_profiles_the_full_sampling_pipeline():
    """0.33's `_dummy_sampler_run` samples a second time with SamplingParams.for_sampler_warmup() ("the profiled peak
    must too"): the fp32 pipeline V1's sampler runs, priced at the fitted bytes per logit."""
    assert model_runner(Version.parse("0.32.0"), QWEN3).light_sampler
    assert not model_runner(Version.parse("0.33.0"), QWEN3).light_sampler
    given = {"model": "meta-llama/Llama-3.2-1B-Instruct", "gpu": "H200", "max_model_len": 16384}
    assert "sampling again with its warmup's parameters" in activation("0.33.0", **given)["formula"]
    assert activation("0.33.0", **given)["bytes"] == activation("0.19.0", **given)["bytes"]


def test_the_log_line_names_the_runner():
    log = parse_vllm_log("(EngineCore pid=186) INFO 09-24 22:07:10 [gpu_worker.py:441] Using V2 Model Runner\n")
    assert log.get("model_runner_v2") is True
    assert model_runner(Version.parse("0.21.0"), QWEN3, logged_v2=True).v2  # opted in with the environment


def activation(version: str, **values) -> dict:
    plan = predict(DeploymentOptions(engine_version=version, **values).plan_inputs())
    found = plan.term("activation")
    assert found is not None
    return {"bytes": found.bytes, "formula": found.formula, "notes": plan.notes}


def test_a_mrv2_plan_sizes_the_sampler_at_two_bytes_a_logit_and_says_which_runner():
    """Llama-3.2-1B on one H200 at 1,024 sequences: V1's profile sampler (fitted, ~15 B a logit) peaks above the
    forward pass; MRv2's (2 B a logit, 0.24 GiB) stays below it, so the forward pass is the peak."""
    given = {"model": "meta-llama/Llama-3.2-1B-Instruct", "gpu": "H200", "max_model_len": 16384}
    v1, v2 = activation("0.19.0", **given), activation("0.31.0", **given)
    assert "sampler's decode step for 1024 sequences" in v1["formula"] and v1["bytes"] > 1.5 * GiB
    assert "the forward pass over" in v2["formula"] and v2["bytes"] < 0.6 * GiB
    assert any(note.startswith("model runner: V2: ") for note in v2["notes"])
    assert any(note.startswith("model runner: V1: ") for note in v1["notes"])


def test_the_public_031_h200_run_without_cuda_graphs_is_planned_within_half_a_percent():
    """vllm-0.31.0-h200-llama-3.2-1b-instruct-fp16-nograph-tp1 logged 0.52 GiB of peak activation and 125.02 GiB of
    KV; kvops planned 123.57 (-1.2%) with V1's sampler, and plans it within 0.5% with MRv2's."""
    item = entry("vllm-0.31.0-h200-llama-3.2-1b-instruct-fp16-nograph-tp1")
    logged = item.log.facts["kv_cache_bytes"]
    assert abs(plan_entry(item).kv_cache_bytes / logged - 1) < 0.005
