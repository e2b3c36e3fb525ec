"""The files and endpoints users point kvops at: text read (plain or gzip), HTTP metrics fetched, outputs written;
each failure one line that names the option and the file or URL."""

from __future__ import annotations

import gzip
from pathlib import Path

from kvops.errors import KvopsError


def read_text(path: str, option: str) -> str:
    """A text file, gzip-compressed or not; one line naming the file when it cannot be read or is not text."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KvopsError(f"{option} {path}: cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise KvopsError(f"{option} {path}: a damaged gzip file ({exc})") from None
    if b"\x00" in data[:4096]:
        raise KvopsError(f"{option} {path}: not a text file")
    return data.decode("utf-8", errors="replace")


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
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise KvopsError(f"{option} {path}: cannot write ({exc.strerror or exc})") from None
