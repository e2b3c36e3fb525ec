"""What differs between serving engines, and only that: one package per engine.

Each holds how the engine turns memory into KV blocks (budget), its launch flags and their validation rules
(flags), the lines it logs at startup (logs) and the metrics it exports (metrics).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

LogPattern = tuple[str, "re.Pattern[str]", Callable[["re.Match[str]"], Any]]  # fact name, regex, value from the match


@dataclass
class LogFacts:
    """Facts read from an engine's log: the first line that matches each pattern, kept with its words."""

    facts: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, str] = field(default_factory=dict)
    matches: dict[str, str] = field(default_factory=dict)  # the words of the line each fact was read from

    def get(self, name: str, default: Any = None) -> Any:
        return self.facts.get(name, default)

    def read(self, line: str, patterns: Iterable[LogPattern]) -> None:
        for name, pattern, convert in patterns:
            if name in self.facts:
                continue
            match = pattern.search(line)
            if match:
                self.facts[name] = convert(match)
                self.lines[name] = line.strip()
                self.matches[name] = match.group(0)


def flag_args(flags: dict[str, object]) -> list[str]:
    """`--flag value ...` in order; True is a bare switch, None and False are left out, floats lose trailing zeros."""
    args: list[str] = []
    for name, value in flags.items():
        if value is True:
            args.append(f"--{name}")
        elif value is not None and value is not False:
            args += [f"--{name}", f"{value:g}" if isinstance(value, float) else str(value)]
    return args
