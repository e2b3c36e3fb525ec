"""The KV guard inside a real vLLM scheduler, built in-process on the CPU with a tiny block pool (vLLM's own
scheduler tests do the same); a stand-in model runner samples one token per request per step."""

from __future__ import annotations

import pytest

from kvops.policy import Level, Limits
from tests.support.policy_endpoint import PolicyEndpoint
from tests.support.servers import captured_log
from tests.support.vllm_scheduler import Driver, Requests, build_scheduler

pytestmark = pytest.mark.vllm


@pytest.fixture
def stock(tiny_model):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    return lambda **options: build_scheduler(AsyncScheduler, tiny_model, **options)


@pytest.fixture
def guard(tiny_model, monkeypatch):
    from kvops_vllm.scheduler import KVGuardScheduler

    def build(env: dict[str, str] | None = None, **options):
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        scheduler = build_scheduler(KVGuardScheduler, tiny_model, **options)
        if scheduler.follower:
            scheduler.follower.stop()  # the tests poll it themselves
        return scheduler

    for name in ("KVOPS_POLICY", "KVOPS_HEADROOM_BLOCKS", "KVOPS_POLICY_URL", "KVOPS_LOG_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    return build


@pytest.fixture
def requests():
    return Requests()


@pytest.fixture
def guard_log():
    with captured_log("vllm.kvops_guard") as (_, records):
        yield records


@pytest.fixture
def watcher():
    with PolicyEndpoint() as endpoint:
        yield endpoint


def mixed_burst(requests: Requests, count: int = 6):
    """Prompts of 20-45 tokens, 30-65 new tokens: 4-7 blocks of 16 each, against a 10-block pool."""
    return [requests.make(f"r{i}", 20 + 5 * i, 30 + 7 * i, first_token=50 * i) for i in range(count)]


# --- admission by projected KV ----------------------------------------------------------------------------


def test_the_stock_scheduler_preempts_where_the_guard_queues(stock, guard, requests):
    runs = {}
    for name, build in (("stock", stock), ("guard", guard)):
        scheduler = build(num_blocks=11)
        burst = mixed_burst(requests)
        for request in burst:
            scheduler.add_request(request)
        runs[name] = Driver(scheduler).drain()
        assert {r: (f.finish_reason, f.tokens) for r, f in runs[name].finished.items()} == {
            r.request_id: ("length", r.max_tokens) for r in burst
        }
        assert not scheduler.waiting and not scheduler.running and not scheduler.requests
    assert runs["stock"].preemptions > 0
    assert runs["guard"].preemptions == 0
    assert runs["guard"].peak_waiting > 0  # it queued instead


@pytest.mark.parametrize(("headroom", "concurrent"), [("0", 3), ("2", 2), ("5", 2), ("6", 1)])
def test_it_admits_exactly_what_fits_the_free_blocks_less_the_headroom(guard, requests, headroom, concurrent):
    scheduler = guard({"KVOPS_HEADROOM_BLOCKS": headroom}, num_blocks=14)  # 13 usable blocks
    for i in range(8):
        scheduler.add_request(requests.make(f"r{i}", 20, 44, first_token=40 * i))  # 64 tokens: 4 blocks each
    assert scheduler.projected_blocks(scheduler.waiting.peek_request()) == 4
    run = Driver(scheduler).drain()
    assert run.peak_running == concurrent  # floor((13 - headroom) / 4), and at least one
    assert run.preemptions == 0 and len(run.finished) == 8


def test_what_admitted_requests_will_still_grow_is_reserved(guard, stock, requests):
    for build, preempts in ((stock, True), (guard, False)):
        scheduler = build(num_blocks=12)  # 11 usable blocks
        scheduler.add_request(requests.make("long", 16, 112))  # 128 tokens: 8 blocks, 1 held after its prefill
        driver = Driver(scheduler)
        driver.step()
        scheduler.add_request(
            requests.make("late", 48, 80, first_token=200)
        )  # 128 tokens: 8 blocks; its prompt fits now
        driver.step()
        if build is guard:
            assert [r.request_id for r in scheduler.running] == ["long"]
            assert [r.request_id for r in scheduler.waiting] == ["late"]
            assert scheduler.kv_slack() == 11 - 8  # free blocks less what "long" will still allocate
        run = driver.drain()
        assert (run.preemptions > 0) == preempts
        assert set(run.finished) == {"long", "late"}


def test_the_first_come_is_served_first(guard, requests):
    scheduler = guard(num_blocks=12)
    scheduler.add_request(requests.make("running", 20, 44))  # 4 blocks
    driver = Driver(scheduler)
    driver.step()
    scheduler.add_request(requests.make("big", 64, 64, first_token=100))  # 8 blocks: must wait for "running"
    scheduler.add_request(requests.make("small", 8, 8, first_token=300))  # 1 block: fits, but comes after "big"
    driver.step()
    assert [r.request_id for r in scheduler.waiting] == ["big", "small"]
    order = []
    while scheduler.has_requests() or driver.in_flight:
        for request in scheduler.running:
            if request.request_id not in order:
                order.append(request.request_id)
        driver.step() if scheduler.has_requests() else driver.settle()
    assert order == ["running", "big", "small"]


def test_an_idle_engine_admits_a_request_larger_than_the_pool_less_the_headroom(guard, requests):
    scheduler = guard({"KVOPS_HEADROOM_BLOCKS": "10"}, num_blocks=12)
    scheduler.add_request(requests.make("only", 20, 44))  # 4 blocks > 11 - 10
    run = Driver(scheduler).drain()
    assert run.finished["only"].tokens == 44 and run.preemptions == 0


def test_a_sliding_window_group_is_projected_up_to_its_window(guard, requests):
    scheduler = guard(num_blocks=80, sliding_window=32, max_num_batched_tokens=64)
    full, sliding = scheduler.kv_shapes
    manager = scheduler.kv_cache_manager.coordinator.single_type_managers[1]
    assert full.max_blocks is None
    assert sliding.window == 32
    # vLLM's own cap: (window - 1 + tokens in flight) / block size, + 1 block for alignment
    assert (
        sliding.max_blocks
        == manager.max_admission_blocks_per_request
        == (31 + scheduler.vllm_config.max_in_flight_tokens + 15) // 16 + 1
    )
    long = requests.make("long", 100, 412)  # 512 tokens
    assert scheduler.projected_blocks(long) == 32 + sliding.max_blocks
    assert scheduler.projected_blocks(requests.make("short", 10, 22)) == 2 + 2  # short: no cap reached
    for request in [long, *(requests.make(f"r{i}", 40, 200, first_token=30 * i) for i in range(4))]:
        scheduler.add_request(request)
    run = Driver(scheduler).drain()
    assert run.preemptions == 0 and len(run.finished) == 5


# --- the policy at admission ------------------------------------------------------------------------------


def small_limits(level: str) -> Limits:
    """The shipped policy's actions at `level`, with a cap small enough to see in a few steps."""
    reject = level == "critical"
    return Limits(
        Level.parse(level),
        max_tokens_cap=8,
        single_sequence=level != "warn",
        reject=reject,
        retry_after_seconds=10 if reject else None,
    )


def followed(guard, watcher, level: str, usage: float = 0.5, **options):
    scheduler = guard({"KVOPS_POLICY_URL": watcher.url, "KVOPS_POLICY_POLL_SECONDS": "3600"}, **options)
    watcher.follow(level, usage, limits=small_limits(level) if level != "ok" else None)
    scheduler.follower.poll()
    return scheduler


def test_warn_caps_max_tokens_for_the_scheduler_and_the_model_runner(guard, watcher, requests):
    scheduler = followed(guard, watcher, "warn", num_blocks=20)
    long, short = requests.make("long", 10, 40, min_tokens=20), requests.make("short", 10, 5, first_token=100)
    scheduler.add_request(long)
    scheduler.add_request(short)
    assert (long.max_tokens, long.sampling_params.max_tokens, long.sampling_params.min_tokens) == (8, 8, 8)
    assert (short.max_tokens, short.sampling_params.max_tokens) == (5, 5)
    run = Driver(scheduler).drain()
    assert (run.finished["long"].finish_reason, run.finished["long"].tokens) == ("length", 8)
    assert run.finished["short"].tokens == 5
    assert scheduler.guard_counts.capped == 1


def test_degrade_serves_a_fanned_out_n_as_one_sequence(guard, watcher, requests):
    scheduler = followed(guard, watcher, "degrade", usage=0.88, num_blocks=20)
    for request_id in ("0_cmpl-a-0-1234abcd", "1_cmpl-a-0-1234abcd", "2_cmpl-a-0-1234abcd", "cmpl-b-0-5678abcd"):
        scheduler.add_request(requests.make(request_id, 10, 20))
    run = Driver(scheduler).drain()
    assert run.finished["0_cmpl-a-0-1234abcd"].tokens == 8
    assert run.finished["cmpl-b-0-5678abcd"].tokens == 8
    for sibling in ("1_cmpl-a-0-1234abcd", "2_cmpl-a-0-1234abcd"):
        finished = run.finished[sibling]
        assert (finished.finish_reason, finished.tokens) == ("abort", 0)
        assert finished.stop_reason == "kvops: KV cache degrade (watcher at 88.0%): n>1 served as one sequence"
    assert scheduler.guard_counts.siblings_dropped == 2


def test_critical_finishes_new_requests_at_once_and_the_engine_goes_on(guard, watcher, requests):
    scheduler = followed(guard, watcher, "critical", usage=0.97, num_blocks=20)
    scheduler.add_request(requests.make("plain", 10, 20))
    scheduler.add_request(requests.make("streamed", 10, 20, stream=True))
    assert scheduler.has_requests()  # nothing runs, but the two answers are still to be sent
    driver = Driver(scheduler)
    run = driver.drain()
    assert run.finished["plain"].finish_reason == "abort"
    assert (
        run.finished["plain"].stop_reason
        == "kvops: KV cache critical (watcher at 97.0%): request rejected; retry after 10 s"
    )
    assert run.finished["streamed"].finish_reason == "error"  # a stream drops a token-less abort; an error shows
    assert run.finished["plain"].tokens == run.finished["streamed"].tokens == 0
    assert not scheduler.requests and scheduler.guard_counts.rejected == 2

    watcher.follow("ok", 0.1)
    scheduler.follower.poll()
    scheduler.add_request(requests.make("after", 10, 20))
    assert driver.drain().finished["after"].tokens == 20


def test_an_unusable_watcher_leaves_the_level_to_own_usage(guard, watcher, requests):
    scheduler = followed(guard, watcher, "critical", num_blocks=20)
    watcher.serve(b"", status=503)
    scheduler.follower.poll()
    scheduler.add_request(requests.make("r", 10, 20))
    assert Driver(scheduler).drain().finished["r"].tokens == 20  # own usage: 0%, ok


def write_policy(tmp_path, warn: float, degrade: float, critical: float) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(
        f"levels: {{warn: {warn}, degrade: {degrade}, critical: {critical}}}\n"
        "actions:\n  warn: {max_tokens_cap: 8}\n  degrade: {max_tokens_cap: 8, single_sequence: true}\n"
        "  critical: {max_tokens_cap: 8, single_sequence: true, reject: true, retry_after_seconds: 5}\n"
    )
    return str(path)


def test_levels_follow_own_kv_usage_and_each_change_is_logged_once(guard, requests, tmp_path, guard_log):
    scheduler = guard({"KVOPS_POLICY": write_policy(tmp_path, 0.3, 0.5, 0.9)}, num_blocks=11)  # 10 usable
    scheduler.add_request(requests.make("first", 60, 20))  # 4 blocks once prefilled, 5 at most
    driver = Driver(scheduler)
    driver.step()
    driver.step()
    scheduler.add_request(requests.make("second", 10, 40, first_token=100))
    assert scheduler.in_force[0].level == Level.WARN
    assert scheduler.requests["second"].max_tokens == 8
    assert [line for line in guard_log if " -> " in line] == [
        "kvops guard: level ok -> warn (own KV usage 40.0%): max_tokens capped at 8"
    ]
    driver.drain()


def test_a_watcher_below_own_usage_does_not_lower_the_level(guard, watcher, requests, tmp_path):
    scheduler = guard(
        {"KVOPS_POLICY": write_policy(tmp_path, 0.3, 0.5, 0.9), "KVOPS_POLICY_URL": watcher.url}, num_blocks=11
    )
    scheduler.follower.stop()
    watcher.follow("ok", 0.0)
    scheduler.follower.poll()
    scheduler.add_request(requests.make("first", 60, 20))
    driver = Driver(scheduler)
    driver.step()
    driver.step()
    scheduler.add_request(requests.make("second", 10, 40, first_token=100))
    assert scheduler.in_force[0].level == Level.WARN and scheduler.in_force[1].startswith("own KV usage")
    driver.drain()


def test_a_bad_setting_stops_the_engine_at_startup_with_one_line(guard, guard_log):
    from kvops_vllm.config import GuardConfigError

    with pytest.raises(GuardConfigError):
        guard({"KVOPS_HEADROOM_BLOCKS": "lots"}, num_blocks=11)
    assert guard_log == ["kvops guard: KVOPS_HEADROOM_BLOCKS='lots': must be a whole number of blocks, 0 or more"]


def test_the_startup_line_and_a_summary_when_the_engine_drains(guard, watcher, requests, guard_log):
    scheduler = followed(guard, watcher, "warn", num_blocks=14)  # 13 usable blocks
    for i in range(5):
        scheduler.add_request(requests.make(f"r{i}", 20, 44, first_token=40 * i))  # capped to 8: 2 blocks each
    scheduler.add_request(requests.make("long prompt", 100, 5, first_token=300))  # 7 blocks: waits for two to finish
    run = Driver(scheduler).drain()
    assert run.preemptions == 0 and len(run.finished) == 6
    assert guard_log[0] == (
        "kvops guard: admitting by projected KV (prompt + max_tokens) over 13 usable blocks, headroom 0; "
        "groups: full attention (16-token blocks); policy shipped default (warn 70%, degrade 85%, critical 95%); "
        f"levels from own KV usage, and the watcher at {watcher.url}"
    )
    summaries = [line for line in guard_log if " in the last " in line]
    assert len(summaries) == 1
    assert summaries[0].endswith(
        " s: 1 queued for KV, 5 max_tokens capped, 0 n>1 siblings dropped, 0 rejected; "
        "now 0 running, 0 waiting, 13 blocks free, 0 reserved for admitted requests"
    )


def test_scheduler_stats_cannot_carry_the_guards_counters_to_the_api_server():
    """Why the guard reports in its log and not in vLLM's /metrics: SchedulerStats crosses from the engine-core
    process to the API server as a fixed msgspec schema, and a subclass's extra fields are dropped on the way."""
    from dataclasses import dataclass

    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    @dataclass
    class GuardedStats(SchedulerStats):
        kvops_rejected: int = 0

    sent = EngineCoreOutputs(scheduler_stats=GuardedStats(num_running_reqs=3, kvops_rejected=7))
    received = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(sent))
    assert received.scheduler_stats.num_running_reqs == 3
    assert type(received.scheduler_stats) is SchedulerStats and not hasattr(received.scheduler_stats, "kvops_rejected")
