"""Facts read from an engine's log, engine-neutral: each engine's `logs.py` names its patterns."""

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
                try:
                    self.facts[name] = convert(match)
                except (ValueError, OverflowError):  # a number no engine prints (5,000 digits, 10**400 GiB)
                    continue
                self.lines[name] = line.strip()
                self.matches[name] = match.group(0)
