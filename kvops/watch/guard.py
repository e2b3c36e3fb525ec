"""What the admission proxy does to one request, with no I/O: the canonical path it matches and forwards, the body
parsed within limits, and the level's limits applied to the fields an engine route names (`kvops.engines.api`).

The proxy matches routes against `canonical_path(raw)` and forwards `quoted(canonical)`, so the path the upstream
decodes is the path that was guarded: a dot segment, a doubled or trailing slash, a percent-encoded letter or slash,
or a `;matrix` parameter cannot name a generation route without being guarded as one. Likewise the body it guards is
the body the upstream parses: a compressed one is decoded here (`decode_body`, within the size limit) and forwarded
decoded, and one it cannot decode is refused, never passed on unread.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
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


Network = IPv4Network | IPv6Network
MAX_CODINGS = 4  # content codings stacked on one body; more is an attack, not a client
_GZIP_WBITS, _ZLIB_WBITS, _RAW_WBITS = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS


class BodyError(ValueError):
    """A guarded request body the proxy refuses (400 unless `status` says otherwise); the message says what is
    wrong."""

    status = HTTPStatus.BAD_REQUEST


class UnsupportedEncoding(BodyError):
    status = HTTPStatus.UNSUPPORTED_MEDIA_TYPE  # RFC 9110 15.5.16: a content coding the server does not read


class BodyTooLarge(BodyError):
    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE


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


def parse_networks(text: str) -> tuple[Network, ...]:
    """'10.0.0.0/8,fd00::/8' (or single addresses) as networks; ValueError with a one-line message."""
    networks = []
    for word in (part.strip() for part in text.split(",")):
        if not word:
            continue
        try:
            networks.append(ip_network(word))
        except ValueError:
            try:
                suggestion = ip_network(word, strict=False)
            except ValueError:
                raise ValueError(f"{word!r} is not an IP network (CIDR, e.g. 10.0.0.0/8, or one address)") from None
            raise ValueError(f"{word!r} has host bits set; did you mean {suggestion}?") from None
    return tuple(networks)


def is_trusted(peer: str | None, networks: Iterable[Network]) -> bool:
    """Whether a connection's peer address (IPv4-mapped IPv6 read as IPv4) lies in one of `networks`."""
    if not peer:
        return False
    try:
        address = ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:  # a dual-stack listener's IPv4 client
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def content_codings(values: Iterable[str]) -> list[str]:
    """The codings of a body's Content-Encoding header(s), in the order they were applied, identity dropped."""
    codings = [coding.strip().lower() for value in values for coding in value.split(",")]
    return [coding for coding in codings if coding and coding != "identity"]


def decode_body(raw: bytes, codings: list[str], limit: int) -> bytes:
    """A body with its content codings undone (gzip, x-gzip, deflate), never more than `limit` bytes at any step
    (a small bomb cannot inflate past it); UnsupportedEncoding, BodyTooLarge or BodyError otherwise."""
    if len(codings) > MAX_CODINGS:
        raise UnsupportedEncoding(f"Content-Encoding has more than {MAX_CODINGS} content codings")
    body = raw
    for coding in reversed(codings):  # the last coding listed was applied last
        if coding in ("gzip", "x-gzip"):
            body = _inflate(body, _GZIP_WBITS, limit, "gzip")
        elif coding == "deflate":  # RFC 9110: zlib-wrapped; some clients send raw deflate
            body = _inflate(body, _ZLIB_WBITS if _zlib_header(body) else _RAW_WBITS, limit, "deflate")
        else:
            raise UnsupportedEncoding(
                f"Content-Encoding {_shown_text(coding)} is not supported on a guarded route; send identity, gzip or "
                "deflate"
            )
    return body


def _zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0  # RFC 1950 2.2


