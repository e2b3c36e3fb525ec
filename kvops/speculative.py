"""Speculative decoding as `--speculative-config` states it (vLLM's JSON keys, which kvops also takes for TGI's
`--speculate N`, read as {"method": "speculate", "num_speculative_tokens": N}): the method, the draft, the tokens.

The method as vLLM 0.32 settles it (`SpeculativeConfig.__post_init__`, vllm/config/speculative.py): the per-model
MTP names are "mtp"; with no method, "ngram" for the model "ngram", an EAGLE or EAGLE-3 head when the draft's name
says so ("eagle-", "eagle3"), else a draft model.
"""

from __future__ import annotations

import json
from typing import Any, TypeGuard

from kvops.errors import UsageError
from kvops.frozen import frozen

MTP_NAMES = ("deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "qwen3_next_mtp", "qwen3_5_mtp", "nemotron_h_mtp", "ernie_mtp")
DRAFTED = ("eagle", "eagle3", "draft_model", "medusa", "mlp_speculator")  # a draft "model" of their own
EXAMPLE = '{"method": "eagle3", "model": "ORG/EAGLE3-HEAD", "num_speculative_tokens": 3}'


@frozen
class SpeculativeSettings:
    method: str
    tokens: int
    model: str | None  # the draft's Hub id, catalog id or folder (None: MTP, n-gram, suffix: no draft)
    draft_tp: int | None


def speculative_settings(text: str) -> SpeculativeSettings:
    """--speculative-config JSON as vLLM reads it."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--speculative-config {text!r} is not JSON ({exc.msg}); e.g. '{EXAMPLE}'") from None
    if not isinstance(config, dict):
        raise UsageError(f"--speculative-config {text!r} must be a JSON object, e.g. '{EXAMPLE}'")
    model, tokens = config.get("model"), config.get("num_speculative_tokens")
    for key in ("model", "method"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise UsageError(f"--speculative-config {text!r}: {key} must be a string")
    method = _method(config.get("method"), str(model or "").lower())
    if not _whole(tokens, 1, MAX_TOKENS):
        raise UsageError(
            f"--speculative-config {text!r}: give num_speculative_tokens, a whole number from 1 to {MAX_TOKENS}"
        )
    if method in DRAFTED and not model:
        raise UsageError(f'--speculative-config method {method} needs "model": the draft\'s Hub id or folder')
    draft_tp = config.get("draft_tensor_parallel_size")
    if draft_tp is not None and not _whole(draft_tp, 1, 4096):
        raise UsageError(
            f"--speculative-config {text!r}: draft_tensor_parallel_size must be a whole number from 1 to 4096"
        )
    return SpeculativeSettings(method, tokens, model if method in DRAFTED else None, draft_tp)


MAX_TOKENS = 1024  # drafted tokens per step: vLLM's runs use up to a few dozen


def _whole(value: Any, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _method(method: str | None, model: str) -> str:
    if method in MTP_NAMES:
        return "mtp"
    if method == "[ngram]" or (method is None and model in ("ngram", "[ngram]")):
        return "ngram"
    if method is not None:
        return method
    if "eagle-" in model:
        return "eagle"
    return "eagle3" if "eagle3" in model else "draft_model"
