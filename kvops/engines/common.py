"""Engine-neutral pieces of a serving memory budget beside the weights (engines/weights.py), the device total
(engines/device_total.py) and the fitted overheads (engines/overhead_fit.py): the activation peak of a forward pass
and the sampler, a profile taken from another run, the notes every engine's plan shares. Pure arithmetic on a
ModelSpec and the plan's inputs."""

from __future__ import annotations

from math import ceil

from kvops.errors import UsageError
from kvops.model.spec import ModelSpec
from kvops.plan import PlanInputs
from kvops.profile import Profile
from kvops.units import format_bytes

QUALITY_WARNING = "quantized KV costs quality on long generations: evaluate it on your own traffic before serving"

CALIBRATE_HINT = "replace with measurements: run the engine once, `kvops calibrate --vllm-log LOG --save PROFILE`, then plan with --profile PROFILE"


# --- activations ----------------------------------------------------------------------------------------


def forward_activation_peak(spec: ModelSpec, tokens: int, tp: int = 1, activation_bytes: int = 2) -> int:
    """Largest set of tensors alive at once in one layer of a forward pass over `tokens` tokens, per GPU.

    The residual stream, the layer's input and its normed copy (3 x hidden), plus the widest of: attention (q, k, v
    and its output) or the MLP (gate+up and the activated half; for MoE the top-k experts' share). Checked on V0
    startup logs, whose profile peaks in the forward pass at long contexts: Llama-3.1-8B at 20000 and 29000
    batched tokens logged 2.07 and 2.99 GiB, this model gives 2.06 and 2.99 (tests/fixtures/corpus).
    """
    heads = spec.num_attention_heads / tp
    kv_heads = max(1, spec.num_kv_heads // tp)
    attention = 2 * heads * spec.head_dim + 2 * kv_heads * spec.head_dim
    if spec.num_experts:
        inter = spec.moe_intermediate_size or spec.intermediate_size
        mlp = max(1, spec.experts_per_token) * 3 * inter / tp + spec.num_experts
    else:
        mlp = 3 * spec.intermediate_size / tp
    width = 3 * spec.hidden_size + max(attention, mlp)
    return ceil(tokens * width * activation_bytes)


def sampler_logits(spec: ModelSpec, sequences: int) -> int:
    """Logits of one decode step for `sequences` sequences: every rank samples over the whole vocabulary."""
    return sequences * spec.vocab_size


def sampler_peak(spec: ModelSpec, sequences: int, bytes_per_logit: float) -> int:
    """The sampler's peak over one step's logits, at a release's bytes per logit (the logits, their fp32 copy and
    probabilities, and a full-vocabulary sort's values and indices where the release sorts)."""
    return ceil(sampler_logits(spec, sequences) * bytes_per_logit)


# --- profiles from another run ----------------------------------------------------------------------------


def profile_mismatch(inputs: PlanInputs, version: str, label: str) -> list[str]:
    """A profile measured on another model, GPU or engine release than the plan's: its figures may not apply."""
    profile = inputs.profile
    assert profile is not None
    out = []
    if model_measurements(inputs) is None:
        out.append(
            f"--profile was measured on model {profile.model}, not {inputs.spec.name}: its weights and activation "
            "are not used (computed for this model); its device figures are used as measured"
        )
    if profile.gpu and inputs.gpu and profile.gpu != inputs.gpu.id:
        out.append(
            f"--profile was measured on {profile.gpu}, the plan is for {inputs.gpu.id}: its device total and overheads may not apply"
        )
    if profile.engine_version and profile.engine_version.removesuffix("-v0") != version:
        out.append(
            f"--profile was measured on {profile.engine} {profile.engine_version}, the plan follows {label}: "
            f"give --engine-version {profile.engine_version} to plan that release"
        )
    return out


def model_measurements(inputs: PlanInputs) -> Profile | None:
    """The profile whose model-dependent figures (weights, activation, overheads) this plan may use: one measured
    on this model (or naming none). A profile from another model would put its weights in this model's place."""
    profile = inputs.profile
    if profile is None or (profile.model and not same_model(profile.model, inputs.spec)):
        return None
    return profile


def same_model(name: str, spec: ModelSpec) -> bool:
    """A profile's model is this one: the same id or path, or the same last path segment (a local copy)."""
    return (
        name in (spec.name, spec.source_path) or name.rstrip("/").split("/")[-1] == spec.name.rstrip("/").split("/")[-1]
    )


OVERHEAD_TERMS = ("activation", "non_torch", "cuda_graphs", "overhead")


def what_does_not_fit(terms: dict[str, int], have: int) -> str:
    """The terms that leave no KV, named: the weights alone when they exceed the budget, else weights and overheads."""
    weights = terms.get("weights", 0)
    if weights > have:
        return f"the weights alone ({format_bytes(weights)}) exceed the budget: weights and overheads"
    overheads = ", ".join(f"{name} {format_bytes(terms[name])}" for name in OVERHEAD_TERMS if terms.get(name))
    return f"weights ({format_bytes(weights)}) and overheads ({overheads})"


def paging_note(num_blocks: int, block_size: int, kv_bytes: int | None, groups: int = 1) -> str:
    """What paging does and does not do to the pool at hand: it ends fragmentation, not the total."""
    per_group = " per KV cache group" if groups > 1 else ""
    size = f" in {format_bytes(max(kv_bytes, 0))}" if kv_bytes is not None else ""
    return (
        f"paged KV (PagedAttention) removes fragmentation, not the limit: the pool still holds {num_blocks:,} blocks x "
        f"{block_size} tokens = {num_blocks * block_size:,} token slots{per_group}{size}, and every cached token takes one"
    )


def model_limit(spec: ModelSpec, given: int | str | None = None) -> int:
    """The longest context the model was trained for: the default max-model-len; the one given where the config
    names none."""
    if spec.max_position_embeddings:
        return spec.max_position_embeddings
    if isinstance(given, int):
        return given
    raise UsageError(f"{spec.name} has no max_position_embeddings: give --max-model-len N")
