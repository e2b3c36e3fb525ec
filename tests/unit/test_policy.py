"""The degrade policy: thresholds, hysteresis, dwell, signal floors, unknown, and request clamping."""

import pytest

from kvops.policy import (
    Level,
    LevelTracker,
    PolicyError,
    RequestClass,
    RequestParams,
    clamp,
    default_policy_text,
    load_policy,
)
from tests.support.paths import REPO


def test_shipped_config_is_the_embedded_default():
    assert (REPO / "configs" / "policy.yaml").read_text() == default_policy_text()


def test_plans_under_the_shipped_policy_use_its_warn_level_without_reading_it(tmp_path):
    from kvops.deployment import SHIPPED_GPU_MEMORY_BELOW, SHIPPED_WARN_LEVEL, policy_levels, warn_level

    assert warn_level(None) == SHIPPED_WARN_LEVEL == load_policy().thresholds[Level.WARN]
    assert policy_levels(None) == (SHIPPED_WARN_LEVEL, SHIPPED_GPU_MEMORY_BELOW)
    assert load_policy().gpu_memory_below == SHIPPED_GPU_MEMORY_BELOW
    (tmp_path / "policy.yaml").write_text("levels:\n  warn: 0.6\n")
    assert warn_level(str(tmp_path / "policy.yaml")) == 0.6


def test_default_levels_and_actions():
    policy = load_policy()
    assert [policy.raw_level(u) for u in (0.0, 0.69, 0.70, 0.85, 0.949, 0.95, 1.0)] == [
        Level.OK,
        Level.OK,
        Level.WARN,
        Level.DEGRADE,
        Level.DEGRADE,
        Level.CRITICAL,
        Level.CRITICAL,
    ]
    assert policy.limits(Level.OK).max_tokens_cap is None
    assert policy.limits(Level.WARN).max_tokens_cap == 512 and not policy.limits(Level.WARN).single_sequence
    assert policy.limits(Level.DEGRADE).single_sequence and not policy.limits(Level.DEGRADE).reject
    critical = policy.limits(Level.CRITICAL)
    assert critical.reject and critical.retry_after_seconds == 10


def test_up_is_immediate_down_needs_hysteresis_and_dwell():
    tracker = LevelTracker(load_policy())  # hysteresis 0.05, dwell 30 s
    assert tracker.update(0.72, now=0) == Level.WARN
    assert tracker.update(0.96, now=1) == Level.CRITICAL
    assert tracker.update(0.93, now=40) == Level.CRITICAL  # within 5 points of 95
    assert tracker.update(0.80, now=45) == Level.DEGRADE  # 0.80 + 0.05 = 0.85: still degrade
    assert tracker.update(0.10, now=50) == Level.DEGRADE  # dwell: only 5 s in degrade
    assert tracker.update(0.10, now=75) == Level.OK


