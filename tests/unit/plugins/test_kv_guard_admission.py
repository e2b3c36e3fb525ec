"""The KV guard's pure parts: projected blocks, the admission prefix, its settings, the watcher contract."""

from __future__ import annotations

import json
import threading
import time

import pytest

from kvops.policy import Level, Limits, PolicyError, load_policy
from kvops_vllm.config import GuardConfig, GuardConfigError
from kvops_vllm.follow import PolicyFollower, parse_reading
from tests.support.policy_endpoint import PolicyEndpoint, policy_document
from tests.support.servers import captured_log

pytest.importorskip(
    "numpy", reason="numpy is not installed: the KV guard's admission needs it (pip install -e '.[test]')"
)
from kvops_vllm.admission import (
    GroupShape,
    admissible_prefix,
    live_blocks,
    projected_blocks,
    whole_blocks,
    window_blocks,
)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (128, 1), (129, 2), (1024, 8)])
def test_whole_blocks_round_up(tokens, blocks):
    assert whole_blocks(tokens, 128) == blocks


def test_a_full_attention_group_grows_with_prompt_plus_max_tokens():
    full = GroupShape(128)
    assert full.blocks(300 + 400) == 6  # ceil(700 / 128)
    assert full.blocks(1024) == 8


def test_a_sliding_window_group_stops_at_window_plus_in_flight_plus_one_block():
    # window 4096, 16-token blocks, 2 x 2048 tokens in flight: (4095 + 4096) / 16 -> 512 blocks, +1 for alignment
    assert window_blocks(4096, 16, in_flight_tokens=4096) == 513
    sliding = GroupShape(16, window_blocks(4096, 16, 4096), window=4096)
    assert sliding.blocks(1000) == 63  # short requests never reach the window
    assert sliding.blocks(32768) == 513
    assert projected_blocks([GroupShape(16), sliding], 32768) == 2048 + 513


class Block:
    def __init__(self, is_null: bool):
        self.is_null = is_null


@pytest.mark.parametrize(("nulls", "live"), [(0, 0), (0, 5), (3, 4), (7, 0)])
def test_live_blocks_skip_the_null_blocks_behind_a_window(nulls, live):
    assert live_blocks([Block(True)] * nulls + [Block(False)] * live) == live


def test_admission_is_first_come_first_served():
    assert admissible_prefix([3, 3, 3], slack=10, idle=False) == 3
    assert admissible_prefix([3, 3, 5, 1], slack=10, idle=False) == 2  # the 5 does not fit: the 1 behind it waits
    assert admissible_prefix([4], slack=3, idle=False) == 0
    assert admissible_prefix([4], slack=-2, idle=False) == 0


def test_an_idle_engine_admits_its_first_request_whatever_its_size():
    assert admissible_prefix([40, 1], slack=30, idle=True) == 1
    assert admissible_prefix([5, 40], slack=30, idle=True) == 1


def test_needs_past_the_first_misfit_are_never_computed():
    computed = []

    def needs():
        for need in (2, 9, 1, 1):
            computed.append(need)
            yield need

    assert admissible_prefix(needs(), slack=5, idle=False) == 1
    assert computed == [2, 9]


# --- settings -------------------------------------------------------------------------------------------


def test_defaults_are_the_shipped_policy_and_no_headroom():
    config = GuardConfig.from_env({})
    assert config.policy == load_policy()
    assert (config.policy_source, config.headroom_blocks, config.policy_url) == ("shipped default", 0, None)
    assert (config.poll_seconds, config.timeout_seconds, config.max_age_seconds, config.log_seconds) == (
        2.0,
        1.0,
        30.0,
        10.0,
    )
    # guard v3's fallback (bench/guard_simulated.py): a short pause, then the victim that frees the most blocks,
    # which waits behind the requests that have not streamed a token yet
    assert (config.pause_steps, config.preempt, config.resume, config.resume_wait_steps) == (
        4,
        "most-computed",
        "after-new",
        200,
    )


