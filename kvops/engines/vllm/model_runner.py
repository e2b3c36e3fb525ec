"""Which GPU model runner a vLLM release runs a model with, and what its memory profile's sampler run holds.

vLLM has two GPU model runners: V1's (`v1/worker/gpu_model_runner.py`) and Model Runner V2 (MRv2,
`v1/worker/gpu/model_runner.py`; the worker logs "Using V2 Model Runner"). With `VLLM_USE_V2_MODEL_RUNNER` unset
(its default in every release), `VllmConfig.use_v2_model_runner` (config/vllm.py) picks MRv2 for:
- 0.22: Qwen3 dense models, 0.23: Llama and Mistral too, neither quantized (`DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`
  and `is_quantized`, config/vllm.py l.492-530 in the 0.22.0 wheel; vllm-project/vllm#39337, #43458); 0.21 has
  it only with VLLM_USE_V2_MODEL_RUNNER=1;
- 0.24: an allow-list of six architectures (`DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`, l.68-77 in the wheel);
- 0.25-0.28: every generation model that is neither MoE (unless allow-listed) nor hybrid (0.27 on: unless
  allow-listed) nor attention-free (`_is_default_v2_model_runner_model`, l.557-574 in the 0.25.0 wheel, l.691-712
  in 0.28.0; vllm-project/vllm#44443, "the default for all dense models");
- 0.29-0.33: every model (vllm-project/vllm#53183; l.644-677 in the 0.29.0 wheel), but on ROCm DeepSeek-V3.2/V4
  (and GLM-MoE-DSA from 0.30) stay on V1 through 0.31 (`ROCM_DEFAULT_MRV1_ARCHITECTURES`);
- 0.34: every model, the only GPU runner (the wheel has neither V1's runner nor VLLM_USE_V2_MODEL_RUNNER).
Before 0.34 a feature MRv2 does not support sends the model back to V1 (`_get_v2_model_runner_unsupported_features`,
l.3053-3087 in the 0.33.0 wheel); of those kvops plans, the speculative decoding methods.

The memory profile samples one decode step for min(max-num-batched-tokens, max-num-seqs) sequences. V1's sampler
run forces top-k and top-p and holds about 14 B per logit (the logits, an fp32 copy, fp32 probabilities and fp32
noise: kvops fits it per release family). MRv2's dummy requests keep their slots' defaults (temperature 0, no top-k
or top-p, no logprobs), so its sampler holds the logits alone in the model's dtype (`_dummy_sampler_run`,
sample/sampler.py `apply_sampling_params` returns them unless a request needs processing: l.238 in the 0.32.0
wheel), plus an fp32 copy made every time before 0.26 (sampler.py l.133 in the 0.22.0 wheel, l.156-157 in the 0.24.0
and 0.25.0 wheels). From 0.33 the profile samples a second time with the sampler warmup's parameters
(`SamplingParams.for_sampler_warmup()`: temperature, top-k, top-p, penalties, logprobs; model_runner.py l.1008-1013
in the 0.33.0 wheel, "the profiled peak must too"), which runs the full fp32 pipeline as V1's sampler does: kvops
prices it at the fitted bytes per logit again.
"""

from __future__ import annotations

from kvops.engines.release import Version
from kvops.frozen import frozen
from kvops.model.spec import ModelSpec

# Architectures MRv2 serves by default beyond the release's general rule, cumulative from the release named
ALLOW_LISTED = (
    (Version(0, 22), ("Qwen3ForCausalLM",)),
    (Version(0, 23), ("LlamaForCausalLM", "MistralForCausalLM")),
    (Version(0, 24), ("DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM")),
    (Version(0, 26), ("InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM")),
    (Version(0, 27), ("KimiK3ForConditionalGeneration",)),
    (Version(0, 28), ("DeepseekV4ForCausalLM",)),
)
# Allow-listed architectures ROCm leaves on V1 (0.27-0.28: `default_v2_model_runner_architectures`)
ROCM_NOT_LISTED = ("KimiK3ForConditionalGeneration", "DeepseekV4ForCausalLM")
# ROCm's V1 architectures once MRv2 is every model's default (0.29-0.31: `ROCM_DEFAULT_MRV1_ARCHITECTURES`)
ROCM_V1 = (
    (Version(0, 29), ("DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM")),
    (Version(0, 30), ("GlmMoeDsaForCausalLM",)),
)
FIRST_DEFAULT = Version(0, 22)  # the first release that runs any model on MRv2 without VLLM_USE_V2_MODEL_RUNNER=1
FIRST_LIST_WITH_QUANTIZED = Version(0, 24)  # 0.22-0.23 also require a checkpoint without quantization_config
FIRST_DENSE_DEFAULT = Version(0, 25)
FIRST_HYBRID_LISTED = Version(0, 27)  # a hybrid model on the allow-list runs on MRv2
FIRST_ALL_DEFAULT = Version(0, 29)
FIRST_WITHOUT_ROCM_LIST = Version(0, 32)
FIRST_WITHOUT_COPY = Version(0, 26)
FIRST_WARMUP_PASS = Version(0, 33)
ONLY_RUNNER = Version(0, 34)  # the 0.34.0 wheel has no v1/worker/gpu_model_runner.py nor VLLM_USE_V2_MODEL_RUNNER
FP32_COPY_BYTES = 4