def test_the_in_process_admission_levels_with_its_own_dwell(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("min_dwell_seconds: 30\nadmission:\n  min_dwell_seconds: 2\n")
    policy = load_policy(path)
    assert policy.min_dwell_seconds == 30 and policy.for_admission().min_dwell_seconds == 2
    assert policy.to_dict()["admission"] == {"min_dwell_seconds": 2, "retry_after_seconds": 1}
    tracker = LevelTracker(policy.for_admission())
    assert tracker.update(0.96, now=0) == Level.CRITICAL
    assert tracker.update(0.10, now=1) == Level.CRITICAL
    assert tracker.update(0.10, now=3) == Level.OK
    path.write_text("admission:\n  min_dwell_seconds: null\n  retry_after_seconds: null\n")  # the watcher's
    assert load_policy(path).for_admission() == load_policy(path)


def test_the_in_process_admission_refuses_with_its_own_retry_after(tmp_path):
    shipped = load_policy()
    assert shipped.limits(Level.CRITICAL).retry_after_seconds == 10  # the watcher's proxy, alerts and runbooks
    admission = shipped.for_admission()
    assert admission.limits(Level.CRITICAL).refusal().retry_after_seconds == 1
    assert admission.limits(Level.DEGRADE).refusal(RequestClass.SHEDDABLE).retry_after_seconds == 1
    assert admission.limits(Level.WARN).retry_after_seconds is None  # a level that refuses nothing gets none
    path = tmp_path / "policy.yaml"
    path.write_text("admission:\n  retry_after_seconds: 0\n")
    with pytest.raises(
        PolicyError, match=r"admission.retry_after_seconds 0 must be a whole number from 1 to 86,400, or null"
    ):
        load_policy(path)


def test_signal_floor_holds_the_level():
    tracker = LevelTracker(load_policy())
    assert tracker.update(0.2, now=0, floor=Level.DEGRADE) == Level.DEGRADE
    assert tracker.update(0.2, now=10) == Level.DEGRADE
    assert tracker.update(0.2, now=31) == Level.OK


@pytest.mark.parametrize("mode, expected_cap", [("fail-open", None), ("fail-closed", 512)])
def test_unknown_keeps_or_lifts_the_limits(tmp_path, mode, expected_cap):
    path = tmp_path / "policy.yaml"
    path.write_text(f"unknown:\n  mode: {mode}\n  grace_polls: 0\n")
    tracker = LevelTracker(load_policy(path))
    tracker.update(0.9, now=0)
    assert tracker.update(None, now=1) == Level.UNKNOWN
    limits = tracker.limits()
    assert limits.level == Level.UNKNOWN and limits.max_tokens_cap == expected_cap
    assert tracker.update(0.9, now=2) == Level.DEGRADE


def test_clamp():
    policy = load_policy()
    params = RequestParams(max_tokens=1024, n=4, best_of=5, beam_width=3)
    same, changes = clamp(params, policy.limits(Level.OK))
    assert same == params and changes == []
    warn, changes = clamp(params, policy.limits(Level.WARN))
    assert warn == RequestParams(512, 4, 5, 3) and changes == ["max_tokens 1024->512"]
    degraded, changes = clamp(RequestParams(max_tokens=None, n=2), policy.limits(Level.DEGRADE))
    assert degraded == RequestParams(512, 1) and changes == ["max_tokens unset->512", "n 2->1"]
    single, changes = clamp(RequestParams(100, 1, best_of=3, beam_width=2), policy.limits(Level.DEGRADE))
    assert single == RequestParams(100, 1, 1, 1) and changes == ["best_of 3->1", "beam_width 2->1"]
    small = RequestParams(max_tokens=100)
    assert clamp(small, policy.limits(Level.DEGRADE))[0] is small  # unchanged: the same params, no copy


@pytest.mark.parametrize(
    "text, message",
    [
        ("levels:\n  warn: 0.9\n", "levels.warn 0.9 must be below levels.degrade 0.85"),
        ("levels:\n  critical: 1.5\n", "levels.critical 1.5 must be a number in (0, 1]"),
        ("hysteresis: lots\n", "hysteresis 'lots'"),
        ("actions:\n  warn:\n    max_tokens_cap: -3\n", "actions.warn.max_tokens_cap -3"),
        ("actions:\n  warn:\n    shrink: true\n", "unknown action 'shrink'"),
        ("signals:\n  stall:\n    raise_to: panic\n", "signals.stall.raise_to 'panic'"),
        ("unknown:\n  mode: maybe\n", "unknown.mode 'maybe'; valid: fail-open, fail-closed"),
        ("levels: [\n", "not valid YAML at line"),
        ("surprise: 1\n", "unknown key 'surprise'"),
        ("admission:\n  min_dwell_seconds: -1\n", "admission.min_dwell_seconds -1 must be a number in [0, 86400]"),
        (
            "admission:\n  hysteresis: 0\n",
            "unknown key 'admission.hysteresis'; valid: min_dwell_seconds, retry_after_seconds",
        ),
    ],
)
def test_bad_policy_is_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert message in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_the_grace_keeps_the_last_level_for_n_failed_polls_then_unknown(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("unknown:\n  grace_polls: 2\n  mode: fail-open\n")
    tracker = LevelTracker(load_policy(path))
    tracker.update(0.97, now=0)
    assert [tracker.update(None, now=t) for t in (1, 2, 3)] == [Level.CRITICAL, Level.CRITICAL, Level.UNKNOWN]
    assert tracker.limits().reject is False  # fail-open once the grace is over
    assert tracker.update(0.97, now=4) == Level.CRITICAL
    assert tracker.update(None, now=5) == Level.CRITICAL  # a good reading starts a new grace


def test_the_grace_is_also_bounded_in_time(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("unknown:\n  grace_polls: 100\n  grace_seconds: 5\n")
    tracker = LevelTracker(load_policy(path))
    tracker.update(0.80, now=0)
    assert tracker.update(None, now=4) == Level.WARN
    assert tracker.update(None, now=6) == Level.UNKNOWN


def test_no_reading_yet_is_unknown_at_once():
    tracker = LevelTracker(load_policy())
    assert tracker.update(None, now=0) == Level.UNKNOWN


def test_the_shipped_policy_keeps_two_failed_polls_then_fails_closed():
    policy = load_policy()
    assert (policy.grace_polls, policy.grace_seconds, policy.unknown_mode) == (2, None, "fail-closed")
    assert policy.to_dict()["unknown"] == {
        "mode": "fail-closed",
        "grace_polls": 2,
        "grace_seconds": None,
        "stale_after_failures": 3,
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("unknown:\n  grace_polls: -1\n", "unknown.grace_polls -1 must be a whole number, 0 or more"),
        ("unknown:\n  grace_polls: 1.5\n", "unknown.grace_polls 1.5 must be a whole number"),
        ("unknown:\n  grace_seconds: .nan\n", "unknown.grace_seconds nan must be a number in [0, 86400]"),
        ("unknown:\n  grace_seconds: .inf\n", "unknown.grace_seconds inf must be a number in [0, 86400]"),
        ("unknown:\n  grace: 3\n", "unknown key 'unknown.grace'; valid: grace_polls, grace_seconds, mode"),
    ],
)
def test_bad_grace_is_one_line(tmp_path, text, message):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_effects_as_the_proxy_answers_and_as_the_guard_holds():
    """The proxy refuses with a status; the KV guard, a scheduler, holds the refused requests in the queue."""
    policy = load_policy()
    degrade, critical = policy.limits(Level.DEGRADE), policy.limits(Level.CRITICAL)
    assert critical.effects() == ["rejected with 503 and Retry-After: 10"]
    assert critical.effects(held=True)[-1] == "held in the queue unless protected"
    assert "forced to one sequence (n, best_of, beam width 1)" in degrade.effects()
    assert "run one sequence at a time (n>1 siblings after the first wait)" in degrade.effects(held=True)
    assert policy.limits(Level.OK).effects(held=True) == []
