"""The degrade policy: levels, hysteresis, dwell, and what each level does to a request.

The only module that knows 70/85/95. The watcher decides the level with a LevelTracker; the admission proxy and
the vLLM KV-guard scheduler apply `policy.limits(level)` to each request with `clamp`. Pure: no I/O except
reading the YAML file in `load_policy`.
"""

from __future__ import annotations

import itertools
from dataclasses import field, replace
from enum import IntEnum
from pathlib import Path
from typing import Any

from kvops.errors import KvopsError
from kvops.frozen import frozen
from kvops.packaged import packaged_text


class Level(IntEnum):
    """Pressure levels; the number is what /kvops/metrics exports (unknown = -1)."""

    UNKNOWN = -1
    OK = 0
    WARN = 1
    DEGRADE = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Level:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"{text!r} is not a level; valid: {', '.join(level.label for level in cls)}") from None


GRADED = (Level.WARN, Level.DEGRADE, Level.CRITICAL)
ACTIONS = ("log_warning", "cap_max_tokens", "single_sequence", "reject_503")  # Limits.actions


class RequestClass(IntEnum):
    """How the levels treat a request, by its priority: the sheddable are refused first, the protected never."""

    SHEDDABLE = 0
    STANDARD = 1
    PROTECTED = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@frozen
class Priorities:
    """Request classes by the request's `priority`, in vLLM's convention (`--scheduling-policy priority`: a lower
    value is served first; unset is 0). llm-d's InferenceObjective counts the other way (higher is more
    important, below 0 sheddable), so its priority p is vLLM's -p: the defaults make vLLM priority > 0 sheddable
    and < 0 protected."""

    sheddable_above: int = 0
    protected_below: int = 0

    def request_class(self, priority: int) -> RequestClass:
        if priority > self.sheddable_above:
            return RequestClass.SHEDDABLE
        if priority < self.protected_below:
            return RequestClass.PROTECTED
        return RequestClass.STANDARD


@frozen
class Refusal:
    """A request a level will not serve now: what the admission proxy answers, in the engine's error shape, with
    `Retry-After: retry_after_seconds`. 429 for a sheddable request (llm-d sheds those with 429), 503 for others."""

    status: int
    retry_after_seconds: int
    message: str


