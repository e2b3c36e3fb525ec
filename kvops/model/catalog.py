"""The embedded catalog: real public config.json files, addressed by HF id (any case) or a short alias."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from kvops.model.params import PublishedCount


@dataclass(frozen=True)
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


@lru_cache(maxsize=1)
def catalog() -> tuple[CatalogEntry, ...]:
    entries = []
    for item in sorted(resources.files("kvops.catalog").joinpath("models").iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        data = json.loads(item.read_text())
        if not data.get("config"):
            continue
        entries.append(
            CatalogEntry(
                id=data["id"],
                aliases=tuple(data.get("aliases", ())),
                config=data["config"],
                config_source=data.get("config_source", ""),
                parameters=data.get("parameters"),
                parameters_source=data.get("parameters_source"),
                file=f"kvops/catalog/models/{item.name}",
                tied_lm_head_stored=bool(data.get("tied_lm_head_stored")),
                hf_quant_config=data.get("hf_quant_config"),
                parameters_exclude_mtp=bool(data.get("parameters_exclude_mtp")),
                notes=data.get("notes"),
            )
        )
    return tuple(entries)


@lru_cache(maxsize=1)
def _index() -> dict[str, CatalogEntry]:
    index: dict[str, CatalogEntry] = {}
    for entry in catalog():
        for key in (entry.id, entry.id.split("/", 1)[-1], *entry.aliases):
            index.setdefault(key.lower(), entry)
    return index


def find(name: str) -> CatalogEntry | None:
    """An entry by HF id, bare repo name or alias, case-insensitive."""
    return _index().get(name.strip().lower())


def suggestions(name: str, limit: int = 3) -> list[str]:
    """Catalog ids close to a mistyped name."""
    key = name.strip().lower()
    close = difflib.get_close_matches(key, list(_index()), n=limit * 3, cutoff=0.5)
    ids: list[str] = []
    for match in close:
        entry_id = _index()[match].id
        if entry_id not in ids:
            ids.append(entry_id)
    return ids[:limit]
