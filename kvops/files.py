"""The files and endpoints users point kvops at: text read (plain or gzip), JSON and YAML parsed, HTTP metrics
fetched, outputs written; each failure one line that names the option and the file or URL.

Every file a user names is bounded before it is parsed: read only when it is a regular file (a FIFO is opened
without blocking and refused, a device such as /dev/zero is refused, so nothing waits on a writer or reads
forever), at most `limit` bytes (after gunzip too), JSON and YAML at most `MAX_DEPTH` levels deep, and YAML at most
`MAX_ALIASES` aliases and `MAX_VALUES` values once its aliases are expanded (a billion-laughs file is refused, not
expanded)."""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from kvops.errors import KvopsError, UsageError

KiB, MiB = 1 << 10, 1 << 20
SETTINGS_LIMIT = 1 * MiB  # a policy, a profile, a -f kvops.yaml: a few KiB each
DOCUMENT_LIMIT = 64 * MiB  # config.json, tokenizer_config.json, a safetensors index, a plan, nvidia-smi output
LOG_LIMIT = 512 * MiB  # an engine's log, a workload of requests
MAX_DEPTH = 64  # nesting of JSON and YAML documents (a config.json is under 8 levels deep)
MAX_ALIASES = 64  # YAML aliases (*name) in one document
MAX_VALUES = 100_000  # YAML values once aliases are expanded (a policy holds about 60)


@contextmanager
def open_regular(path: str | Path, option: str, error: type[KvopsError] = KvopsError) -> Iterator[BinaryIO]:
    """A regular file opened for reading. It is opened without blocking and checked before a byte is read, so a FIFO
    (which would wait for a writer), a device such as /dev/zero (which never ends) or a folder is refused."""
    label = f"{option} {path}" if option else str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise error(f"{label}: cannot read ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{label}: {_kind(mode)}; kvops reads regular files only")
    with os.fdopen(fd, "rb") as handle:
        try:
            yield handle
        except OSError as exc:
            raise error(f"{label}: cannot read ({exc.strerror or exc})") from None


def read_bytes(path: str | Path, option: str, limit: int, error: type[KvopsError] = KvopsError) -> bytes:
    """A regular file's bytes, at most `limit` of them; one line naming the option and the file otherwise."""
    label = f"{option} {path}" if option else str(path)
    with open_regular(path, option, error) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit:
            raise error(f"{label}: {size:,} bytes, more than the {_size(limit)} kvops reads from it")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise error(f"{label}: more than the {_size(limit)} kvops reads from it")
    return data


def read_text(path: str | Path, option: str, limit: int = DOCUMENT_LIMIT, error: type[KvopsError] = KvopsError) -> str:
    """A text file, gzip-compressed or not, at most `limit` bytes once decompressed; one line naming the file when
    it cannot be read or is not text."""
    label = f"{option} {path}" if option else str(path)
    data = read_bytes(path, option, limit, error)
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, limit, label, error)
    if b"\x00" in data[:4096]:
        raise error(f"{label}: not a text file")
    return data.decode("utf-8", errors="replace")


def _gunzip(data: bytes, limit: int, label: str, error: type[KvopsError]) -> bytes:
    """Every gzip member, decompressed to at most `limit` bytes in all (a gzip bomb stops at the limit)."""
    out = bytearray()
    while data:
        inflater = zlib.decompressobj(wbits=31)
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise error(f"{label}: a damaged gzip file ({exc})") from None
        if len(out) > limit:
            raise error(f"{label}: more than {_size(limit)} once decompressed, more than kvops reads from it")
        if not inflater.eof:
            raise error(f"{label}: a damaged gzip file (it ends inside a member)")
        data = inflater.unused_data.lstrip(b"\x00")
    return bytes(out)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "cannot read (Is a directory)"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), which could block forever"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, which may never end"
    return "not a regular file"


def _size(limit: int) -> str:
    return f"{limit // MiB} MiB" if limit >= MiB else f"{limit // KiB} KiB"


# --- JSON and YAML, bounded --------------------------------------------------------------------------------


def load_json(text: str, where: str, error: type[KvopsError] = KvopsError) -> Any:
    """A JSON document at most MAX_DEPTH levels deep. NaN and Infinity are read as Python reads them (real
    config.json files hold them, e.g. Nemotron-H's time_step_limit): the caller types each field it uses."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep, more than kvops reads") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise error(f"{where}: not usable JSON ({' '.join(str(exc).split()[:8])})") from None
    check_shape(value, where, error)
    return value


def load_yaml(text: str, where: str, error: type[KvopsError] = KvopsError, as_typed: bool = False) -> Any:
    """A YAML document (safe tags only) at most MAX_DEPTH levels deep, with at most MAX_ALIASES aliases and
    MAX_VALUES values once they are expanded. `as_typed`: numbers kept as the text written (0.10 stays "0.10", not
    the float 0.1; 010 is not octal), to be read as the same text typed on the command line would be, and a key
    given twice refused (YAML would keep the last silently)."""
    import yaml

    try:
        value = yaml.load(text, Loader=_typed_loader() if as_typed else _bounded_loader())  # safe tags only
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_DEPTH} levels deep, more than kvops reads") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{where}: not valid YAML{at} ({problem})") from None
    check_shape(value, where, error, MAX_VALUES)
    return value


class _Refused(Exception):
    """A YAML document kvops does not read (past the bounds, a key given twice): the message says why."""


@cache
def _bounded_loader() -> type:
    """yaml.SafeLoader that counts aliases and nesting as it composes the document, before anything is built."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        aliases = 0
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise _Refused(f"more than {MAX_ALIASES} YAML aliases (*name), more than kvops reads")
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep, more than kvops reads")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return BoundedLoader