@frozen
class Limits:
    """What a level does to each new request."""

    level: Level
    max_tokens_cap: int | None = None  # cap on max new tokens; a request without a limit gets the cap
    single_sequence: bool = False  # force n, best_of and beam width to 1
    reject: bool = False  # answer 503 + Retry-After, do not forward
    retry_after_seconds: int | None = None
    reject_sheddable: bool = False  # answer sheddable requests (Priorities) 429 + Retry-After, do not forward

    def actions(self) -> list[str]:
        """What these limits do, as short names: kvops_action_in_force's labels, the watcher's log and alerts."""
        done: list[str] = []
        if self.level in GRADED:
            done.append("log_warning")
        if self.max_tokens_cap is not None:
            done.append(f"cap_max_tokens:{self.max_tokens_cap}")
        if self.single_sequence:
            done.append("single_sequence")
        if self.reject:
            done.append(f"reject_503:retry_after={self.retry_after_seconds}")
        return done

    def effects(self, held: bool = False) -> list[str]:
        """What these limits do to each new request, as phrases after "new requests are" (explain, alert texts).

        held: as the KV guard enforces them. A scheduler cannot answer a request, so the ones a level refuses wait
        in the engine's queue, and n>1 siblings after the first wait too, instead of being forced to one."""
        if self.reject and not held:
            return [f"rejected with 503 and Retry-After: {self.retry_after_seconds}"]
        done = []
        if self.max_tokens_cap is not None:
            done.append(f"capped at {self.max_tokens_cap} new tokens")
        if self.single_sequence:
            done.append(
                "run one sequence at a time (n>1 siblings after the first wait)"
                if held
                else "forced to one sequence (n, best_of, beam width 1)"
            )
        if self.reject:
            done.append("held in the queue unless protected")
        elif self.reject_sheddable:
            done.append(
                "held in the queue when sheddable"
                if held
                else f"rejected with 429 and Retry-After: {self.retry_after_seconds} when sheddable"
            )
        return done

    def refusal(self, request_class: RequestClass = RequestClass.STANDARD) -> Refusal | None:
        """The answer to a new request of `request_class` this level refuses, or None: serve it (clamped).

        The sheddable are refused from the first level that sets reject_sheddable, the standard from the one that
        sets reject, the protected by none: they are clamped and wait in the engine's queue."""
        retry = self.retry_after_seconds or 1
        if request_class == RequestClass.SHEDDABLE and (self.reject or self.reject_sheddable):
            return Refusal(
                429,
                retry,
                f"KV cache pressure is {self.level.label}: sheddable requests are refused; retry in {retry} s",
            )
        if request_class == RequestClass.STANDARD and self.reject:
            return Refusal(503, retry, f"KV cache pressure is {self.level.label}; retry in {retry} s")
        return None

    def batch_refusal(self, prompts: int, request_class: RequestClass = RequestClass.STANDARD) -> Refusal | None:
        """The answer to one request that fans out into `prompts` generations (a list of prompts), or None.

        Where the level runs one sequence per request (single_sequence), such a request counts as `prompts`
        requests: it is refused with 429 and Retry-After, as the sheddable are, rather than cut to its first prompt
        (a 200 that silently answers one question of many). The protected are never refused: each prompt is clamped.
        """
        if prompts <= 1 or not self.single_sequence or request_class == RequestClass.PROTECTED:
            return None
        retry = self.retry_after_seconds or 1
        return Refusal(
            429,
            retry,
            f"KV cache pressure is {self.level.label}: a request of {prompts} prompts counts as {prompts} requests "
            f"of one sequence each; send one prompt per request, or retry in {retry} s",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level.label,
            "max_tokens_cap": self.max_tokens_cap,
            "single_sequence": self.single_sequence,
            "reject": self.reject,
            "retry_after_seconds": self.retry_after_seconds,
            # present only when set: a level without it keeps the shape older readers of /kvops/policy know
            **({"reject_sheddable": True} if self.reject_sheddable else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "limits") -> Limits:
        """The inverse of to_dict (what the watcher's /kvops/policy sends); PolicyError names the bad field."""
        if not isinstance(data, dict):
            raise PolicyError(f"{where}: must be a mapping with level, {', '.join(sorted(_ACTION_KEYS))}")
        try:
            level = Level.parse(str(data.get("level")))
        except ValueError as exc:
            raise PolicyError(f"{_at(where, 'level')}: {exc}") from None
        return _limits(level, {key: value for key, value in data.items() if key != "level"}, where)


@frozen
class SignalRule:
    """A saturation signal beyond KV %: when it fires, the level is at least `raise_to` (None: alert only)."""

    name: str
    raise_to: Level | None
    window_seconds: float = 60.0
    min_growth: float = 0.0  # queue_growth: requests
    seconds: float = 0.0  # stall: no tokens for this long
    below: float = 0.0  # prefix_cache_hit_rate: alert under this fraction
    above: float = 0.0  # offload_usage: alert over this fraction of the host (CPU) KV tier
    above_ms: float = 0.0  # offload_load_latency: alert when loads from host memory take longer on average (ms each)


@frozen
class Admission:
    """Where the in-process admission (vLLM's `--middleware`) departs from the watcher's levels; None: as they are."""

    min_dwell_seconds: float | None = None
    retry_after_seconds: int | None = None  # for every level that refuses

    def to_dict(self) -> dict[str, Any]:
        return {"min_dwell_seconds": self.min_dwell_seconds, "retry_after_seconds": self.retry_after_seconds}


@frozen
class Policy:
    thresholds: dict[Level, float]
    hysteresis: float
    min_dwell_seconds: float
    actions: dict[Level, Limits]
    signals: dict[str, SignalRule] = field(default_factory=dict)
    unknown_mode: str = "fail-closed"
    stale_after_failures: int = 3
    grace_polls: int = 2  # failed polls in a row that keep the last level before it turns unknown
    grace_seconds: float | None = None  # nor longer than this since the last good reading (None: no time bound)
    request_tokens: int | None = None  # headroom: KV tokens one request holds at its peak (None: the engine's context)
    gpu_memory_below: float = 0.80  # the share of the device weights, overheads and the KV blocks in use stay under
    priorities: Priorities = field(default_factory=Priorities)
    admission: Admission = field(default_factory=Admission)

    def for_admission(self) -> Policy:
        """The policy as the in-process admission (vLLM's `--middleware`) levels each request: with its own dwell
        and Retry-After where the `admission` section sets them.

        The watcher's level feeds alerts and autoscalers, which must not flap; the admission judges each request on
        the KV usage it meets, and a dwell there only keeps refusing after the pressure is gone."""
        admission = self.admission
        dwell = self.min_dwell_seconds if admission.min_dwell_seconds is None else admission.min_dwell_seconds
        retry = admission.retry_after_seconds
        actions = {
            level: limits
            if retry is None or limits.retry_after_seconds is None
            else replace(limits, retry_after_seconds=retry)
            for level, limits in self.actions.items()
        }
        return replace(self, min_dwell_seconds=dwell, actions=actions)

    def raw_level(self, usage: float) -> Level:
        """The level usage alone implies, without hysteresis."""
        level = Level.OK
        for graded in GRADED:
            if usage >= self.thresholds[graded]:
                level = graded
        return level

    def limits(self, level: Level, last_known: Level | None = None) -> Limits:
        """The limits in force at a level; at `unknown` they depend on the fail-open/fail-closed mode: fail-open
        lifts them, fail-closed keeps those of `last_known`, the last level read. With no good reading yet
        (`last_known` None: a watcher that starts while the engine's metrics are unusable) fail-closed has no level
        to keep and assumes the worst, critical: missing data is not good news, and an engine never read is not
        known to be below any threshold."""
        if level == Level.UNKNOWN:
            if self.unknown_mode == "fail-open":
                held = Level.OK
            else:
                held = Level.CRITICAL if last_known is None else last_known
            return replace(self.actions.get(held, Limits(held)), level=Level.UNKNOWN)
        return self.actions.get(level, Limits(level))

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": {level.label: self.thresholds[level] for level in GRADED},
            "hysteresis": self.hysteresis,
            "min_dwell_seconds": self.min_dwell_seconds,
            "actions": {level.label: self.actions[level].to_dict() for level in GRADED},
            "unknown": {
                "mode": self.unknown_mode,
                "grace_polls": self.grace_polls,
                "grace_seconds": self.grace_seconds,
                "stale_after_failures": self.stale_after_failures,
            },
            "headroom": {"request_tokens": self.request_tokens},
            "gpu_memory": {"below": self.gpu_memory_below},
            "priorities": {
                "sheddable_above": self.priorities.sheddable_above,
                "protected_below": self.priorities.protected_below,
            },
            "admission": self.admission.to_dict(),
        }

    def in_grace(self, failures: int, since_good: float | None) -> bool:
        """Whether a replica whose last `failures` polls failed, its last good reading `since_good` seconds ago
        (None: never read), still keeps its last level."""
        if since_good is None or failures > self.grace_polls:
            return False
        return self.grace_seconds is None or since_good <= self.grace_seconds


