"""Quoting for every context kvops writes a value into, one function per context, so that no value (a model path,
a URL, a name a user typed) can end the word, the line or the comment it sits in.

- shell: `shell_word` (POSIX single quotes; ANSI-C `$'...'` when the value holds a newline or other control
  character, so a pasted command stays on one line), `shell_line`;
- shell text kvops itself writes for the shell to expand (`~/.cache/...`, `"$PWD"/data`) is a `ShellText`, never
  built from a user's value;
- comments in YAML, shell and rule files: `comment`, every line of the text prefixed;
- environment files: `env_assignment`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ShellText(str):
    """Shell text kvops writes itself, to be expanded by the shell (a `~` or `"$PWD"`): emitted as it is."""


def shell_word(value: str) -> str:
    """One shell word that reads back as `value`, on one line."""
    if isinstance(value, ShellText):
        return str(value)
    if not _CONTROL.search(value):
        return shlex.quote(value)
    escaped = "".join(_ansi_c(char) for char in value)
    return f"$'{escaped}'"


def shell_line(words: Iterable[str]) -> str:
    return " ".join(shell_word(word) for word in words)


def comment(text: str, marker: str = "#") -> str:
    """`text` as comment lines: every line of it prefixed, control characters shown as escapes."""
    lines = text.split("\n")
    return "".join(f"{marker} {_printable(line)}\n" for line in lines)


def env_assignment(name: str, value: str) -> str:
    """NAME=value for a shell-sourced environment file (the value one shell word)."""
    return f"{name}={shell_word(value)}"


def _ansi_c(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char == "'":
        return "\\'"
    if _CONTROL.match(char):
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char, f"\\x{ord(char):02x}")
    return char


def _printable(line: str) -> str:
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group(0)):02x}", line)