def _inflate(data: bytes, wbits: int, limit: int, name: str) -> bytes:
    """`data` inflated (gzip: each of its members in turn), or BodyTooLarge past `limit` bytes."""
    out = bytearray()
    while True:
        stream = zlib.decompressobj(wbits)
        try:
            out += stream.decompress(data, limit + 1 - len(out))
        except zlib.error:
            raise BodyError(f"request body is not valid {name}") from None
        if len(out) > limit or stream.unconsumed_tail:
            raise BodyTooLarge(f"request body decoded exceeds the proxy's limit of {limit} bytes")
        if not stream.eof:
            raise BodyError(f"request body is not valid {name} (it ends early)")
        data = stream.unused_data
        if not data:
            return bytes(out)
        if wbits != _GZIP_WBITS:
            raise BodyError(f"request body is not valid {name} (bytes after its end)")


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
    if route.each is None:
        items = [body]  # a JSON object already (parse_body): nothing to check
    else:
        listed = body.get(route.each)
        if not (isinstance(listed, list) and all(isinstance(i, dict) for i in listed)):
            raise BodyError(f'"{route.each}" must be a list of JSON objects')
        items = listed
    found = []
    for item in items:
        fields = _fields(route, item)
        if fields is None:
            continue  # no request type of this route: the engine refuses it, nothing to clamp
        site = Site(item, fields)
        _validate(site)
        found.append(site)
    return found


def _fields(route: Route, item: dict[str, Any]) -> Fields | None:
    """The fields of the route's first request type that `item` reads as, or None."""
    for variant in route.variants:
        if variant.when is None or variant.when in item:
            return variant.fields
    return None


def _validate(site: Site) -> None:
    fields, holder = site.fields, site.holder
    if holder is None:
        return
    if not isinstance(holder, dict):
        raise BodyError(f'"{fields.within}" must be a JSON object')
    for name in fields.tokens:  # 0 generates nothing: vLLM's completions score a prompt so (echo, no new tokens)
        value = holder.get(name)
        if value is not None and (type(value) is not int or value < 0):
            raise BodyError(f'"{name}" must be a whole number of tokens, 0 or more, got {_shown(value)}')
    for sequences in (fields.n, fields.best_of):
        value = holder.get(sequences) if sequences else None
        if value is not None and (type(value) is not int or value < 1):
            raise BodyError(f'"{sequences}" must be a positive integer, got {_shown(value)}')
    if fields.beam_search and fields.beam_search in holder and type(holder[fields.beam_search]) is not bool:
        raise BodyError(f'"{fields.beam_search}" must be true or false')


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _shown_text(text: str) -> str:
    """A client's header text in a message: printable ASCII, at most 40 characters."""
    printable = "".join(c if c.isascii() and c.isprintable() else "?" for c in text)
    return printable if len(printable) <= 40 else printable[:37] + "..."


def prompt_count(item: dict[str, Any]) -> int:
    """How many generations one request body fans out into, as vLLM counts them: `prompt` is one text, one list of
    token ids, or a list of either (`vllm/renderers/inputs/preprocess.py`, `prompt_to_seq`), `prompt_embeds` adds
    its own (`vllm/renderers/online_renderer.py`, `preprocess_completion`), and the chat batch route's `messages` is
    a list of conversations (`vllm/entrypoints/openai/chat_completion/protocol.py`, `BatchChatCompletionRequest`).
    TGI's OpenAI completions read `prompt` the same way. Each generation runs `n` sequences of its own."""
    messages = item.get("messages")
    conversations = len(messages) if isinstance(messages, list) and all(type(m) is list for m in messages) else 0
    return max(_prompts(item.get("prompt")) + _prompts(item.get("prompt_embeds")) + conversations, 1)


def _prompts(value: Any) -> int:
    if value is None:
        return 0
    if type(value) is not list:
        return 1
    if value and all(type(element) is int for element in value):
        return 1  # one prompt as token ids
    return len(value)


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
    # With two spellings the engine reads one (vLLM's chat: max_completion_tokens when set, else max_tokens), so the
    # largest given is the request's limit, and each spelling above the cap is capped on its own.
    params = RequestParams(
        max_tokens=max(holder[name] for name in given) if given else fields.default,
        n=n,
        best_of=holder.get(fields.best_of) if fields.best_of else None,
        beam_width=beams,
    )
    clamped, changes = clamp(params, limits)
    cap = clamped.max_tokens
    if cap is not None and cap != params.max_tokens:
        if given:
            names = [name for name in given if holder[name] > cap]
        else:
            names = [fields.add] if fields.add else []
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


# json.dumps builds a new encoder per call when given separators; this one is built once.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def encode_body(body: dict[str, Any]) -> bytes:
    """A clamped body for the upstream: compact, ASCII (any lone surrogate a client sent stays an escape)."""
    return _COMPACT.encode(body).encode()