class LevelTracker:
    """Turns a stream of usage readings into a level that does not flap.

    Up is immediate. Down needs usage below (threshold of the current level - hysteresis) and at least
    min_dwell_seconds spent in the current level; it then lands on the level that usage + hysteresis implies.
    A signal floor (queue growth, preemptions, stall) holds the level up the same way. A missing reading (None)
    keeps the last level through the policy's grace, then makes it unknown; before the first good reading there is
    no level to keep, so it is unknown at once, with `last_known` None (what `Policy.limits` fails closed on).
    """

    def __init__(self, policy: Policy):
        self.policy = policy
        self.level = Level.OK
        self.last_known: Level | None = None  # the level before unknown; None: never read
        self.since: float | None = None
        self.failures = 0  # missing readings in a row
        self.last_good: float | None = None

    def update(self, usage: float | None, now: float, floor: Level = Level.OK) -> Level:
        if usage is None:
            self.failures += 1
            since_good = None if self.last_good is None else now - self.last_good
            if self.level != Level.UNKNOWN and not self.policy.in_grace(self.failures, since_good):
                self.last_known = None if self.last_good is None else self.level
                self.level, self.since = Level.UNKNOWN, now
            return self.level
        first = self.last_good is None
        self.failures, self.last_good = 0, now
        target = max(self.policy.raw_level(usage), floor)
        if first:  # the first reading sets the level outright: no hysteresis from a level never read
            if target != self.level:
                self.level, self.since = target, now
            return self.level
        current = self.last_known if self.level == Level.UNKNOWN and self.last_known is not None else self.level
        if target >= current:
            if target != self.level:
                self.level, self.since = target, now
            return self.level
        dwelt = self.since is None or now - self.since >= self.policy.min_dwell_seconds
        relaxed = max(self.policy.raw_level(usage + self.policy.hysteresis), floor)
        if dwelt and relaxed < current:
            self.level, self.since = relaxed, now
        elif self.level == Level.UNKNOWN:
            self.level, self.since = current, now
        return self.level

    def limits(self) -> Limits:
        return self.policy.limits(self.level, self.last_known)


