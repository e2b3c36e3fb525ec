"""An engine's HTTP API as the admission proxy sees it, engine-neutral: its generation routes, where each request
body keeps its new-token limit and its parallel sequences, and the shape of its errors.

Each engine's `api.py` lists its routes in a `RouteTable` (`ROUTES`) and names its default error shape (`ERRORS`,
for answers on paths that are not generation routes); the proxy matches the canonical request path against the
table and clamps what the route's `Fields` name. Nothing here knows an engine.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Protocol

from kvops.frozen import frozen


class ErrorShape(Protocol):
    """How an engine (or one of its APIs) spells an error: as a JSON body, and as the event that ends a stream."""

    def body(self, status: HTTPStatus, message: str) -> dict[str, Any]: ...

    def event(self, status: HTTPStatus, message: str) -> bytes:
        """A server-sent event (or events) that tells a streaming client the stream ended in an error."""
        ...


@frozen
class Fields:
    """Where one generation's limits sit in a request body, and what the engine calls them."""

    tokens: tuple[str, ...]  # the new-token limit, every spelling the engine reads; each one present is capped
    add: str | None = None  # the spelling to set when a request gives none; None: the engine requires one
    default: int | None = None  # new tokens the engine generates when none is given; None: up to the context
    n: str | None = None  # parallel sequences
    best_of: str | None = None
    beam_search: str | None = None  # a flag that makes `n` the beam width
    within: str | None = None  # the object that holds these fields ("parameters"), created when a limit is added
    # (dotted field, margin): fields the engine requires to stay at or below the limit minus margin, lowered with it
    below: tuple[tuple[str, int], ...] = ()


@frozen
class Variant:
    """One reading of a body that may be one of several request types (an untagged union, tried in order)."""

    fields: Fields
    when: str | None = None  # the key whose presence selects this reading; None: always


@frozen
class Route:
    """A generation route: POST to `path` (canonical; a `*` segment matches any one segment)."""

    path: str
    errors: ErrorShape
    variants: tuple[Variant, ...] = ()  # empty: nothing to clamp, the route is only refused at critical
    each: str | None = None  # the body is a list of generations under this key (Vertex's "instances")
    json: bool = True  # False: a body the proxy does not read (multipart audio): refused at critical, else untouched
    method: str = "POST"


class RouteTable:
    """Routes by canonical path: exact paths in a dict (one lookup per request), `*` patterns tried after."""

    def __init__(self, routes: tuple[Route, ...]):
        self.routes = routes
        self._exact = {(r.method, r.path): r for r in routes if "*" not in r.path}
        self._patterns = [(r, r.path.split("/")) for r in routes if "*" in r.path]

    def match(self, method: str, path: str) -> Route | None:
        route = self._exact.get((method, path))
        if route is not None or not self._patterns:
            return route
        segments = path.split("/")
        for candidate, pattern in self._patterns:
            if candidate.method == method and _segments_match(pattern, segments):
                return candidate
        return None

    def __iter__(self):
        return iter(self.routes)


def _segments_match(pattern: list[str], segments: list[str]) -> bool:
    return len(pattern) == len(segments) and all(p in ("*", s) for p, s in zip(pattern, segments))
