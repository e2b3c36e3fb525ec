"""TGI's own `--max-batch-prefill-tokens` when the flag is not given, release by release: read from
`launcher/src/main.rs` of huggingface/text-generation-inference at each tag (re-expressed here, not copied).

- 0.9-1.x: the clap default, 4096. 2.x: `max_input_tokens + 50` (v2.4.1 l.1732-1740). Both are planned in plan.py.
- 3.0.0 onward (PRs #2797 "Auto max prefill", #2806 A100, #2808; none of them in v2.4.1), `main` at the tag
  (v3.0.0 l.2031-2057, v3.3.7 l.2114-2151), in this order:
  1. compute-optimal: the shards' f16 peak over the model's FLOPs per token, `(card FLOP/s x num_shard) //
     flop()` (`compute_optimal`, v3.0.0 l.32, v3.3.7 l.28), kept only above 100. The card is the first line of
     `nvidia-smi --query-gpu=gpu_name --format=csv` with spaces as dashes, lowercased (`compute_type`, v3.3.7
     l.1819): a card not in the release's table ('Unkown compute for card nvidia-geforce-rtx-3090'), or no
     nvidia-smi (the ROCm image), gives no value. `Config::flop` (v3.3.7 l.281) is None for a config with a
     `vision_config`; else per layer 2 x hidden x head_dim x (3 x heads + 2 x kv heads) for attention plus
     6 x hidden x intermediate_size x (num_experts_per_tok + n_shared_experts) for the MLP, times the layers.
  2. else the fallback: 4096; from v3.1.1 (l.2062-2071) `model_type` qwen2_vl / qwen2_5_vl 10000; from v3.2.0
     (l.2067) gemma3 8000 (the config's top-level model_type: gemma3_text, Gemma 3 1B, has no vision_config and
     takes step 1).
  3. at most the config's max_position_embeddings (else max_seq_len, else n_positions), when it has one.
  4. at most the VRAM cap (`vram_maximum`, v3.0.0 l.66, v3.3.7 l.62): nvidia-smi's memory.total of the first
     GPU x num_shard x --cuda-memory-fraction x TGI_WIGGLE_ROOM (read by the launcher itself, default 0.95 in
     every 3.x release even where the server's is 0.93 or 0.90; f32 arithmetic), less the model's 16-bit size
     (`model_vram`), over the bytes per token (`token_vram`: 16-bit K and V of every layer plus 3 x 2 bytes x
     1.5 x intermediate_size x num_local_experts); no cap for a checkpoint whose config names a quantization
     (`model_vram` and `kv_vram_per_tok` return None), nor when the model does not fit (a warning).
  The launcher logs the result: "Default `max_batch_prefill_tokens` to N". There is no clamp to
  max_input_tokens or max_total_tokens: the router refuses a value below max_input_tokens without prefill
  chunking and one above the KV pool (backends/v3/src/main.rs l.188-193 at v3.3.7).
  A config the launcher cannot parse (`get_config(...).ok()`: a `quantization_config.quant_method` its
  `Quantization` enum lacks, such as fbgemm_fp8 or mxfp4) leaves it none of these: 4096, no clamp.

The card table (`ComputeType::f16_flop`) grew by release: 3.0.0 RTX 4090, T4, L4, L40, L40S, A10G, H100 80GB HBM3,
A100-SXM4-80GB (and a bare "nvidia-a100"); 3.0.2 adds A40, "nvidia-h100-nvl", "nvidia-h100", A100-SXM4-40GB and
A100 80GB PCIe; 3.1.0 adds H200. Its names must equal nvidia-smi's: 'NVIDIA GeForce RTX 4090' becomes
'nvidia-geforce-rtx-4090', never the table's 'nvidia-4090', and 'Tesla T4' never 'nvidia-t4', so those two rows
never match. TGI's figures are its own (dense f16 tensor peaks, H100 900 TFLOP/s where the datasheet's SXM figure is
989), and the rule is TGI's, so they are used as TGI has them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvops.engines.release import Version
from kvops.engines.tgi import options
from kvops.frozen import frozen
from kvops.gpus import Gpu

FALLBACK = 4096
SOURCE = "huggingface/text-generation-inference launcher/src/main.rs"
LAUNCHER_WIGGLE_ROOM = 0.95  # the launcher's own TGI_WIGGLE_ROOM default, for `vram_maximum`
OPTIMAL_FLOOR = 100  # `compute_optimal` ignores a quotient this small or smaller ("Most likely an error")

# nvidia-smi's name as the launcher keys it -> (TGI's f16 TFLOP/s for one card, the first release with the row)
CARD_TFLOPS: dict[str, tuple[int, Version]] = {
    "nvidia-4090": (82, Version(3, 0, 0)),
    "nvidia-t4": (65, Version(3, 0, 0)),
    "nvidia-l4": (121, Version(3, 0, 0)),
    "nvidia-l40": (181, Version(3, 0, 0)),
    "nvidia-l40s": (363, Version(3, 0, 0)),
    "nvidia-a10g": (125, Version(3, 0, 0)),
    "nvidia-h100-80gb-hbm3": (900, Version(3, 0, 0)),
    "nvidia-a100-sxm4-80gb": (312, Version(3, 0, 0)),
    "nvidia-a100": (312, Version(3, 0, 0)),
    "nvidia-a40": (149, Version(3, 0, 2)),
    "nvidia-h100-nvl": (900, Version(3, 0, 2)),
    "nvidia-h100": (900, Version(3, 0, 2)),
    "nvidia-a100-sxm4-40gb": (312, Version(3, 0, 2)),
    "nvidia-a100-80gb-pcie": (312, Version(3, 0, 2)),
    "nvidia-h200": (989, Version(3, 1, 0)),
}

# model_type -> (the fallback, the first release with it)
FALLBACKS: dict[str, tuple[int, Version]] = {
    "qwen2_vl": (10_000, Version(3, 1, 1)),
    "qwen2_5_vl": (10_000, Version(3, 1, 1)),
    "gemma3": (8000, Version(3, 2, 0)),
}

# checkpoint formats that need a pre-quantized checkpoint, whose config.json then names its quant_method
PREQUANTIZED = ("awq", "gptq", "compressed-tensors", "exl2", "marlin")


@frozen
class PrefillDefault:
    tokens: int
    why: str


def card(gpu: Gpu | None) -> str | None:
    """The name the launcher looks the card up by; None where it runs no nvidia-smi (ROCm) or the GPU is unnamed."""
    if gpu is None or gpu.vendor != "nvidia":
        return None
    return gpu.name.replace(" ", "-").lower()


def card_flops(name: str, version: Version) -> int | None:
    row = CARD_TFLOPS.get(name)
    if row is None or not version >= row[1]:
        return None
    return row[0] * 10**12


class _Unreadable(Exception):
    """A field the launcher's serde would refuse: the whole config.json is then ignored."""