@frozen
class RequestParams:
    """The request fields a level may change, engine-neutral (OpenAI max_tokens/n/best_of/use_beam_search, TGI max_new_tokens/best_of)."""

    max_tokens: int | None = None
    n: int = 1
    best_of: int | None = None
    beam_width: int | None = None  # beams when beam search is on


def clamp(params: RequestParams, limits: Limits) -> tuple[RequestParams, list[str]]:
    """The request as the level allows it, and what changed ('max_tokens 1024->512', 'n 4->1', ...). Unchanged,
    `params` itself; else one new RequestParams (no dataclasses.replace per field: this runs on every guarded
    request)."""
    changes: list[str] = []
    max_tokens, n, best_of, beam_width = params.max_tokens, params.n, params.best_of, params.beam_width
    cap = limits.max_tokens_cap
    if cap is not None and (max_tokens is None or max_tokens > cap):
        changes.append(f"max_tokens {'unset' if max_tokens is None else max_tokens}->{cap}")
        max_tokens = cap
    if limits.single_sequence:
        if n > 1:
            changes.append(f"n {n}->1")
            n = 1
        if best_of is not None and best_of > 1:
            changes.append(f"best_of {best_of}->1")
            best_of = 1
        if beam_width is not None and beam_width > 1:
            changes.append(f"beam_width {beam_width}->1")
            beam_width = 1
    if not changes:
        return params, changes
    return RequestParams(max_tokens, n, best_of, beam_width), changes


# --- loading -------------------------------------------------------------------------------------------


class PolicyError(KvopsError):
    """A policy file that cannot be used, named with the key at fault."""


def default_policy_text() -> str:
    return packaged_text("kvops.data", "policy.yaml")


