"""Whether a regex searched along a line runs in linear time, read from the pattern's structure (no timing).

`re.search` tries the pattern at every position of the line. It stays linear when the work of the positions it
tries does not overlap: each unbounded repeat (`*`, `+`, `{n,}`) must stop before the place another match could
begin, or be the pattern's last word. `problems(pattern)` names each repeat for which none of these holds:

- a pattern that begins with a repeat needs a lookbehind that excludes the repeat's characters (`(?<![\\d.])\\d+`
  starts only where a run of digits starts, not at each of its digits);
- a repeat after a phrase must exclude one of the characters every match has before it (a run of the repeat's
  characters cannot then hold another match's beginning, so the runs scanned from two starts do not overlap), or be
  tempered by a lookahead for that phrase (`(?:(?!PHRASE).)*` stops where the phrase occurs again);
- or whatever follows it must match at the end of the line (the first start that gets there succeeds);
- and no unbounded repeat sits inside another, nor two run side by side over the same characters.

A pattern anchored at the line's start (`^`) is tried once, so only the last rule applies to it.
"""

from __future__ import annotations

import re
from typing import Any

try:
    from re import _constants as C  # type: ignore[attr-defined]
    from re import _parser as P  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as P  # type: ignore[no-redef]

ALPHABET = frozenset([chr(code) for code in range(128)] + ["\u00e9", "\u2588", "\u00a0"])
REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT)
_CATEGORIES = {
    C.CATEGORY_DIGIT: r"\d",
    C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w",
    C.CATEGORY_NOT_WORD: r"\W",
}

Items = list[tuple[Any, Any]]


def problems(pattern: re.Pattern[str]) -> list[str]:
    """Why `pattern.search(line)` could take more than linear time; empty when its structure rules that out."""
    items: Items = list(P.parse(pattern.pattern, pattern.flags))
    found: list[str] = []
    anchored = bool(items) and items[0] == (C.AT, C.AT_BEGINNING)
    _walk(items, [], frozenset(), set(), found, anchored=anchored, nested=False)
    return sorted(set(found))


def _walk(
    items: Items,
    after: list[Items],
    required: frozenset[str],
    guard: set[str],
    found: list[str],
    *,
    anchored: bool,
    nested: bool,
) -> frozenset[str]:
    """Check the repeats of `items` (followed by `after`), given the characters every match has before them and
    those a lookbehind rules out right before them; returns the characters every match has once past `items`."""
    for index, (op, av) in enumerate(items):
        rest = [items[index + 1 :], *after]
        if op == C.ASSERT_NOT and av[0] == -1:
            guard = guard | first_chars(list(av[1]))
            continue
        if op in REPEATS and av[1] == C.MAXREPEAT:
            _repeat(list(av[2]), rest, required, guard, found, anchored=anchored, nested=nested)
            previous = first_chars(list(av[2]))
            following = _next_repeat([item for part in rest for item in part])
            if following is not None and previous & following:
                found.append("two unbounded repeats side by side over the same characters")
        elif op in REPEATS:
            _walk(list(av[2]), rest, required, guard, found, anchored=anchored, nested=nested)
        elif op == C.SUBPATTERN:
            required = _walk(list(av[-1]), rest, required, guard, found, anchored=anchored, nested=nested)
        elif op == C.BRANCH:
            ends = [_walk(list(b), rest, required, guard, found, anchored=anchored, nested=nested) for b in av[1]]
            required = frozenset.intersection(*ends)
        elif op == C.LITERAL and not nested:
            required = required | {chr(av)}
        if not _nullable([(op, av)]):
            guard = set()
    return required


