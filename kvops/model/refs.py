"""A --model argument as a Hugging Face Hub reference: `hf://org/name[@revision]` or `org/name[@revision]`.

Names only: `kvops.model.locate` decides where a model comes from, `kvops.model.hub` reads it from the Hub.
"""

from __future__ import annotations

import re

from kvops.errors import ModelNotFound
from kvops.frozen import frozen

HUB_PREFIX = "hf://"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@frozen
class HubRef:
    repo: str
    revision: str | None = None  # a branch, tag or commit; None: the repository's default branch
    explicit: bool = False  # written as hf://... or with @revision: the Hub, not the catalog

    @property
    def label(self) -> str:
        return f"{self.repo}@{self.revision}" if self.revision else self.repo


def parse_ref(text: str) -> HubRef | None:
    """`hf://org/name[@revision]` or `org/name[@revision]` as a Hub reference; None when it is not one."""
    value = text.strip()
    explicit = value.startswith(HUB_PREFIX)
    if explicit:
        value = value[len(HUB_PREFIX) :]
    repo, _, revision = value.partition("@")
    if not _REPO.match(repo):
        if explicit:
            raise ModelNotFound(f"--model {text!r}: write hf://ORG/NAME or hf://ORG/NAME@REVISION")
        return None
    return HubRef(repo, revision or None, explicit or bool(revision))


def same_model(named: str, model: str) -> bool:
    """Two names of one model: a Hub id, a local path or an alias (a served-model-name, a catalog id) against a
    model's id: the same when the ids agree in any case, or when one ends in the other's name."""
    named, model = named.rstrip("/").lower(), model.rstrip("/").lower()
    return named == model or named.endswith("/" + model.split("/")[-1]) or model.endswith("/" + named)