@frozen
class ModelRunner:
    """The runner a launch's engine uses, and why (a line a user can check against the log's "Using V2 Model
    Runner")."""

    v2: bool
    why: str
    fp32_copy: bool = False  # MRv2 before 0.26: the sampler copies the logits to fp32 every time
    warmup_pass: bool = False  # MRv2 from 0.33: the profile samples again with the sampler warmup's parameters

    @property
    def light_sampler(self) -> bool:
        """The profile's sampler holds the bytes the release sets (MRv2 0.22-0.32), not the fitted bytes per logit
        of the full sampling pipeline (V1's runner; MRv2 from 0.33, whose second pass runs it)."""
        return self.v2 and not self.warmup_pass

    def sampler_bytes_per_logit(self, logits_dtype_bytes: int) -> int:
        """MRv2's light profile sampler run: the logits in the model's dtype, and their fp32 copy where the release
        makes one."""
        return logits_dtype_bytes + (FP32_COPY_BYTES if self.fp32_copy else 0)


def model_runner(
    version: Version,
    spec: ModelSpec,
    rocm: bool = False,
    speculative_method: str | None = None,
    logged_v2: bool = False,
) -> ModelRunner:
    """The GPU model runner vLLM `version` runs `spec` with: MRv2 where its log says "Using V2 Model Runner"
    (`logged_v2`), else as the release chooses when VLLM_USE_V2_MODEL_RUNNER is unset."""
    if logged_v2:
        return _v2(version, "the log says 'Using V2 Model Runner'")
    if version < FIRST_DEFAULT:
        return ModelRunner(False, f"vLLM {version} has only the V1 model runner as its default")
    unsupported = _unsupported_method(version, speculative_method)
    if unsupported:
        return ModelRunner(False, f"Model Runner V2 does not support {unsupported} in vLLM {version}: V1 runs it")
    default, why = _default_for(version, spec, rocm)
    return _v2(version, why) if default else ModelRunner(False, why)


def _v2(version: Version, why: str) -> ModelRunner:
    return ModelRunner(True, why, fp32_copy=version < FIRST_WITHOUT_COPY, warmup_pass=version >= FIRST_WARMUP_PASS)


def _default_for(version: Version, spec: ModelSpec, rocm: bool) -> tuple[bool, str]:
    architecture = spec.architectures[0] if spec.architectures else spec.model_type
    if version >= ONLY_RUNNER:
        return True, f"Model Runner V2 is vLLM's only GPU model runner from {ONLY_RUNNER} (gpu_model_runner.py is gone)"
    if version >= FIRST_ALL_DEFAULT:
        if rocm and version < FIRST_WITHOUT_ROCM_LIST and architecture in _listed(ROCM_V1, version):
            return False, f"vLLM {version} keeps {architecture} on the V1 model runner on ROCm"
        return True, f"Model Runner V2 is every model's default from {FIRST_ALL_DEFAULT} (vllm-project/vllm#53183)"
    listed = architecture in _listed(ALLOW_LISTED, version) and not (rocm and architecture in ROCM_NOT_LISTED)
    allow_listed = f"vLLM {version} runs {architecture} on Model Runner V2 by default (its allow-list)"
    if version < FIRST_DENSE_DEFAULT:
        if not listed:
            return False, f"vLLM {version} runs only its allow-listed architectures on Model Runner V2"
        if version < FIRST_LIST_WITH_QUANTIZED and spec.quantization is not None:
            return False, f"vLLM {version} runs quantized checkpoints on the V1 model runner (V2 from 0.24)"
        return True, allow_listed
    hybrid_listed = listed and version >= FIRST_HYBRID_LISTED and bool(spec.attention_layers())
    if spec.has_state and not hybrid_listed:
        return False, f"vLLM {version} runs models with state layers on the V1 model runner (V2 from 0.29)"
    if spec.num_experts and not listed:
        return False, f"vLLM {version} runs mixture-of-experts models on the V1 model runner (V2 from 0.29)"
    if listed:
        return True, allow_listed
    return True, f"Model Runner V2 is every dense model's default from {FIRST_DENSE_DEFAULT} (vllm-project/vllm#44443)"


def _unsupported_method(version: Version, method: str | None) -> str | None:
    """A speculative decoding method that sends the model to V1 (`_get_v2_model_runner_unsupported_features` in the
    0.24.0-0.33.0 wheels; 0.22-0.23 taken as 0.24; 0.34 has no V1 runner to send it to)."""
    if not method:
        return None
    if version >= ONLY_RUNNER:
        return None
    if version.at_least(0, 33):
        unsupported = {"suffix", "custom_class"}
    elif version.at_least(0, 32):
        unsupported = {"suffix", "medusa", "mlp_speculator", "custom_class"}
    elif version.at_least(0, 30):
        unsupported = {"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator", "custom_class"}
        if not version.at_least(0, 31):
            unsupported.add("draft_model")
    else:
        supported = {"eagle", "eagle3", "mtp", "dflash"}
        if version.at_least(0, 25):
            supported.add("dspark")
        if version.at_least(0, 29):
            supported.add("extract_hidden_states")
        return None if method in supported else f"speculative decoding by {method}"
    return f"speculative decoding by {method}" if method in unsupported else None


def _listed(table: tuple[tuple[Version, tuple[str, ...]], ...], version: Version) -> set[str]:
    return {name for since, names in table if version >= since for name in names}
