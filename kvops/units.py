"""Byte sizes in and out: binary units (KiB, MiB, GiB, TiB) only, exact integers underneath."""

from __future__ import annotations

import re
from decimal import Decimal

from kvops.errors import UsageError

BINARY_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_DECIMAL_UNITS = {"k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12}
_BINARY_BY_NAME = {name.lower(): size for name, size in BINARY_UNITS} | {"b": 1, "": 1}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, what: str = "size") -> int:
    """'24GiB' -> 25769803776. Binary units are exact; decimal 'GB' means 10**9, as on a spec sheet.

    Fractions of a unit are rounded down to whole bytes: '17.8GiB' -> 19112603238.
    """
    match = _SIZE.match(str(text))
    if not match:
        raise UsageError(f"{what} {text!r} is not a size; write e.g. 24GiB, 80GB, 512MiB or a byte count")
    number, unit = match.group(1), match.group(2).lower()
    factor = _BINARY_BY_NAME.get(unit) or _DECIMAL_UNITS.get(unit)
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
