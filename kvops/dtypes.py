"""KV-cache element types: how many bits a cached value takes, and what scales a quantized cache adds."""

from __future__ import annotations

from math import ceil

from kvops.errors import UsageError
from kvops.frozen import frozen

SCALE_BYTES = 4  # quantized caches keep their scales in fp32


@frozen
class KvDtype:
    """One KV element type.

    scales:
      "none"           - plain floats;
      "per_tensor"     - one fp32 k_scale and v_scale per layer (vLLM/TGI fp8): fixed bytes kept with the
                         weights, not per token, so they do not enter the cache figures;
      "per_token_head" - one fp32 scale per token per KV head, for K and for V (vLLM int8/int4 per-token-head):
                         counted in every per-token figure;
      "packed"         - K and V of one token and KV head packed into one slot of `slot_bytes` bytes, codes and
                         scales together (vLLM NVFP4, TurboQuant, UltraQuant, Octave: `packing` names the rule).
    """

    name: str
    bits: int
    scales: str = "none"
    packing: str = ""  # the packed slot's rule (see slot_bytes); "" for plain values

    @property
    def bytes(self) -> float:
        """The 's' of the formula (0.5 for int4)."""
        return self.bits / 8

    @property
    def is_quantized(self) -> bool:
        return self.scales != "none"

    @property
    def is_packed(self) -> bool:
        return bool(self.packing)

    def slot_bytes(self, head_k: int, head_v: int, rope_dim: int = 0) -> int:
        """Bytes of one token's K and V for one KV head, as vLLM's backends pack them (`state_content_bytes`)."""
        return packed_slot_bytes(self.packing, head_k, head_v, rope_dim or head_k)

    def scale_note(self) -> str:
        if self.scales == "per_tensor":
            return f"{self.name}: one fp32 k_scale and v_scale per layer ({2 * SCALE_BYTES} B per layer, held with the weights, not in the cache)"
        if self.scales == "per_token_head":
            return f"{self.name}: one fp32 scale per token per KV head for K and for V ({2 * SCALE_BYTES} B per token per KV head per layer, counted)"
        if self.packing:
            return (
                f"{self.name}: K and V packed per token and KV head with their scales ({PACKING_SOURCES[self.packing]})"
            )
        return ""


# vLLM's packed KV layouts, per token and KV head (K + V), as the wheels 0.20.0-0.34.0 compute them:
# - nvfp4: per side head/2 bytes of fp4 values + head/16 fp8 block scales (utils/torch_utils.py
#   nvfp4_kv_cache_full_dim; v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes in 0.20.0, FlashInfer's
#   customize_spec with 2 x kv heads slots in 0.34.0);
# - turboquant K/V bits: key = head bytes (fp8, 8 bits) or ceil(head x bits / 8) + 2 (fp16 norm), value =
#   ceil(head x bits / 8) + 4 (fp16 scale and zero), the slot rounded up to even
#   (model_executor/layers/quantization/turboquant/config.py slot_size_aligned, TQ_PRESETS);
# - ultraquant: per side head/2 bytes of fp4 codes + one E8M0 byte per 32 (v1/attention/ops/ultraquant/format.py
#   slot_size, GROUP_SIZE 32; 0.32.0+);
# - octave V bits (compact): K's rotary dims at 4 bits and the rest at 3 (compact: all at 3), V at its bits, two
#   bytes per scale (one per 64-dim K block, or one for compact K, and one for V), rounded up to 8 (compact 4)
#   (v1/attention/ops/rocm_octave.py OctaveFormat.slot_bytes; 0.33.0+, ROCm).
PACKING_SOURCES = {
    "nvfp4": "vllm utils/torch_utils.py nvfp4_kv_cache_full_dim: head/2 + head/16 per side",
    "tq:8:4": "vllm turboquant/config.py TQ_PRESETS turboquant_k8v4, slot_size_aligned",
    "tq:4:4": "vllm turboquant/config.py TQ_PRESETS turboquant_4bit_nc, slot_size_aligned",
    "tq:3:4": "vllm turboquant/config.py TQ_PRESETS turboquant_k3v4_nc, slot_size_aligned",
    "tq:3:3": "vllm turboquant/config.py TQ_PRESETS turboquant_3bit_nc, slot_size_aligned",
    "ultraquant": "vllm v1/attention/ops/ultraquant/format.py slot_size (group 32)",
    "octave:4": "vllm v1/attention/ops/rocm_octave.py OctaveFormat octave_k3v4",
    "octave:3": "vllm v1/attention/ops/rocm_octave.py OctaveFormat octave_k3v3",
    "octave:3c": "vllm v1/attention/ops/rocm_octave.py OctaveFormat octave_k3v3_compact",
}
OCTAVE_BLOCK = 64  # HADAMARD_BLOCK
ULTRAQUANT_GROUP = 32


