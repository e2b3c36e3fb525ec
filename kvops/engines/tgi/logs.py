"""TGI launcher/router/shard log lines (plain text or `--json-output`), as TGI v2-v3 word them.

- router (backends/v3/src/lib.rs): "Setting max batch total tokens to 133696" (the KV pool in tokens);
  "Model does not support automatic max batch total tokens" (non-flash models: a 16000 default);
- router (backends/v3/src/main.rs): "Maximum input tokens defaulted to N", "Maximum total tokens defaulted to N";
- shard (flash_causal_lm.py): "KV-cache blocks: N, size: B";
- launcher (main.rs): "Using attention flashinfer - Prefix caching true", "Default `max_batch_prefill_tokens` to N",
  "Default `max_input_tokens` to N" and "Default `max_total_tokens` to N" (2.x), "Sharding model on N processes",
  and the `Args { ... }` dump on one line or many (model_id, num_shard, cuda_memory_fraction, ...), with or without
  its `Args` prefix (some posts keep only the braces);
- router (router/client/src/v3/sharded_client.rs in 2.x, backends/v3/src/client/sharded_client.rs in 3.x): the
  span of its `warmup` call, `warmup{max_input_length=500 max_prefill_tokens=550 max_total_tokens=13107 ...}` (3.x
  prints a figure the user left to the shard as `None`, one given as `Some(N)`), on every line logged inside it,
  a failed warmup's error among them: the figures the launch ran with;
- shard (flash_causal_lm.py, 0.9.0-0.9.3): "Not enough memory to handle 16000 total tokens with 2 prefill tokens"
  (its warmup allocates the stated `--max-batch-total-tokens`, default 16000, as the pool; 0.9.4 on sizes it itself);
- the release: the image tag a quoted command runs (`text-generation-inference:3.2.1`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kvops.engines.logs import LogFacts, LogPattern

_COUNT = r"(\d{1,18})\b"  # a count: at most 18 digits, so int() of a hostile 5,000-digit run never fails

PATTERNS: list[LogPattern] = [
    ("max_batch_total_tokens", re.compile(r"Setting max batch total tokens to " + _COUNT), lambda m: int(m.group(1))),
    ("no_automatic_total", re.compile(r"Model does not support automatic max batch total tokens"), lambda m: True),
    ("max_input_tokens", re.compile(r"Maximum input tokens defaulted to " + _COUNT), lambda m: int(m.group(1))),
    ("max_total_tokens", re.compile(r"Maximum total tokens defaulted to " + _COUNT), lambda m: int(m.group(1))),
    (
        "kv_blocks",
        re.compile(r"KV-cache blocks: " + _COUNT + r", size: " + _COUNT),
        lambda m: (int(m.group(1)), int(m.group(2))),
    ),
    ("attention", re.compile(r"Using attention (\S+) - Prefix caching (\S+)"), lambda m: (m.group(1), m.group(2))),
    (
        "max_batch_prefill_tokens",
        re.compile(r"Default `max_batch_prefill_tokens` to " + _COUNT),
        lambda m: int(m.group(1)),
    ),
    ("num_shard", re.compile(r"Sharding model on " + _COUNT + r" processes"), lambda m: int(m.group(1))),
    ("launcher_max_input_tokens", re.compile(r"Default `max_input_tokens` to " + _COUNT), lambda m: int(m.group(1))),
    ("launcher_max_total_tokens", re.compile(r"Default `max_total_tokens` to " + _COUNT), lambda m: int(m.group(1))),
    ("version", re.compile(r"text-generation-inference:v?(\d+\.\d+\.\d+)\b"), lambda m: m.group(1)),
    (
        "warmup",
        re.compile(
            r"warmup\{max_input_length=(?:Some\()?(\d{1,18}|None)\)? max_prefill_tokens="
            + _COUNT
            + r" max_total_tokens=(?:Some\()?(\d{1,18}|None)\b"
        ),
        lambda m: (_count(m.group(1)), int(m.group(2)), _count(m.group(3))),
    ),
    (
        "pool_out_of_memory",
        re.compile(r"Not enough memory to handle " + _COUNT + r" total tokens with " + _COUNT + r" prefill tokens"),
        lambda m: (int(m.group(1)), int(m.group(2))),
    ),
]
_ARGS = re.compile(r"Args \{(.*?)(?:\}\s*$|$)")
_BARE_ARGS = re.compile(r"^\s*\{ model_id: .*\}\s*$")
_ARG_FIELDS = {
    "model_id": re.compile(r'model_id: "([^"]+)"'),
    "num_shard": re.compile(r"num_shard: Some\((\d+)\)"),
    "cuda_memory_fraction": re.compile(r"cuda_memory_fraction: ([\d.]+)"),
    "max_batch_prefill_tokens": re.compile(r"max_batch_prefill_tokens: (?:Some\()?(\d+)"),
    "max_total_tokens": re.compile(r"max_total_tokens: (?:Some\()?(\d+)"),
    "max_input_tokens": re.compile(r"max_input_(?:tokens|length): (?:Some\()?(\d+)"),
    "kv_cache_dtype": re.compile(r"kv_cache_dtype: Some\((\w+)\)"),
    # a bare count is 0.9.0-0.9.3's `u32` (default 16000): the pool itself; `Some(N)` (0.9.4 on) only caps the one
    # the warmup sizes, and a flash model's is ignored (backends/v3/src/lib.rs), so it is left out
    "max_batch_total_tokens": re.compile(r"max_batch_total_tokens: (\d+)"),
}


@dataclass
class TgiLog(LogFacts):
    """What one TGI launcher log says: its facts and the launcher's own argument dump."""

    args: dict[str, Any] = field(default_factory=dict)