def test_settings_come_from_kvops_variables(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("levels: {warn: 0.5, degrade: 0.6, critical: 0.7}\n")
    config = GuardConfig.from_env(
        {
            "KVOPS_POLICY": str(policy),
            "KVOPS_HEADROOM_BLOCKS": "3",
            "KVOPS_POLICY_URL": "http://127.0.0.1:9400",
            "KVOPS_POLICY_POLL_SECONDS": "0.5",
            "KVOPS_LOG_SECONDS": "60",
            "KVOPS_PAUSE_STEPS": "0",
            "KVOPS_PREEMPT": "least-computed",
            "KVOPS_RESUME": "first",
            "KVOPS_RESUME_WAIT_STEPS": "50",
        }
    )
    assert config.policy.thresholds[Level.CRITICAL] == 0.7
    assert config.policy_source == str(policy)
    assert config.headroom_blocks == 3
    assert config.policy_url == "http://127.0.0.1:9400/kvops/policy"
    assert (config.poll_seconds, config.log_seconds) == (0.5, 60.0)
    assert config.pause_steps == 0
    assert (config.preempt, config.resume, config.resume_wait_steps) == ("least-computed", "first", 50)
    assert GuardConfig.from_env({"KVOPS_POLICY_URL": "http://w:1/custom/path"}).policy_url == "http://w:1/custom/path"


def test_a_cold_engine_admits_as_stock_unless_told_to_project_max_tokens():
    assert GuardConfig.from_env({}).cold_start == "stock"
    assert GuardConfig.from_env({"KVOPS_COLD_START": "max_tokens"}).cold_start == "max_tokens"
    with pytest.raises(GuardConfigError) as error:
        GuardConfig.from_env({"KVOPS_COLD_START": "guess"})
    assert str(error.value) == "KVOPS_COLD_START='guess': must be one of stock, max_tokens"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KVOPS_HEADROOM_BLOCKS", "-1", "KVOPS_HEADROOM_BLOCKS='-1': must be a whole number of blocks, 0 or more"),
        ("KVOPS_HEADROOM_BLOCKS", "2.5", "KVOPS_HEADROOM_BLOCKS='2.5': must be a whole number of blocks, 0 or more"),
        ("KVOPS_POLICY_POLL_SECONDS", "0", "KVOPS_POLICY_POLL_SECONDS='0': must be a number of seconds above 0"),
        ("KVOPS_PAUSE_STEPS", "-3", "KVOPS_PAUSE_STEPS='-3': must be a whole number of steps, 0 or more"),
        (
            "KVOPS_PREEMPT",
            "newest",
            "KVOPS_PREEMPT='newest': must be one of most-computed, least-computed",
        ),
        ("KVOPS_RESUME", "last", "KVOPS_RESUME='last': must be one of after-new, first"),
        ("KVOPS_RESUME_WAIT_STEPS", "x", "KVOPS_RESUME_WAIT_STEPS='x': must be a whole number of steps, 0 or more"),
        (
            "KVOPS_POLICY_TIMEOUT_SECONDS",
            "soon",
            "KVOPS_POLICY_TIMEOUT_SECONDS='soon': must be a number of seconds above 0",
        ),
        (
            "KVOPS_POLICY_URL",
            "watcher:9400",
            "KVOPS_POLICY_URL='watcher:9400': must be an http(s) URL such as http://127.0.0.1:9400/kvops/policy",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(name, value, message):
    with pytest.raises(GuardConfigError) as error:
        GuardConfig.from_env({name: value})
    assert str(error.value) == message


def test_a_missing_policy_file_names_the_path(tmp_path):
    with pytest.raises(PolicyError, match=r"nope.yaml: cannot read"):
        GuardConfig.from_env({"KVOPS_POLICY": str(tmp_path / "nope.yaml")})


# --- the watcher's /kvops/policy ------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["ok", "warn", "degrade", "critical", "unknown"])
def test_limits_survive_the_round_trip_through_json(level):
    limits = load_policy().limits(Level.parse(level))
    assert Limits.from_dict(json.loads(json.dumps(limits.to_dict()))) == limits


def test_a_reading_is_parsed_from_the_contract():
    reading = parse_reading(policy_document("critical", 0.97, updated_at=1700000000.5))
    assert reading.level == Level.CRITICAL
    assert reading.limits.reject and reading.limits.retry_after_seconds == 10
    assert (reading.kv_usage, reading.updated_at, reading.source) == (
        0.97,
        1700000000.5,
        "http://127.0.0.1:8000/metrics",
    )
    assert parse_reading(policy_document("unknown", None)).kv_usage is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"level": "panic"}, "level: 'panic' is not a level"),
        ({"kv_usage": 7}, "kv_usage 7 is not a fraction"),
        ({"updated_at": "now"}, "updated_at 'now' is not unix seconds"),
        ({"limits": {"level": "warn", "max_tokens_cap": -3}}, "limits.max_tokens_cap -3 must be a whole number from 1"),
        ({"limits": {"level": "warn", "hurry": True}}, "limits: unknown action 'hurry'"),
        ({"limits": None}, "limits: must be a mapping"),
    ],
)
def test_a_bad_reading_names_its_field(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_reading({**policy_document("warn"), **change})


@pytest.fixture
def watcher():
    with PolicyEndpoint() as endpoint:
        yield endpoint


@pytest.fixture
def guard_log():
    with captured_log("kvops-test-follower") as captured:
        yield captured


def test_the_follower_reads_the_watcher_and_drops_it_when_unusable(watcher, guard_log):
    log, records = guard_log
    follower = PolicyFollower(watcher.url, interval=60, timeout=10, max_age=30, logger=log)

    watcher.serve(policy_document("degrade", 0.88))
    follower.poll()
    assert follower.reading().level == Level.DEGRADE
    follower.poll()  # still following: no second line
    assert records == [f"kvops guard: following the watcher at {watcher.url}"]

    for payload, status, problem in [
        (policy_document("warn"), 503, "HTTP 503"),
        (b"<html>", 200, "body is not JSON"),
        ({**policy_document("warn"), "level": "high"}, 200, "level: 'high' is not a level"),
        (policy_document("warn", updated_at=time.time() - 31), 200, "its updated_at is more than 30 s old"),
    ]:
        watcher.serve(payload, status)
        follower.poll()
        assert follower.reading() is None
        assert problem in records[-1]
        assert records[-1].startswith(f"kvops guard: watcher at {watcher.url} unusable (")


def test_a_slow_read_never_lands_after_a_newer_one(watcher, guard_log):
    """The background thread's read, answered before the watcher became unusable, must not win over a later poll."""
    log, _ = guard_log
    follower = PolicyFollower(watcher.url, interval=60, timeout=10, max_age=30, logger=log)
    fetch, answered = follower._fetch, threading.Event()

    def slow_fetch():
        body = fetch()
        if not answered.is_set():
            answered.set()
            time.sleep(0.5)  # a busy machine: the answer is in, the thread not yet scheduled
        return body

    follower._fetch = slow_fetch
    watcher.serve(policy_document("critical"))
    background = threading.Thread(target=follower.poll)
    background.start()
    assert answered.wait(10)
    watcher.serve(b"", 503)
    follower.poll()
    background.join()
    assert follower.reading() is None


def test_a_reading_goes_stale_between_polls(watcher, guard_log):
    log, _ = guard_log
    follower = PolicyFollower(watcher.url, interval=60, timeout=10, max_age=30, logger=log)
    watcher.serve(policy_document("warn", updated_at=time.time() - 20))
    follower.poll()
    assert follower.reading() is not None
    assert follower.reading(now=time.time() + 15) is None


def test_an_unreachable_watcher_times_out_and_is_reported_once(guard_log):
    log, records = guard_log
    follower = PolicyFollower("http://127.0.0.1:9/kvops/policy", interval=60, timeout=0.5, max_age=30, logger=log)
    follower.poll()
    follower.poll()
    assert follower.reading() is None
    assert len(records) == 1 and "unusable" in records[0]


def test_the_follower_polls_in_the_background_until_stopped(watcher, guard_log):
    log, _ = guard_log
    watcher.follow("critical")
    follower = PolicyFollower(watcher.url, interval=0.05, timeout=10, max_age=30, logger=log).start()
    deadline = time.monotonic() + 5
    while follower.reading() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert follower.reading().level == Level.CRITICAL
    watcher.follow("ok")
    deadline = time.monotonic() + 5
    while follower.reading().level != Level.OK and time.monotonic() < deadline:
        time.sleep(0.02)
    assert follower.reading().level == Level.OK
    follower.stop()
    follower._thread.join(timeout=2)
    assert not follower._thread.is_alive()
