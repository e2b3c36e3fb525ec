"""Models from the Hugging Face Hub: config.json (and ModelOpt's hf_quant_config.json) through huggingface_hub, and
the checkpoint's safetensors headers by HTTP range. Nothing else is downloaded: no weights.

huggingface_hub decides where to ask and with what: `HF_ENDPOINT` (a mirror), `HF_TOKEN` (or the token saved by
`hf auth login`), the cache (`HF_HOME`, `HF_HUB_CACHE`) and `HF_HUB_OFFLINE=1` (the cache only). The headers read
are kept in kvops's own cache (`$XDG_CACHE_HOME/kvops/checkpoints/`, by repository and commit), so a second plan,
or an offline one, reads them from disk.

Requests, as huggingface_hub makes them: `GET {endpoint}/api/models/{repo}/revision/{rev}` (the commit and the
file list), `HEAD`/`GET {endpoint}/{repo}/resolve/{commit}/{file}` (config.json, the safetensors index), and for
each safetensors file `GET .../resolve/{commit}/{file}` with `Range: bytes=0-N` (its first bytes: the header).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from kvops.errors import ConfigError, KvopsError, ModelNotFound
from kvops.files import DOCUMENT_LIMIT, load_json, read_text
from kvops.frozen import frozen
from kvops.model.checkpoint import (
    HEADER_PREFIX,
    SAFETENSORS_INDEX,
    SAFETENSORS_SINGLE,
    Checkpoint,
    Tensor,
    header_length,
    index_entries,
    parse_header,
)
from kvops.model.refs import HubRef

FIRST_READ = 100_000  # one range read holds the whole header for almost every file; a second read when not
HEADER_READERS = 8  # shards whose headers are read at once
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})/")


class HubError(ModelNotFound):
    """The Hub could not give a model's files: one line saying what failed and what to do."""


@frozen
class HubModel:
    ref: HubRef
    config: dict[str, Any]
    hf_quant_config: dict[str, Any] | None
    commit: str | None
    config_path: str
    checkpoint: Checkpoint | None
    note: str | None = None  # why the checkpoint's bytes are not known, when they are not


def fetch_model(ref: HubRef) -> HubModel:
    """config.json and the checkpoint's headers of a Hub model (from the cache when offline)."""
    _need_library()
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    with _hub_errors(ref, offline):
        files, commit = (None, None) if offline else _repository(ref)
        revision = ref.revision  # by name, so the cache records it (refs/<revision>) for offline use
        config_path = _download(ref.repo, "config.json", revision, offline)
        commit = commit or _commit_of(config_path)
        quant = None
        if files is None or "hf_quant_config.json" in files:
            quant_path = _download_if_present(ref.repo, "hf_quant_config.json", revision, offline)
            quant = _json(Path(quant_path), ref) if quant_path else None
        checkpoint, note = _checkpoint(ref, revision, commit, files, offline)
    return HubModel(ref, _json(Path(config_path), ref), quant, commit, config_path, checkpoint, note)


def _need_library() -> None:
    if find_spec("huggingface_hub") is None:
        raise HubError("reading models from the Hugging Face Hub needs huggingface_hub: pip install 'kvops[hub]'")


