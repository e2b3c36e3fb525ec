"""`text-generation-launcher` flags (TGI v3.3.7) and the launcher's and router's own validation messages.

Messages are TGI's words (launcher/src/main.rs `LauncherError::ArgumentValidation` -> "Invalid argument: ...",
backends/v3/src/main.rs `RouterError::ArgumentValidation` -> "Argument validation error: ...",
backends/v3/src/lib.rs `V3Error::NotEnoughMemory` -> "Backend failed: Not enough memory to handle ...").
"""

from __future__ import annotations

PROGRAM = ("text-generation-launcher",)
IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7"
ROCM_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.7-rocm"
PORT = 80  # the image sets PORT=80; the bare launcher defaults to 3000
MAX_BATCH_TOTAL_TOKENS_IGNORED = "`--max-batch-total-tokens` is deprecated for Flash Attention models."


def validation_errors(
    max_input_tokens: int,
    max_total_tokens: int,
    max_batch_prefill_tokens: int,
    max_batch_total_tokens: int,
    chunking: bool,
) -> list[str]:
    """Every check TGI runs on these values, in its order, as TGI words it; empty when the launch passes."""
    errors = []
    if max_input_tokens >= max_total_tokens:
        errors.append(
            f"Invalid argument: `max_input_tokens`({max_input_tokens}) must be < `max_total_tokens`({max_total_tokens})"
        )
    if max_total_tokens > max_batch_total_tokens:
        errors.append(f"Backend failed: Not enough memory to handle `max_total_tokens={max_total_tokens}`")
    if max_input_tokens > max_batch_prefill_tokens and not chunking:
        errors.append(
            f"Argument validation error: `max_batch_prefill_tokens` must be >= `max_input_tokens`. Given: {max_batch_prefill_tokens} and {max_input_tokens}"
        )
    if max_batch_prefill_tokens > max_batch_total_tokens:
        errors.append(
            f"Argument validation error: `max_batch_prefill_tokens` must be <= `max_batch_total_tokens`. Given: {max_batch_prefill_tokens} and {max_batch_total_tokens}"
        )
    return errors


def env_name(flag: str) -> str:
    """Every launcher flag is `#[clap(long, env)]`: the env var is the field name in upper case."""
    return flag.replace("-", "_").upper()


# `--kv-cache-dtype` (and its Args dump spelling) -> kvops KV dtype: how a run's own args name it
KV_DTYPE_OF_FLAG = {"Fp8e4m3fn": "fp8_e4m3", "Fp8e5m2": "fp8_e5m2", "fp8_e4m3fn": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def image(vendor: str | None) -> str:
    """The official image for the device's vendor."""
    return ROCM_IMAGE if vendor == "amd" else IMAGE
