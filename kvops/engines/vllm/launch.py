"""The `vllm serve` options of a plan, in the planned release's own option set (vllm/engine/arg_utils.py of each
release, kvops/engines/vllm/release_options.json)."""

from __future__ import annotations

from typing import Any

from kvops.engines.vllm import flags, options
from kvops.engines.vllm.capacity import Draft
from kvops.errors import UsageError
from kvops.plan import LoraSlots, PlanInputs, model_argument
from kvops.units import format_bytes


def engine_flags(
    inputs: PlanInputs,
    length: int,
    draft: Draft,
    seqs: int,
    batched: int,
    block_size: int,
    kv_flag: str,
    release_options: options.ReleaseOptions,
    bytes_per_block: int,
) -> dict[str, Any]:
    """The `vllm serve` options of this plan, in the planned release's own option set: an option the release does
    not take is a one-line error naming the release that adds it; --gpu-memory-utilization is left unset where the
    release's default is to leave it unset (the extensible KV cache: an emitted value would cap it)."""
    release = draft.release
    pinned = inputs.kv_cache_memory_bytes is not None and inputs.num_gpu_blocks_override is None
    utilization = inputs.memory_fraction
    if utilization is None and release.emits_default_utilization and not (pinned and inputs.device == "cpu"):
        utilization = release.default_gpu_memory_utilization
    engine_flags: dict[str, Any] = {
        "model": model_argument(inputs.spec),
        "revision": inputs.spec.revision,
        "tensor-parallel-size": inputs.tp,
        "pipeline-parallel-size": inputs.pp if inputs.pp > 1 else None,
        "decode-context-parallel-size": inputs.dcp if inputs.dcp > 1 else None,
        "data-parallel-size": inputs.replicas if inputs.replicas > 1 else None,
        "enable-expert-parallel": True if inputs.expert_parallel else None,
        "dtype": _DTYPE_FLAGS.get(inputs.dtype),
        "quantization": _quantization(inputs, draft),
        "language-model-only": True if inputs.text_only else None,
        "cpu-offload-gb": inputs.cpu_offload_bytes / (1 << 30) if inputs.cpu_offload_bytes else None,
        "speculative-config": inputs.speculative.config if inputs.speculative else None,
        "disable-hybrid-kv-cache-manager": True if not inputs.hybrid_manager else None,
        "no-enable-prefix-caching": True if inputs.prefix_caching is False and not release.v0 else None,
        "no-enable-chunked-prefill": True if not inputs.chunked_prefill else None,
        "performance-mode": None if inputs.performance_mode == "balanced" else inputs.performance_mode,
        "async-scheduling": True if inputs.async_scheduling else None,
        "no-async-scheduling": True if inputs.async_scheduling is False else None,
        "disable-sliding-window": True if inputs.disable_sliding_window else None,
        "kv-cache-dtype-skip-layers": inputs.kv_skip_layers or None,
        **_lora_flags(inputs.lora),
        "mamba-cache-mode": inputs.mamba_cache_mode,
        "mamba-cache-dtype": None if inputs.mamba_cache_dtype == "auto" else inputs.mamba_cache_dtype,
        "mamba-ssm-cache-dtype": None if inputs.mamba_ssm_cache_dtype == "auto" else inputs.mamba_ssm_cache_dtype,
        "max-model-len": length,
        "gpu-memory-utilization": utilization,
        "kv-cache-memory-bytes": draft.kv_bytes if pinned else None,
        "num-gpu-blocks-override": inputs.num_gpu_blocks_override,
        "enable-extensible-kv-cache": True if inputs.extensible_kv_cache else None,
        "no-enable-extensible-kv-cache": True if inputs.extensible_kv_cache is False else None,
        "max-num-seqs": seqs,
        "max-num-batched-tokens": batched,
        "block-size": block_size,
        "kv-cache-dtype": kv_flag,
        "enforce-eager": True if inputs.enforce_eager else None,
        "disable-custom-all-reduce": True if not inputs.custom_all_reduce else None,
        "compilation-config": inputs.compilation_config,
        "scheduler-cls": flags.GUARD_SCHEDULER if guard_named(inputs) else None,
        "max-num-queued-reqs": inputs.max_queued,
    }
    chosen = {name: value for name, value in engine_flags.items() if value is not None}
    if (
        pinned
        and not release_options.has("--kv-cache-memory-bytes")
        and release_options.has("--num-gpu-blocks-override")
    ):
        blocks = draft.kv_bytes // bytes_per_block
        chosen = {
            ("num-gpu-blocks-override" if name == "kv-cache-memory-bytes" else name): value
            for name, value in chosen.items()
        }
        chosen["num-gpu-blocks-override"] = blocks
        draft.notes.append(
            f"{release.label} has no --kv-cache-memory-bytes (from 0.10.2): the pinned {format_bytes(draft.kv_bytes)} is "
            f"emitted as --num-gpu-blocks-override {blocks} ({bytes_per_block} B per block)"
        )
    _check_block_size(release_options, block_size, release.label)
    problem = options.missing(release_options, _spelled(chosen), release.label)
    if problem:
        raise UsageError(problem)
    return chosen