def load_policy(path: str | Path | None = None) -> Policy:
    """The shipped default, or a YAML file laid out like it (any key left out keeps its default)."""
    import yaml

    defaults = yaml.safe_load(default_policy_text())
    if path is None:
        return policy_from_dict(defaults, "default policy")
    from kvops.files import SETTINGS_LIMIT, load_yaml, read_text

    where = str(path)  # a regular file of at most 1 MiB (no FIFO, no /dev/zero), its YAML without alias bombs
    loaded = load_yaml(read_text(path, "--policy", SETTINGS_LIMIT, PolicyError), where, PolicyError)
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise PolicyError(f"{where}: a policy must be a YAML mapping with levels, actions, signals, unknown")
    return policy_from_dict(_merge(defaults, loaded), where)


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def policy_from_dict(data: dict[str, Any], where: str) -> Policy:
    _mapping(data, where, required=True)
    for section in _SECTIONS:  # each section a mapping of names, so nothing below meets a list or a number
        _mapping(data.get(section), f"{where}: {section}", required=section in ("levels", "actions"))
    for section in ("actions", "signals"):
        for name, value in (data.get(section) or {}).items():
            _mapping(value, f"{where}: {section}.{name}")
    known = {
        "levels",
        "hysteresis",
        "min_dwell_seconds",
        "actions",
        "signals",
        "unknown",
        "headroom",
        "gpu_memory",
        "priorities",
        "admission",
    }
    unknown_keys = sorted(set(data) - known)
    if unknown_keys:
        raise PolicyError(f"{where}: unknown key {unknown_keys[0]!r}; valid: {', '.join(sorted(known))}")
    thresholds = {level: _fraction(data["levels"], level.label, f"{where}: levels") for level in GRADED}
    for lower, upper in itertools.pairwise(GRADED):
        if thresholds[lower] >= thresholds[upper]:
            raise PolicyError(
                f"{where}: levels.{lower.label} {thresholds[lower]} must be below levels.{upper.label} {thresholds[upper]}"
            )
    hysteresis = _number(data, "hysteresis", f"{where}:", low=0.0, high=0.5)
    dwell = _number(data, "min_dwell_seconds", f"{where}:", low=0.0, high=86400.0)
    actions = {
        level: _limits(level, data["actions"].get(level.label) or {}, f"{where}: actions.{level.label}")
        for level in GRADED
    }
    signals = {
        name: _signal(name, rule or {}, f"{where}: signals.{name}")
        for name, rule in (data.get("signals") or {}).items()
    }
    unknown = data.get("unknown") or {}
    _only_keys(unknown, "unknown", _UNKNOWN_KEYS, where)
    mode = unknown.get("mode", "fail-closed")
    if mode not in ("fail-open", "fail-closed"):
        raise PolicyError(f"{where}: unknown.mode {mode!r}; valid: fail-open, fail-closed")
    stale = unknown.get("stale_after_failures", 3)
    if not _whole(stale, 1, MAX_POLLS):
        raise PolicyError(
            f"{where}: unknown.stale_after_failures {stale!r} must be a whole number from 1 to {MAX_POLLS:,}"
        )
    grace_polls = unknown.get("grace_polls", 2)
    if not _whole(grace_polls, 0, MAX_POLLS):
        raise PolicyError(
            f"{where}: unknown.grace_polls {grace_polls!r} must be a whole number, 0 or more (at most {MAX_POLLS:,})"
        )
    grace_seconds = None
    if unknown.get("grace_seconds") is not None:
        grace_seconds = _number(unknown, "grace_seconds", f"{where}: unknown", low=0.0, high=86400.0)
    return Policy(
        thresholds,
        hysteresis,
        dwell,
        actions,
        signals,
        mode,
        stale,
        grace_polls,
        grace_seconds,
        _request_tokens(data.get("headroom") or {}, where),
        _fraction(data.get("gpu_memory") or {}, "below", f"{where}: gpu_memory"),
        _priorities(data, where),
        _admission(data.get("admission") or {}, where),
    )


