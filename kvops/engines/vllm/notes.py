"""What a vLLM plan says beside its figures: the KV guard (named or not, and why), speculative decoding, sliding
windows, replicated KV heads, quantized KV."""

from __future__ import annotations

from kvops.dtypes import KvDtype
from kvops.engines import common
from kvops.engines.vllm import context, flags, layout
from kvops.engines.vllm.capacity import Draft, VllmCapacity
from kvops.engines.vllm.launch import guard_named
from kvops.engines.vllm.releases import VllmRelease, nvidia_id
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs


def guard_note(inputs: PlanInputs, capacity: VllmCapacity) -> str:
    if guard_named(inputs):
        return (
            f"KV guard: --scheduler-cls {flags.GUARD_SCHEDULER} loads a plugin from vLLM's own Python: pip install "
            "kvops into the environment that runs vLLM (check there: python -c 'import kvops_vllm.scheduler'). The "
            "official image has none: --format docker/k8s leave the flag out; `kvops manifests` adds the plugin. "
            f"{_refusal_route(inputs)}"
        )
    if inputs.guard is False:
        return "KV guard: not named (--no-guard)"
    held = capacity.requests_at_full
    measured = flags.GUARD_LARGE_POOL if held >= flags.GUARD_POOL_REQUESTS else flags.GUARD_SMALL_POOL
    return (
        f"KV guard: not named by default; this pool holds {held} requests of the planned size at once, {measured}; "
        "your traffic decides: kvops simulate with this plan's options and --compare stock,guard; --guard names it "
        "(kvops installed in vLLM's own Python)"
    )


def _refusal_route(inputs: PlanInputs) -> str:
    """Where a client of this deployment gets a refusal it can retry: the guard itself only holds requests."""
    held = "At a level that refuses, the guard keeps new requests waiting in vLLM's queue (never an empty answer)"
    retry = (
        f"for 429/503 with Retry-After add --middleware {flags.MIDDLEWARE} (inside vLLM's API server; "
        "kvops manifests adds it)"
        if flags.middleware(True, inputs.replicas)
        else "for 429/503 with Retry-After put `kvops watch --proxy` in front (kvops manifests does)"
    )
    if inputs.max_queued is not None:
        return (
            f"{held}; beyond {inputs.max_queued} requests in flight (waiting + running) vLLM refuses with 503 (an error event in a stream, no "
            f"Retry-After); {retry}"
        )
    return f"{held}; {retry}, or bound the queue with --max-queued"


def cpu_mla_note(amx: bool, block_size: int) -> str:
    """vLLM's CPU build picks its MLA kernel, and so the block size, by the host's AMX tiles (kvops.cpu_features)."""
    if amx:
        kernel, other = "AMX tiles on this host: vLLM's AMX MLA kernel", "a host without them runs 16-token blocks"
    else:
        kernel, other = "no AMX tiles on this host: vLLM's reference MLA kernel", "a host with them runs 128"
    return f"CPU MLA: {kernel}, {block_size}-token blocks (vllm/platforms/cpu.py); {other} (--block-size plans it)"


def mla_backend_note(inputs: PlanInputs, release: VllmRelease, dtype: KvDtype, block_size: int) -> str:
    """The MLA backend kvops takes vLLM to pick on this GPU, which decides the block (and a sparse model's fp8
    layout); --attention-backend picks another, which kvops cannot see."""
    gpu = nvidia_id(inputs.gpu)
    if inputs.spec.is_sparse_mla:
        picked = f"sparse MLA: 64-token blocks (the indexer's kernel){_sparse_storage(release, gpu, dtype)}"
    elif chosen := release.gpu_mla_backend(gpu, dtype.bits == 8):
        picked = f"MLA: vLLM runs {chosen[0]} on this GPU, {block_size}-token blocks"
    else:
        picked = f"MLA: vLLM's backend on this GPU not read by kvops, FlashMLA's {block_size}-token blocks planned"
    return f"{picked} (platforms/cuda.py); --attention-backend picks another: give --block-size to plan its block"


