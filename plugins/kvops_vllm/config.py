"""The KV guard's settings, from `KVOPS_*` environment variables (the engine-core process inherits them).

KVOPS_POLICY                   policy YAML (default: the shipped kvops/data/policy.yaml)
KVOPS_HEADROOM_BLOCKS          blocks kept free beyond every request's projected KV (default 0)
KVOPS_POLICY_URL               the watcher's /kvops/policy; when set, its level is followed (default: unset)
KVOPS_POLICY_POLL_SECONDS      how often to read it, off the scheduling path (default 2)
KVOPS_POLICY_TIMEOUT_SECONDS   give up on one read after this long (default 1)
KVOPS_POLICY_MAX_AGE_SECONDS   ignore a reading whose updated_at is older than this (default 30)
KVOPS_LOG_SECONDS              at most one summary line of what the guard did per this many seconds (default 10)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kvops.errors import KvopsError
from kvops.policy import Policy, load_policy

POLICY_PATH = "/kvops/policy"


class GuardConfigError(KvopsError):
    """A KVOPS_* variable the guard cannot use, named with what would be valid."""


@dataclass(frozen=True)
class GuardConfig:
    policy: Policy
    policy_source: str  # the YAML path, or "shipped default"
    headroom_blocks: int = 0
    policy_url: str | None = None
    poll_seconds: float = 2.0
    timeout_seconds: float = 1.0
    max_age_seconds: float = 30.0
    log_seconds: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GuardConfig:
        env = os.environ if env is None else env
        path = env.get("KVOPS_POLICY") or None
        url = env.get("KVOPS_POLICY_URL") or None
        return cls(
            policy=load_policy(path),
            policy_source=path or "shipped default",
            headroom_blocks=_whole(env, "KVOPS_HEADROOM_BLOCKS", 0),
            policy_url=_policy_url(url) if url else None,
            poll_seconds=_seconds(env, "KVOPS_POLICY_POLL_SECONDS", 2.0),
            timeout_seconds=_seconds(env, "KVOPS_POLICY_TIMEOUT_SECONDS", 1.0),
            max_age_seconds=_seconds(env, "KVOPS_POLICY_MAX_AGE_SECONDS", 30.0),
            log_seconds=_seconds(env, "KVOPS_LOG_SECONDS", 10.0),
        )


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    return _number(env, name, default, int, lambda value: value >= 0, "a whole number of blocks, 0 or more")


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return _number(
        env, name, default, float, lambda value: math.isfinite(value) and value > 0, "a number of seconds above 0"
    )


def _number(
    env: Mapping[str, str], name: str, default, parse: Callable[[str], Any], valid: Callable[[Any], bool], expected: str
):
    """`name` from the environment (unset or blank: `default`), or one line naming the variable and what is valid."""
    text = env.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise GuardConfigError(f"{name}={text!r}: must be {expected}")
    return value


def _policy_url(text: str) -> str:
    """The watcher's policy URL; a bare http://host:port means its /kvops/policy."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise GuardConfigError(
            f"KVOPS_POLICY_URL={text!r}: must be an http(s) URL such as http://127.0.0.1:9400{POLICY_PATH}"
        )
    if parts.path in ("", "/"):
        parts = parts._replace(path=POLICY_PATH)
    return urlunsplit(parts)