@cache
def _typed_loader() -> type:
    """The bounded loader with numbers as their text and a repeated key refused."""

    class TypedLoader(_bounded_loader()):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            keys = [self.construct_object(key, deep=True) for key, _ in node.value]
            repeated = next((key for index, key in enumerate(keys) if key in keys[:index]), None)
            if repeated is not None:
                raise _Refused(f"the key {repeated!r} is given twice")
            return super().construct_mapping(node, deep)

    def as_text(loader: Any, node: Any) -> str:
        return str(loader.construct_scalar(node))

    TypedLoader.add_constructor("tag:yaml.org,2002:int", as_text)
    TypedLoader.add_constructor("tag:yaml.org,2002:float", as_text)
    return TypedLoader


def check_shape(value: Any, where: str, error: type[KvopsError] = KvopsError, max_values: int | None = None) -> None:
    """Refuse a document nested more than MAX_DEPTH levels or, with `max_values`, holding more values than that,
    counting a value each time an alias repeats it (a self-referencing YAML anchor is refused, not walked forever)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise error(
                f"{where}: more than {MAX_VALUES:,} values once its aliases are expanded, more than kvops reads"
            )
        if isinstance(node, dict):
            children = list(node.keys()) + list(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            children = list(node)
        else:
            continue
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested more than {MAX_DEPTH} levels deep, more than kvops reads")
        stack.extend((child, depth + 1) for child in children)


def read_json(path: str | Path, option: str, limit: int = DOCUMENT_LIMIT, error: type[KvopsError] = KvopsError) -> Any:
    """A JSON file, bounded (see the module's docstring)."""
    where = f"{option} {path}" if option else str(path)
    return load_json(read_text(path, option, limit, error), where, error)


def read_yaml(
    path: str | Path,
    option: str,
    limit: int = SETTINGS_LIMIT,
    error: type[KvopsError] = KvopsError,
    as_typed: bool = False,
) -> Any:
    """A YAML (or JSON) file, bounded (see the module's docstring); `as_typed` as load_yaml's."""
    where = f"{option} {path}" if option else str(path)
    return load_yaml(read_text(path, option, limit, error), where, error, as_typed)


# --- endpoints and outputs -------------------------------------------------------------------------------


def fetch_metrics(url: str, option: str = "--metrics") -> str:
    """An engine's /metrics (the path added when the URL names only the server)."""
    return fetch_endpoint(url, "/metrics", option)


def fetch_endpoint(url: str, path: str, option: str) -> str:
    """One of a server's endpoints (`/metrics`, `/version`): `path` replaces the URL's own last segment when the URL
    names another endpoint of it, else is added."""
    import urllib.error
    import urllib.request

    base = url.rstrip("/")
    if base.endswith(("/metrics", "/version")):
        base = base.rsplit("/", 1)[0]
    target = base + path
    try:
        with urllib.request.urlopen(target, timeout=10) as response:
            return response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise KvopsError(f"{option} {url}: cannot read {target} ({getattr(exc, 'reason', exc)})") from None


def write_files(directory: Path, files: dict[str, str], option: str = "--out") -> None:
    """Write each name -> text into `directory` (created)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
    except OSError as exc:
        raise KvopsError(f"{option} {directory}: cannot write ({exc.strerror or exc})") from None


def write_text(path: str, text: str, option: str) -> None:
    """Write `text` to `path`, its folder made if missing (as every command that writes a file makes it)."""
    try:
        make_folder(path)
        Path(path).write_text(text)
    except OSError as exc:
        raise KvopsError(f"{option} {path}: cannot write ({exc.strerror or exc})") from None


def make_folder(path: str | Path) -> None:
    """The folder a file is written into, made with its parents where missing (OSError where it cannot be)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)


def _nearest_folder(path: Path) -> Path:
    """The path, or its nearest ancestor that exists: where a missing folder would be made."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_path(path: str, option: str, suffix: str | None = None) -> None:
    """A file a command will write when its work is done, checked before the work: a name, in a folder that exists
    or can be made (the writer makes it, as `make_folder`), with `suffix` where the format needs one."""
    if not path.strip() or path == "-":
        raise UsageError(f"{option} {path!r}: give a file name to write")
    target = Path(path)
    if suffix is not None and target.suffix.lower() != suffix:
        raise UsageError(f"{option} {path}: the file is written as {suffix[1:].upper()}: give a name ending {suffix}")
    folder = _nearest_folder(target.parent)
    if target.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UsageError(f"{option} {path}: cannot write there ({folder} is not a writable folder)")


def is_http_url(url: str) -> bool:
    """An http(s) URL that names a host, and a port within range where it names one."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and (port is None or port > 0)
