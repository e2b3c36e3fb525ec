"""The data files kvops ships inside its packages (catalogs, option tables, the shipped policy), read as files.

Not through importlib.resources: importing it brings tempfile, zipfile and shutil along, about a tenth of
`kvops kv`'s whole start, and kvops is always installed as files (a wheel unpacked, or a checkout), never imported
from a zip archive."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).parent


def packaged_path(package: str, name: str = "") -> Path:
    """A file or folder of a kvops package: packaged_path("kvops.catalog", "gpus.json")."""
    top, *inner = package.split(".")
    if top != "kvops":
        raise ValueError(f"{package} is not a kvops package")
    return ROOT.joinpath(*inner, name)


def packaged_text(package: str, name: str) -> str:
    return packaged_path(package, name).read_text(encoding="utf-8")