def packed_slot_bytes(packing: str, head_k: int, head_v: int, rope_dim: int) -> int:
    """One token's K + V bytes for one KV head under a packed layout (PACKING_SOURCES names each rule)."""
    if packing == "nvfp4":
        return head_k // 2 + head_k // 16 + head_v // 2 + head_v // 16
    if packing.startswith("tq:"):
        key_bits, value_bits = (int(part) for part in packing.split(":")[1:])
        key = head_k if key_bits == 8 else ceil(head_k * key_bits / 8) + 2
        slot = key + ceil(head_v * value_bits / 8) + 4
        return slot + slot % 2
    if packing == "ultraquant":
        return head_k // 2 + head_k // ULTRAQUANT_GROUP + head_v // 2 + head_v // ULTRAQUANT_GROUP
    if packing.startswith("octave:"):
        return _octave_slot(head_k, rope_dim, packing)
    raise ValueError(f"unknown KV packing {packing!r}")


def _octave_slot(head: int, rope_dim: int, packing: str) -> int:
    compact = packing.endswith("c")
    v_bits = int(packing.split(":")[1].rstrip("c"))
    wide = 0 if compact else rope_dim
    k_bytes = wide * 4 // 8 + (head - wide) * 3 // 8
    scales = (1 if compact else head // OCTAVE_BLOCK) + 1
    raw = k_bytes + head * v_bits // 8 + 2 * scales
    align = 4 if compact else 8
    return -(-raw // align) * align


KV_DTYPES = {
    "fp32": KvDtype("fp32", 32),
    "fp16": KvDtype("fp16", 16),
    "bf16": KvDtype("bf16", 16),
    "fp8": KvDtype("fp8", 8, "per_tensor"),
    "fp8_e4m3": KvDtype("fp8_e4m3", 8, "per_tensor"),
    "fp8_e5m2": KvDtype("fp8_e5m2", 8, "per_tensor"),
    "int8": KvDtype("int8", 8, "per_token_head"),
    "int4": KvDtype("int4", 4, "per_token_head"),
    "fp8_per_token_head": KvDtype("fp8_per_token_head", 8, "per_token_head"),
    "nvfp4": KvDtype("nvfp4", 4, "packed", "nvfp4"),
    "nvfp4_4over6": KvDtype("nvfp4_4over6", 4, "packed", "nvfp4"),
    "turboquant_k8v4": KvDtype("turboquant_k8v4", 6, "packed", "tq:8:4"),
    "turboquant_4bit_nc": KvDtype("turboquant_4bit_nc", 4, "packed", "tq:4:4"),
    "turboquant_k3v4_nc": KvDtype("turboquant_k3v4_nc", 4, "packed", "tq:3:4"),
    "turboquant_3bit_nc": KvDtype("turboquant_3bit_nc", 3, "packed", "tq:3:3"),
    "ultraquant_4bit": KvDtype("ultraquant_4bit", 4, "packed", "ultraquant"),
    "octave_k3v4": KvDtype("octave_k3v4", 4, "packed", "octave:4"),
    "octave_k3v3": KvDtype("octave_k3v3", 3, "packed", "octave:3"),
    "octave_k3v3_compact": KvDtype("octave_k3v3_compact", 3, "packed", "octave:3c"),
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