def _spelled(chosen: dict[str, Any]) -> dict[str, Any]:
    """The options as the release's option table spells them (`--no-X` of a boolean is `--X`'s negation)."""
    out: dict[str, Any] = {}
    for name, value in chosen.items():
        if name == "no-enable-extensible-kv-cache":
            name = "enable-extensible-kv-cache"
        out[name] = value
    return out


def _check_block_size(release_options: options.ReleaseOptions, block_size: int, label: str) -> None:
    choices = release_options.block_sizes
    if choices is not None and block_size not in choices.values:
        raise UsageError(
            f"--block-size {block_size}: {label} takes {', '.join(map(str, choices.values))} "
            f"(vllm {release_options.read} wheel, {choices.source})"
        )


_DTYPE_FLAGS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # vLLM's --dtype values


def guard_named(inputs: PlanInputs) -> bool:
    """The plan names the KV-guard scheduler: with --guard, or by default while the guard holds stock vLLM's
    goodput on bench/guard_goodput.py (GUARD_BY_DEFAULT). Never by default for models with recurrent-state layers:
    the guard projects their state groups as if they grew with every token (vLLM's MambaManager has no per-request
    cap) and would hold requests back."""
    if inputs.guard is not None:
        return inputs.guard
    return flags.GUARD_BY_DEFAULT and not inputs.spec.has_state


def _lora_flags(lora: LoraSlots | None) -> dict[str, Any]:
    """--enable-lora and the LoRA options that differ from vLLM's defaults (vllm/config/lora.py)."""
    if lora is None:
        return {}
    default = LoraSlots()
    return {
        "enable-lora": True,
        "max-loras": lora.max_loras if lora.max_loras != default.max_loras else None,
        "max-lora-rank": lora.max_rank if lora.max_rank != default.max_rank else None,
        "fully-sharded-loras": True if lora.fully_sharded else None,
        "lora-dtype": lora.dtype if lora.dtype != default.dtype else None,
    }


def _quantization(inputs: PlanInputs, draft: Draft) -> str | None:
    """--quantization as vLLM takes it: a pasted command's own value; fp8 asked of a checkpoint without a
    quantization_config, which vLLM quantizes as it loads it (online FP8, per-tensor scales: `Fp8Config` with
    `is_checkpoint_fp8_serialized` false); else none, as vLLM reads the checkpoint's own quantization_config. Another
    format asked of an unquantized checkpoint plans a quantized copy of it, which the plan says."""
    asked, spec, given = inputs.quantization.lower(), inputs.spec, inputs.quantization_method
    if given and flags.quantization(given) == asked:  # not when a format typed beside the command replaced it
        return given
    if asked in ("auto", "bf16", "fp16", "fp32") or spec.quantization:  # a float format is --dtype's
        return None
    if asked == "fp8":
        return "fp8"
    draft.warnings.append(
        f"--quantization {asked}: planned for {spec.name}'s weights in {asked}, but its config has no "
        f"quantization_config and vLLM reads {asked} weights only from a checkpoint quantized so: serve such a copy "
        "with this command's flags (vLLM quantizes at load with --quantization fp8 alone)"
    )
    return None