def _only_keys(section: dict, name: str, valid: set[str], where: str) -> None:
    """A section's keys are among `valid`: else one line naming the first other key and the valid ones."""
    extra = sorted(set(section) - valid)
    if extra:
        raise PolicyError(f"{where}: unknown key '{name}.{extra[0]}'; valid: {', '.join(sorted(valid))}")


def _admission(admission: dict, where: str) -> Admission:
    _only_keys(admission, "admission", {"min_dwell_seconds", "retry_after_seconds"}, where)
    dwell = admission.get("min_dwell_seconds")
    if dwell is not None:
        dwell = _number(admission, "min_dwell_seconds", f"{where}: admission", low=0.0, high=86400.0)
    retry = admission.get("retry_after_seconds")
    if retry is not None and not _whole(retry, 1, 86400):
        raise PolicyError(
            f"{where}: admission.retry_after_seconds {retry!r} must be a whole number from 1 to 86,400, or null"
        )
    return Admission(dwell, retry)


def _request_tokens(headroom: dict, where: str) -> int | None:
    _only_keys(headroom, "headroom", {"request_tokens"}, where)
    tokens = headroom.get("request_tokens")
    if tokens is not None and not _whole(tokens, 1, MAX_TOKENS):
        raise PolicyError(
            f"{where}: headroom.request_tokens {tokens!r} must be a whole number from 1 to {MAX_TOKENS:,}, or null"
        )
    return tokens


_UNKNOWN_KEYS = {"mode", "grace_polls", "grace_seconds", "stale_after_failures"}
_SECTIONS = ("levels", "actions", "signals", "unknown", "headroom", "gpu_memory", "priorities", "admission")
MAX_POLLS = 1_000_000
MAX_TOKENS = 1 << 32  # a request's tokens, a max_tokens cap
MAX_PRIORITY = 1 << 62  # vLLM priorities are Python ints; a policy's bounds past this are no request's


def _mapping(value: Any, where: str, required: bool = False) -> None:
    """A policy section: a mapping whose keys are names (YAML also allows numbers and lists as keys), or absent."""
    if value is None and not required:
        return
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be a mapping of names to values, not {type(value).__name__} {value!r:.60}")
    for key in value:
        if not isinstance(key, str):
            raise PolicyError(f"{where}: the key {key!r:.60} is not a name; keys are names such as warn or actions")


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _priorities(data: dict[str, Any], where: str) -> Priorities:
    section = data.get("priorities") or {}
    if not isinstance(section, dict):
        raise PolicyError(f"{where}: priorities must be a mapping with sheddable_above, protected_below")
    extra = sorted(set(section) - {"sheddable_above", "protected_below"})
    if extra:
        raise PolicyError(f"{where}: priorities: unknown key {extra[0]!r}; valid: protected_below, sheddable_above")
    bounds = {}
    for key in ("sheddable_above", "protected_below"):
        value = section.get(key, 0)
        if not _whole(value, -MAX_PRIORITY, MAX_PRIORITY):
            raise PolicyError(
                f"{where}: priorities.{key} {value!r} must be a whole number (a vLLM request priority) within +-2**62"
            )
        bounds[key] = value
    if bounds["protected_below"] > bounds["sheddable_above"] + 1:
        raise PolicyError(
            f"{where}: priorities.protected_below {bounds['protected_below']} must be at most sheddable_above + 1 "
            f"({bounds['sheddable_above'] + 1}): a priority cannot be both"
        )
    return Priorities(**bounds)


_ACTION_KEYS = {"max_tokens_cap", "single_sequence", "reject", "retry_after_seconds", "reject_sheddable"}
# Removed: vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1, which also opens its RPC and sleep
# endpoints to every client; the reset fails while running requests hold blocks (vllm/entrypoints/serve/dev/cache/
# api_router.py), that is under pressure; and idle cached blocks already count as free in vllm:kv_cache_usage_perc.
_REMOVED_ACTIONS = {
    "reset_prefix_cache": "removed: vLLM resets its prefix cache only in dev mode (VLLM_SERVER_DEV_MODE=1, which "
    "exposes its RPC endpoints), not while requests hold blocks, and idle cached blocks already count as free"
}
_SIGNALS = {
    "queue_growth": ("window_seconds", "min_growth"),
    "preemptions": ("window_seconds",),
    "stall": ("seconds",),
    "prefix_cache_hit_rate": ("window_seconds", "below"),
    "offload_usage": ("above",),
    "offload_load_latency": ("window_seconds", "above_ms"),
}

