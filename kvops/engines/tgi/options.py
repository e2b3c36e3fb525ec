"""Each TGI release's own launcher options: which `text-generation-launcher` options a plan for that release may
emit, under which name, its `--quantize` values and its image tag.

The table is release_options.json, read from launcher/src/main.rs at every tag of
huggingface/text-generation-inference by bench/tgi_options.py (each option with its file and line); a release not
read there follows the newest tag read at or before it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from kvops.engines.release import Version, newest_read
from kvops.errors import UsageError
from kvops.frozen import frozen
from kvops.packaged import packaged_text

OPTIONS_FILE = "release_options.json"
IMAGE = "ghcr.io/huggingface/text-generation-inference:{version}"
# README.md l.79 at v1.2.0 ("...:1.2+rocm") and v1.3.0 ("...:1.3-rocm"); no ROCm image before 1.2
ROCM_SINCE = Version(1, 3, 0)
ROCM_1_2 = "ghcr.io/huggingface/text-generation-inference:1.2+rocm"
# options a later release renamed: the name a plan uses -> the name earlier releases took (2.0.0 added
# --max-input-tokens and kept --max-input-length as its legacy spelling: launcher/src/main.rs l.226-230 at v2.0.0)
EARLIER_NAMES = {"--max-input-tokens": "--max-input-length"}


@frozen
class LauncherOptions:
    read: Version
    options: dict[str, str]  # option -> launcher/src/main.rs:line at the tag
    quantize: tuple[str, ...]

    def has(self, option: str) -> bool:
        return option in self.options


@lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    return json.loads(packaged_text("kvops.engines.tgi", OPTIONS_FILE))["releases"]


@lru_cache(maxsize=64)
def for_version(version: Version) -> LauncherOptions:
    table = _table()
    chosen = newest_read(table, version)
    data = table[chosen.text]
    return LauncherOptions(
        Version(chosen.major, chosen.minor, chosen.patch), dict(data["options"]), tuple(data["quantize"])
    )


def first_with(option: str) -> Version | None:
    found = sorted(Version.parse(name) for name, data in _table().items() if option in data["options"])
    return found[0] if found else None


def image(version: Version, vendor: str | None) -> str:
    tag = f"{version.major}.{version.minor}.{version.patch}"
    if vendor != "amd":
        return IMAGE.format(version=tag)
    if version >= ROCM_SINCE:
        return IMAGE.format(version=f"{tag}-rocm")
    if version.at_least(1, 2):
        return ROCM_1_2
    raise UsageError(f"TGI {version} has no ROCm image (the first is 1.2+rocm); plan --engine-version 1.2.0 or later")


def spelled(launcher: LauncherOptions, emitted: dict[str, Any], label: str) -> dict[str, Any]:
    """The plan's launcher options as this release spells them; one it does not take at all is a one-line error
    naming the release that adds it."""
    out: dict[str, Any] = {}
    for name, value in emitted.items():
        option = f"--{name}"
        if launcher.has(option):
            out[name] = value
            continue
        earlier = EARLIER_NAMES.get(option)
        if earlier and launcher.has(earlier):
            out[earlier.removeprefix("--")] = value
            continue
        since = first_with(option)
        added = f"; added in TGI {since}" if since else ""
        raise UsageError(f"{option}: {label} has no {option} (launcher/src/main.rs at v{launcher.read}{added})")
    return out


def check_quantize(launcher: LauncherOptions, value: str, label: str) -> None:
    if value not in launcher.quantize:
        raise UsageError(
            f"--quantize {value}: {label} takes {', '.join(launcher.quantize)} (launcher/src/main.rs at v{launcher.read})"
        )
