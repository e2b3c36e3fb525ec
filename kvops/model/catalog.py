"""The embedded catalog: real public config.json files, addressed by HF id (any case) or a short alias."""

from __future__ import annotations

import json
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from kvops.frozen import frozen
from kvops.model.params import PublishedCount
from kvops.packaged import packaged_path, packaged_text


@frozen
class CatalogEntry:
    """One catalog file: the config.json, its source, and the published parameter count of the checkpoint."""

    id: str
    aliases: tuple[str, ...]
    config: dict[str, Any]
    config_source: str
    parameters: int | None
    parameters_source: str | None
    file: str
    tied_lm_head_stored: bool = False  # the checkpoint stores lm_head.weight although tied (counted once when loaded)
    hf_quant_config: dict[str, Any] | None = None  # NVIDIA ModelOpt's hf_quant_config.json, beside config.json
    parameters_exclude_mtp: bool = False  # the published count is of a port without the MTP layers
    notes: str | None = None

    @property
    def published(self) -> PublishedCount | None:
        if not self.parameters:
            return None
        return PublishedCount(self.parameters, self.tied_lm_head_stored, self.parameters_exclude_mtp)


INDEX = "model_index.json"  # in kvops/catalog/: every name a model answers to, to its file (`write_index`)


def _models() -> Path:
    return packaged_path("kvops.catalog", "models")


@cache
def _entry(file_name: str) -> CatalogEntry | None:
    """One catalog file, parsed once; None when it holds no config."""
    data = json.loads(_models().joinpath(file_name).read_text(encoding="utf-8"))
    if not data.get("config"):
        return None
    return CatalogEntry(
        id=data["id"],
        aliases=tuple(data.get("aliases", ())),
        config=data["config"],
        config_source=data.get("config_source", ""),
        parameters=data.get("parameters"),
        parameters_source=data.get("parameters_source"),
        file=f"kvops/catalog/models/{file_name}",
        tied_lm_head_stored=bool(data.get("tied_lm_head_stored")),
        hf_quant_config=data.get("hf_quant_config"),
        parameters_exclude_mtp=bool(data.get("parameters_exclude_mtp")),
        notes=data.get("notes"),
    )


@lru_cache(maxsize=1)
def catalog() -> tuple[CatalogEntry, ...]:
    names = sorted(item.name for item in _models().iterdir() if item.name.endswith(".json"))
    return tuple(entry for entry in map(_entry, names) if entry is not None)


def index_of(entries: tuple[CatalogEntry, ...]) -> dict[str, str]:
    """Every name an entry answers to (HF id, bare repo name, aliases; lower case) to its file name.

    The first file in name order keeps a name two files share.
    """
    index: dict[str, str] = {}
    for entry in entries:
        for key in (entry.id, entry.id.split("/", 1)[-1], *entry.aliases):
            index.setdefault(key.lower(), entry.file.rsplit("/", 1)[-1])
    return index


@lru_cache(maxsize=1)
def shipped_index() -> dict[str, str]:
    """The index written beside the catalog: a lookup parses one file, not all of them."""
    return json.loads(packaged_text("kvops.catalog", INDEX))


def find(name: str) -> CatalogEntry | None:
    """An entry by HF id, bare repo name or alias, case-insensitive."""
    file_name = shipped_index().get(name.strip().lower())
    return _entry(file_name) if file_name else None


def suggestions(name: str, limit: int = 3) -> list[str]:
    """Catalog ids close to a mistyped name."""
    import difflib

    key = name.strip().lower()
    close = difflib.get_close_matches(key, list(shipped_index()), n=limit * 3, cutoff=0.5)
    ids: list[str] = []
    for match in close:
        entry = _entry(shipped_index()[match])
        if entry is not None and entry.id not in ids:
            ids.append(entry.id)
    return ids[:limit]


def write_index() -> Path:
    """Rewrite kvops/catalog/model_index.json from the catalog files (after adding or renaming a model)."""
    path = packaged_path("kvops.catalog", INDEX)
    path.write_text(json.dumps(index_of(catalog()), indent=2, sort_keys=True) + "\n")
    return path
