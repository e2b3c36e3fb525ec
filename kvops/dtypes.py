"""KV-cache element types: how many bits a cached value takes, and what scales a quantized cache adds."""

from __future__ import annotations

from dataclasses import dataclass

from kvops.errors import UsageError

SCALE_BYTES = 4  # quantized caches keep their scales in fp32


@dataclass(frozen=True)
class KvDtype:
    """One KV element type.

    scales:
      "none"           - plain floats;
      "per_tensor"     - one fp32 k_scale and v_scale per layer (vLLM/TGI fp8): fixed bytes kept with the
                         weights, not per token, so they do not enter the cache figures;
      "per_token_head" - one fp32 scale per token per KV head, for K and for V (vLLM int8/int4 per-token-head):
                         counted in every per-token figure.
    """

    name: str
    bits: int
    scales: str = "none"

    @property
    def bytes(self) -> float:
        """The 's' of the formula (0.5 for int4)."""
        return self.bits / 8

    @property
    def is_quantized(self) -> bool:
        return self.scales != "none"

    def scale_note(self) -> str:
        if self.scales == "per_tensor":
            return f"{self.name}: one fp32 k_scale and v_scale per layer ({2 * SCALE_BYTES} B per layer, held with the weights, not in the cache)"
        if self.scales == "per_token_head":
            return f"{self.name}: one fp32 scale per token per KV head for K and for V ({2 * SCALE_BYTES} B per token per KV head per layer, counted)"
        return ""


KV_DTYPES = {
    "fp32": KvDtype("fp32", 32),
    "fp16": KvDtype("fp16", 16),
    "bf16": KvDtype("bf16", 16),
    "fp8": KvDtype("fp8", 8, "per_tensor"),
    "fp8_e4m3": KvDtype("fp8_e4m3", 8, "per_tensor"),
    "fp8_e5m2": KvDtype("fp8_e5m2", 8, "per_tensor"),
    "int8": KvDtype("int8", 8, "per_token_head"),
    "int4": KvDtype("int4", 4, "per_token_head"),
}

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}

KV_DTYPE_CHOICES = ("auto", *KV_DTYPES)


def canonical_dtype_name(name: str) -> str | None:
    """'bfloat16' -> 'bf16'; None when the name is no known dtype."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in KV_DTYPES else None


def resolve_kv_dtype(name: str, model_dtype: str) -> KvDtype:
    """A KV dtype by name; 'auto' is the model's own dtype, as the engines treat it."""
    key = model_dtype if name.strip().lower() == "auto" else name
    canonical = canonical_dtype_name(key)
    if canonical is None:
        raise UsageError(f"--kv-dtype {name!r} is not a KV dtype; valid: {', '.join(KV_DTYPE_CHOICES)}")
    return KV_DTYPES[canonical]


_SERVING_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def serving_dtype(name: str) -> str:
    """A serving dtype (`--dtype`) as the dtypes here name it: bf16, fp16 or fp32."""
    return _SERVING_NAMES.get(name.lower(), name.lower())
