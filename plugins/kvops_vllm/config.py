"""The KV guard's settings, from `KVOPS_*` environment variables (the engine-core process inherits them).

KVOPS_ADMISSION                peak: by the future peak of the whole batch (guard v2, default); reserve: every admitted
                               request's prompt + max_tokens reserved at once (guard v1)
KVOPS_OUTPUT_QUANTILE          where lengths are unknown (EOS, stop tokens or strings), the risk: the batch's blocks, by
                               the output lengths the engine produced recently, must fit at this quantile (default 0.8)
KVOPS_OUTPUT_HISTORY           how many recently finished requests those lengths come from (default 1000)
KVOPS_OUTPUT_MIN_ENDS          until this many requests ended by themselves there are no lengths to project by: the
                               engine is cold (default 32)
KVOPS_COLD_START               how a cold engine serves requests of unknown length: stock (default: admitted by what
                               they hold now and preempted, as stock vLLM does) or max_tokens (each projected at its
                               max_tokens, as guard v2 did: no preemption, few at once)
KVOPS_HEADROOM_BLOCKS          blocks kept free beyond every request's projected KV (default 0)
KVOPS_PAUSE_STEPS              a request sits out at most this many steps in a row for blocks before vLLM preempts
                               (default 4; 0: never pause, preempt at once)
KVOPS_PREEMPT                  which running request vLLM preempts then: most-computed (default: of those not preempted
                               before, the one that computed most: it frees the most blocks, so the pool runs short,
                               and preempts, least often) or least-computed (the least to compute again; guard v2)
KVOPS_RESUME                   where a preempted request waits to run again: after-new (default: behind the requests
                               that have not started, for at most KVOPS_RESUME_WAIT_STEPS steps: it already streamed
                               its first tokens, they wait for theirs) or first (at the queue's head, as vLLM puts it)
KVOPS_RESUME_WAIT_STEPS        after-new: the most steps a preempted request lets new ones go first (default 200)
KVOPS_LEVELS                   where the policy level comes from: watcher (default: the watcher's, when
                               KVOPS_POLICY_URL is set, else none) or own (also the engine's own KV usage)
KVOPS_POLICY_URL               the watcher's /kvops/policy; when set, its level is followed (default: unset)
KVOPS_POLICY_POLL_SECONDS      how often to read it, off the scheduling path (default 2)
KVOPS_POLICY_TIMEOUT_SECONDS   give up on one read after this long (default 1)
KVOPS_POLICY_MAX_AGE_SECONDS   ignore a reading whose updated_at is older than this (default 30)
KVOPS_LOG_SECONDS              at most one summary line of what the guard did per this many seconds (default 10)

Any other KVOPS_* name (a misspelling) stops the startup with one line naming the nearest setting.
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
from kvops.settings import check_names

POLICY_PATH = "/kvops/policy"
ADMISSIONS = ("peak", "reserve")
COLD_STARTS = ("stock", "max_tokens")
LEVEL_SOURCES = ("watcher", "own")
PREEMPT_VICTIMS = ("most-computed", "least-computed")
RESUME_ORDERS = ("after-new", "first")


class GuardConfigError(KvopsError):
    """A KVOPS_* variable the guard cannot use, named with what would be valid."""


@dataclass(frozen=True)
class GuardConfig:
    policy: Policy
    policy_source: str  # the YAML path, or "shipped default"
    headroom_blocks: int = 0
    admission: str = "peak"
    output_quantile: float = 0.8
    output_history: int = 1000
    output_min_ends: int = 32
    cold_start: str = "stock"
    pause_steps: int = 4
    preempt: str = "most-computed"
    resume: str = "after-new"
    resume_wait_steps: int = 200
    levels: str = "watcher"
    policy_url: str | None = None
    poll_seconds: float = 2.0
    timeout_seconds: float = 1.0
    max_age_seconds: float = 30.0
    log_seconds: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GuardConfig:
        env = os.environ if env is None else env
        check_names(env, GuardConfigError)
        path = env.get("KVOPS_POLICY") or None
        url = env.get("KVOPS_POLICY_URL") or None
        return cls(
            policy=load_policy(path),
            policy_source=path or "shipped default",
            headroom_blocks=_whole(env, "KVOPS_HEADROOM_BLOCKS", 0),
            admission=_choice(env, "KVOPS_ADMISSION", ADMISSIONS),
            output_quantile=_number(
                env,
                "KVOPS_OUTPUT_QUANTILE",
                0.8,
                float,
                lambda value: 0.5 <= value < 1,
                "a fraction from 0.5 to 0.999",
            ),
            output_history=_number(
                env,
                "KVOPS_OUTPUT_HISTORY",
                1000,
                int,
                lambda value: value >= 10,
                "a whole number of requests, 10 or more",
            ),
            output_min_ends=_number(
                env, "KVOPS_OUTPUT_MIN_ENDS", 32, int, lambda value: value >= 1, "a whole number of requests, 1 or more"
            ),
            cold_start=_choice(env, "KVOPS_COLD_START", COLD_STARTS),
            pause_steps=_whole(env, "KVOPS_PAUSE_STEPS", 4, "steps"),
            preempt=_choice(env, "KVOPS_PREEMPT", PREEMPT_VICTIMS),
            resume=_choice(env, "KVOPS_RESUME", RESUME_ORDERS),
            resume_wait_steps=_whole(env, "KVOPS_RESUME_WAIT_STEPS", 200, "steps"),
            levels=_choice(env, "KVOPS_LEVELS", LEVEL_SOURCES),
            policy_url=_policy_url(url) if url else None,
            poll_seconds=_seconds(env, "KVOPS_POLICY_POLL_SECONDS", 2.0),
            timeout_seconds=_seconds(env, "KVOPS_POLICY_TIMEOUT_SECONDS", 1.0),
            max_age_seconds=_seconds(env, "KVOPS_POLICY_MAX_AGE_SECONDS", 30.0),
            log_seconds=_seconds(env, "KVOPS_LOG_SECONDS", 10.0),
        )


def _whole(env: Mapping[str, str], name: str, default: int, unit: str = "blocks") -> int:
    return _number(env, name, default, int, lambda value: value >= 0, f"a whole number of {unit}, 0 or more")


def _choice(env: Mapping[str, str], name: str, valid: tuple[str, ...]) -> str:
    """One of `valid` (the first is the default), or one line naming the variable and the choices."""
    text = (env.get(name) or "").strip().lower() or valid[0]
    if text not in valid:
        raise GuardConfigError(f"{name}={env[name]!r}: must be one of {', '.join(valid)}")
    return text


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
