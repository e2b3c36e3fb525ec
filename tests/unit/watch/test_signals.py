"""Saturation signals over successive readings: queue growth, preemptions, stall, prefix-cache hit rate."""

import pytest

from kvops.engines.metrics import Reading
from kvops.policy import Level, SignalRule, load_policy
from kvops.watch.signals import SignalTracker, floor, increase


def reading(**fields) -> Reading:
    return Reading(kv_usage=fields.pop("kv_usage", 0.5), basis="test", **fields)


def states(tracker, **fields):
    now = fields.pop("now")
    return {s.name: s for s in tracker.update(reading(**fields), now)}


def test_queue_growth_is_now_minus_the_window_minimum():
    tracker = SignalTracker({"queue_growth": SignalRule("queue_growth", Level.WARN, window_seconds=10, min_growth=5)})
    assert not states(tracker, now=0, waiting=2)["queue_growth"].firing
    assert states(tracker, now=5, waiting=6)["queue_growth"].value == 4
    grown = states(tracker, now=9, waiting=7)["queue_growth"]
    assert grown.firing and grown.value == 5 and floor([grown]) == Level.WARN
    later = states(tracker, now=16, waiting=7)["queue_growth"]  # the readings of 2 and 6 left the window
    assert not later.firing and later.value == 0


def test_preemptions_fire_on_any_increase_within_the_window_and_survive_a_counter_reset():
    tracker = SignalTracker({"preemptions": SignalRule("preemptions", Level.DEGRADE, window_seconds=10)})
    assert states(tracker, now=0, preemptions_total=12)["preemptions"].value is None  # one reading: no rate yet
    assert not states(tracker, now=1, preemptions_total=12)["preemptions"].firing
    assert states(tracker, now=2, preemptions_total=15)["preemptions"].value == 3
    restarted = states(tracker, now=3, preemptions_total=2)["preemptions"]  # engine restarted: 2 new ones
    assert restarted.firing and restarted.value == 5
    assert not states(tracker, now=14, preemptions_total=2)["preemptions"].firing


def test_preemptions_between_polls_slower_than_the_window_still_fire():
    """A busy engine answers /metrics late: readings 3 s apart under a 2 s window. The counter moved between them,
    so the signal fires, counted from the last reading before the window."""
    tracker = SignalTracker({"preemptions": SignalRule("preemptions", Level.DEGRADE, window_seconds=2)})
    states(tracker, now=0, preemptions_total=12)
    slow = states(tracker, now=3, preemptions_total=13)["preemptions"]
    assert slow.firing and slow.value == 1
    assert not states(tracker, now=6, preemptions_total=13)["preemptions"].firing


def test_an_engine_without_preemptions_never_fires():
    tracker = SignalTracker({"preemptions": SignalRule("preemptions", Level.DEGRADE, window_seconds=10)})
    for now in range(3):
        state = states(tracker, now=now, running=3)["preemptions"]
    assert not state.firing and state.detail == "the engine exports no preemption counter"


def test_stall_is_requests_running_while_the_token_counter_stands_still():
    tracker = SignalTracker({"stall": SignalRule("stall", Level.CRITICAL, seconds=30)})
    assert not states(tracker, now=0, running=4, progress_total=100)["stall"].firing
    assert not states(tracker, now=20, running=4, progress_total=180)["stall"].firing
    assert states(tracker, now=45, running=4, progress_total=180)["stall"].value == 25
    stalled = states(tracker, now=50, running=4, progress_total=180)["stall"]
    assert stalled.firing and floor([stalled]) == Level.CRITICAL
    assert not states(tracker, now=51, running=0, progress_total=180)["stall"].firing  # idle is not a stall
    assert states(tracker, now=60, running=1, progress_total=180)["stall"].value == 9  # the clock restarted at 51


def test_prefix_cache_hit_rate_over_the_window():
    tracker = SignalTracker(
        {"prefix_cache_hit_rate": SignalRule("prefix_cache_hit_rate", None, window_seconds=300, below=0.85)}
    )
    states(tracker, now=0, prefix_hits_total=0, prefix_queries_total=0)
    low = states(tracker, now=10, prefix_hits_total=500, prefix_queries_total=1000)["prefix_cache_hit_rate"]
    assert low.firing and low.value == 0.5 and floor([low]) == Level.OK  # informational: raises nothing
    high = states(tracker, now=20, prefix_hits_total=9500, prefix_queries_total=10000)["prefix_cache_hit_rate"]
    assert not high.firing and high.value == pytest.approx(0.95)


def test_the_shipped_policy_signals():
    tracker = SignalTracker(load_policy().signals)
    assert [s.name for s in tracker.update(reading(), 0)] == [
        "queue_growth",
        "preemptions",
        "stall",
        "prefix_cache_hit_rate",
        "offload_usage",
        "offload_load_latency",
    ]


def test_increase():
    assert increase([1, 3, 3, 7]) == 6
    assert increase([10, 2, 5]) == 5  # a reset: 2 counts, then +3
    assert increase([4]) == 0