def _repeat(
    body: Items,
    rest: list[Items],
    required: frozenset[str],
    guard: set[str],
    found: list[str],
    *,
    anchored: bool,
    nested: bool,
) -> None:
    chars = first_chars(body)
    tempered = _tempered(body)
    if nested and not tempered:
        found.append("an unbounded repeat inside another")
    terminal = all(_nullable(part) for part in rest) or (chars >= ALPHABET - {"\n"} and _matches_at_end(rest))
    if not (anchored or tempered or terminal):
        if not required and not chars <= guard:
            found.append(f"begins with an unbounded repeat over {_shown(chars)} that no lookbehind excludes")
        elif required and required <= chars:
            found.append(f"an unbounded repeat over {_shown(chars)} can run over another match's beginning")
    _walk(body, rest, frozenset(), set(), found, anchored=anchored, nested=True)


def _next_repeat(items: Items) -> set[str] | None:
    """The characters of the unbounded repeat that comes next with nothing required in between, if one does."""
    for op, av in items:
        if op in REPEATS and av[1] == C.MAXREPEAT:
            return first_chars(list(av[2]))
        if not _nullable([(op, av)]):
            return None
    return None


def _tempered(body: Items) -> bool:
    """`(?:(?!PHRASE).)`: one character that does not begin PHRASE."""
    if len(body) == 1 and body[0][0] == C.SUBPATTERN:
        body = list(body[0][1][-1])
    return len(body) == 2 and body[0][0] == C.ASSERT_NOT and body[0][1][0] == 1 and body[1][0] == C.ANY


def _matches_at_end(rest: list[Items]) -> bool:
    """Whether what follows can match at the end of the line (nothing, `$`, optional parts, an alternative of such)."""
    return all(_at_end(part) for part in rest)


def _at_end(items: Items) -> bool:
    for op, av in items:
        if op == C.AT and av in (C.AT_END, C.AT_END_STRING):
            continue
        if op == C.BRANCH and any(_at_end(list(branch)) for branch in av[1]):
            continue
        if op == C.SUBPATTERN and _at_end(list(av[-1])):
            continue
        if op in REPEATS and (av[0] == 0 or _at_end(list(av[2]))):
            continue
        return False
    return True


def first_chars(items: Items) -> set[str]:
    """The characters `items` can begin with (over ALPHABET, which holds a few non-ASCII ones too)."""
    chars: set[str] = set()
    for op, av in items:
        chars |= _first(op, av)
        if not _nullable([(op, av)]):
            break
    return chars


def _first(op: Any, av: Any) -> set[str]:
    if op == C.LITERAL:
        return {chr(av)}
    if op == C.NOT_LITERAL:
        return set(ALPHABET - {chr(av)})
    if op == C.ANY:
        return set(ALPHABET - {"\n"})
    if op == C.IN:
        return {char for char in ALPHABET if _in(av, char)}
    if op in REPEATS:
        return first_chars(list(av[2]))
    if op == C.SUBPATTERN:
        return first_chars(list(av[-1]))
    if op == C.BRANCH:
        return set().union(*(first_chars(list(branch)) for branch in av[1]))
    return set()


def _nullable(items: Items) -> bool:
    """Whether `items` can match the empty string."""
    for op, av in items:
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return False
        if op in REPEATS and av[0] > 0 and not _nullable(list(av[2])):
            return False
        if op == C.SUBPATTERN and not _nullable(list(av[-1])):
            return False
        if op == C.BRANCH and not any(_nullable(list(branch)) for branch in av[1]):
            return False
    return True


def _in(members: Items, char: str) -> bool:
    negate, hit = False, False
    for op, av in members:
        if op == C.NEGATE:
            negate = True
        elif op == C.LITERAL:
            hit |= char == chr(av)
        elif op == C.RANGE:
            hit |= av[0] <= ord(char) <= av[1]
        elif op == C.CATEGORY:
            hit |= re.match(_CATEGORIES[av], char) is not None
    return hit != negate


def _shown(chars: set[str]) -> str:
    text = "".join(sorted(char for char in chars if char.isprintable()))
    return repr(text if len(text) <= 16 else text[:16] + "...")
