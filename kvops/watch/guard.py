"""What the admission proxy does to one request, with no I/O: the canonical path it matches and forwards, the body
parsed within limits, and the level's limits applied to the fields an engine route names (`kvops.engines.api`).

The proxy matches routes against `canonical_path(raw)` and forwards `quoted(canonical)`, so the path the upstream
decodes is the path that was guarded: a dot segment, a doubled or trailing slash, a percent-encoded letter or slash,
or a `;matrix` parameter cannot name a generation route without being guarded as one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from kvops.engines.api import Fields, Route
from kvops.policy import Limits, Priorities, RequestClass, RequestParams, clamp

# serde_json's default recursion limit: TGI itself refuses deeper bodies; no generation request nests this deep.
MAX_JSON_DEPTH = 128
# The request's priority as the proxy reads it, in vLLM's convention (the body's `priority` field: lower is served
# first, unset is 0); the policy's `priorities` section turns it into a class (sheddable, standard, protected).
PRIORITY_HEADER = "X-KVops-Priority"
_PRIORITY_DIGITS = 18  # far beyond any priority in use; a longer header is refused, not parsed
# Characters a path segment may carry unencoded (RFC 3986 pchar), minus "%" (re-encoded) and ";" (dropped).
_PATH_SAFE = "/:@!$&'()*+,=-._~"


class BodyError(ValueError):
    """A guarded request body the proxy refuses (400); the message says what is wrong."""


def request_class(header: str | None, priorities: Priorities) -> RequestClass:
    """The class of a request whose PRIORITY_HEADER is `header` (absent: priority 0, standard); BodyError when
    the header is not an integer."""
    if header is None:
        return priorities.request_class(0)
    text = header.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= _PRIORITY_DIGITS):
        raise BodyError(
            f"{PRIORITY_HEADER} {_shown(header)} must be an integer (a vLLM request priority: lower is served first)"
        )
    return priorities.request_class(int(text))


def canonical_path(raw: str) -> str:
    """The path as an upstream that decodes once sees it, with dot segments resolved, empty segments and a trailing
    slash dropped and matrix parameters removed: '/v1/./completions', '/x/../v1//completions/',
    '/v1/%63ompletions;a=b' and '/v1%2Fcompletions' all give '/v1/completions'. `raw` excludes the query."""
    if "%" not in raw and "/." not in raw and "//" not in raw and ";" not in raw and (raw == "/" or raw[-1] != "/"):
        return raw  # already canonical: the common case costs four scans
    segments: list[str] = []
    for segment in unquote(raw, errors="surrogateescape").split("/"):
        segment = segment.split(";", 1)[0]
        if segment in ("", "."):
            continue
        if segment == "..":
            if segments:
                segments.pop()
            continue
        segments.append(segment)
    return "/" + "/".join(segments)


def quoted(path: str) -> str:
    """A canonical path as it goes on the wire: what needs encoding encoded, so one decode gives `path` back."""
    return quote(path, safe=_PATH_SAFE, errors="surrogateescape")


def parse_body(raw: bytes) -> dict[str, Any]:
    """A guarded request's JSON object, or BodyError. Integers are held to Python's own digit limit (what vLLM's
    parser applies) and nesting to MAX_JSON_DEPTH."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BodyError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise BodyError("request body is not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise BodyError(f"request body is not JSON ({exc.msg})") from None
    except ValueError:  # an integer longer than sys.get_int_max_str_digits() (4300 digits)
        raise BodyError("request body has an integer too long to read (more than 4300 digits)") from None
    # every level of nesting opens a bracket: a body with few brackets needs no walk
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(body, MAX_JSON_DEPTH):
        raise BodyError(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(body, dict):
        raise BodyError("request body must be a JSON object")
    return body


def _deeper_than(document: Any, limit: int) -> bool:
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if type(node) is dict else node if type(node) is list else ()
        stack.extend((child, depth + 1) for child in children if type(child) in (dict, list))
    return False


@dataclass
class Site:
    """One generation in a body: the object that holds (or will hold) its limit fields, and their names."""

    item: dict[str, Any]  # the request (or one Vertex instance)
    fields: Fields

    @property
    def holder(self) -> dict[str, Any] | None:
        return self.item.get(self.fields.within) if self.fields.within else self.item

    def holder_for_writing(self) -> dict[str, Any]:
        if self.fields.within is None:
            return self.item
        return self.item.setdefault(self.fields.within, {})


def sites(route: Route, body: dict[str, Any]) -> list[Site]:
    """The generations a body asks for, each validated; BodyError names the first malformed field."""
    items = [body] if route.each is None else body.get(route.each)
    if not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
        raise BodyError(f'"{route.each}" must be a list of JSON objects')
    found = []
    for item in items:
        variant = next((v for v in route.variants if v.when is None or v.when in item), None)
        if variant is None:
            continue  # no request type of this route: the engine refuses it, nothing to clamp
        site = Site(item, variant.fields)
        _validate(site)
        found.append(site)
    return found


def _validate(site: Site) -> None:
    fields, holder = site.fields, site.holder
    if holder is None:
        return
    if not isinstance(holder, dict):
        raise BodyError(f'"{fields.within}" must be a JSON object')
    for name in (*fields.tokens, fields.n, fields.best_of):
        value = holder.get(name) if name else None
        if value is not None and (type(value) is not int or value < 1):
            raise BodyError(f'"{name}" must be a positive integer, got {_shown(value)}')
    if fields.beam_search and fields.beam_search in holder and type(holder[fields.beam_search]) is not bool:
        raise BodyError(f'"{fields.beam_search}" must be true or false')


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def apply_limits(found: list[Site], limits: Limits) -> list[str]:
    """Clamp each generation in place; what changed ('max_tokens 1024->512', 'n 4->1'), each change once."""
    changes: list[str] = []
    for site in found:
        for change in _clamp_site(site, limits):
            if change not in changes:
                changes.append(change)
    return changes


def _clamp_site(site: Site, limits: Limits) -> list[str]:
    fields, holder = site.fields, site.holder or {}
    given = [name for name in fields.tokens if holder.get(name) is not None]
    n = (holder.get(fields.n) if fields.n else None) or 1
    beams = n if fields.beam_search and holder.get(fields.beam_search) else None
    params = RequestParams(
        max_tokens=min(holder[name] for name in given) if given else fields.default,
        n=n,
        best_of=holder.get(fields.best_of) if fields.best_of else None,
        beam_width=beams,
    )
    clamped, changes = clamp(params, limits)
    cap = clamped.max_tokens
    if cap is not None and cap != params.max_tokens:
        names = given or ([fields.add] if fields.add else [])
        if not names:  # the engine requires the field and the request lacks it: the engine refuses it
            changes = [change for change in changes if not change.startswith("max_tokens ")]
        else:
            writable = site.holder_for_writing()
            for name in names:
                writable[name] = cap
            changes += _lower_dependents(site.item, writable, fields, cap)
    if fields.n and (clamped.n != params.n or clamped.beam_width != params.beam_width):
        site.holder_for_writing()[fields.n] = 1
    if fields.best_of and clamped.best_of != params.best_of:
        site.holder_for_writing()[fields.best_of] = 1
    if beams is not None:  # with beam search, n is the beam width: report it once, as beam_width
        changes = [change for change in changes if not change.startswith("n ")]
    return changes


def _lower_dependents(item: dict, holder: dict, fields: Fields, limit: int) -> list[str]:
    """Fields the engine requires below the token limit (min_tokens, thinking.budget_tokens), lowered with it."""
    changes = []
    for dotted, margin in fields.below:
        *parents, name = dotted.split(".")
        owner: Any = holder if fields.within else item
        for parent in parents:
            owner = owner.get(parent) if isinstance(owner, dict) else None
        value = owner.get(name) if isinstance(owner, dict) else None
        ceiling = max(limit - margin, 0)
        if type(value) is int and value > ceiling:
            owner[name] = ceiling
            changes.append(f"{dotted} {value}->{ceiling}")
    return changes


def encode_body(body: dict[str, Any]) -> bytes:
    """A clamped body for the upstream: compact, ASCII (any lone surrogate a client sent stays an escape)."""
    return json.dumps(body, separators=(",", ":")).encode()
