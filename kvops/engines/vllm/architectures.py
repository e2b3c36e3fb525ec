"""Architectures vLLM has removed: a release after the last one that served an architecture refuses the model at
startup ("Model architecture X was supported in vLLM until vY, and is not supported anymore"), so a plan for it is
one line, not figures.

The table is `_PREVIOUSLY_SUPPORTED_MODELS` in vllm/model_executor/models/registry.py (l.799 in the 0.32.0 wheel,
l.883 in 0.34.0), text-generation architectures only, less those that are also a class of transformers itself
(BambaForCausalLM, MiniMaxForCausalLM, MptForCausalLM, ...): vLLM serves those with its Transformers backend
(`_try_resolve_transformers`), not refuses them.
"""

from __future__ import annotations

from kvops.engines.release import Version
from kvops.errors import UsageError
from kvops.model.spec import ModelSpec, SlidingWindow

# Qwen2Model (Qwen2 and Qwen3 dense, which builds on it) asserts that no layer_types mix sliding and full layers
# (vllm/model_executor/models/qwen2.py l.351-353 in the 0.32.0 wheel; the same in 0.34.0)
NO_PARTIAL_SLIDING = ("qwen2", "qwen3")

REMOVED = {
    "Phi3SmallForCausalLM": "0.9.2",
    "MotifForCausalLM": "0.10.2",
    "Phi4FlashForCausalLM": "0.10.2",
    "JAISLMHeadModel": "0.22.0",
    "InternLMForCausalLM": "0.23.0",
    "QWenLMHeadModel": "0.23.0",
    "XverseForCausalLM": "0.23.0",
    "MiniMaxText01ForCausalLM": "0.23.0",
    "MiniMaxM1ForCausalLM": "0.23.0",
    "BaiChuanForCausalLM": "0.23.0",
    "BaichuanForCausalLM": "0.23.0",
    "AquilaForCausalLM": "0.24.0",
    "Grok1ForCausalLM": "0.24.0",
    "Grok1ModelForCausalLM": "0.24.0",
    "TeleChatForCausalLM": "0.25.0",
    "Plamo2ForCausalLM": "0.26.0",
    "OuroForCausalLM": "0.26.0",
    "ArcticForCausalLM": "0.28.0",
    "Fairseq2LlamaForCausalLM": "0.28.0",
    "MPTForCausalLM": "0.28.0",
    "RWForCausalLM": "0.28.0",
    "StableLMEpochForCausalLM": "0.28.0",
}


def check_served(spec: ModelSpec, version: Version, label: str) -> None:
    """Refuse, as vLLM does, a model whose every listed architecture this release no longer serves."""
    if not spec.architectures:
        return
    last = [REMOVED.get(name) for name in spec.architectures]
    if any(found is None or version <= Version.parse(found) for found in last):
        return
    name, until = spec.architectures[0], last[0]
    raise UsageError(
        f"{label} refuses {name}: it was supported until vLLM {until} and is not anymore "
        f"(vllm/model_executor/models/registry.py); plan with --engine-version {until}"
    )


def check_built(spec: ModelSpec, label: str) -> None:
    """Refuse, as vLLM's model code does, a Qwen2/Qwen3 dense model whose window covers some layers but not all."""
    sliding = [isinstance(layer, SlidingWindow) for layer in spec.layers]
    if spec.model_type in NO_PARTIAL_SLIDING and any(sliding) and not all(sliding):
        raise UsageError(
            f"{label} refuses {spec.name}: sliding window on {sum(sliding)} of {len(sliding)} layers "
            "(max_window_layers below num_hidden_layers) is not supported by its Qwen2 model code (qwen2.py)"
        )