def parse_tgi_log(text: str) -> TgiLog:
    log = TgiLog()
    lines = [_message(raw) for raw in text.splitlines()]
    for line in lines:
        log.read(line, PATTERNS)
    _spread_warmup(log)
    dump = _args_dump(lines)
    if dump:
        log.args = _args(dump)
    return log


def _count(text: str) -> int | None:
    return None if text == "None" else int(text)


def _spread_warmup(log: TgiLog) -> None:
    """The warmup span's figures as facts of their own (`warmup_max_prefill_tokens`, ...), each with its line."""
    warmup = log.facts.pop("warmup", None)
    line, words = log.lines.pop("warmup", ""), log.matches.pop("warmup", "")
    if warmup is None:
        return
    for name, value in zip(("max_input_tokens", "max_prefill_tokens", "max_total_tokens"), warmup):
        if value is not None:
            log.facts[f"warmup_{name}"] = value
            log.lines[f"warmup_{name}"], log.matches[f"warmup_{name}"] = line, words


def _args_dump(lines: list[str]) -> str | None:
    """The launcher's `Args { ... }` dump: on one line, over many (2.x prints it pretty), or its braces alone."""
    for index, line in enumerate(lines):
        if line.rstrip().endswith("Args {"):
            body = []
            for following in lines[index + 1 :]:
                if following.strip() == "}":
                    break
                body.append(following.strip())
            return " ".join(body)
        if match := _ARGS.search(line):
            return match.group(1)
        if _BARE_ARGS.match(line):
            return line.strip()[1:-1]
    return None


def _message(raw: str) -> str:
    """A `--json-output` line's message, or the plain line."""
    text = raw.strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, a 5,000-digit number, nesting past the recursion limit
            return text
        if isinstance(record, dict):
            nested = record.get("fields")
            fields = nested if isinstance(nested, dict) else record
            return str(fields.get("message", text))
    return text


def _args(body: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, pattern in _ARG_FIELDS.items():
        match = pattern.search(body)
        if match:
            value = match.group(1)
            try:  # a log is input: "1.2.3" or 5,000 digits are left out, not a traceback
                found[name] = (
                    float(value) if name == "cuda_memory_fraction" else int(value) if value.isdigit() else value
                )
            except ValueError:
                continue
    return found
