"""Byte sizes in and out: binary units (KiB, MiB, GiB, TiB) only, exact integers underneath."""

from __future__ import annotations

import re
from decimal import Decimal

from kvops.errors import UsageError

GiB = 1 << 30  # the one definition: import it from here
BINARY_UNITS = (("TiB", 1 << 40), ("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DECIMAL_UNITS = {"k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12}
_BINARY_BY_NAME = {name.lower(): size for name, size in BINARY_UNITS} | {"b": 1, "": 1}
_SINGLE_LETTER_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": GiB, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str = "size") -> int:
    """'24GiB' -> 25769803776. Binary units are exact; decimal 'GB' means 10**9, as on a spec sheet. A single letter
    reads as vLLM's own sizes do (`human_readable_int`, vllm/utils/argparse_utils.py): 'G' is 2**30, 'g' 10**9.

    Fractions of a unit are rounded down to whole bytes: '17.8GiB' -> 19112603238.
    """
    match = _SIZE.match(str(text))
    if not match:
        raise UsageError(f"{what} {text!r} is not a size; write e.g. 24GiB, 80GB, 512MiB or a byte count")
    number, unit = match.group(1), match.group(2)
    factor = _SINGLE_LETTER_BINARY.get(unit) or _BINARY_BY_NAME.get(unit.lower()) or _DECIMAL_UNITS.get(unit.lower())
    if factor is None:
        raise UsageError(
            f"{what} {text!r} has an unknown unit {match.group(2)!r}; use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB)"
        )
    value = int(Decimal(number) * factor)  # 17.8GiB: whole bytes, rounded down
    if value <= 0:
        raise UsageError(f"{what} {text!r} must be positive")
    return value


def format_bytes(n: int | float) -> str:
    """Largest binary unit with at most two decimals: 131072 -> '128 KiB', 1610612736 -> '1.5 GiB'.

    Rounded figures carry a '~' so no reader takes them for exact; the exact byte count is always in --json.
    """
    n = int(n)
    for name, size in BINARY_UNITS:
        if abs(n) >= size:
            value = n / size
            text = f"{value:.2f}".rstrip("0").rstrip(".")
            exact = float(text) * size == n
            return f"{text} {name}" if exact else f"~{text} {name}"
    return f"{n} B"


_TOKEN_COUNT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT]?)$")
_DECIMAL_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_count(text: str, what: str, *, or_auto: bool = False) -> int:
    """A count as vLLM's `human_readable_int` reads it (vllm/utils/argparse_utils.py): '32K' is 32768 (binary, upper
    case), '32k' is 32000 (decimal, lower case, decimals allowed: '25.6k'), a plain integer as it is. Decimals go
    through a float as there, so '4.02k' is 4019 tokens, the length vLLM would run. `or_auto` names 'auto' among
    the valid spellings (the caller handles it)."""
    value = str(text).strip()
    match = _TOKEN_COUNT.match(value)
    valid = "a positive integer or 'auto'" if or_auto else "a positive integer"
    suffixes = "suffixes as vLLM takes them: 32K = 32768, 32k = 32000, 1M = 1048576"
    if not match or ("." in match.group(1) and not match.group(2)):
        raise UsageError(f"{what} {text!r} is not {valid} ({suffixes})")
    number, suffix = match.groups()
    if suffix in _BINARY_SUFFIX:
        if "." in number:
            raise UsageError(
                f"{what} {text!r}: no decimals with a binary suffix ({suffix}); write {number}{suffix.lower()}"
            )
        count = int(number) * _BINARY_SUFFIX[suffix]
    else:
        count = int(float(number) * _DECIMAL_SUFFIX.get(suffix, 1))
    if count <= 0:
        raise UsageError(f"{what} {text!r} must be positive")
    return count


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")


def parse_duration(text: str, what: str) -> float:
    """'200ms' -> 0.2, '2s' -> 2.0, in seconds: the unit is required (a bare number could be either)."""
    match = _DURATION.match(str(text))
    if not match:
        raise UsageError(f"{what} {text!r} is not a duration; write it with its unit, e.g. 200ms or 2s")
    seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    if seconds <= 0:
        raise UsageError(f"{what} {text!r} must be above 0")
    return seconds
