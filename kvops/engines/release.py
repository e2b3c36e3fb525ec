"""Engine versions as users and logs write them, engine-neutral: each engine's `releases.py` says which rules a
version follows.

"0.10.1.dev101+gbda9d0535", "0.16.1rc1.dev206", "0.8.5.post1", "0.10.1.1", "v3.2.1" and "1.0" all name a release by
its first three numbers; what follows them (a hotfix's fourth number, rc, dev, post, a local build tag) keeps the
release's rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvops.errors import UsageError
from kvops.frozen import frozen

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")
# what may follow a release's numbers as engines print them: a hotfix's fourth number (vLLM 0.9.0.1, 0.10.1.1 on
# PyPI), PEP 440's (0.10.1rc1.dev101+gbda9d0535), TGI's -dev0
_SUFFIXES = re.compile(r"(?:\.\d+)?(?:[-.]?(?:rc|dev|post|a|b)\d*)*(?:\+\S+)?")


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int
    patch: int = 0
    text: str = field(default="", compare=False)  # as written, suffixes included

    @classmethod
    def parse(cls, text: str, option: str = "--engine-version") -> Version:
        match = _VERSION.match(text.strip())
        if not match:
            raise UsageError(f"{option} {text!r} is not a version; give one like 0.32.0 or 3.3.7")
        major, minor, patch = (int(part) if part else 0 for part in match.groups())
        return cls(major, minor, patch, text.strip().removeprefix("v"))

    @classmethod
    def given(cls, text: str) -> Version:
        """A release as a user types it (--engine-version): the numbers and a release's own suffixes, nothing else."""
        version = cls.parse(text)
        match = _VERSION.match(text.strip())
        assert match is not None
        if not _SUFFIXES.fullmatch(text.strip()[match.end() :]):
            raise UsageError(f"--engine-version {text!r} is not a release; give one like 0.32.0, 0.8.5.post1 or 3.3.7")
        return version

    @property
    def release_tag(self) -> str:
        """The release's numbers as its image tags them: three, and a hotfix's fourth (0.10.1.1)."""
        hotfix = re.match(r"\d+\.\d+\.\d+(\.\d+)", self.text)
        return f"{self.major}.{self.minor}.{self.patch}{hotfix.group(1) if hotfix else ''}"

    def at_least(self, major: int, minor: int, patch: int = 0) -> bool:
        return (self.major, self.minor, self.patch) >= (major, minor, patch)

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}.{self.patch}"


def newest_read(read: Iterable[str], version: Version) -> Version:
    """Of the releases whose tables were read (`read`, versions as written), the newest at or before `version`; the
    oldest read where `version` precedes them all."""
    ordered = sorted(Version.parse(name) for name in read)
    return next((item for item in reversed(ordered) if item <= version), ordered[0])


@frozen
class Rule:
    """One rule a release follows, and where it comes from (the engine's source, a PR, a changelog)."""

    text: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.text, "source": self.source}