_SHARES = {"below", "above"}  # hit rate, usage: shares of 1


def _limits(level: Level, data: dict, where: str) -> Limits:
    for key, why in _REMOVED_ACTIONS.items():
        if data.get(key) not in (None, False):
            raise PolicyError(f"{_at(where, key)}: {why}; drop the key")
    data = {key: value for key, value in data.items() if key not in _REMOVED_ACTIONS}
    extra = sorted(set(data) - _ACTION_KEYS)
    if extra:
        raise PolicyError(f"{where}: unknown action {extra[0]!r}; valid: {', '.join(sorted(_ACTION_KEYS))}")
    cap = data.get("max_tokens_cap")
    if cap is not None and not _whole(cap, 1, MAX_TOKENS):
        raise PolicyError(
            f"{_at(where, 'max_tokens_cap')} {cap!r} must be a whole number from 1 to {MAX_TOKENS:,}, or null"
        )
    retry = data.get("retry_after_seconds")
    refuses = bool(data.get("reject") or data.get("reject_sheddable"))
    if refuses and not _whole(retry, 1, 86400):
        which = "reject" if data.get("reject") else "reject_sheddable"
        raise PolicyError(
            f"{_at(where, 'retry_after_seconds')} {retry!r} must be a whole number from 1 to 86,400 when {which} is true"
        )
    for flag in ("single_sequence", "reject", "reject_sheddable"):
        if not isinstance(data.get(flag, False), bool):
            raise PolicyError(f"{_at(where, flag)} {data[flag]!r} must be true or false")
    return Limits(
        level,
        cap,
        data.get("single_sequence", False),
        data.get("reject", False),
        retry if refuses else None,
        data.get("reject_sheddable", False),
    )


def _signal(name: str, data: dict, where: str) -> SignalRule:
    if name not in _SIGNALS:
        raise PolicyError(f"{where}: unknown signal; valid: {', '.join(_SIGNALS)}")
    raise_to = str(data.get("raise_to", "none"))
    try:
        level = None if raise_to == "none" else Level.parse(raise_to)
    except ValueError:
        raise PolicyError(f"{_at(where, 'raise_to')} {raise_to!r}; valid: none, warn, degrade, critical") from None
    if level in (Level.UNKNOWN, Level.OK):
        raise PolicyError(f"{_at(where, 'raise_to')} {raise_to!r}; valid: none, warn, degrade, critical")
    fields = {
        key: _number(data, key, where, low=0.0, high=1.0 if key in _SHARES else 1e9)
        for key in _SIGNALS[name]
        if key in data
    }
    return SignalRule(name=name, raise_to=level, **fields)


def _fraction(data: dict, key: str, where: str) -> float:
    return _number(data, key, where, low=0.0, high=1.0, exclusive_low=True)


def _at(where: str, key: str) -> str:
    """A key's place for an error: under its section ("policy.yaml: admission.min_dwell_seconds", "limits.max_tokens_cap"),
    or at the top of a file, `where` ending in a colon ("policy.yaml: hysteresis")."""
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def _number(data: dict, key: str, where: str, *, low: float, high: float, exclusive_low: bool = False) -> float:
    value = data.get(key)
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value > low if exclusive_low else value >= low)
        and value <= high
    ):
        return float(value)
    raise PolicyError(
        f"{_at(where, key)} {value!r} must be a number in {'(' if exclusive_low else '['}{low:g}, {high:g}]"
    )