def _sparse_storage(release: VllmRelease, gpu: str | None, dtype: KvDtype) -> str:
    if release.sparse_mla_always_ds(gpu):
        return ", any cache as fp8_ds_mla, 656 B a token (FLASHINFER_MLA_SPARSE_SM120)"
    if dtype.bits != 8:
        return ""
    return f", an fp8 cache as {'fp8_ds_mla, 656 B' if release.sparse_mla_fp8_ds(gpu) else 'plain fp8, 576 B'} a token"


def add_notes(draft: Draft, kv_layout: layout.KVCacheLayout, dtype: KvDtype, capacity: VllmCapacity) -> None:
    inputs = draft.inputs
    draft.notes.append(guard_note(inputs, capacity))
    spec, length = inputs.spec, capacity.max_model_len
    limit = context.max_len_limit(spec)
    if limit and length > limit:
        draft.warnings.append(
            f"--max-model-len {length} exceeds {spec.name}'s {_limit_source(spec, limit)}; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    windows = sorted({group.window for group in kv_layout.groups if group.kind == "sliding" and group.window})
    if windows:
        draft.notes.append(
            f"sliding-window layers (window {', '.join(map(str, windows))}) hold about window + {capacity.max_in_flight_tokens} tokens in flight per request, not the whole context"
        )
    if inputs.device == "cpu" and spec.is_mla and inputs.block_size is None:
        draft.notes.append(cpu_mla_note(inputs.cpu_amx, kv_layout.block_size))
    if inputs.device == "gpu" and spec.is_mla and inputs.block_size is None:
        draft.notes.append(mla_backend_note(inputs, draft.release, dtype, kv_layout.block_size))
    gpu = nvidia_id(inputs.gpu)
    if inputs.device == "gpu" and spec.is_sparse_mla and draft.release.refuses_sparse_mla(gpu):
        draft.warnings.append(
            f"{spec.name}: vLLM has no sparse MLA attention backend on the {gpu} (Hopper and Blackwell only: "
            "platforms/cuda.py, v1/attention/backends/mla/); it stops at startup ('No valid attention backend found')"
        )
    if inputs.device == "cpu" and dtype.bits == 8 and not inputs.cpu_fp8_kv:
        draft.warnings.append(
            f"--kv-dtype {dtype.name}: this host has neither AVX-512 nor AMX tiles, and vLLM's CPU build refuses an "
            "fp8 KV cache without them ('FP8 KV cache on CPU requires x86 with AVX-512 or AMX': "
            "v1/attention/backends/cpu_attn.py); the command starts on a host that has them"
        )
    if dtype.is_quantized and dtype.scales == "per_token_head":
        draft.warnings.append(f"--kv-dtype {dtype.name}: {common.QUALITY_WARNING}")
    if spec.num_kv_heads < inputs.tp and not spec.is_mla:
        draft.notes.append(
            f"tp {inputs.tp} > {spec.num_kv_heads} KV heads: each KV head is replicated on {inputs.tp // spec.num_kv_heads} ranks, per-GPU KV does not shrink further"
        )
    if inputs.guard is None and spec.has_state:
        draft.notes.append(
            "the KV guard scheduler is not named: it does not yet model the state groups of hybrid models (--guard names it anyway)"
        )
    if inputs.workload.sequences > 1:
        draft.notes.append(
            f"{inputs.workload.sequences} sequences per request (n x beams): vLLM runs each as its own request; with prefix caching the prompt's full blocks are shared"
        )


def _limit_source(spec: ModelSpec, limit: int) -> str:
    """Where vLLM's limit comes from: max_position_embeddings, times a RoPE scaling factor where one applies."""
    if limit == spec.max_position_embeddings:
        return f"max_position_embeddings {limit}"
    return f"max_position_embeddings {spec.max_position_embeddings} x RoPE scaling factor {context.scaling_factor(spec):g} = {limit}"