def _count_or(config: Mapping[str, Any], key: str, absent: int) -> int:
    value = _count(config, key)
    return absent if value is None else value


def _count(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Unreadable(key)
    return value


@frozen
class LauncherConfig:
    """config.json's fields as the launcher's `RawConfig` -> `Config` reads them (v3.3.7 l.206-400)."""

    model_type: str | None
    max_position_embeddings: int | None
    quantized: bool
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    num_layers: int | None
    intermediate_size: int | None
    vocab_size: int | None
    vision: bool
    experts_per_token: int
    shared_experts: int
    experts: int

    def shape(self) -> tuple[int, int, int, int, int, int] | None:
        """(heads, kv heads, head dim, hidden, intermediate, layers), or None where the config lacks one."""
        fields = (
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.hidden_size,
            self.intermediate_size,
            self.num_layers,
        )
        if any(value is None for value in fields):
            return None
        return tuple(int(value) for value in fields)  # type: ignore[return-value, arg-type]

    def flop(self) -> int | None:
        """FLOPs per token (`Config::flop`); None for a VLM or a missing field."""
        shape = self.shape()
        if self.vision or shape is None:
            return None
        heads, kv, head, hidden, inter, layers = shape
        attention = 2 * head * hidden * (3 * heads + 2 * kv)  # q, attention, o; k and v
        mlp = 6 * hidden * inter * (self.experts_per_token + self.shared_experts)
        return (attention + mlp) * layers

    def model_bytes(self) -> int | None:
        """`Config::model_vram`: its 16-bit parameter count, as it counts them (None when quantized)."""
        shape = self.shape()
        if self.quantized or shape is None or self.vocab_size is None:
            return None
        heads, kv, head, hidden, inter, layers = shape
        layer = 3 * inter * self.experts * hidden + (heads + 2 * kv) * head + heads * head * hidden
        return 2 * (layer * layers + 2 * hidden * self.vocab_size)

    def token_bytes(self) -> int | None:
        """`Config::token_vram`: 16-bit K and V of every layer plus its MLP estimate (None when quantized)."""
        if self.quantized or None in (self.num_kv_heads, self.head_dim, self.num_layers, self.intermediate_size):
            return None
        kv = int(self.num_kv_heads) * 2 * int(self.head_dim) * 2 * int(self.num_layers)  # type: ignore[arg-type]
        inter = int(self.intermediate_size)  # type: ignore[arg-type]
        return kv + (inter + inter // 2) * self.experts * 2 * 3


def launcher_config(config: Mapping[str, Any] | None, version: Version) -> LauncherConfig | str:
    """The launcher's view of config.json, or why it has none."""
    if config is None:
        return "kvops has no config.json for the model"
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, Mapping) else None
    if method is not None and method not in options.for_version(version).quantize:
        return f"its config.json names quant_method {method!r}, which the launcher's `Quantization` cannot parse"
    try:
        hidden = _count(config, "hidden_size")
        hidden = hidden if hidden is not None else _count(config, "n_embd")
        heads = _count(config, "num_attention_heads")
        kv = _count(config, "num_key_value_heads")
        head_dim = _count(config, "head_dim")
        if head_dim is None and hidden is not None and heads and hidden % heads == 0:
            head_dim = hidden // heads
        text = config.get("text_config")
        if head_dim is None and isinstance(text, Mapping) and version.at_least(3, 2, 1):
            head_dim = _count(text, "head_dim")  # `get_head_dim` from v3.2.1
            if head_dim is None and config.get("model_type") == "gemma3" and version.at_least(3, 3):
                head_dim = 256
        positions = next(
            (
                value
                for key in ("max_position_embeddings", "max_seq_len", "n_positions")
                if (value := _count(config, key)) is not None
            ),
            None,
        )
        return LauncherConfig(
            model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
            max_position_embeddings=positions,
            quantized=method is not None,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv if kv is not None else heads,
            head_dim=head_dim,
            num_layers=_count(config, "num_hidden_layers"),
            intermediate_size=_count(config, "intermediate_size"),
            vocab_size=_count(config, "vocab_size"),
            vision=config.get("vision_config") is not None,
            experts_per_token=_count_or(config, "num_experts_per_tok", 1),
            shared_experts=_count_or(config, "n_shared_experts", 0),
            experts=_count_or(config, "num_local_experts", 1),
        )
    except _Unreadable as field:
        return f"its config.json's {field.args[0]} is not a count the launcher reads"


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def vram_cap(config: LauncherConfig, gpu: Gpu, shards: int, fraction: float) -> tuple[int | None, str]:
    """`vram_maximum`: the tokens the launcher thinks the shards can hold beside the model, or None and why not."""
    model, per_token = config.model_bytes(), config.token_bytes()
    if model is None or per_token is None:
        why = "a quantized checkpoint" if config.quantized else "a field it needs is missing"
        return None, f"no VRAM cap ({why})"
    total = gpu.memory_bytes // (1 << 20) * (1 << 20) * shards  # nvidia-smi's MiB
    available = int(_f32(_f32(_f32(total) * _f32(fraction)) * _f32(LAUNCHER_WIGGLE_ROOM)))
    if available < model:
        return None, "no VRAM cap (the model's 16-bit size exceeds the memory: the launcher warns)"
    tokens = (available - model) // per_token
    return tokens, (
        f"VRAM cap {tokens:,} = ({shards} x {total // shards >> 20} MiB x {fraction:g} x TGI_WIGGLE_ROOM "
        f"{LAUNCHER_WIGGLE_ROOM:g} - {model:,} B of 16-bit model) // {per_token:,} B a token"
    )


def default(
    config_json: Mapping[str, Any] | None,
    gpu: Gpu | None,
    shards: int,
    fraction: float,
    version: Version,
    quantization: str = "auto",
) -> PrefillDefault:
    """The value a TGI 3.x launcher logs as "Default `max_batch_prefill_tokens` to N" on `shards` of `gpu`."""
    label = f"TGI {version}"
    config = launcher_config(config_json, version)
    if isinstance(config, str):
        return PrefillDefault(FALLBACK, f"{label}'s launcher default {FALLBACK}: {config} ({SOURCE})")
    if quantization.lower() in PREQUANTIZED and not config.quantized:
        config = replace(config, quantized=True)  # the checkpoint served names its quant_method
    name = card(gpu)
    per_card = card_flops(name, version) if name else None
    flop = config.flop()
    parts: list[str] = []
    tokens: int | None = None
    if per_card and flop:
        quotient = per_card * shards // flop
        if quotient > OPTIMAL_FLOOR:
            tokens = quotient
            parts.append(
                f"compute-optimal {quotient:,} = {shards} x {per_card // 10**12} TFLOP/s ({name}) // {flop:,} FLOPs a token"
            )
    if tokens is None:
        fallback, since = FALLBACKS.get(config.model_type or "", (FALLBACK, version))
        tokens = fallback if version >= since else FALLBACK
        if name is None:
            why = "no nvidia-smi in the ROCm image" if gpu is not None and gpu.vendor == "amd" else "no card name"
        elif per_card is None:
            why = f"{label} has no compute figure for card {name}"
        elif flop is None:
            why = "no FLOPs per token for a VLM config" if config.vision else "a config field it needs is missing"
        else:
            why = f"compute-optimal {per_card * shards // flop} is not above {OPTIMAL_FLOOR}"
        kind = f" for {config.model_type}" if tokens != FALLBACK else ""
        parts.append(f"fallback {tokens}{kind} ({why})")
    if config.max_position_embeddings and config.max_position_embeddings < tokens:
        tokens = config.max_position_embeddings
        parts.append(f"held to max_position_embeddings {tokens:,}")
    if gpu is not None and gpu.vendor == "nvidia":
        cap, how = vram_cap(config, gpu, shards, fraction)
        if cap is not None and cap < tokens:
            tokens = cap
            parts.append(f"reduced to the {how}")
    return PrefillDefault(tokens, f"{label}'s launcher default {tokens:,}: {'; '.join(parts)} ({SOURCE})")
