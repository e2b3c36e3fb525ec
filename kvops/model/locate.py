"""Find a model's config.json: a local path, then the local Hugging Face cache (offline), then the catalog."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvops.errors import ConfigError, ModelNotFound
from kvops.model import catalog
from kvops.model.config import spec_from_config
from kvops.model.params import PublishedCount
from kvops.model.spec import ModelSpec


def load_model(name: str) -> ModelSpec:
    """Resolve a --model argument to a ModelSpec, or fail with one line that says what was tried."""
    path = Path(name).expanduser()
    if path.exists():
        return _from_file(_config_file(path), name=name, source="path")
    cached = _hf_cache_config(name)
    if cached is not None:
        entry = catalog.find(name)
        return _from_file(cached, name=name, source="hf-cache", published=entry.published if entry else None)
    entry = catalog.find(name)
    if entry is not None:
        return catalog_spec(entry)
    close = catalog.suggestions(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ModelNotFound(
        f"model {name!r} not found: not a path, not in the local Hugging Face cache, not in the catalog{hint} (`kvops models` lists the catalog)"
    )


def catalog_spec(entry: catalog.CatalogEntry) -> ModelSpec:
    """A catalog entry's ModelSpec, its published count and its ModelOpt hf_quant_config applied."""
    return spec_from_config(
        with_quant_config(entry.config, entry.hf_quant_config),
        name=entry.id,
        source="catalog",
        where=entry.file,
        published=entry.published,
        aliases=entry.aliases,
    )


def with_quant_config(config: dict, hf_quant_config: dict | None) -> dict:
    """vLLM reads hf_quant_config.json (NVIDIA ModelOpt <= 0.29) as the quantization_config when config.json has none."""
    if hf_quant_config and not config.get("quantization_config"):
        return {**config, "quantization_config": hf_quant_config}
    return config


def _config_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise ConfigError(f"{path.parent}: no config.json in this folder")
    return path


def _from_file(path: Path, *, name: str, source: str, published: PublishedCount | None = None) -> ModelSpec:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: a config.json must hold a JSON object")
    return spec_from_config(
        config, name=name, source=source, where=str(path), source_path=str(path), published=published
    )


def _hf_cache_config(repo_id: str) -> Path | None:
    """config.json of a model already in the local HF cache; never downloads.

    A cheap folder check first, so the common catalog path does not import huggingface_hub.
    """
    cache = _hf_cache_dir()
    if repo_id.count("/") != 1 or not cache.joinpath("models--" + repo_id.replace("/", "--")).is_dir():
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache)
    return Path(found) if isinstance(found, str) else None


def _hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"
