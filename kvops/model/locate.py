"""Find a model's config.json: a local path, then the local Hugging Face cache (offline), then the catalog, then the
Hugging Face Hub. `hf://ORG/NAME[@REVISION]` (or `ORG/NAME@REVISION`) asks the Hub first, for catalog models too.

Where the checkpoint's safetensors files can be read (a local folder, a full snapshot in the HF cache, the Hub by
HTTP range), the spec carries their headers: weights are then the checkpoint's own bytes."""

from __future__ import annotations

import os
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from kvops.errors import ConfigError, ModelNotFound
from kvops.files import DOCUMENT_LIMIT, load_json, read_text
from kvops.model import catalog
from kvops.model.config import spec_from_config
from kvops.model.params import PublishedCount
from kvops.model.refs import HUB_PREFIX, parse_ref
from kvops.model.spec import ModelSpec

if TYPE_CHECKING:
    from kvops.model.checkpoint import Checkpoint


def load_model(name: str) -> ModelSpec:
    """Resolve a --model argument to a ModelSpec, or fail with one line that says what was tried.

    A name with neither `hf://` nor `@` is never an explicit Hub reference: the cache and the catalog are asked
    before the Hub module (and the checkpoint reader it needs) is imported."""
    path = Path(name).expanduser()
    if not name.startswith(HUB_PREFIX) and path.exists():
        from kvops.model.checkpoint import read_local

        config = _config_file(path)
        return _with_checkpoint(_from_file(config, name=name, source="path"), read_local(config.parent))
    local_first = "@" not in name and not name.strip().startswith(HUB_PREFIX)
    found = _local(name) if local_first else None
    if found is not None:
        return found
    from kvops.model import hub

    ref = parse_ref(name)
    if not local_first and (ref is None or not ref.explicit):
        found = _local(name)
        if found is not None:
            return found
    if ref is None:
        raise ModelNotFound(_not_found(name, "not a path, not in the local Hugging Face cache, not in the catalog"))
    if not ref.explicit and find_spec("huggingface_hub") is None:
        tried = (
            "not a path, not in the catalog; reading it from the Hub needs huggingface_hub (pip install 'kvops[hub]')"
        )
        raise ModelNotFound(_not_found(name, tried))
    try:
        return hub_spec(hub.fetch_model(ref))
    except hub.HubError as exc:
        if ref.explicit:
            raise
        raise hub.HubError(f"{name!r} is not in the catalog; {exc}") from None


def _local(name: str) -> ModelSpec | None:
    """The model from the local HF cache (offline) or the catalog, without asking the Hub."""
    cached = _hf_cache_config(name)
    entry = catalog.find(name)
    if cached is not None:
        from kvops.model.checkpoint import read_local

        spec = _from_file(cached, name=name, source="hf-cache", published=entry.published if entry else None)
        return _with_checkpoint(spec, read_local(cached.parent) or _cached_headers(name, cached))
    return catalog_spec(entry) if entry is not None else None


def _not_found(name: str, tried: str) -> str:
    close = catalog.suggestions(name)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"model {name!r} not found: {tried}{hint} (`kvops models` lists the catalog)"


def hub_spec(model) -> ModelSpec:
    """A ModelSpec from a Hub model's config.json, with its checkpoint's headers when they were read."""
    entry = catalog.find(model.ref.repo)
    config = with_quant_config(model.config, model.hf_quant_config)
    spec = spec_from_config(
        config,
        name=model.ref.repo,
        source="hub",
        where=f"{model.ref.label} config.json",
        source_path=model.config_path,
        published=entry.published if entry else None,
    )
    spec = replace(spec, revision=model.ref.revision)
    if model.note:
        spec = replace(spec, notes=(*spec.notes, f"weights from the parameter count: {model.note}"))
    return _with_checkpoint(spec, model.checkpoint)


def _with_checkpoint(spec: ModelSpec, checkpoint: Checkpoint | None) -> ModelSpec:
    if checkpoint is None or not checkpoint.tensors:
        return spec
    return replace(spec, checkpoint=checkpoint, parameters_source="checkpoint")


def _cached_headers(name: str, config: Path) -> Checkpoint | None:
    """Headers kvops read earlier for this snapshot (config.json's folder is named by its commit)."""
    from kvops.model import hub

    return hub.cached_headers(name, config.parent.name)


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
    """A config.json on disk: a regular file of at most DOCUMENT_LIMIT bytes (a FIFO or /dev/zero is refused)."""
    config = load_json(read_text(path, "--model", DOCUMENT_LIMIT, ConfigError), str(path), ConfigError)
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