def _repository(ref: HubRef) -> tuple[set[str], str | None]:
    """The repository's files and the commit the revision points at (the Hub's model info)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(ref.repo, revision=ref.revision)
    return {sibling.rfilename for sibling in info.siblings or ()}, info.sha


def _download(repo: str, filename: str, revision: str | None, offline: bool) -> str:
    """The file's path in the HF cache (fetched unless offline); a missing file raises the library's error."""
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo, filename, revision=revision, local_files_only=offline)


def _download_if_present(repo: str, filename: str, revision: str | None, offline: bool) -> str | None:
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return _download(repo, filename, revision, offline)
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return None


def _commit_of(path: str) -> str | None:
    match = _SNAPSHOT.search(Path(path).as_posix())
    return match.group(1) if match else None


def _json(path: Path, ref: HubRef) -> dict[str, Any]:
    """A JSON file the Hub gave, bounded as a local one is."""
    where = f"{ref.label}: {path.name} from the Hub"
    data = load_json(read_text(path, "", DOCUMENT_LIMIT, ConfigError), where, ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{ref.label}: {path.name} from the Hub is not a JSON object")
    return data


# --- the checkpoint's headers --------------------------------------------------------------------------------


def _checkpoint(
    ref: HubRef, revision: str | None, commit: str | None, files: set[str] | None, offline: bool
) -> tuple[Checkpoint | None, str | None]:
    cached = cached_headers(ref.repo, commit) if commit else None
    if cached is not None:
        return cached, None
    if offline:
        return None, "HF_HUB_OFFLINE=1 and the checkpoint's headers are not in kvops's cache"
    if files is not None and SAFETENSORS_INDEX not in files and SAFETENSORS_SINGLE not in files:
        return None, "the repository has no model.safetensors or model.safetensors.index.json"
    index_path = _download_if_present(ref.repo, SAFETENSORS_INDEX, revision, offline)
    total = None
    if index_path:
        shards, total = index_entries(_json(Path(index_path), ref), f"{ref.label} {SAFETENSORS_INDEX}")
    else:
        shards = [SAFETENSORS_SINGLE]
    from concurrent.futures import ThreadPoolExecutor

    read = _header_reader(ref.repo, revision)
    with ThreadPoolExecutor(HEADER_READERS) as pool:
        headers = list(pool.map(read, shards))
    tensors = tuple(tensor for header in headers for tensor in header)
    label = f"{ref.repo}@{commit[:7]}" if commit else ref.label
    checkpoint = Checkpoint(
        tensors, f"{label}: {len(shards)} safetensors file(s), headers read by HTTP range", len(shards), total
    )
    if commit:
        _store(ref.repo, commit, checkpoint)
    return checkpoint, None


def _header_reader(repo: str, revision: str | None) -> Callable[[str], tuple[Tensor, ...]]:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers()

    def read(filename: str) -> tuple[Tensor, ...]:
        url = hf_hub_url(repo, filename, revision=revision)
        response = get_session().get(url, headers={**headers, "Range": f"bytes=0-{FIRST_READ - 1}"})
        hf_raise_for_status(response)
        data = response.content
        length = header_length(data[:HEADER_PREFIX], f"{repo}/{filename}")
        if len(data) < HEADER_PREFIX + length:
            response = get_session().get(
                url, headers={**headers, "Range": f"bytes={HEADER_PREFIX}-{HEADER_PREFIX + length - 1}"}
            )
            hf_raise_for_status(response)
            data = data[:HEADER_PREFIX] + response.content
        return parse_header(data[HEADER_PREFIX : HEADER_PREFIX + length], f"{repo}/{filename}")

    return read


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "kvops" / "checkpoints"


def _cache_file(repo: str, commit: str) -> Path:
    return cache_dir() / repo.replace("/", "--") / f"{commit}.json"


def cached_headers(repo: str, commit: str) -> Checkpoint | None:
    """Headers read earlier for this repository's commit, from kvops's cache."""
    path = _cache_file(repo, commit)
    try:
        return Checkpoint.from_dict(load_json(read_text(path, "", DOCUMENT_LIMIT), str(path)))
    except (KvopsError, ValueError, KeyError, TypeError):  # a damaged cache entry: the headers are read again
        return None


def _store(repo: str, commit: str, checkpoint: Checkpoint) -> None:
    """Keep what was read; a cache that cannot be written costs a second read next time, nothing more."""
    path = _cache_file(repo, commit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(checkpoint.to_dict()))
        temporary.replace(path)
    except OSError:
        pass


# --- errors as one line ------------------------------------------------------------------------------------


class _hub_errors:
    """huggingface_hub's and the network's exceptions as one line each."""

    def __init__(self, ref: HubRef, offline: bool):
        self.ref = ref
        self.offline = offline

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> Literal[False]:
        if error is None or isinstance(error, KvopsError):
            return False
        message = _message(self.ref, error, self.offline)
        if message is None:
            return False
        raise HubError(message) from None


def _message(ref: HubRef, error: BaseException, offline: bool) -> str | None:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name, endpoint = ref.label, constants.ENDPOINT
    local = "or pass a local folder holding its config.json"
    if isinstance(error, GatedRepoError):
        return f"{name} is gated on the Hub: accept its terms at {endpoint}/{ref.repo} and set HF_TOKEN (or run `hf auth login`), {local}"
    if isinstance(error, RevisionNotFoundError):
        return f"{name}: revision {ref.revision!r} not found in {ref.repo} on the Hub; give a branch, tag or commit that exists"
    if isinstance(error, RepositoryNotFoundError):
        return f"model {ref.repo!r} not found on the Hub ({endpoint}): check the id; if it is private, set HF_TOKEN (or run `hf auth login`); {local}"
    if isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled)) and offline:
        return f"{name} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1: unset it to read the config from the Hub, {local}"
    if isinstance(error, EntryNotFoundError):
        return f"{name} has no config.json on the Hub: not a transformers model kvops can read (GGUF-only repositories are not); {local}"
    if isinstance(error, LocalEntryNotFoundError):
        return f"cannot reach the Hub at {endpoint} for {name} and it is not in the local cache; check the network or HF_ENDPOINT, {local}"
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else "?"
        return f"the Hub answered {status} for {name} ({endpoint}); {local}"
    if isinstance(error, OSError) or type(error).__name__ in ("ConnectError", "ConnectTimeout", "ReadTimeout"):
        return f"cannot reach the Hub at {endpoint} for {name} ({type(error).__name__}); check the network or HF_ENDPOINT, set HF_HUB_OFFLINE=1 to use the cache, {local}"
    return None
