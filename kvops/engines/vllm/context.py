"""The context vLLM derives from a model's config.json: `_get_and_verify_max_len` in vllm/config/model.py
(l.2527 in the 0.32.0 wheel, l.2545 in 0.33.0, l.2589 in 0.34.0; the same rule in all three).

- The limit (what a longer --max-model-len is refused against) is the config's own: the smallest of
  max_position_embeddings, n_positions, max_seq_len, seq_length, ... present, model_max_length over them all
  (Command-R's 131,072 over its max_position_embeddings of 8,192: `derive_max_model_len_and_key` in
  vllm/transformers_utils/model_arch_config_convertor.py), times the RoPE scaling `factor` unless the type already scales max_position_embeddings: su, longrope, llama3,
  yarn, deepseek_yarn and deepseek_llama_scaling leave it as it is; linear, dynamic and the rest multiply it. A
  gemma3 model's limit is already scaled, and kept. A null factor reads as 1.
- The default (no --max-model-len) is that limit, except under longrope: the config's top-level
  original_max_position_embeddings, where it has one ("to avoid performance degradation for shorter sequences").
  A config that names no context runs at 2,048 (vLLM warns so) and takes any --max-model-len.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kvops.engines import common
from kvops.model.config import language_config
from kvops.model.defaults import with_defaults
from kvops.model.spec import ModelSpec

# the RoPE types whose max_position_embeddings is already the scaled context (vllm/config/model.py)
UNSCALED_TYPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# the config keys vLLM reads a context from (derive_max_model_len_and_key)
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# the context vLLM runs a model at whose config names none
UNNAMED_CONTEXT = 2048


def _rope_parameters(spec: ModelSpec) -> Iterator[Mapping[str, Any]]:
    """Each RoPE parameter set the config declares (rope_parameters, or the older rope_scaling), one per layer type
    where it is nested by layer type, as vllm/transformers_utils/config.py `iter_rope_parameters` yields them."""
    text = language_config(dict(spec.config_json or {}))
    params = text.get("rope_parameters") or text.get("rope_scaling")
    if not isinstance(params, Mapping) or not params:
        return
    if all(isinstance(value, Mapping) for value in params.values()):
        yield from (value for value in params.values() if value)
    else:
        yield params


def _rope_type(params: Mapping[str, Any]) -> str:
    return str(params.get("rope_type") or params.get("type") or "default")


def scaling_factor(spec: ModelSpec) -> float:
    """The factor vLLM multiplies the config's limit by: the last scaling type's that does not already scale it."""
    if "gemma3" in spec.model_type:  # the text config's type, as vLLM tests hf_text_config.model_type
        return 1.0
    factor: float | None = 1.0
    for params in _rope_parameters(spec):
        if _rope_type(params) not in UNSCALED_TYPES:
            factor = params.get("factor", factor)
    return float(factor) if factor is not None else 1.0


def config_context(spec: ModelSpec) -> int | None:
    """The context the config names, as vLLM reads it: model_max_length where given, else the smallest key; under
    --disable-sliding-window no longer than the window."""
    if spec.config_json is None:
        return spec.max_position_embeddings
    text = with_defaults(language_config(dict(spec.config_json)), [])  # vLLM reads the config class's defaults too
    named = {key: text[key] for key in CONTEXT_KEYS if isinstance(text.get(key), int) and text[key] > 0}
    derived = named["model_max_length"] if "model_max_length" in named else min(named.values(), default=None)
    if spec.window_cap is None:
        return derived
    return spec.window_cap if derived is None else min(derived, spec.window_cap)


def configured_window(spec: ModelSpec) -> int | None:
    """The config's sliding_window, which vLLM caps the context at under --disable-sliding-window
    (ModelConfig.get_sliding_window: hf_text_config.sliding_window)."""
    window = language_config(dict(spec.config_json or {})).get("sliding_window")
    return window if isinstance(window, int) and window > 0 else None


def max_len_limit(spec: ModelSpec) -> int | None:
    """The longest --max-model-len vLLM accepts for the model (None: the config names no limit)."""
    named = config_context(spec)
    if not named:
        return None
    return int(named * scaling_factor(spec))


def default_max_len(spec: ModelSpec) -> int | None:
    """The --max-model-len vLLM runs without one: the limit, or longrope's original_max_position_embeddings."""
    limit = max_len_limit(spec)
    original = (spec.config_json or {}).get("original_max_position_embeddings")
    if limit and original and any(_rope_type(params) in ("longrope", "su") for params in _rope_parameters(spec)):
        return int(original)
    return limit


def model_limit(spec: ModelSpec, given: int | str | None = None) -> int:
    """The longest context a plan may ask for: vLLM's limit; where the config names none, the one given, or the
    2,048 vLLM runs at."""
    limit = max_len_limit(spec)
    if limit:
        return limit
    return UNNAMED_CONTEXT if given is None else common.model_limit(spec, given)


def model_default(spec: ModelSpec) -> int:
    """The context a plan runs at when none is given, as vLLM picks it."""
    return default_max_len(spec) or UNNAMED_CONTEXT
